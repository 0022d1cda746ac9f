"""FROZEN copy of ``lit_rlft/core/losses.py`` as of commit 624bb5d (before issue 18): never edit it.

``test_losses_bit_identity.py`` checks that today's :class:`GRPOLoss`, with the options this copy knows and their
defaults, gives bit-identical (``torch.equal``) losses, gradients and metrics: seven fingerprinted training runs
depend on it.

GRPO's clipped surrogate loss, its aggregations ("loss types"), the k3 KL penalty and the off-policy
correction used for replayed rollouts.

Notation: ``B`` prompts, ``G`` completions per prompt, ``N = B * G`` sequences, ``L`` completion length.
Three policies appear per token: ``pi_theta`` (the current, differentiable policy: ``logprobs``), ``pi_old``
(the policy at the start of this update, i.e. before the first optimizer step on this rollout batch:
``old_logprobs``) and ``mu`` (the behaviour policy that generated the sequence, whose log-probs were stored at
generation time: ``behaviour_logprobs``). For fresh rollouts ``mu == pi_old``; for replayed ones ``mu`` is an
older policy. ``A`` is one advantage per sequence, broadcast over its tokens; ``mask`` marks real completion
tokens (1) against padding (0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
from torch import Tensor

LossType = Literal["grpo", "dapo", "dr_grpo"]
"""How per-token losses are reduced to a scalar; see :data:`AGGREGATIONS`."""

OffPolicyForm = Literal["geppo", "paper"]
"""Off-policy correction for replayed rollouts: ``"geppo"`` (the Rollout Replay reference code) or ``"paper"``."""

MismatchCorrection = Literal["token_truncate", "sequence_mask"]
"""Truncated importance sampling for the engine/trainer mismatch of fresh rollouts (TRL's names): ``pi_old / mu``
per token capped (``token_truncate``), or per sequence, the sequence zeroed when its ratio exceeds the cap
(``sequence_mask``)."""


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Schulman's k3 estimator of ``KL(pi_theta || pi_ref)`` per token: ``exp(ref - logp) - (ref - logp) - 1``.

    Non-negative, unbiased for samples drawn from ``pi_theta``, and 0 where the two policies agree.

    Args:
        logprobs: ``[N, L]`` log-probs under the current policy.
        ref_logprobs: ``[N, L]`` log-probs under the reference policy.

    Returns:
        ``[N, L]`` per-token KL estimate.
    """
    delta = ref_logprobs - logprobs  # [N, L]
    return torch.exp(delta) - delta - 1


def _masked(per_token: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``per_token`` with padding replaced by 0 (so inf/NaN there cannot leak) and the float mask, both ``[N, L]``."""
    valid = mask.bool()  # [N, L]
    return torch.where(valid, per_token, torch.zeros_like(per_token)), valid.to(per_token.dtype)


def sequence_mean(per_token: Tensor, mask: Tensor, max_completion_length: int | None = None) -> Tensor:
    """``"grpo"``: mean over each sequence's real tokens, then mean over the ``N`` sequences.

    Long sequences weigh as much as short ones, so each token of a long sequence counts less (the length bias
    that DAPO and Dr. GRPO remove). A sequence without real tokens contributes 0 to the mean.

    Args:
        per_token: ``[N, L]`` per-token loss.
        mask: ``[N, L]`` 1 for real completion tokens.
        max_completion_length: unused.

    Returns:
        ``[]`` scalar loss.
    """
    values, weights = _masked(per_token, mask)  # [N, L], [N, L]
    return (values.sum(-1) / weights.sum(-1).clamp(min=1.0)).mean()


def token_mean(per_token: Tensor, mask: Tensor, max_completion_length: int | None = None) -> Tensor:
    """``"dapo"``: sum over all real tokens of the batch divided by their number (verl's ``token-mean``).

    Args:
        per_token: ``[N, L]`` per-token loss.
        mask: ``[N, L]`` 1 for real completion tokens.
        max_completion_length: unused.

    Returns:
        ``[]`` scalar loss.
    """
    values, weights = _masked(per_token, mask)  # [N, L], [N, L]
    return values.sum() / weights.sum().clamp(min=1.0)


def constant_length_sum(per_token: Tensor, mask: Tensor, max_completion_length: int | None = None) -> Tensor:
    """``"dr_grpo"``: sum over all real tokens divided by the constant ``N * max_completion_length``.

    Args:
        per_token: ``[N, L]`` per-token loss.
        mask: ``[N, L]`` 1 for real completion tokens.
        max_completion_length: the generation length limit; required.

    Returns:
        ``[]`` scalar loss.
    """
    if max_completion_length is None:
        raise ValueError("loss_type='dr_grpo' needs `max_completion_length` (the generation length limit), got None")
    values, _ = _masked(per_token, mask)  # [N, L]
    return values.sum() / (per_token.shape[0] * max_completion_length)


AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, int | None], Tensor]] = {
    "grpo": sequence_mean,
    "dapo": token_mean,
    "dr_grpo": constant_length_sum,
}
"""``loss_type`` -> aggregation ``(per_token [N, L], mask [N, L], max_completion_length) -> []``."""


@dataclass
class LossOutput:
    """What :class:`GRPOLoss` returns."""

    loss: Tensor
    """``[]`` differentiable scalar to call ``backward`` on."""
    metrics: dict[str, Tensor] = field(default_factory=dict)
    """Detached ``[]`` scalars keyed by TRL's metric names (``clip_ratio/region_mean``, ``kl``, ...)."""


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, low: float, high: float) -> Tensor:
    """PPO's pessimistic objective ``min(ratio * A, clip(ratio, low, high) * A)``, ``[N, L]``."""
    return torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)


def _masked_mean(x: Tensor, valid: Tensor) -> Tensor:
    """Mean of ``x [N, L]`` over ``valid [N, L]`` positions (0 when there are none), detached ``[]``."""
    x = torch.where(valid, x.float(), torch.zeros((), dtype=torch.float32, device=x.device))
    return (x.sum() / valid.sum().clamp(min=1)).detach()


def _masked_log_ratio_sum(old: Tensor, mu: Tensor, valid: Tensor) -> Tensor:
    """``[N, 1]`` ``sum over valid tokens of (log pi_old - log mu)``: a sequence's log importance ratio."""
    return torch.where(valid, old - mu, torch.zeros((), dtype=old.dtype, device=old.device)).sum(-1, keepdim=True)


@dataclass
class GRPOLoss:
    """GRPO's clipped surrogate with optional k3 KL penalty and off-policy correction for replayed rollouts.

    Per token, with ``rho = pi_theta / pi_old``:

    * on-policy (``behaviour_logprobs=None``): ``-min(rho * A, clip(rho, 1 - epsilon, 1 + epsilon_high) * A)``.
    * ``off_policy="geppo"``: with ``r_pi = pi_theta / mu`` and ``r_old = pi_old / mu`` the objective
      ``min(r_pi * A, clip(r_pi, r_old (1 - eps), r_old (1 + eps_high)) * A)`` equals
      ``r_old * min(rho * A, clip(rho, 1 - eps, 1 + eps_high) * A)`` because ``r_old > 0``: a PPO clip around
      ``pi_old`` weighted by the truncated importance weight ``w = min(r_old, importance_cap)`` (detached).
      For fresh samples ``mu == pi_old``, so ``w = 1`` and this is ordinary GRPO.
    * ``off_policy="paper"``: the clipped surrogate with ``rho = pi_theta / mu``; ``old_logprobs`` only feeds the
      staleness statistics. Fresh samples again give ordinary GRPO.
    * fresh rows whose sampling engine reported its own log-probs ``mu`` (vLLM: another kernel, precision or weight
      copy than the trainer's ``pi_old``) are weighted by ``mismatch_correction`` on ``pi_old / mu``:
      ``token_truncate``: ``min(pi_old / mu, mismatch_cap)`` per token; ``sequence_mask``: the sequence's ratio
      ``exp(sum(log pi_old - log mu))``, or 0 when it exceeds ``mismatch_cap`` (TRL's two defaults, cap 3). With
      ``replay_mask`` given, replayed rows keep the off-policy form above (their stored mu already measures both
      staleness and mismatch) and only fresh rows get this correction.
    * ``beta > 0`` adds ``beta * k3_kl(logp, ref)`` per token (not importance-weighted, as in TRL).

    The per-token losses are reduced over ``mask`` by the ``loss_type`` aggregation (:data:`AGGREGATIONS`).
    Padding tokens never reach an ``exp``: their log-probs are replaced by 0 first, so garbage there (``-inf``,
    NaN) affects neither the loss, its gradient nor the metrics.

    Example:
        >>> loss_fn = GRPOLoss(epsilon=0.2, epsilon_high=0.28, loss_type="dapo")
        >>> logp = torch.zeros(2, 3, requires_grad=True)
        >>> out = loss_fn(logp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]), torch.ones(2, 3))
        >>> out.loss.item(), sorted(out.metrics)[0]
        (0.0, 'clip_ratio/high_mean')
    """

    epsilon: float = 0.2
    """Lower clip range: ratios below ``1 - epsilon`` stop pushing down a negative advantage."""
    epsilon_high: float | None = None
    """Upper clip range (``1 + epsilon_high``); None uses ``epsilon``. DAPO's clip-higher uses 0.28."""
    loss_type: LossType = "dapo"
    """Aggregation: ``"grpo"`` (sequence mean then batch mean), ``"dapo"`` (token mean), ``"dr_grpo"`` (sum over
    ``N * max_completion_length``)."""
    beta: float = 0.0
    """Weight of the k3 KL penalty to the reference policy; 0 (both papers' setting) needs no reference model."""
    max_completion_length: int | None = None
    """Generation length limit; required by ``loss_type="dr_grpo"``."""
    off_policy: OffPolicyForm = "geppo"
    """Correction for replayed rollouts: ``"geppo"`` (reference code, default) or ``"paper"``."""
    importance_cap: float | None = 10.0
    """Upper bound on the GePPO importance weight ``pi_old / mu`` (truncated importance sampling); None: no cap."""
    mismatch_correction: MismatchCorrection | None = "sequence_mask"
    """Correction of fresh rows for the engine/trainer mismatch (when the engine reports log-probs); None: off."""
    mismatch_cap: float = 3.0
    """Cap of the mismatch ratio ``pi_old / mu`` (TRL's ``vllm_importance_sampling_cap``)."""

    def __post_init__(self) -> None:
        if self.epsilon <= 0:
            raise ValueError(f"`epsilon` must be > 0, got {self.epsilon!r}")
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        if self.epsilon_high < 0:
            raise ValueError(f"`epsilon_high` must be >= 0 (or None to reuse `epsilon`), got {self.epsilon_high!r}")
        if self.loss_type not in AGGREGATIONS:
            raise ValueError(f"`loss_type` must be one of {tuple(AGGREGATIONS)}, got {self.loss_type!r}")
        if self.beta < 0:
            raise ValueError(f"`beta` must be >= 0, got {self.beta!r}")
        if self.max_completion_length is not None and self.max_completion_length <= 0:
            raise ValueError(f"`max_completion_length` must be > 0 or None, got {self.max_completion_length!r}")
        if self.loss_type == "dr_grpo" and self.max_completion_length is None:
            raise ValueError(
                "loss_type='dr_grpo' needs `max_completion_length` (the generation length limit), got None"
            )
        if self.off_policy not in get_args(OffPolicyForm):
            raise ValueError(f"`off_policy` must be one of {get_args(OffPolicyForm)}, got {self.off_policy!r}")
        if self.importance_cap is not None and self.importance_cap <= 0:
            raise ValueError(f"`importance_cap` must be > 0 or None, got {self.importance_cap!r}")
        if self.mismatch_correction not in (*get_args(MismatchCorrection), None):
            raise ValueError(f"`mismatch_correction` must be one of {get_args(MismatchCorrection)} or None, got "
                             f"{self.mismatch_correction!r}")
        if self.mismatch_cap <= 0:
            raise ValueError(f"`mismatch_cap` must be > 0, got {self.mismatch_cap!r}")

    def _mismatch_weight(self, old: Tensor, mu: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        return _mismatch_weights(self.mismatch_correction, self.mismatch_cap, old, mu, valid)

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        ref_logprobs: Tensor | None = None,
        behaviour_logprobs: Tensor | None = None,
        replay_mask: Tensor | None = None,
    ) -> LossOutput:
        """Compute the loss and its statistics.

        Args:
            logprobs: ``[N, L]`` log pi_theta of each completion token (differentiable).
            old_logprobs: ``[N, L]`` log pi_old, the policy at the start of this update (treated as constant).
            advantages: ``[N]`` one advantage per sequence (treated as constant).
            mask: ``[N, L]`` 1 (or True) for real completion tokens, 0 for padding.
            ref_logprobs: ``[N, L]`` log pi_ref; required iff ``beta > 0``; when given, ``kl`` is logged.
            behaviour_logprobs: ``[N, L]`` log mu stored at generation time; None means every sequence is fresh
                (``mu == pi_old``).
            replay_mask: ``[N]`` bool, the replayed rows; the others are fresh, their ``behaviour_logprobs`` the
                engine's sampling log-probs (mismatch correction). None: every row with ``behaviour_logprobs`` is
                treated as replayed.

        Returns:
            :class:`LossOutput` with the ``[]`` loss and detached ``[]`` metrics.
        """
        if logprobs.dim() != 2:
            raise ValueError(f"`logprobs` must have shape [N, L], got {tuple(logprobs.shape)}")
        shape = logprobs.shape
        others = {"old_logprobs": old_logprobs, "mask": mask, "ref_logprobs": ref_logprobs}
        others["behaviour_logprobs"] = behaviour_logprobs
        for name, t in others.items():
            if t is not None and t.shape != shape:
                raise ValueError(f"`{name}` must have the shape of `logprobs` {tuple(shape)}, got {tuple(t.shape)}")
        if advantages.shape != shape[:1]:
            raise ValueError(f"`advantages` must have shape [N] = {tuple(shape[:1])}, got {tuple(advantages.shape)}")
        if self.beta > 0 and ref_logprobs is None:
            raise ValueError(f"`ref_logprobs` is required when `beta` > 0 (beta={self.beta!r})")

        valid = mask.bool()  # [N, L]

        def clean(t: Tensor) -> Tensor:  # [N, L] float32 with padding set to 0, before any exp
            return torch.where(valid, t.float(), torch.zeros((), dtype=torch.float32, device=t.device))

        logp = clean(logprobs)  # [N, L] differentiable
        old = clean(old_logprobs.detach())  # [N, L]
        adv = advantages.detach().float().unsqueeze(-1)  # [N, 1]
        low, high = 1.0 - self.epsilon, 1.0 + self.epsilon_high
        metrics: dict[str, Tensor] = {}

        if behaviour_logprobs is None:
            ratio = torch.exp(logp - old)  # [N, L] pi_theta / pi_old
            per_token = -_clipped_surrogate(ratio, adv, low, high)  # [N, L]
        else:
            mu = clean(behaviour_logprobs.detach())  # [N, L]
            replayed = (torch.ones(shape[0], dtype=torch.bool, device=valid.device) if replay_mask is None
                        else replay_mask.to(valid.device).bool())  # [N]
            staleness = torch.exp(old - mu)  # [N, L] r_old = pi_old / mu, uncapped
            ratio = torch.exp(logp - old)  # [N, L] pi_theta / pi_old
            surrogate = _clipped_surrogate(ratio, adv, low, high)  # [N, L]
            # replayed rows: the off-policy form
            if self.off_policy == "geppo":
                cap = float("inf") if self.importance_cap is None else self.importance_cap
                replay_loss = -staleness.clamp(max=cap) * surrogate  # [N, L]
                capped = staleness > cap  # [N, L]
            else:  # "paper"
                replay_ratio = torch.exp(logp - mu)  # [N, L] pi_theta / mu
                replay_loss = -_clipped_surrogate(replay_ratio, adv, low, high)
                capped = torch.zeros_like(valid)
                ratio = torch.where(replayed[:, None], replay_ratio, ratio)
            # fresh rows: the engine/trainer mismatch correction
            weight, corrected = self._mismatch_weight(old, mu, valid)  # [N, L], [N, L] bool
            per_token = torch.where(replayed[:, None], replay_loss, -weight * surrogate)  # [N, L]
            rows = valid & replayed[:, None]  # replayed tokens
            if bool(rows.any()):
                prefix = "sampling/importance_sampling_ratio"
                inf = torch.tensor(float("inf"), device=staleness.device)
                metrics[f"{prefix}/min"] = torch.where(rows, staleness, inf).amin().detach()
                metrics[f"{prefix}/mean"] = _masked_mean(staleness, rows)
                metrics[f"{prefix}/max"] = torch.where(rows, staleness, -inf).amax().detach()
                metrics[f"{prefix}/capped_frac"] = _masked_mean(capped, rows)
            fresh = valid & ~replayed[:, None]  # fresh tokens
            if bool(fresh.any()) and replay_mask is not None:
                diff = (old - mu).abs()  # [N, L]
                metrics["sampling/sampling_logp_difference/mean"] = _masked_mean(diff, fresh)
                metrics["sampling/sampling_logp_difference/max"] = torch.where(fresh, diff, 0.0).amax().detach()
                metrics["sampling/mismatch_corrected_frac"] = _masked_mean(corrected, fresh)

        if ref_logprobs is not None:
            kl = k3_kl(logp, clean(ref_logprobs.detach()))  # [N, L]
            metrics["kl"] = _masked_mean(kl, valid)
            if self.beta > 0:
                per_token = per_token + self.beta * kl  # [N, L]

        loss = AGGREGATIONS[self.loss_type](per_token, mask, self.max_completion_length)

        with torch.no_grad():
            is_low = (ratio < low) & (adv < 0)  # [N, L]
            is_high = (ratio > high) & (adv > 0)  # [N, L]
            metrics["clip_ratio/low_mean"] = _masked_mean(is_low, valid)
            metrics["clip_ratio/high_mean"] = _masked_mean(is_high, valid)
            metrics["clip_ratio/region_mean"] = _masked_mean(is_low | is_high, valid)
        return LossOutput(loss=loss, metrics=metrics)


def _mismatch_weights(mode: MismatchCorrection | None, cap: float, old: Tensor, mu: Tensor,
                      valid: Tensor) -> tuple[Tensor, Tensor]:
    """Per-token weights ``[N, L]`` of fresh rows for ``pi_old / mu``, and ``[N, L]`` bool: where the cap bit."""
    if mode is None:
        return torch.ones_like(old), torch.zeros_like(valid)
    if mode == "token_truncate":
        ratio = torch.exp(old - mu)  # [N, L]
        return ratio.clamp(max=cap), (ratio > cap) & valid
    ratio = torch.exp(_masked_log_ratio_sum(old, mu, valid))  # [N, 1] per sequence
    masked = ratio > cap  # [N, 1]
    weight = torch.where(masked, torch.zeros_like(ratio), ratio).expand_as(old)  # [N, L]
    return weight, masked.expand_as(valid) & valid
