"""Selection callbacks in a real Trainer: the prompts trained at step t+1 are exactly those chosen after step t
(with and without loader workers), state round-trips, and a resumed run selects what the uninterrupted run does."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rlft.callbacks import (
    AllocationCallback,
    AutoShareCallback,
    DOTSCallback,
    DPSCallback,
    DynamicSamplingCallback,
    GRESOCallback,
    HistoryResamplingCallback,
    MoPPSCallback,
    ReplayCallback,
    ScreeningCallback,
    SequentialSamplingCallback,
)
from tests.conftest import countdown_dm, tiny_module, tiny_trainer


class Recorder(L.Callback):
    """After the selection callbacks: what was trained at each step and what was scheduled for the next."""

    def __init__(self):
        self.trained: list[list[int]] = []
        self.scheduled: list[list[int]] = []
        self.replayed: list[list[int]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        r = outputs["rollouts"]
        self.trained.append(sorted(r.prompt_ids[~r.is_replay].tolist()))
        self.replayed.append(sorted(r.prompt_ids[r.is_replay].tolist()))
        scheduled = trainer.datamodule.plan.scheduled  # None after the last step: nothing left to plan
        self.scheduled.append(None if scheduled is None else sorted(scheduled.tolist()))


class StepSeededCoins:
    """Coin-flip rewards from torch's global generator, which GRPOModule re-seeds every step: a resumed run sees
    the rewards the uninterrupted run saw, and groups are a mix of effective and degenerate ones."""

    totals: dict = {}

    def __call__(self, completions, columns):
        from lit_rlft.rewards.runner import RewardResult

        total = (torch.rand(len(completions)) < 0.5).float()
        return RewardResult(total=total, per_func={"coin": total}, num_errors=0, num_timeouts=0, num_unscored=0)


def _fit(tmp_path, callbacks, steps=5, num_workers=0, ckpt_path=None, extra=None):
    rec = Recorder()
    module = tiny_module(learning_rate=1e-3)
    module.grpo.scorer = StepSeededCoins()
    trainer = tiny_trainer(tmp_path, max_steps=steps, callbacks=[*callbacks, rec, *(extra or [])],
                           enable_checkpointing=bool(extra))
    trainer.fit(module, datamodule=countdown_dm(size=48, batch_size=4, num_workers=num_workers), ckpt_path=ckpt_path)
    return rec, module


@pytest.mark.parametrize("num_workers", [0, 2])
def test_step_t_plus_1_trains_what_was_chosen_after_step_t(tmp_path, num_workers):
    rec, _ = _fit(tmp_path, [DPSCallback(decay=0.5)], steps=4, num_workers=num_workers)
    assert len(rec.trained) == 4
    for t in range(3):
        assert rec.trained[t + 1] == rec.scheduled[t]


def test_replay_composes_with_dps_and_keeps_the_plan_exact(tmp_path):
    rec, module = _fit(tmp_path, [DPSCallback(), ReplayCallback(delta=0.5, capacity=8)], steps=4)
    assert rec.scheduled[-1] is None
    assert all(len(ids) == 2 for ids in rec.scheduled[:-1])  # DPS chooses delta * B = 2 fresh prompts
    for t in range(3):
        assert rec.trained[t + 1][: len(rec.scheduled[t])] == rec.scheduled[t] or set(rec.scheduled[t]) <= set(
            rec.trained[t + 1]
        )


def _dots(tmp_path):
    return DOTSCallback(reference_size=6, update_every=2, online_steps_per_update=2, cache_dir=str(tmp_path / "c"))


@pytest.mark.parametrize(
    "make",
    [lambda tmp: [DPSCallback(decay=0.7)], lambda tmp: [HistoryResamplingCallback(seed=3)], lambda tmp: [_dots(tmp)],
     lambda tmp: [DPSCallback(), ReplayCallback(delta=0.5, capacity=8)], lambda tmp: [DPSCallback(candidate_ratio=3)],
     lambda tmp: [MoPPSCallback(candidate_ratio=4)], lambda tmp: [GRESOCallback(initial_p=0.2)],
     lambda tmp: [DynamicSamplingCallback(max_rounds=3)], lambda tmp: [ReplayCallback(delta=0.5, capacity=8)],
     lambda tmp: [DPSCallback(), DynamicSamplingCallback(max_rounds=3)],
     lambda tmp: [_dots(tmp), ReplayCallback(delta=0.5, capacity=8)],
     lambda tmp: [_dots(tmp), DynamicSamplingCallback(max_rounds=3)],
     lambda tmp: [ScreeningCallback(initial_generations=2, max_rounds=3)],
     lambda tmp: [ScreeningCallback(initial_generations=2, max_rounds=3), DPSCallback(),
                  ReplayCallback(delta=0.5, capacity=8)],
     lambda tmp: [SequentialSamplingCallback(1, 2, 5), DPSCallback(), ReplayCallback(delta=0.5, capacity=8)],
     lambda tmp: [AllocationCallback(1, 6, budget_ratio=1.25, granularity=1, min_gain=0.0), MoPPSCallback(),
                  ReplayCallback(delta=0.5, capacity=8)],
     lambda tmp: [MoPPSCallback(candidate_ratio=4), AutoShareCallback(rate=1.0)],
     lambda tmp: [DPSCallback(), AutoShareCallback(rate=1.0, seed=2), ReplayCallback(delta=0.5, capacity=8)]],
    ids=["dps", "history", "dots", "dps+replay", "dps-candidates", "mopps", "greso", "dynamic-sampling", "replay",
         "dps+dynamic-sampling", "dots+replay", "dots+dynamic-sampling", "screening", "screening+dps+replay",
         "sequential+dps+replay", "allocation+mopps+replay", "mopps+auto",
         "dps+auto+replay"],
)
def test_resume_selects_exactly_what_the_uninterrupted_run_selects(tmp_path, make):
    full, full_module = _fit(tmp_path / "full", make(tmp_path), steps=6)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    _fit(tmp_path / "first", make(tmp_path), steps=3, extra=[ckpt])
    path = tmp_path / "ckpt" / "epoch=0-step=3.ckpt"
    assert path.exists(), list((tmp_path / "ckpt").iterdir())
    resumed, module = _fit(tmp_path / "resumed", make(tmp_path), steps=6, ckpt_path=str(path))
    assert module.grpo.rollout_step == 6
    assert resumed.trained == full.trained[3:]
    assert resumed.scheduled == full.scheduled[3:]
    assert resumed.replayed == full.replayed[3:]
    if "replay" in str(make(tmp_path)):
        assert any(full.replayed[3:]), "nothing was replayed: the test would not see a buffer mismatch"
    assert module.grpo.budget.completions == full_module.grpo.budget.completions
    # fit 6 == fit 3 + resume 3, to the bit: weights and the callbacks' selection state
    for (name, a), (_, b) in zip(full_module.policy.state_dict().items(), module.policy.state_dict().items()):
        assert torch.equal(a, b), name
    np.testing.assert_equal(_selection_state(module.trainer), _selection_state(full_module.trainer))  # NaN == NaN


def _selection_state(trainer) -> list:
    """Every stateful callback's checkpoint state, with arrays and tensors as lists (comparable with ==)."""
    return [plain_state(cb.state_dict()) for cb in trainer.callbacks if cb.state_dict()]


def plain_state(obj):
    """A callback state with arrays and tensors as lists and wall times left out (comparable with ==)."""
    if isinstance(obj, dict):
        return {k: plain_state(v) for k, v in obj.items() if k not in ("seconds", "wall_s", "time_s")}
    if isinstance(obj, (list, tuple)):
        return [plain_state(v) for v in obj]
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        return obj.tolist()
    return obj
