"""GRPOLoss equals TRL's own ``GRPOTrainer._compute_loss`` (TRL 1.16) on random batches, to 1e-6 in float32.

TRL's method runs unbound on a minimal stand-in object that carries the attributes it reads, with a stub model whose
forward returns fixed per-token log-probs and entropies (what TRL's fused LM head returns). So the surrogates,
masks, KL, entropy bonus, adaptive controller and aggregations compared here are TRL's code, not a transcription.
Two steps of TRL's pipeline live outside ``_compute_loss`` and are reproduced from its ``_generate_and_score_
completions`` (marked below): zeroing the completion mask of truncated rows, and the vLLM importance ratio.

Batches: ``N = 6`` rows of lengths 7, 1, 4, 0, 5, 3 (one empty), advantages of both signs, ``pi_theta != pi_old``
(several updates per batch) so that every clip, gate and mask is exercised.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections import defaultdict
from types import MethodType, SimpleNamespace

import pytest
import torch

from lit_rlft.core.entropy_control import AdaptiveEntropyCoef
from lit_rlft.core.loss_masks import entropy_threshold
from lit_rlft.core.losses import LOSS_TYPES, GRPOLoss

trl = pytest.importorskip("trl", reason="TRL is not installed (`pip install -e .[dev]` installs it): the loss is "
                                        "compared with TRL's own GRPOTrainer code")
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

TOL = {"rtol": 1e-6, "atol": 1e-6}
MAX_LEN = 9
P = 2  # prompt tokens in front of the completion (TRL cuts them off)
OPTION_NAMES = [f.name for f in dataclasses.fields(GRPOLoss)]
LIT_ONLY = {"off_policy", "importance_cap", "mismatch_correction", "mismatch_cap"}


class _Accelerator:
    """One process: gathers and reductions are the identity."""

    num_processes = 1
    process_index = 0
    is_main_process = True
    sync_gradients = True

    def autocast(self):
        return contextlib.nullcontext()

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


class _StubModel(torch.nn.Module):
    """Returns the given per-token log-probs and entropies for the completion positions."""

    def __init__(self, logp: torch.Tensor, entropy: torch.Tensor):
        super().__init__()
        self.logp, self.entropy = logp, entropy

    def forward(self, input_ids, attention_mask, labels=None, fused_lm_head=False, **kwargs):
        pad = torch.zeros(input_ids.shape[0], P)
        return SimpleNamespace(log_probs=torch.cat([pad, self.logp], 1), entropy=torch.cat([pad, self.entropy], 1))


def _trl_stand_in(options: dict, vllm: bool) -> SimpleNamespace:
    """The attributes ``GRPOTrainer._compute_loss`` reads, set as ``GRPOTrainer.__init__`` sets them."""
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    args = SimpleNamespace(**{**defaults, **options, "steps_per_generation": 1, "report_to": []})
    stub = SimpleNamespace(
        args=args, accelerator=_Accelerator(), state=SimpleNamespace(global_step=0), aux_loss_enabled=False,
        loss_type=args.loss_type, beta=args.beta, epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        importance_sampling_level=args.importance_sampling_level,
        off_policy_mask_threshold=args.off_policy_mask_threshold, top_entropy_quantile=args.top_entropy_quantile,
        mask_truncated_completions=args.mask_truncated_completions, max_completion_length=MAX_LEN,
        entropy_coef=args.entropy_coef, use_adaptive_entropy=args.use_adaptive_entropy,
        _entropy_bonus_enabled=args.entropy_coef != 0.0 or args.use_adaptive_entropy,
        _last_world_entropy=float("inf"), _entropy_window_stats=None,
        use_vllm=vllm, vllm_importance_sampling_correction=vllm, current_gradient_accumulation_steps=1,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask, get_gamma_weights=GRPOTrainer.get_gamma_weights,
    )
    stub._get_per_token_logps_and_entropies = MethodType(GRPOTrainer._get_per_token_logps_and_entropies, stub)
    stub.get_high_entropy_mask = MethodType(GRPOTrainer.get_high_entropy_mask, stub)
    return stub


def _vllm_ratio(old, sampling, mask, mode, clip_max):
    """TRL's vLLM importance ratio, from ``GRPOTrainer._generate_and_score_completions`` (1.16), clip_min None."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=None, max=clip_max)
    return ratio.masked_fill((ratio < -math.inf) | (ratio > clip_max), value=0.0)


