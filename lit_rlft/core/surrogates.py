"""Policy-gradient surrogates: the per-token (or per-sequence) loss before masking, weighting and aggregation.

Notation: ``N`` sequences, ``L`` completion length; ``A`` ``[N, 1]`` one advantage per sequence. ``log pi`` is the
current policy's log-prob of each token (differentiable), ``log b`` the log-prob under the policy the ratio is
taken against (``pi_old``, or the behaviour policy ``mu`` for replayed rows under ``off_policy="paper"``).
``r`` is the importance ratio at ``importance_sampling_level``: ``[N, L]`` ``r_t = pi / b`` per token (``"token"``)
or ``[N, 1]`` ``s = exp(mean_t log(pi / b))`` per sequence (``"sequence"``, GSPO). ``sg`` stops the gradient.

Each surrogate returns ``l`` with the shape of ``r`` (a sequence-level ``l`` is broadcast over the sequence's
tokens by the caller). They are registered in :data:`SURROGATES`; TRL's ``loss_type`` pairs one with an
aggregation (:data:`lit_rlft.core.losses.LOSS_TYPES`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor


class SurrogateOptions(Protocol):
    """The options a surrogate reads (fields of :class:`lit_rlft.core.losses.GRPOLoss`)."""

    epsilon: float
    epsilon_high: float | None
    delta: float | None
    sapo_temperature_pos: float
    sapo_temperature_neg: float
    vespo_k_pos: float
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float


@dataclass(frozen=True)
class SurrogateInput:
    """What every surrogate may read; tensors are float32 with padding already replaced by 0."""

    logprobs: Tensor
    """``[N, L]`` log pi_theta (differentiable)."""
    log_ratio: Tensor
    """``[N, L]`` ``log pi_theta - log b`` per token (differentiable)."""
    ratio: Tensor
    """``[N, L]`` or ``[N, 1]``: the importance ratio at ``importance_sampling_level`` (differentiable)."""
    advantages: Tensor
    """``[N, 1]`` (constant)."""
    valid: Tensor
    """``[N, L]`` bool, the loss tokens."""
    per_sequence: bool = False
    """Whether ``ratio`` is per sequence (``importance_sampling_level="sequence"``)."""
    importance_weight: Tensor | None = None
    """``[N, L]`` detached replay / engine-mismatch weight, given only to surrogates that fold it in."""


@dataclass
class SurrogateOutput:
    """A surrogate's loss and its statistics."""

    loss: Tensor
    """``[N, L]`` or ``[N, 1]`` (the shape of ``ratio``) per-token / per-sequence loss to minimise."""
    metrics: dict[str, Tensor] = field(default_factory=dict)
    """Detached ``[]`` scalars under TRL's names."""


def level_mean(x: Tensor, valid: Tensor, per_sequence: bool = False) -> Tensor:
    """TRL's metric mean, detached ``[]``: of ``[N, L]`` ``x`` over the ``valid`` tokens, or of ``[N, 1]`` ``x`` over
    all ``N`` rows when ``per_sequence``."""
    if per_sequence:
        return (x.float().sum() / max(x.shape[0], 1)).detach()
    x = torch.where(valid, x.float(), torch.zeros((), dtype=torch.float32, device=x.device))
    return (x.sum() / valid.sum().clamp(min=1)).detach()


def clipped(x: SurrogateInput, opt: SurrogateOptions) -> SurrogateOutput:
    """PPO's pessimistic clip (grpo, dapo, dr_grpo, bnpo, luspo): ``l = -min(r' A, clip(r, 1 - eps, 1 + eps_high) A)``.

    ``r' = min(r, delta)`` when ``delta`` is set (INTELLECT-2's two-sided clip: with ``A < 0`` a huge ratio no
    longer gives an unbounded loss), else ``r' = r``. Logs ``clip_ratio/{low,high,region}_mean``: the share of
    tokens (sequences, at sequence level) with ``r' < 1 - eps, A < 0`` / ``r' > 1 + eps_high, A > 0``.
    """
    low, high = 1.0 - opt.epsilon, 1.0 + _eps_high(opt)
    adv = x.advantages
    coef_2 = x.ratio.clamp(low, high)
    coef_1 = x.ratio if opt.delta is None else x.ratio.clamp(max=opt.delta)
    loss = -torch.minimum(coef_1 * adv, coef_2 * adv)
    with torch.no_grad():
        is_low = (coef_1 < low) & (adv < 0)
        is_high = (coef_1 > high) & (adv > 0)
        metrics = {
            "clip_ratio/low_mean": level_mean(is_low, x.valid, x.per_sequence),
            "clip_ratio/high_mean": level_mean(is_high, x.valid, x.per_sequence),
            "clip_ratio/region_mean": level_mean(is_low | is_high, x.valid, x.per_sequence),
        }
    return SurrogateOutput(loss, metrics)


