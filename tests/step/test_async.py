"""Asynchronous rollouts (``model.asynchronous.depth``): rows carry the log-probs of the weights that generated
them and the loss is the written formula on them; a prompt in flight is never drawn again, under every strategy;
staleness is bounded by admission; a resumed run regenerates its ledger (no prompt lost, none trained twice); a dead
or hung generation process stops the run naming it, and no process outlives the run."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rlft import build_step
from lit_rlft.callbacks import (
    AllocationCallback,
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
from lit_rlft.core.advantages import group_advantages
from lit_rlft.step import TorchBackend, train
from lit_rlft.step.optim import configure_adamw
from tests.conftest import REPO, countdown_dm, tiny_config, tiny_module, tiny_trainer
from tests.step.test_grpo_step import Trained

COIN = "tests.distributed.helpers.coin_reward"


def _step(depth: int = 1, **kw):
    settings = dict(reward_funcs=[COIN], learning_rate=1e-2, async_depth=depth, async_threads=1)
    settings.update(kw)
    return build_step(tiny_config(**settings))


def _loop(step, callbacks=(), steps=4, size=48, batch_size=4, before_step=None):
    """The plain loop (lit_rlft.step.train): the step bound to Countdown prompts, ``steps`` rollout steps; each
    step's output."""
    data = countdown_dm(size=size, batch_size=batch_size)
    data.setup("fit")
    step.bind(data, callbacks=callbacks)
    opt = configure_adamw(step.policy, step.optim, total_steps=100)
    backend = TorchBackend(step.policy, opt["optimizer"], opt["lr_scheduler"]["scheduler"])
    outs = []
    if before_step is not None:
        before_step(step)
    for out in train(step, backend, callbacks):
        outs.append(out)
        if len(outs) == steps:
            break
        if before_step is not None:
            before_step(step)
    return outs


def test_rows_carry_the_log_probs_of_the_weights_that_generated_them_and_the_loss_is_the_formula():
    versions: dict[int, dict[str, torch.Tensor]] = {}

    def keep(step):  # the trainer's weights before step t: version t
        versions[step.rollout_step] = {n: p.detach().clone() for n, p in step.policy.state_dict().items()}

    step = _step(depth=1)
    outs = _loop(step, steps=4, before_step=keep)
    policy = copy.deepcopy(step.policy).eval()

    def logprobs(version: int, rollouts):
        policy.load_state_dict(versions[version])
        with torch.no_grad():
            return step.updater.model_logprobs(policy, rollouts, torch.arange(rollouts.completion_tokens.shape[0]),
                                               torch.device("cpu"))[0]

    for t, out in enumerate(outs):
        r = out.rollouts
        assert r.birth_step.tolist() == [max(t - 1, 0)] * r.num_groups  # one-step-off after the first batch
        assert out.metrics["async/staleness"] == min(t, 1)
        mask = r.completion_mask.bool()
        mu = logprobs(max(t - 1, 0), r)
        assert torch.allclose(r.behaviour_logprobs[mask], mu[mask], atol=1e-4), t  # the generating weights' mu
        if t == 0:
            continue
        old = logprobs(t, r)  # pi_old: the trainer's weights when it trained step t
        assert (old - mu)[mask].abs().max() > 1e-3  # the weights moved: mu is not pi_old
        # The written formula (GRPOLoss docstring, dapo + mismatch_correction="sequence_mask", cap 3, one update, so
        # pi_theta = pi_old and the clipped surrogate is A): loss = -sum_i,t m w_i A_i / sum m, with
        # w_i = exp(sum_t m (log pi_old - log mu)), 0 above the cap.
        adv = group_advantages(r.rewards, "group").reshape(-1)  # [N]
        w = torch.exp(((old - mu) * mask).sum(1))  # [N]
        w = torch.where(w > 3.0, torch.zeros_like(w), w)
        expected = -(w[:, None] * adv[:, None] * mask).sum() / mask.sum()
        assert out.metrics["loss"] == pytest.approx(float(expected), abs=1e-5)