def trl_loss(stub, batch, vllm_mode=None, clip_max=3.0):
    """TRL's loss and its gradients w.r.t. the log-probs and the entropies, on ``batch``."""
    logp = batch["logp"].clone().requires_grad_(True)
    ent = batch["entropy"].clone().requires_grad_(True)
    model = _StubModel(logp, ent)
    stub.model = model  # TRL reads model.training for the train / eval mode
    mask = batch["mask"]
    if stub.mask_truncated_completions:  # from _generate_and_score_completions
        mask = mask * (~batch["truncated"]).unsqueeze(1).int()
    n = mask.shape[0]
    inputs = {
        "prompt_ids": torch.ones(n, P, dtype=torch.long), "prompt_mask": torch.ones(n, P, dtype=torch.long),
        "completion_ids": torch.ones_like(mask), "completion_mask": mask, "advantages": batch["adv"],
        "old_per_token_logps": batch["old"], "num_items_in_batch": mask.sum(),
    }
    if stub.beta != 0.0:
        inputs["ref_per_token_logps"] = batch["ref"]
    if vllm_mode is not None:
        inputs["sampling_per_token_logps"] = batch["mu"]
        inputs["importance_sampling_ratio"] = _vllm_ratio(batch["old"], batch["mu"], mask, vllm_mode, clip_max)
    loss = GRPOTrainer._compute_loss(stub, model, inputs)
    grad_logp, grad_ent = torch.autograd.grad(loss, [logp, ent], allow_unused=True)
    return loss, grad_logp, grad_ent


def lit_loss(loss_fn, batch, engine=False, **kwargs):
    """GRPOLoss's loss and gradients on ``batch``; ``engine``: every row fresh with the engine's log-probs mu."""
    logp = batch["logp"].clone().requires_grad_(True)
    ent = batch["entropy"].clone().requires_grad_(True)
    call = {"entropy": ent, "truncated": batch["truncated"], **kwargs}
    if loss_fn.beta > 0:
        call["ref_logprobs"] = batch["ref"]
    if engine:
        call["behaviour_logprobs"] = batch["mu"]
        call["replay_mask"] = torch.zeros(batch["adv"].shape[0], dtype=torch.bool)
    out = loss_fn(logp, batch["old"], batch["adv"], batch["mask"], **call)
    grad_logp, grad_ent = torch.autograd.grad(out.loss, [logp, ent], allow_unused=True)
    return out, grad_logp, grad_ent


def make_batch(seed: int, n: int = 6, length: int = 7) -> dict:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, length, generator=g) * 2 - 0.05  # [N, L]
    logp = old + torch.randn(n, length, generator=g) * 0.3  # ratios in and out of [0.8, 1.28]
    mu = old + torch.randn(n, length, generator=g) * 0.3  # engine / behaviour log-probs
    ref = old + torch.randn(n, length, generator=g) * 0.2
    entropy = torch.rand(n, length, generator=g) * 3
    adv = torch.randn(n, generator=g)
    adv[0], adv[1] = adv[0].abs() + 0.1, -adv[1].abs() - 0.1  # both signs, always
    lengths = torch.tensor([7, 1, 4, 0, 5, 3])[:n]
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()  # [N, L]
    truncated = torch.tensor([True, False, False, False, True, False])[:n]
    return {"logp": logp, "old": old, "mu": mu, "ref": ref, "entropy": entropy, "adv": adv, "mask": mask,
            "truncated": truncated}


