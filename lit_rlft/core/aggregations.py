"""Aggregations: how per-token losses become the scalar loss, and how much a micro-batch weighs in its mini-batch.

Notation: ``N`` sequences, ``L`` completion length, ``mask`` ``[N, L]`` the tokens that enter the loss (real
completion tokens, minus truncated completions under ``mask_truncated_completions``). ``T = mask.sum()`` tokens.

Each TRL ``loss_type`` is a surrogate (:mod:`lit_rlft.core.surrogates`) paired with one of these aggregations
(:data:`lit_rlft.core.losses.LOSS_TYPES`). Splitting a mini-batch into micro-batches (and ranks) must not change the
gradient: each aggregation is ``sum over units / D`` where ``D`` counts units of the whole mini-batch, so with a
micro-batch's weight ``w = its own D``::

    sum over micro-batches  loss(micro) * w(micro) / sum(w)  ==  loss(whole mini-batch)

holds for every aggregation except ``local_token_mean`` (TRL's ``bnpo``), which normalises each micro-batch by its
own tokens by definition: its weight is 1, i.e. the mini-batch loss is the mean of the micro-batches' token means,
which is what TRL computes (per-device token mean, divided by the accumulation steps, averaged over ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Reduce = Callable[[Tensor, Tensor, "int | None"], Tensor]
"""``(per_token [N, L], mask [N, L], max_completion_length) -> []`` scalar loss."""

MicroBatchWeight = Literal["sequences", "tokens", "one"]
"""What a micro-batch's weight counts: its rows, its loss tokens, or nothing (weight 1)."""


def _masked(per_token: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``per_token`` with padding replaced by 0 (so inf/NaN there cannot leak) and the float mask, both ``[N, L]``."""
    valid = mask.bool()  # [N, L]
    return torch.where(valid, per_token, torch.zeros_like(per_token)), valid.to(per_token.dtype)


def sequence_mean(per_token: Tensor, mask: Tensor, max_completion_length: int | None = None) -> Tensor:
    """Mean over each sequence's tokens, then mean over the ``N`` sequences (``loss_type`` grpo, sapo).

    ``(1 / N) sum_i (1 / |o_i|) sum_t l_{i,t}``. Long sequences weigh as much as short ones, so each token of a long
    sequence counts less (the length bias that DAPO and Dr. GRPO remove). A sequence without tokens (all padding,
    or masked as truncated) adds 0 but still counts in ``N``, as in TRL.

    Args:
        per_token: ``[N, L]`` per-token loss.
        mask: ``[N, L]`` 1 for loss tokens.
        max_completion_length: unused.

    Returns:
        ``[]`` scalar loss.
    """
    values, weights = _masked(per_token, mask)  # [N, L], [N, L]
    return (values.sum(-1) / weights.sum(-1).clamp(min=1.0)).mean()


def token_mean(per_token: Tensor, mask: Tensor, max_completion_length: int | None = None) -> Tensor:
    """Sum over all tokens divided by their number, ``sum_{i,t} l_{i,t} / T`` (dapo, cispo, vespo, bnpo).

    verl's ``token-mean``; with micro-batches the denominator is the mini-batch's (global) token count.

    Args:
        per_token: ``[N, L]`` per-token loss.
        mask: ``[N, L]`` 1 for loss tokens.
        max_completion_length: unused.

    Returns:
        ``[]`` scalar loss.
    """
    values, weights = _masked(per_token, mask)  # [N, L], [N, L]
    return values.sum() / weights.sum().clamp(min=1.0)


def constant_length_sum(per_token: Tensor, mask: Tensor, max_completion_length: int | None = None) -> Tensor:
    """Sum over all tokens divided by the constant ``N * max_completion_length`` (dr_grpo).

    Args:
        per_token: ``[N, L]`` per-token loss.
        mask: ``[N, L]`` 1 for loss tokens.
        max_completion_length: the generation length limit; required.

    Returns:
        ``[]`` scalar loss.
    """
    if max_completion_length is None:
        raise ValueError("loss_type='dr_grpo' needs `max_completion_length` (the generation length limit), got None")
    values, _ = _masked(per_token, mask)  # [N, L]
    return values.sum() / (per_token.shape[0] * max_completion_length)


def sequence_sum_mean(per_token: Tensor, mask: Tensor, max_completion_length: int | None = None) -> Tensor:
    """Sum over each sequence's tokens, then mean over sequences, ``(1 / N) sum_i sum_t l_{i,t}`` (luspo).

    With a sequence-level ratio every token of ``o_i`` carries the same loss, so this is ``|o_i|`` times the
    sequence's GSPO loss: LUSPO's length-unbiased scaling (long sequences are not down-weighted).

    Args:
        per_token: ``[N, L]`` per-token loss.
        mask: ``[N, L]`` 1 for loss tokens.
        max_completion_length: unused.

    Returns:
        ``[]`` scalar loss.
    """
    values, _ = _masked(per_token, mask)  # [N, L]
    return values.sum(-1).mean()


@dataclass(frozen=True)
class Aggregation:
    """A registered aggregation: its reduction and what its micro-batch weight counts."""

    reduce: Reduce
    """``(per_token [N, L], mask [N, L], max_completion_length) -> []``."""
    weight: MicroBatchWeight
    """``"sequences"``: ``D = N``; ``"tokens"``: ``D = T``; ``"one"``: per-micro-batch normalisation (bnpo)."""
    unit: Literal["sequences", "tokens"] | None = None
    """What the reduction's own denominator counts in a call (``D`` of that call): the weight's unit, or, for a
    weight of ``"one"``, the unit it normalises each micro-batch by."""

    def __post_init__(self) -> None:
        if self.unit is None:
            if self.weight == "one":
                raise ValueError("an aggregation whose micro-batch weight is 'one' must say its unit")
            object.__setattr__(self, "unit", self.weight)

    @property
    def additive(self) -> bool:
        """Whether a micro-batch's weight is its own denominator, so that each row's share of the mini-batch loss
        does not depend on which micro-batch holds it (all but bnpo's)."""
        return self.weight != "one"

    def units(self, mask: Tensor) -> float:
        """``D`` of a call on loss-token ``mask`` ``[n, L]``: its rows or its tokens."""
        return float(mask.bool().sum()) if self.unit == "tokens" else float(mask.shape[0])

    def micro_batch_weight(self, mask: Tensor) -> float:
        """A micro-batch's weight in its mini-batch, from its loss-token ``mask`` ``[n, L]``; see the module doc."""
        if self.weight == "tokens":
            return float(mask.bool().sum())
        if self.weight == "sequences":
            return float(mask.shape[0])
        return 1.0


AGGREGATIONS: dict[str, Aggregation] = {
    "sequence_mean": Aggregation(sequence_mean, "sequences"),
    "token_mean": Aggregation(token_mean, "tokens"),
    "local_token_mean": Aggregation(token_mean, "one", unit="tokens"),
    "constant_length_sum": Aggregation(constant_length_sum, "sequences"),
    "sequence_sum_mean": Aggregation(sequence_sum_mean, "sequences"),
}
"""Aggregation name -> :class:`Aggregation`. ``local_token_mean`` is ``token_mean`` over each micro-batch alone."""
