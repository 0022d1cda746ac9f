"""GRPO's policy loss: TRL's loss types, importance-sampling levels, masks, KL and entropy terms, and the off-policy
corrections for replayed rollouts and for the inference engine's log-probs.

Notation: ``B`` prompts, ``G`` completions per prompt, ``N = B * G`` sequences, ``L`` completion length.
Three policies appear per token: ``pi_theta`` (the current, differentiable policy: ``logprobs``), ``pi_old``
(the policy at the start of this update, i.e. before the first optimizer step on this rollout batch:
``old_logprobs``) and ``mu`` (the behaviour policy that generated the sequence, whose log-probs were stored at
generation time: ``behaviour_logprobs``). For fresh rollouts ``mu == pi_old`` (or the engine's own log-probs of
``pi_old``); for replayed ones ``mu`` is an older policy. ``A`` is one advantage per sequence, broadcast over its
tokens; ``mask`` marks real completion tokens (1) against padding (0).

:class:`GRPOLoss` composes four separate pieces, each a registry, so that options combine without branches
multiplying:

1. the *surrogate* (:data:`lit_rlft.core.surrogates.SURROGATES`: clip, cispo, sapo, vespo) on the importance ratio
   at ``importance_sampling_level`` (token, or GSPO's sequence);
2. the *masks* (:mod:`lit_rlft.core.loss_masks`: truncated completions, off-policy sequences, high-entropy tokens);
3. the *importance weight* of replayed rows (``off_policy``) and of fresh rows sampled by an engine
   (``mismatch_correction``), plus the k3 KL penalty and the entropy bonus;
4. the *aggregation* (:data:`lit_rlft.core.aggregations.AGGREGATIONS`).

TRL's ``loss_type`` names a (surrogate, aggregation) pair (:data:`LOSS_TYPES`). ``docs/losses.md`` has the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
from torch import Tensor

from lit_rlft.core.aggregations import (
    AGGREGATIONS,
    Aggregation,
    constant_length_sum,
    sequence_mean,
    sequence_sum_mean,
    token_mean,
)
from lit_rlft.core.finite import check_finite
from lit_rlft.core.loss_masks import LOSS_MASKS, MaskInput, loss_token_mask
from lit_rlft.core.surrogates import SURROGATES, Surrogate, SurrogateInput, level_mean

__all__ = [
    "AGGREGATIONS",
    "LOSS_TYPES",
    "GRPOLoss",
    "ImportanceSamplingLevel",
    "LossOutput",
    "LossType",
    "LossTypeSpec",
    "MismatchCorrection",
    "OffPolicyForm",
    "constant_length_sum",
    "k3_kl",
    "sequence_mean",
    "sequence_sum_mean",
    "token_mean",
]

LossType = Literal["grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo"]
"""TRL's ``loss_type``: a surrogate and an aggregation, see :data:`LOSS_TYPES`."""

ImportanceSamplingLevel = Literal["token", "sequence"]
"""Per-token ratios, or GSPO's one ratio per sequence (the geometric mean of its token ratios)."""

OffPolicyForm = Literal["geppo", "paper"]
"""Off-policy correction for replayed rollouts: ``"geppo"`` (the Rollout Replay reference code) or ``"paper"``."""

MismatchCorrection = Literal["token_truncate", "sequence_mask"]
"""Truncated importance sampling for the engine/trainer mismatch of fresh rollouts (TRL's names): ``pi_old / mu``
per token capped (``token_truncate``), or per sequence, the sequence zeroed when its ratio exceeds the cap
(``sequence_mask``)."""


@dataclass(frozen=True)
class LossTypeSpec:
    """What a ``loss_type`` is made of."""

    surrogate: str
    """Key of :data:`lit_rlft.core.surrogates.SURROGATES`."""
    aggregation: str
    """Key of :data:`lit_rlft.core.aggregations.AGGREGATIONS`."""