STRATEGIES = {
    "uniform": lambda tmp: [],
    "dps": lambda tmp: [DPSCallback(decay=0.5)],
    "dps-candidates": lambda tmp: [DPSCallback(candidate_ratio=2)],
    "mopps": lambda tmp: [MoPPSCallback(candidate_ratio=2)],
    "greso": lambda tmp: [GRESOCallback()],
    "history": lambda tmp: [HistoryResamplingCallback()],
    "dots": lambda tmp: [DOTSCallback(reference_size=6, update_every=2, online_steps_per_update=1,
                                      cache_dir=str(tmp / "emb"))],
    "dynamic-sampling": lambda tmp: [DPSCallback(), DynamicSamplingCallback(max_rounds=3)],
    "replay": lambda tmp: [DPSCallback(), ReplayCallback(delta=0.5, capacity=8)],
    "screening": lambda tmp: [DPSCallback(), ScreeningCallback(initial_generations=2, max_rounds=3)],
    "sequential": lambda tmp: [DPSCallback(), SequentialSamplingCallback(1, 1, 3)],
    "allocation": lambda tmp: [MoPPSCallback(candidate_ratio=2), AllocationCallback(1, 4, granularity=1, min_gain=0)],
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("depth", [1, 2])
def test_every_strategy_never_draws_a_prompt_in_flight(tmp_path, name, depth):
    trained = Trained()
    outs = _loop(_step(depth=depth), [*STRATEGIES[name](tmp_path), trained], steps=6, size=24)
    fresh = [sorted(o.rollouts.prompt_ids[~o.rollouts.is_replay].tolist()) for o in outs]
    for t in range(len(fresh)):  # the batches in flight together (t .. t + depth) share no prompt
        window = [i for ids in fresh[t : t + depth + 1] for i in ids]
        assert len(window) == len(set(window)), (t, fresh)
    assert [o.metrics["async/staleness/max"] for o in outs] == [min(t, depth) for t in range(len(outs))]


def test_a_resumed_run_trains_its_ledger_once_and_loses_no_prompt(tmp_path):
    def fit(out, steps, ckpt_path=None, save=False):
        L.seed_everything(0, verbose=False)
        module = tiny_module(reward_funcs=[COIN], learning_rate=1e-2, async_depth=1, async_threads=1)
        trained = Trained()
        extra = [ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=3, save_top_k=-1)] if save else []
        tiny_trainer(out, max_steps=steps, callbacks=[DPSCallback(), trained, *extra],
                     enable_checkpointing=save).fit(module, datamodule=countdown_dm(size=24, batch_size=4),
                                                    ckpt_path=ckpt_path)
        return trained.ids, module

    full, _ = fit(tmp_path / "full", 6)
    first, _ = fit(tmp_path / "first", 3, save=True)
    path = tmp_path / "first" / "ckpt" / "epoch=0-step=3.ckpt"
    ledger = torch.load(path, weights_only=True)["lit_rlft"]["async"]["ledger"]
    assert [index for index, _ in ledger] == [3] and sorted(ledger[0][1]) == sorted(full[3])  # step 3 in flight
    resumed, module = fit(tmp_path / "resumed", 6, ckpt_path=str(path))
    assert first == full[:3]
    assert resumed[0] == ledger[0][1]  # the ledger trained first, once, after resume: nothing lost
    assert sorted(resumed[1]) == sorted(full[4])  # the batch planned before the checkpoint
    trained_ids = [i for ids in first + resumed for i in ids]
    assert module.grpo.rollout_step == 6 and len(first + resumed) == 6
    for t in range(5):  # no batch repeats a prompt of the batch in flight beside it
        assert not set((first + resumed)[t]) & set((first + resumed)[t + 1])
    assert len(trained_ids) == 6 * 4


def test_a_generation_process_that_dies_stops_the_run_naming_it():
    step = _step(depth=1)

    def kill(step):
        if step.rollout_step == 2:
            os.kill(step.source.pid, signal.SIGKILL)

    t0 = time.monotonic()
    with pytest.raises(Exception, match=r"generation process \(pid \d+\) died \(exit code -9\)"):
        _loop(step, steps=4, before_step=kill)
    assert time.monotonic() - t0 < 60


def slow_reward(completions, **columns):
    """Never answers in time."""
    time.sleep(60)
    return [0.0] * len(completions)


def test_a_generation_process_that_hangs_stops_the_run_within_its_timeout():
    step = _step(depth=1, reward_funcs=["tests.step.test_async.slow_reward"], reward_timeout_s=None,
                 async_timeout_s=3.0)
    t0 = time.monotonic()
    with pytest.raises(Exception, match=r"did not answer request 1 within 3 s \(model.asynchronous.timeout_s\)"):
        _loop(step, steps=2)
    assert time.monotonic() - t0 < 30


def test_no_generation_process_outlives_its_run(tmp_path):
    """Closed with the step; and killed with the trainer's process when it dies without closing anything."""
    step = _step(depth=1)
    _loop(step, steps=1)
    assert step.source.process is None  # closed by step.close()
    script = tmp_path / "dies.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.step.test_async import _step\n"
        "from tests.conftest import countdown_dm\n"
        "step = _step(depth=1)\n"
        "data = countdown_dm(size=24, batch_size=4); data.setup('fit'); step.bind(data); step.start()\n"
        "step.sync_weights()  # starts the generation process (with the current weights)\n"
        "print(step.source.pid, flush=True)\n"
        "os._exit(0)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    pid = int(out.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), f"generation process {pid} outlived its trainer"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped by init) is not alive
        return f.read().split()[2] != "Z"


def test_depth_is_checked_and_a_step_needs_no_config_to_generate_ahead():
    """The generation process's source is given what it needs when it is built (its policy factory), so a step whose
    config is gone (built by hand) still runs at depth 1; before, the process read the step's config and refused."""
    from lit_rlft import AsyncConfig

    with pytest.raises(ValueError, match="asynchronous.depth must be >= 0"):
        AsyncConfig(depth=-1)
    step = _step(depth=1)
    step.config = None  # a step built by hand
    outs = _loop(step, steps=2)
    assert [o.metrics["async/staleness/max"] for o in outs] == [0, 1]


def test_a_reward_model_scores_in_the_generation_process_as_in_the_trainer():
    """At depth 1 the generation process scores with its copy of the reward model (pickled with the step's reward
    runner): each trained row's reward is the model's score of its completion."""
    from tests.distributed.helpers import TinyRewardModel

    step = _step(depth=1, reward_funcs=["tests.distributed.helpers.TinyRewardModel", COIN], reward_weights=[1.0, 0.0])
    outs = _loop(step, steps=2)
    reward = TinyRewardModel()
    for out in outs:
        roll = out.rollouts
        fresh = ~roll.is_replay
        G = roll.rewards.shape[1]
        prompts = [p for p, keep in zip(roll.prompts, fresh.tolist()) if keep for _ in range(G)]
        texts = [t for b, keep in enumerate(fresh.tolist()) if keep for t in roll.completions[b * G:(b + 1) * G]]
        expected = torch.tensor(reward.score(texts, {"prompts": prompts})).view(-1, G)
        assert torch.allclose(roll.rewards[fresh], expected, atol=1e-5)
        assert roll.reward_per_func["tiny_rm"][fresh].allclose(expected, atol=1e-5)
