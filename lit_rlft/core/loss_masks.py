"""Masks of the policy loss: which tokens and sequences it trains on.

Notation: ``N`` sequences, ``L`` completion length; ``mask`` ``[N, L]`` real completion tokens; ``A`` ``[N, 1]``.

Two stages, in TRL's order:

1. The *token mask* (:func:`loss_token_mask`): real tokens, minus every token of truncated completions under
   ``mask_truncated_completions``. It is the mask the aggregation normalises by (TRL zeroes the completion mask of
   truncated rows, so they leave the token count too) and the one every statistic is taken over.
2. *Multiplicative masks* (:data:`LOSS_MASKS`): they zero the policy loss of some tokens or sequences but leave the
   normalisation alone (a dropped sequence still counts in the denominator), exactly as TRL multiplies its
   ``per_token_loss`` by them. The KL penalty is not masked.

Batch-wide quantities are pure functions of gathered inputs, so the caller can make them global: the entropy
threshold (:func:`entropy_threshold` of the valid entropies of the whole mini-batch, gathered over ranks) makes 2
ranks equal 1 rank on the same batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

_QUANTILE_MAX = 2**24  # torch.quantile refuses larger inputs


class MaskOptions(Protocol):
    """The options the masks read (fields of :class:`lit_rlft.core.losses.GRPOLoss`)."""

    off_policy_mask_threshold: float | None
    top_entropy_quantile: float


def loss_token_mask(mask: Tensor, truncated: Tensor | None = None) -> Tensor:
    """``[N, L]`` bool tokens that enter the loss: ``mask`` minus the rows flagged in ``truncated`` ``[N]`` (if any).

    ``mask_truncated_completions`` (DAPO's overlong filtering): a completion cut at the length limit has no
    reward-bearing ending, so its tokens leave the loss and its normalisation. When to use it: long-reasoning runs
    where many completions hit the limit and their (usually negative) advantage is noise.
    """
    valid = mask.bool()  # [N, L]
    if truncated is None:
        return valid
    return valid & ~truncated.to(valid.device).bool()[:, None]


def off_policy_sequence_mask(logprobs: Tensor, behaviour_logprobs: Tensor, advantages: Tensor, valid: Tensor,
                             threshold: float) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (TRL's ``off_policy_mask_threshold``), ``[N, 1]`` bool (True: keep).

    ``keep_i = A_i >= 0  or  (1 / |o_i|) sum_t (log mu_t - log pi_theta_t) <= delta``: a sequence with a negative
    advantage is dropped when the policy has drifted, on average per token, more than ``delta`` nats (a k1 estimate
    of KL(mu || pi_theta)) from the policy ``mu`` that sampled it. ``pi_theta`` is detached; a NaN difference
    counts as 0. When to use it: many optimizer steps per batch, replay, or an inference engine whose log-probs
    differ from the trainer's: negative samples far off-policy otherwise push the policy around most.

    Args:
        logprobs: ``[N, L]`` log pi_theta (detached here).
        behaviour_logprobs: ``[N, L]`` log mu: the engine's sampling log-probs, the stored ones of replayed rows, or
            log pi_old when neither exists.
        advantages: ``[N, 1]``.
        valid: ``[N, L]`` bool loss tokens.
        threshold: ``delta`` (> 0).
    """
    kl = torch.nan_to_num(behaviour_logprobs - logprobs.detach(), nan=0.0)  # [N, L]
    kl = torch.where(valid, kl, torch.zeros_like(kl))
    mean_kl = kl.sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)  # [N, 1]
    return (advantages >= 0) | (mean_kl <= threshold)


def _quantile(values: Tensor, q: float) -> Tensor:
    """``torch.quantile(values, q)`` (linear interpolation), also for more than 2**24 values."""
    if values.numel() <= _QUANTILE_MAX:
        return torch.quantile(values, q)
    ordered = values.sort().values  # [M]
    rank = q * (ordered.numel() - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return torch.lerp(ordered[lo], ordered[hi], rank - lo)


def entropy_threshold(entropies: Tensor, top_entropy_quantile: float) -> float:
    """The entropy above which a token is among the ``top_entropy_quantile`` highest of the batch.

    ``tau = quantile(H, 1 - rho)`` (linear interpolation, as ``torch.quantile`` and TRL). Pass the valid entropies of
    the *whole* mini-batch, gathered over ranks (``entropy[loss_token_mask(...)]`` of each rank, concatenated), so
    every rank and micro-batch applies the same threshold; TRL gathers per micro-batch.

    Args:
        entropies: ``[M]`` entropies of the loss tokens (any order).
        top_entropy_quantile: ``rho`` in ``[0, 1]``.

    Returns:
        The threshold; ``inf`` (no token kept) when there are no entropies.
    """
    if not 0.0 <= top_entropy_quantile <= 1.0:
        raise ValueError(f"`top_entropy_quantile` must be in [0, 1], got {top_entropy_quantile!r}")
    if entropies.numel() == 0:
        return math.inf
    return float(_quantile(entropies.detach().float().flatten(), 1.0 - top_entropy_quantile))


def high_entropy_mask(entropy: Tensor, valid: Tensor, threshold: float) -> Tensor:
    """``[N, L]`` bool: the loss tokens whose entropy is at least ``threshold`` (``top_entropy_quantile``).

    "Beyond the 80/20 rule": ``keep_t = H_t >= tau``, ``tau`` from :func:`entropy_threshold`. When to use it: reasoning
    RL where the gradient of the ~20% "forking" tokens carries the learning; rho = 0.2 is the paper's choice.
    """
    return (entropy.detach() >= threshold) & valid


@dataclass(frozen=True)
class MaskInput:
    """What the multiplicative masks may read; float32 tensors with padding replaced by 0."""

    logprobs: Tensor
    """``[N, L]`` log pi_theta (detached)."""
    behaviour_logprobs: Tensor
    """``[N, L]`` log mu of each row (engine / stored), log pi_old for rows without one."""
    advantages: Tensor
    """``[N, 1]``."""
    valid: Tensor
    """``[N, L]`` bool loss tokens."""
    entropy: Tensor | None = None
    """``[N, L]`` per-token entropy of pi_theta."""
    entropy_threshold: float | None = None
    """Batch-wide threshold (:func:`entropy_threshold`); None computes it from this call's tokens."""


def _off_policy(x: MaskInput, opt: MaskOptions) -> Tensor | None:
    if opt.off_policy_mask_threshold is None:
        return None
    return off_policy_sequence_mask(x.logprobs, x.behaviour_logprobs, x.advantages, x.valid,
                                    opt.off_policy_mask_threshold)


def _high_entropy(x: MaskInput, opt: MaskOptions) -> Tensor | None:
    if opt.top_entropy_quantile >= 1.0:
        return None
    if x.entropy is None:
        raise ValueError("`top_entropy_quantile` < 1 needs the per-token `entropy` [N, L] in the loss call")
    tau = x.entropy_threshold
    if tau is None:
        tau = entropy_threshold(x.entropy[x.valid], opt.top_entropy_quantile)
    return high_entropy_mask(x.entropy, x.valid, tau)


LOSS_MASKS: dict[str, Callable[[MaskInput, MaskOptions], Tensor | None]] = {
    "off_policy": _off_policy,
    "high_entropy": _high_entropy,
}
"""Multiplicative masks in application order: name -> ``(MaskInput, options) -> [N, 1] / [N, L] bool or None``
(None: the option is off). ``high_entropy``'s mask also selects the tokens of the entropy bonus."""