def _check(stub, loss_fn, seeds=(0, 1, 2), vllm_mode=None, clip_max=3.0, **lit_kwargs):
    for seed in seeds:
        batch = make_batch(seed)
        loss, grad, grad_ent = trl_loss(stub, batch, vllm_mode, clip_max)
        out, lit_grad, lit_grad_ent = lit_loss(loss_fn, batch, engine=vllm_mode is not None, **lit_kwargs)
        torch.testing.assert_close(out.loss, loss.detach(), **TOL)
        torch.testing.assert_close(lit_grad, grad, **TOL)
        if grad_ent is None:
            assert lit_grad_ent is None or not lit_grad_ent.any()
        else:
            torch.testing.assert_close(lit_grad_ent, grad_ent, **TOL)
        for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "cispo_clip_ratio",
                    "vespo/phi_seq_mean", "kl"):
            assert (key in stub._metrics["train"]) == (key in out.metrics), f"{key}: logged by one side only"
            if key in out.metrics:
                torch.testing.assert_close(out.metrics[key].item(), stub._metrics["train"][key][-1], **TOL)
        if "policy_loss" in out.metrics:
            torch.testing.assert_close(out.metrics["policy_loss"].item(), stub._metrics["train"]["policy_loss"][-1],
                                       **TOL)


def _pair(vllm: bool = False, **options):
    """The same options for TRL and lit_rlft (identical names); ``use_bias_correction_kl``, whose defaults differ,
    is passed to TRL as lit_rlft resolved it."""
    trl_only = {k: options.pop(k) for k in list(options) if k.startswith("vllm_")}
    lit = GRPOLoss(max_completion_length=MAX_LEN, **options)
    trl_options = {**options, **trl_only, "use_bias_correction_kl": lit.use_bias_correction_kl}
    return _trl_stand_in(trl_options, vllm=vllm), lit


# ---------------------------------------------------------------------------------------------------------------
# Every loss type at both importance-sampling levels, alone and with the options that change its formula
# ---------------------------------------------------------------------------------------------------------------
LEVELS = [(lt, level) for lt in LOSS_TYPES for level in ("token", "sequence")
          if not (lt == "vespo" and level == "sequence")]
SCENARIOS = {
    "defaults": {},
    "clip_higher": {"epsilon_high": 0.28},
    "kl": {"beta": 0.04, "use_bias_correction_kl": False},
    "kl_bias_corrected": {"beta": 0.04, "use_bias_correction_kl": True},
    "truncated_masked": {"mask_truncated_completions": True},
    "off_policy_mask": {"off_policy_mask_threshold": 0.02},
    "top_entropy": {"top_entropy_quantile": 0.3},
    "entropy_bonus": {"entropy_coef": 0.01},
    "entropy_bonus_on_top_tokens": {"entropy_coef": 0.01, "top_entropy_quantile": 0.5},
    "everything": {"epsilon_high": 0.28, "beta": 0.02, "use_bias_correction_kl": True,
                   "mask_truncated_completions": True, "off_policy_mask_threshold": 0.02,
                   "top_entropy_quantile": 0.6, "entropy_coef": 0.005},
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize(("loss_type", "level"), LEVELS)
def test_equals_trl(loss_type, level, scenario):
    stub, lit = _pair(loss_type=loss_type, importance_sampling_level=level, **SCENARIOS[scenario])
    _check(stub, lit)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "bnpo", "dr_grpo", "luspo"])
def test_two_sided_clip_delta_equals_trl(loss_type, level):
    # delta 1.1 < the largest ratios of the batch, so the cap bites on negative advantages
    stub, lit = _pair(loss_type=loss_type, importance_sampling_level=level, delta=1.1, epsilon=0.05)
    _check(stub, lit)


@pytest.mark.parametrize(("loss_type", "options"), [
    ("cispo", {"epsilon_high": 5.0}),
    ("cispo", {"epsilon_high": 1.05}),  # the cap bites
    ("sapo", {"sapo_temperature_pos": 2.0, "sapo_temperature_neg": 0.5}),
    ("vespo", {"vespo_k_pos": 1.0, "vespo_lambda_pos": 0.5, "vespo_k_neg": 4.0, "vespo_lambda_neg": 6.0}),
])
def test_surrogate_parameters_equal_trl(loss_type, options):
    stub, lit = _pair(loss_type=loss_type, **options)
    _check(stub, lit)


