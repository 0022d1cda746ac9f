"""Every lit_rlft callback works against a minimal context that implements only the StepContext Protocol (no
GRPOModule, no Trainer): the declared seam is all they use."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_rlft.callbacks import (
    BatchCompositionLogger,
    CompletionLogger,
    DifficultyPredictorConfig,
    DOTSCallback,
    DPSCallback,
    DynamicSamplingCallback,
    GRESOCallback,
    HistoryResamplingCallback,
    MoPPSCallback,
    ReplayCallback,
    RolloutBudgetStop,
    SuccessRateRecorder,
)
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2
from lit_rlft.step import LocalCollective, RolloutBudget, StepContext, StepOutput
from lit_rlft.step.context import PromptData, RolloutHook, StopCondition
from tests.conftest import TINY_SMALL, countdown_dm

G, L_MAX = 4, 6


PROMPT_DATA = {n for n in (*PromptData.__annotations__, *vars(PromptData)) if not n.startswith("_")}


class DataOnly:
    """A ``PromptDataModule`` seen through :class:`PromptData` only: a member the Protocol does not declare raises."""

    def __init__(self, dm):
        self._dm = dm

    def __getattr__(self, name: str):
        if name not in PROMPT_DATA:
            raise AttributeError(f"{name!r} is not a PromptData member (declared: {sorted(PROMPT_DATA)})")
        return getattr(self._dm, name)


class FakeContext:
    """StepContext and nothing more: rollouts are random token rows with coin-flip rewards (deterministic)."""

    def __init__(self, tmp_path: Path, ends_at: int = 10**9):
        self.tokenizer = char_tokenizer()
        dm = countdown_dm(size=48, batch_size=4)
        dm.setup("fit")
        dm.set_tokenizer(self.tokenizer)
        self.data = DataOnly(dm)
        self.policy = tiny_qwen2(self.tokenizer, TinyConfig(**TINY_SMALL))
        self.rollout_step, self.num_generations = 0, G
        self.collective, self.budget = LocalCollective(), RolloutBudget()
        self.stop_token_ids = [self.tokenizer.eos_token_id]
        self.device = torch.device("cpu")
        self.log_dir = str(tmp_path)
        self.logged: dict[str, float] = {}
        self.history: list[dict[str, float]] = []  # every log call, in order
        self.planned: list[np.ndarray | None] = []  # the plan's scheduled batch after each step's callbacks
        self.texts: dict[str, str] = {}
        self.gen = torch.Generator().manual_seed(0)
        self.ends_at = ends_at
        self.callbacks: list = []  # what a driver binds: the stop conditions among them are asked, as GRPOStep does
        self.async_depth, self.in_flight = 0, np.zeros(0, dtype=np.int64)  # synchronous
        self.stopped: str | None = None
        self.saved: list[str] = []  # checkpoints asked of the driver

    def rollout(self, prompt_ids: np.ndarray, purpose: str = "train",
                num_generations: int | None = None) -> tuple[Rollouts, OutcomeRecord]:
        ids = np.asarray(prompt_ids, dtype=np.int64)
        g = num_generations or G
        b, n = len(ids), len(ids) * g
        rewards = (torch.rand(b, g, generator=self.gen) < 0.5).float()
        comp = torch.randint(3, 20, (n, L_MAX), generator=self.gen)
        roll = Rollouts(
            prompt_ids=torch.as_tensor(ids), prompt_tokens=torch.randint(3, 20, (n, 5), generator=self.gen),
            prompt_mask=torch.ones(n, 5, dtype=torch.long), completion_tokens=comp,
            completion_mask=torch.ones(n, L_MAX, dtype=torch.long), rewards=rewards, correct=rewards >= 1,
            birth_step=torch.full((b,), self.rollout_step), is_replay=torch.zeros(b, dtype=torch.bool),
            truncated=torch.ones(n, dtype=torch.bool), behaviour_logprobs=-torch.rand(n, L_MAX, generator=self.gen),
            completions=["x"] * n, prompts=["p"] * b,
        )
        self.budget.add(b, n, n * L_MAX, 0.0, purpose)
        return roll, OutcomeRecord.from_rollouts(roll)

    def success_rates(self, prompt_ids: np.ndarray, purpose: str = "reference",
                      num_generations: int | None = None) -> np.ndarray:
        return self.rollout(prompt_ids, purpose, num_generations)[1].success_rates.numpy()

    def log(self, metrics: Mapping[str, float]) -> None:
        self.logged.update(metrics)
        self.history.append(dict(metrics))

    def log_text(self, tag: str, text: str) -> None:
        self.texts[tag] = text

    def request_stop(self, reason: str) -> None:
        self.stopped = self.stopped or reason

    def save_checkpoint(self, path: str) -> None:
        self.saved.append(path)

    def ends_after_this_step(self) -> bool:
        for cb in self.callbacks:
            reason = cb.stop_reason(self) if isinstance(cb, StopCondition) else None
            if reason:
                self.request_stop(reason)
        return self.stopped is not None or self.rollout_step >= self.ends_at


def _drive(ctx: FakeContext, callbacks: list, steps: int = 3) -> list[StepOutput]:
    """What GRPOStep and its drivers do with callbacks, through the context-level methods only."""
    ctx.callbacks = list(callbacks)
    for cb in callbacks:
        cb.setup_step(ctx)
    for cb in callbacks:
        cb.before_first_step(ctx)
    outs = []
    for _ in range(steps):
        rollouts, record = ctx.rollout(ctx.data.plan.next_batch())
        for cb in callbacks:
            if isinstance(cb, RolloutHook):
                rollouts, record = cb.on_rollouts(ctx, rollouts, record)
        ctx.rollout_step += 1
        out = StepOutput(step=ctx.rollout_step - 1, rollouts=rollouts, record=record)
        for cb in callbacks:
            cb.after_step(ctx, out)
        scheduled = ctx.data.plan.scheduled
        ctx.planned.append(None if scheduled is None else np.array(scheduled))
        outs.append(out)
    return outs


SELECTION = {
    "dps": lambda tmp: DPSCallback(decay=0.5, candidate_ratio=2, confusion_every_n_steps=1),
    "dps_cold_start": lambda tmp: DPSCallback(cold_start=DifficultyPredictorConfig(
        reference_size=8, update_every=2, online_steps_per_update=1, cache_dir=str(tmp / "emb"))),
    "dots": lambda tmp: DOTSCallback(reference_size=8, update_every=2, online_steps_per_update=1,
                                     cache_dir=str(tmp / "emb")),
    "mopps": lambda tmp: MoPPSCallback(candidate_ratio=2),
    "greso": lambda tmp: GRESOCallback(),
    "history": lambda tmp: HistoryResamplingCallback(),
}


def test_the_fake_is_a_step_context(tmp_path):
    assert isinstance(FakeContext(tmp_path), StepContext)


@pytest.mark.parametrize("name", sorted(SELECTION))
def test_each_selection_callback_plans_from_the_context_alone(tmp_path, name):
    ctx = FakeContext(tmp_path)
    cb = SELECTION[name](tmp_path)
    outs = _drive(ctx, [cb])
    for t in range(len(outs) - 1):  # step t+1 trained what the callback planned after step t
        assert ctx.planned[t] is not None and len(ctx.planned[t]) == 4
        assert outs[t + 1].record.prompt_ids.tolist() == ctx.planned[t].tolist()
    assert ctx.data.plan.scheduled is not None and len(ctx.data.plan.scheduled) == 4
    assert f"{cb.name}/effective_ratio" in ctx.logged
    if name == "dps":
        assert "dps/confusion" in ctx.texts
    if name in ("dots", "dps_cold_start"):
        assert ctx.budget.by_purpose["reference"] > 0  # reference sets rolled out through ctx.success_rates


def test_replay_and_dynamic_sampling_reshape_batches_through_the_context(tmp_path):
    ctx = FakeContext(tmp_path)
    replay, ds = ReplayCallback(delta=0.5, capacity=16), DynamicSamplingCallback(max_rounds=3)
    outs = _drive(ctx, [DPSCallback(), ds, replay], steps=4)
    assert ctx.data.plan.batch_size == 2  # replay shrank the fresh share
    assert any(bool(o.rollouts.is_replay.any()) for o in outs[1:])  # stored groups came back
    assert "dynamic_sampling/rounds" in ctx.logged and "replay/buffer_size" in ctx.logged

    ctx = FakeContext(tmp_path)  # dynamic sampling alone: every trained group has a reward spread
    outs = _drive(ctx, [DynamicSamplingCallback(max_rounds=10)], steps=6)
    rounds = [m for m in ctx.history if "dynamic_sampling/rounds" in m]
    assert len(rounds) == 6 and all(m["dynamic_sampling/filled"] == 1.0 for m in rounds)
    for out in outs:
        trained = out.record.trained_batch()
        assert trained.num_groups == 4 and bool((trained.rewards.std(dim=1) > 0).all())
    extra_groups = sum(m["dynamic_sampling/rolled_out_groups"] - 4 for m in rounds)  # beyond each first round
    assert extra_groups > 0 and ctx.budget.by_purpose["dynamic_sampling"] == extra_groups * G


def test_loggers_and_recorder_use_the_context_only(tmp_path):
    ctx = FakeContext(tmp_path, ends_at=2)
    recorder = SuccessRateRecorder()
    _drive(ctx, [DPSCallback(), BatchCompositionLogger("difficulty"), CompletionLogger(every_n_steps=1), recorder],
           steps=2)
    assert "composition/distinct_prompts" in ctx.logged and "completions" in ctx.texts
    assert len((tmp_path / "success_rates.jsonl").read_text().splitlines()) == 8  # 2 steps x 4 prompts
    assert ctx.data.plan.scheduled is None  # the context said training ends: no next batch was planned


def test_the_budget_stop_is_a_stop_condition_that_planners_listed_before_it_see(tmp_path):
    ctx = FakeContext(tmp_path)
    stop = RolloutBudgetStop(max_completions=32)
    _drive(ctx, [DPSCallback(), stop], steps=2)  # DPS plans in its after_step, before the stop's own turn
    assert stop.exhausted(ctx)  # 2 steps x 4 prompts x G=4 = 32 completions
    assert ctx.data.plan.scheduled is None  # DPS asked and learnt that training ends: no third batch was planned
    assert ctx.stopped == "RolloutBudgetStop: 32 completions generated, max_completions=32"