def cispo(x: SurrogateInput, opt: SurrogateOptions) -> SurrogateOutput:
    """CISPO (MiniMax-M1, ScaleRL): ``l = -sg(min(r, eps_high)) A log pi``.

    The importance weight is capped and detached, so every token keeps a REINFORCE gradient ``-w A grad log pi``
    (none is zeroed by a clip). Note that ``epsilon_high`` is the cap itself here, not ``1 + eps`` (ScaleRL: 5.0);
    when None it falls back to ``epsilon``, as in TRL. Logs ``cispo_clip_ratio`` (``r > eps_high, A > 0``).
    """
    cap = _eps_high(opt)
    weight = torch.clamp(x.ratio, max=cap).detach()
    loss = -weight * x.advantages * x.logprobs
    with torch.no_grad():
        metrics = {"cispo_clip_ratio": level_mean((x.ratio > cap) & (x.advantages > 0), x.valid, x.per_sequence)}
    return SurrogateOutput(loss, metrics)


def sapo(x: SurrogateInput, opt: SurrogateOptions) -> SurrogateOutput:
    """SAPO: a smooth gate instead of the hard clip, ``l = -(4 / tau) sigmoid(tau (r - 1)) A``.

    ``tau = sapo_temperature_pos`` for ``A > 0``, ``sapo_temperature_neg`` otherwise. The gradient
    ``4 sigmoid'(tau (r - 1)) r A`` equals ``r A`` at ``r = 1`` and decays smoothly as ``r`` leaves 1.
    """
    tau = torch.where(x.advantages > 0, opt.sapo_temperature_pos, opt.sapo_temperature_neg)  # [N, 1]
    gate = torch.sigmoid(tau * (x.ratio - 1)) * 4 / tau
    return SurrogateOutput(-gate * x.advantages)


@torch.no_grad()
def gamma_weights(advantages: Tensor, log_ratio: Tensor, valid: Tensor, importance_weight: Tensor | None,
                  k_pos: float, lambda_pos: float, k_neg: float, lambda_neg: float) -> Tensor:
    """VESPO's detached ``[N, 1]`` weight ``phi(w) = exp(lambda + k log w - lambda w)`` (``phi(1) = 1``).

    ``log w = clamp(sum_t clamp(log pi/b, -20, 20) + sum_t clamp(log iw_t, log 1e-8, 20), log 1e-8, 20)``: the
    *sum* (not the mean) of the token log-ratios, plus the log of the replay / engine-mismatch weight ``iw`` when
    given (TRL folds its vLLM importance ratio in the same way). ``k, lambda`` by the sign of ``A`` (``A >= 0``:
    ``k_pos, lambda_pos``); non-finite weights become 0.

    Args:
        advantages: ``[N, 1]``.
        log_ratio: ``[N, L]`` token log-ratios (0 on padding).
        valid: ``[N, L]`` bool loss tokens.
        importance_weight: ``[N, L]`` or None.
        k_pos, lambda_pos, k_neg, lambda_neg: the Gamma shape for each advantage sign.

    Returns:
        ``[N, 1]`` weights.
    """
    lower = math.log(1e-8)
    seq_log_ratio = (log_ratio.clamp(-20.0, 20.0) * valid).sum(-1, keepdim=True)  # [N, 1]
    if importance_weight is not None:
        log_iw = torch.log(importance_weight).clamp(lower, 20.0) * valid  # [N, L]
        seq_log_ratio = seq_log_ratio + log_iw.sum(-1, keepdim=True)
    log_w = seq_log_ratio.clamp(lower, 20.0)  # [N, 1]
    nonneg = advantages >= 0  # [N, 1]
    k = torch.where(nonneg, k_pos, k_neg)
    lam = torch.where(nonneg, lambda_pos, lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo(x: SurrogateInput, opt: SurrogateOptions) -> SurrogateOutput:
    """VESPO: ``l = -phi(w) A log pi`` with ``w`` the sequence's importance weight (:func:`gamma_weights`).

    A smooth, asymmetric Gamma-shaped down-weighting of whole sequences instead of a hard clip. It weighs
    sequences itself, so it runs at ``importance_sampling_level="token"`` and folds the replay / mismatch weight
    into ``w`` rather than multiplying the loss by it. Logs ``vespo/phi_seq_mean``.
    """
    phi = gamma_weights(x.advantages, x.log_ratio, x.valid, x.importance_weight, opt.vespo_k_pos,
                        opt.vespo_lambda_pos, opt.vespo_k_neg, opt.vespo_lambda_neg)  # [N, 1]
    loss = -phi * x.advantages * x.logprobs  # [N, L]
    return SurrogateOutput(loss, {"vespo/phi_seq_mean": level_mean(phi, x.valid, per_sequence=True)})


def _eps_high(opt: SurrogateOptions) -> float:
    return opt.epsilon if opt.epsilon_high is None else opt.epsilon_high


@dataclass(frozen=True)
class Surrogate:
    """A registered surrogate and what it composes with."""

    fn: Callable[[SurrogateInput, SurrogateOptions], SurrogateOutput]
    folds_importance_weight: bool = False
    """True: the replay / mismatch weight goes into the surrogate (``importance_weight``) instead of multiplying
    its loss afterwards."""
    sequence_level: bool = True
    """Whether ``importance_sampling_level="sequence"`` is meaningful for it."""
    uses_delta: bool = False
    """Whether ``delta`` (two-sided clip) applies to it."""


SURROGATES: dict[str, Surrogate] = {
    "clip": Surrogate(clipped, uses_delta=True),
    "cispo": Surrogate(cispo),
    "sapo": Surrogate(sapo),
    "vespo": Surrogate(vespo, folds_importance_weight=True, sequence_level=False),
}
"""Surrogate name -> :class:`Surrogate`."""