LOSS_TYPES: dict[str, LossTypeSpec] = {
    "grpo": LossTypeSpec("clip", "sequence_mean"),
    "dapo": LossTypeSpec("clip", "token_mean"),
    "dr_grpo": LossTypeSpec("clip", "constant_length_sum"),
    "bnpo": LossTypeSpec("clip", "local_token_mean"),
    "luspo": LossTypeSpec("clip", "sequence_sum_mean"),
    "cispo": LossTypeSpec("cispo", "token_mean"),
    "sapo": LossTypeSpec("sapo", "sequence_mean"),
    "vespo": LossTypeSpec("vespo", "token_mean"),
}
"""``loss_type`` -> (surrogate, aggregation), as in TRL 1.16's ``GRPOTrainer._compute_loss``."""


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


@dataclass
class LossOutput:
    """What :class:`GRPOLoss` returns."""

    loss: Tensor
    """``[]`` differentiable scalar to call ``backward`` on."""
    metrics: dict[str, Tensor] = field(default_factory=dict)
    """Detached ``[]`` scalars keyed by TRL's metric names (``clip_ratio/region_mean``, ``kl``, ...)."""
    entropy_stats: Tensor | None = None
    """``[2]`` detached (sum of the entropy over the entropy-bonus tokens, their count) when ``entropy`` was given:
    sum it over micro-batches and ranks for :meth:`AdaptiveEntropyCoef.update`'s global mean."""


def _masked_log_ratio_sum(old: Tensor, mu: Tensor, valid: Tensor) -> Tensor:
    """``[N, 1]`` ``sum over valid tokens of (log pi_old - log mu)``: a sequence's log importance ratio."""
    return torch.where(valid, old - mu, torch.zeros((), dtype=old.dtype, device=old.device)).sum(-1, keepdim=True)