def test_global_entropy_threshold_equals_trl_when_given_explicitly():
    # the threshold computed by the pure function from the batch's loss-token entropies, passed in: TRL's mask
    stub, lit = _pair(top_entropy_quantile=0.2, mask_truncated_completions=True)
    for seed in range(3):
        batch = make_batch(seed)
        tau = entropy_threshold(batch["entropy"][lit.token_mask(batch["mask"], batch["truncated"])], 0.2)
        loss, grad, _ = trl_loss(stub, batch)
        out, lit_grad, _ = lit_loss(lit, batch, entropy_threshold=tau)
        torch.testing.assert_close(out.loss, loss.detach(), **TOL)
        torch.testing.assert_close(lit_grad, grad, **TOL)


# ---------------------------------------------------------------------------------------------------------------
# Engine log-probs: TRL's vLLM importance-sampling correction (fresh rows, mu = the engine's log-probs)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask"])
@pytest.mark.parametrize(("loss_type", "level"), LEVELS)
def test_engine_mismatch_correction_equals_trl(loss_type, level, mode):
    if loss_type == "vespo" and mode == "sequence_mask":
        pytest.skip("refused, by TRL and by GRPOLoss (see test_losses_variants.py)")
    cap = 1.3  # bites on some rows
    options = {"loss_type": loss_type, "importance_sampling_level": level, "off_policy_mask_threshold": 0.02}
    stub, _ = _pair(vllm=True, vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_max=cap, **options)
    lit = GRPOLoss(max_completion_length=MAX_LEN, mismatch_correction=mode, mismatch_cap=cap, **options)
    _check(stub, lit, vllm_mode=mode, clip_max=cap)


# ---------------------------------------------------------------------------------------------------------------
# Adaptive entropy control over several optimizer steps: TRL's trainer state against AdaptiveEntropyCoef
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("quantile", "target"), [(1.0, 1.3), (0.5, 2.2)])
def test_adaptive_entropy_coefficient_follows_trl_step_by_step(quantile, target):
    # entropies ~ U(0, 3): the mean over all tokens is about 1.5, over the top half about 2.25; each target sits
    # among the batches' means, so c goes up and down
    options = {"entropy_coef": 0.02, "use_adaptive_entropy": True, "entropy_target": target,
               "entropy_coef_delta": 0.01, "top_entropy_quantile": quantile, "loss_type": "grpo"}
    stub, lit = _pair(**options)
    ctl = AdaptiveEntropyCoef.from_loss(lit)
    applied = []
    for step in range(6):
        batch = make_batch(10 + step)
        loss, grad, grad_ent = trl_loss(stub, batch)
        out, lit_grad, lit_grad_ent = lit_loss(lit, batch, entropy_coef=ctl.apply_coef())
        applied.append(ctl.apply_coef())
        torch.testing.assert_close(out.loss, loss.detach(), **TOL)
        torch.testing.assert_close(lit_grad, grad, **TOL)
        torch.testing.assert_close(lit_grad_ent, grad_ent, **TOL)
        total, count = out.entropy_stats.tolist()
        ctl.update(total / max(count, 1.0))
        assert ctl.coef == pytest.approx(stub.entropy_coef, abs=1e-12)
        assert ctl.last_entropy == pytest.approx(stub._last_world_entropy, rel=1e-6)
    assert applied[0] == 0.0 and any(c > 0 for c in applied)  # no bonus before the first measurement, then some


def test_defaults_and_names_are_trls():
    """Every GRPOLoss option but the replay / engine ones is a GRPOConfig key with TRL's default, except two
    documented ones: max_completion_length (the module fills it) and use_bias_correction_kl (bit-identity)."""
    trl_defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    ours = {f.name: f.default for f in dataclasses.fields(GRPOLoss)}
    assert set(ours) - set(trl_defaults) == LIT_ONLY
    differ = {k for k in set(ours) - LIT_ONLY if ours[k] != trl_defaults[k]}
    assert differ == {"max_completion_length", "use_bias_correction_kl"}
    assert set(GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"].split("'")[1::2]) >= set(LOSS_TYPES)