@dataclass
class GRPOLoss:
    """GRPO's policy loss with TRL 1.16's options, plus replay and engine corrections.

    Names and defaults are TRL's ``GRPOConfig``'s, except ``use_bias_correction_kl`` (False here, True in TRL) and
    ``max_completion_length`` (None here: the module fills it in). ``docs/losses.md`` has the table.

    Per call, on ``N`` sequences (see the module notation; ``b`` is the policy each ratio is taken against):

    1. token mask ``m`` = real tokens, minus truncated rows under ``mask_truncated_completions``;
    2. ratio ``r = pi_theta / b`` per token, or ``s = exp(mean_t log(pi_theta / b))`` per sequence
       (``importance_sampling_level``);
    3. per-token loss ``l`` of the ``loss_type``'s surrogate (clip / cispo / sapo / vespo) on ``r``;
    4. ``l`` times the off-policy sequence mask (``off_policy_mask_threshold``) and the high-entropy mask
       (``top_entropy_quantile``);
    5. ``l`` times the importance weight ``w`` of the row (replay: ``off_policy``; fresh rows sampled by an engine:
       ``mismatch_correction``), except for vespo, which folds ``w`` into its own sequence weight;
    6. ``+ beta * k3(pi_theta, pi_ref)`` (times ``r`` under ``use_bias_correction_kl``);
    7. the ``loss_type``'s aggregation over ``m``, then ``- c * mean(entropy)`` over the bonus tokens when
       ``entropy_coef != 0`` or ``use_adaptive_entropy``.

    Rows and their behaviour policy ``mu`` (``behaviour_logprobs``):

    * replayed, ``off_policy="geppo"``: ``b = pi_old`` and ``w = min(pi_old / mu, importance_cap)`` per token
      (detached): for the clip surrogate ``w * min(rho A, clip(rho) A)`` equals the reference code's
      ``min(r_pi A, clip(r_pi, r_old (1 - eps), r_old (1 + eps_high)) A)`` (``r_pi = pi_theta / mu``,
      ``r_old = pi_old / mu``), a PPO clip around ``pi_old`` weighted by the truncated importance weight.
    * replayed, ``off_policy="paper"``: ``b = mu`` and ``w = 1``: the surrogate on ``pi_theta / mu`` directly.
    * fresh with engine log-probs (``replay_mask`` given): ``b = pi_old`` and ``w`` from ``mismatch_correction`` on
      ``pi_old / mu``: ``token_truncate`` ``min(pi_old / mu, mismatch_cap)`` per token, ``sequence_mask`` the
      sequence's ratio ``exp(sum(log pi_old - log mu))``, or 0 above ``mismatch_cap`` (TRL's vLLM correction).
    * otherwise (no ``behaviour_logprobs``): ``b = pi_old``, ``w = 1``, TRL's loss.

    For fresh rows ``mu == pi_old`` gives ``w = 1`` in every form, so all variants reduce to TRL's. The
    off-policy sequence mask measures the drift from each row's ``mu`` (stored, engine, or ``pi_old``).

    Refused combinations (``ValueError`` at construction): ``delta`` with a surrogate other than clip (the
    two-sided clip has nothing to bound there), or ``delta <= 1`` (it would cap the on-policy ratio); vespo with ``importance_sampling_level="sequence"`` (VESPO already
    weighs whole sequences, the level would only change the KL correction); at call time, vespo on engine-sampled
    fresh rows with ``mismatch_correction="sequence_mask"`` (its log-weight is per token, as TRL requires).

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
    """Upper clip range (``1 + epsilon_high``); None uses ``epsilon``. DAPO's clip-higher uses 0.28. For
    ``loss_type="cispo"`` it is the cap of the importance weight itself (ScaleRL recommends 5.0)."""
    delta: float | None = None
    """Two-sided clip (INTELLECT-2): the unclipped ratio is capped at ``delta``, ``-min(min(r, delta) A, clip(r) A)``,
    which bounds the loss of negative-advantage tokens whose ratio exploded. None: off; use a value > 1 + epsilon
    (e.g. 4). Clip surrogate only. When to use it: instability from rare huge ratios on negative samples."""
    loss_type: LossType = "dapo"
    """Surrogate and aggregation (TRL's names): ``grpo`` (clip, sequence mean then batch mean), ``dapo`` (clip, token
    mean over the mini-batch), ``dr_grpo`` (clip, sum over ``N * max_completion_length``), ``bnpo`` (clip, token
    mean per micro-batch), ``luspo`` (clip, per-sequence sum then mean), ``cispo`` (capped detached weight times
    log-prob, token mean), ``sapo`` (soft sigmoid gate, sequence mean), ``vespo`` (Gamma sequence weight times
    log-prob, token mean). When to use it: ``dapo`` for long reasoning (no length bias), ``grpo`` for the original,
    ``dr_grpo`` with unscaled advantages, the others as in their papers (docs/losses.md)."""
    importance_sampling_level: ImportanceSamplingLevel = "token"
    """``token``: one ratio per token. ``sequence`` (GSPO): ``s_i = exp((1/|o_i|) sum_t log(pi_theta / b))`` for
    every token of the sequence. When to use it: sequence-level rewards and MoE / long sequences where token ratios
    are noisy; GSPO pairs it with ``loss_type="grpo"`` (or ``luspo``)."""
    beta: float = 0.0
    """Weight of the k3 KL penalty ``beta * (exp(ref - logp) - (ref - logp) - 1)`` to the reference policy; 0 (both
    papers' setting) needs no reference model."""
    use_bias_correction_kl: bool = False
    """Multiply the k3 KL by the ratio ``r`` (DeepSeek-V3.2: unbiased reverse-KL gradient for samples from ``b``).
    TRL's default is True; lit_rlft keeps False so that runs with ``beta > 0`` stay as they were."""
    max_completion_length: int | None = None
    """Generation length limit; required by ``loss_type="dr_grpo"`` when the loss is computed."""
    mask_truncated_completions: bool = False
    """Drop completions that hit the length limit from the loss and its token count (DAPO's overlong filtering).
    When to use it: many truncations whose negative advantage only says "too long"."""
    sapo_temperature_neg: float = 1.05
    """SAPO gate temperature ``tau`` for ``A <= 0``: ``l = -(4 / tau) sigmoid(tau (r - 1)) A``."""
    sapo_temperature_pos: float = 1.0
    """SAPO gate temperature ``tau`` for ``A > 0``."""
    vespo_k_pos: float = 2.0
    """VESPO ``k`` for ``A >= 0`` in ``phi(w) = exp(lambda + k log w - lambda w)``: how fast weights ``w < 1`` fade."""
    vespo_lambda_pos: float = 3.0
    """VESPO ``lambda`` for ``A >= 0``: how fast weights ``w > 1`` fade."""
    vespo_k_neg: float = 3.0
    """VESPO ``k`` for ``A < 0``."""
    vespo_lambda_neg: float = 2.0
    """VESPO ``lambda`` for ``A < 0``."""
    top_entropy_quantile: float = 1.0
    """``rho``: train only on the tokens whose entropy is in the top ``rho`` of the batch ("Beyond the 80/20 rule",
    ``keep_t = H_t >= quantile(H, 1 - rho)``); 1 keeps all. When to use it: reasoning RL, rho = 0.2."""
    entropy_coef: float = 0.0
    """Entropy bonus ``- c * mean_t H_t`` (over the loss tokens, or the high-entropy ones) added to the loss; with
    ``use_adaptive_entropy`` the initial ``c``. When to use it: the policy's entropy collapses early."""
    use_adaptive_entropy: bool = False
    """Skywork-OR1: after each optimizer step ``c += entropy_coef_delta`` if the global mean entropy is at or below
    ``entropy_target``, else ``c -= entropy_coef_delta`` (within [min, max]); ``c`` applies only while the entropy is
    at or below the target (see :class:`lit_rlft.core.entropy_control.AdaptiveEntropyCoef`)."""
    entropy_coef_min: float = 0.0
    """Lower bound of the adaptive ``c``."""
    entropy_coef_max: float = 1.0
    """Upper bound of the adaptive ``c``."""
    entropy_coef_delta: float = 0.005
    """Step of the adaptive ``c`` per optimizer step."""
    entropy_target: float = 0.2
    """Target mean per-token entropy (nats) of adaptive control; set it near the entropy seen early in training."""
    off_policy_mask_threshold: float | None = None
    """DeepSeek-V3.2's off-policy sequence mask ``delta``: drop a sequence with ``A < 0`` whose mean per-token
    ``log mu - log pi_theta`` exceeds it (e.g. 0.5). None: off. When to use it: several updates per batch, replay or
    engine mismatch."""
    off_policy: OffPolicyForm = "geppo"
    """Correction for replayed rollouts: ``"geppo"`` (reference code, default) or ``"paper"``."""
    importance_cap: float | None = 10.0
    """Upper bound on the GePPO importance weight ``pi_old / mu`` (truncated importance sampling); None: no cap."""
    mismatch_correction: MismatchCorrection | None = "sequence_mask"
    """Correction of fresh rows for the engine/trainer mismatch (when the engine reports log-probs); None: off."""
    mismatch_cap: float = 3.0
    """Cap of the mismatch ratio ``pi_old / mu`` (TRL's ``vllm_importance_sampling_clip_max``)."""

    def __post_init__(self) -> None:
        check_finite(self, "model.loss")
        if self.epsilon <= 0:
            raise ValueError(f"`epsilon` must be > 0, got {self.epsilon!r}")
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        if self.epsilon_high < 0:
            raise ValueError(f"`epsilon_high` must be >= 0 (or None to reuse `epsilon`), got {self.epsilon_high!r}")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"`loss_type` must be one of {tuple(LOSS_TYPES)}, got {self.loss_type!r}")
        if self.importance_sampling_level not in get_args(ImportanceSamplingLevel):
            raise ValueError(f"`importance_sampling_level` must be one of {get_args(ImportanceSamplingLevel)}, got "
                             f"{self.importance_sampling_level!r}")
        surrogate = self.surrogate
        if self.delta is not None:
            if not surrogate.uses_delta:
                raise ValueError(f"`delta` bounds the clipped surrogate only; loss_type={self.loss_type!r} has no "
                                 "clip to make two-sided: set delta=None")
            if self.delta <= 1.0:
                raise ValueError(f"`delta` must be > 1 (above the on-policy ratio; 1 + epsilon or more), got "
                                 f"{self.delta!r}")
        if self.importance_sampling_level == "sequence" and not surrogate.sequence_level:
            raise ValueError(f"loss_type={self.loss_type!r} weighs whole sequences itself: set "
                             "importance_sampling_level='token'")
        if self.beta < 0:
            raise ValueError(f"`beta` must be >= 0, got {self.beta!r}")
        if self.max_completion_length is not None and self.max_completion_length <= 0:
            raise ValueError(f"`max_completion_length` must be > 0 or None, got {self.max_completion_length!r}")
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be > 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise ValueError(f"`top_entropy_quantile` must be in [0, 1], got {self.top_entropy_quantile!r}")
        if self.entropy_coef_min > self.entropy_coef_max:
            raise ValueError(f"`entropy_coef_min` ({self.entropy_coef_min!r}) must be <= `entropy_coef_max` "
                             f"({self.entropy_coef_max!r})")
        if self.entropy_coef_delta < 0:
            raise ValueError(f"`entropy_coef_delta` must be >= 0, got {self.entropy_coef_delta!r}")
        if self.off_policy_mask_threshold is not None and self.off_policy_mask_threshold <= 0:
            raise ValueError(f"`off_policy_mask_threshold` must be > 0 or None, got {self.off_policy_mask_threshold!r}")
        if self.off_policy not in get_args(OffPolicyForm):
            raise ValueError(f"`off_policy` must be one of {get_args(OffPolicyForm)}, got {self.off_policy!r}")
        if self.importance_cap is not None and self.importance_cap <= 0:
            raise ValueError(f"`importance_cap` must be > 0 or None, got {self.importance_cap!r}")
        if self.mismatch_correction not in (*get_args(MismatchCorrection), None):
            raise ValueError(f"`mismatch_correction` must be one of {get_args(MismatchCorrection)} or None, got "
                             f"{self.mismatch_correction!r}")
        if self.mismatch_cap <= 0:
            raise ValueError(f"`mismatch_cap` must be > 0, got {self.mismatch_cap!r}")

    # ---- the pieces this configuration selects ------------------------------------------------------------------
    @property
    def surrogate(self) -> Surrogate:
        """The registered surrogate of ``loss_type``."""
        return SURROGATES[LOSS_TYPES[self.loss_type].surrogate]

    @property
    def aggregation(self) -> Aggregation:
        """The registered aggregation of ``loss_type``."""
        return AGGREGATIONS[LOSS_TYPES[self.loss_type].aggregation]

    @property
    def entropy_bonus(self) -> bool:
        """Whether the loss has an entropy term (``entropy_coef != 0`` or ``use_adaptive_entropy``)."""
        return self.entropy_coef != 0.0 or self.use_adaptive_entropy

    @property
    def zero_advantage_rows_matter(self) -> bool:
        """Whether a row whose advantage is exactly 0 gives the loss a gradient: only through the KL term
        (``beta > 0``) or the entropy bonus. Every surrogate is the advantage times a function of the ratio (or of
        the log-prob), every loss mask and importance weight multiplies it, and every aggregation sums rows before
        it divides, so otherwise such a row adds exactly 0 to the loss and to its gradient (it still counts in the
        normaliser: :meth:`micro_batch_weight`)."""
        return self.beta > 0 or self.entropy_bonus

    @property
    def needs_entropy(self) -> bool:
        """Whether calls need ``entropy`` (the bonus, with gradient, or the high-entropy mask)."""
        return self.entropy_bonus or self.top_entropy_quantile < 1.0

    def token_mask(self, mask: Tensor, truncated: Tensor | None = None) -> Tensor:
        """``[N, L]`` bool tokens of the loss: ``mask`` minus ``truncated`` rows under ``mask_truncated_completions``.

        Select the entropies for :func:`lit_rlft.core.loss_masks.entropy_threshold` with it.
        """
        return loss_token_mask(mask, truncated if self.mask_truncated_completions else None)

    def micro_batch_weight(self, mask: Tensor, truncated: Tensor | None = None) -> float:
        """A micro-batch's weight in its mini-batch, from its ``mask`` ``[n, L]`` and ``truncated`` ``[n]``.

        ``sum_micro loss(micro) * w(micro) / sum_micro w(micro) == loss(mini-batch)`` (up to rounding) for every
        ``loss_type`` but ``bnpo``, whose per-micro-batch normalisation is its definition: weight 1 gives TRL's
        "mean of the micro-batches' token means". Sum the weights over the mini-batch's micro-batches *and ranks*;
        that total is 0 only when no token is left (every row truncated): clamp it to 1 (every loss is then 0).
        The weight counts rows for grpo/sapo/dr_grpo/luspo, loss tokens for dapo/cispo/vespo. It covers the
        policy and KL terms; for the entropy bonus see ``entropy_normalizer`` in :meth:`__call__`.
        """
        return self.aggregation.micro_batch_weight(self.token_mask(mask, truncated))

    # ---- the loss -----------------------------------------------------------------------------------------------
    def _mismatch_weight(self, old: Tensor, mu: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        return _mismatch_weights(self.mismatch_correction, self.mismatch_cap, old, mu, valid)

    def _importance(self, old: Tensor, mu: Tensor, valid: Tensor,
                    replay_mask: Tensor | None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """``b`` ``[N, L]`` (the log-probs each ratio is taken against), the weight ``w`` ``[N, L]`` of each row
        (replay: ``off_policy``; fresh: ``mismatch_correction``) and the importance-sampling statistics."""
        shape = old.shape
        replayed = (torch.ones(shape[0], dtype=torch.bool, device=valid.device) if replay_mask is None
                    else replay_mask.to(valid.device).bool())  # [N]
        staleness = torch.exp(old - mu)  # [N, L] r_old = pi_old / mu, uncapped
        if self.off_policy == "geppo":
            cap = float("inf") if self.importance_cap is None else self.importance_cap
            replay_weight = staleness.clamp(max=cap)  # [N, L]
            capped = staleness > cap  # [N, L]
            base = old
        else:  # "paper": the ratio is taken against mu itself
            replay_weight = torch.ones_like(staleness)
            capped = torch.zeros_like(valid)
            base = torch.where(replayed[:, None], mu, old)  # [N, L]
        fresh_weight, corrected = self._mismatch_weight(old, mu, valid)  # [N, L], [N, L] bool
        weight = torch.where(replayed[:, None], replay_weight, fresh_weight)  # [N, L]

        metrics: dict[str, Tensor] = {}
        rows = valid & replayed[:, None]  # replayed tokens
        if bool(rows.any()):
            prefix = "sampling/importance_sampling_ratio"
            inf = torch.tensor(float("inf"), device=staleness.device)
            metrics[f"{prefix}/min"] = torch.where(rows, staleness, inf).amin().detach()
            metrics[f"{prefix}/mean"] = level_mean(staleness, rows)
            metrics[f"{prefix}/max"] = torch.where(rows, staleness, -inf).amax().detach()
            metrics[f"{prefix}/capped_frac"] = level_mean(capped, rows)
        fresh = valid & ~replayed[:, None]  # fresh tokens
        if bool(fresh.any()) and replay_mask is not None:
            diff = (old - mu).abs()  # [N, L]
            metrics["sampling/sampling_logp_difference/mean"] = level_mean(diff, fresh)
            metrics["sampling/sampling_logp_difference/max"] = torch.where(fresh, diff, 0.0).amax().detach()
            metrics["sampling/mismatch_corrected_frac"] = level_mean(corrected, fresh)
        return base, weight, metrics

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        ref_logprobs: Tensor | None = None,
        behaviour_logprobs: Tensor | None = None,
        replay_mask: Tensor | None = None,
        entropy: Tensor | None = None,
        entropy_threshold: float | None = None,
        truncated: Tensor | None = None,
        entropy_coef: float | None = None,
        entropy_normalizer: float | None = None,
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
            entropy: ``[N, L]`` per-token entropy of pi_theta; required when :attr:`needs_entropy`, and with its
                gradient when the entropy bonus is on.
            entropy_threshold: the batch-wide threshold of ``top_entropy_quantile``
                (:func:`lit_rlft.core.loss_masks.entropy_threshold` of the whole mini-batch's loss-token entropies,
                gathered over ranks); None computes it from this call's tokens (TRL on one process).
            truncated: ``[N]`` bool, the completions that hit the length limit; required by
                ``mask_truncated_completions``.
            entropy_coef: the coefficient ``c`` to apply now; None uses the field ``entropy_coef``. Required under
                ``use_adaptive_entropy``: pass :meth:`AdaptiveEntropyCoef.apply_coef`.
            entropy_normalizer: the denominator of the entropy bonus; None: this call's count of bonus tokens
                (TRL's per-micro-batch mean). For a bonus exact over micro-batches and ranks, pass
                ``E * w / W``: ``E`` the mini-batch's global count of bonus tokens, ``w`` this micro-batch's
                :meth:`micro_batch_weight`, ``W`` the global sum of the weights (0, a micro-batch without tokens,
                reads as None).

        Returns:
            :class:`LossOutput` with the ``[]`` loss and detached ``[]`` metrics.
        """
        self._check_call(logprobs, old_logprobs, advantages, mask, ref_logprobs, behaviour_logprobs, replay_mask,
                         entropy, truncated, entropy_coef)
        shape = logprobs.shape
        surrogate = self.surrogate
        valid = self.token_mask(mask, truncated)  # [N, L]

        def clean(t: Tensor) -> Tensor:  # [N, L] float32 with padding set to 0, before any exp
            return torch.where(valid, t.float(), torch.zeros((), dtype=torch.float32, device=t.device))

        logp = clean(logprobs)  # [N, L] differentiable
        old = clean(old_logprobs.detach())  # [N, L]
        adv = advantages.detach().float().unsqueeze(-1)  # [N, 1]
        metrics: dict[str, Tensor] = {}

        # 1. the policy b each ratio is taken against, and each row's importance weight w
        mu = weight = None
        base = old
        if behaviour_logprobs is not None:
            mu = clean(behaviour_logprobs.detach())  # [N, L]
            base, weight, is_metrics = self._importance(old, mu, valid, replay_mask)  # [N, L], [N, L]
            metrics.update(is_metrics)

        # 2. the importance ratio, per token or per sequence (GSPO)
        log_ratio = logp - base  # [N, L]
        per_sequence = self.importance_sampling_level == "sequence"
        if per_sequence:
            log_ratio_seq = (log_ratio * valid).sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1.0)
            ratio = torch.exp(log_ratio_seq)  # [N, 1]
        else:
            ratio = torch.exp(log_ratio)  # [N, L]

        # 3. the surrogate
        folded = weight if surrogate.folds_importance_weight else None
        sur = surrogate.fn(SurrogateInput(logp, log_ratio, ratio, adv, valid, per_sequence, folded), self)
        per_token = sur.loss  # [N, L] or [N, 1]

        # 4. multiplicative masks (off-policy sequences, high-entropy tokens)
        ent = None if entropy is None else clean(entropy)  # [N, L] keeps its gradient
        behaviour = old if mu is None else mu
        mask_input = MaskInput(logp.detach(), behaviour, adv, valid, None if ent is None else ent.detach(),
                               entropy_threshold)
        applied: dict[str, Tensor] = {}
        for name, loss_mask in LOSS_MASKS.items():
            keep = loss_mask(mask_input, self)  # [N, 1] or [N, L] bool, or None
            if keep is not None:
                per_token = per_token * keep
                applied[name] = keep

        # 5. the replay / engine-mismatch weight (vespo folded it in step 3)
        if weight is not None and folded is None:
            per_token = per_token * weight  # [N, L]

        # 6. the KL penalty
        if ref_logprobs is not None:
            kl = k3_kl(logp, clean(ref_logprobs.detach()))  # [N, L]
            if self.use_bias_correction_kl:
                kl = kl * ratio
            metrics["kl"] = level_mean(kl, valid)
            if self.beta > 0:
                per_token = per_token + self.beta * kl  # [N, L]

        # 7. aggregation, then the entropy bonus
        if per_token.shape != shape:
            per_token = per_token.expand(shape)  # a sequence's loss on each of its tokens
        loss = self.aggregation.reduce(per_token, valid, self.max_completion_length)

        entropy_stats = None
        if ent is not None:
            bonus_tokens = valid & applied["high_entropy"] if "high_entropy" in applied else valid  # [N, L]
            entropy_sum = torch.where(bonus_tokens, ent, torch.zeros_like(ent)).sum()
            count = bonus_tokens.sum()
            entropy_stats = torch.stack([entropy_sum.detach(), count.to(entropy_sum.dtype)])
            if self.entropy_bonus:
                coef = self.entropy_coef if entropy_coef is None else entropy_coef
                denominator = entropy_normalizer if entropy_normalizer else count.clamp(min=1)
                metrics["policy_loss"] = loss.detach()
                loss = loss - coef * (entropy_sum / denominator)
            if "high_entropy" in applied:
                metrics["entropy/high_entropy_token_frac"] = level_mean(applied["high_entropy"], valid)
        if "off_policy" in applied:
            metrics["sampling/off_policy_masked_frac"] = (~applied["off_policy"]).float().mean().detach()
        metrics.update(sur.metrics)
        return LossOutput(loss=loss, metrics=metrics, entropy_stats=entropy_stats)

    def _check_call(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    ref_logprobs: Tensor | None, behaviour_logprobs: Tensor | None, replay_mask: Tensor | None,
                    entropy: Tensor | None, truncated: Tensor | None, entropy_coef: float | None) -> None:
        if logprobs.dim() != 2:
            raise ValueError(f"`logprobs` must have shape [N, L], got {tuple(logprobs.shape)}")
        shape = logprobs.shape
        others = {"old_logprobs": old_logprobs, "mask": mask, "ref_logprobs": ref_logprobs,
                  "behaviour_logprobs": behaviour_logprobs, "entropy": entropy}
        for name, t in others.items():
            if t is not None and t.shape != shape:
                raise ValueError(f"`{name}` must have the shape of `logprobs` {tuple(shape)}, got {tuple(t.shape)}")
        for name, t in {"advantages": advantages, "truncated": truncated, "replay_mask": replay_mask}.items():
            if t is not None and t.shape != shape[:1]:
                raise ValueError(f"`{name}` must have shape [N] = {tuple(shape[:1])}, got {tuple(t.shape)}")
        if self.beta > 0 and ref_logprobs is None:
            raise ValueError(f"`ref_logprobs` is required when `beta` > 0 (beta={self.beta!r})")
        if self.mask_truncated_completions and truncated is None:
            raise ValueError("mask_truncated_completions=True needs `truncated` [N] in the loss call")
        if self.needs_entropy and entropy is None:
            raise ValueError("`entropy` [N, L] is required with entropy_coef != 0, use_adaptive_entropy or "
                             "top_entropy_quantile < 1")
        if self.use_adaptive_entropy and entropy_coef is None:
            raise ValueError("use_adaptive_entropy=True: pass entropy_coef=AdaptiveEntropyCoef.apply_coef() to the "
                             "loss call")
        if (self.surrogate.folds_importance_weight and behaviour_logprobs is not None and replay_mask is not None
                and self.mismatch_correction == "sequence_mask" and not bool(replay_mask.bool().all())):
            raise ValueError(f"loss_type={self.loss_type!r} folds a per-token engine-mismatch weight: set "
                             "mismatch_correction='token_truncate' (or None)")


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
