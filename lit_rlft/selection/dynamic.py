"""Dynamic sampling (DAPO, the papers' "DS" baseline and DPS's "oracle"): bookkeeping only.

One training step under dynamic sampling: roll out a round of candidate prompts, keep the groups whose rewards are
not all equal (non-zero reward std: the only groups that give GRPO a gradient), and repeat with fresh prompts until
``batch_size`` groups are kept or ``max_rounds`` rounds were rolled out; then truncate to ``batch_size``. The
rollouts of discarded groups and of the surplus are the method's cost and are counted.

This module does not generate anything: the caller rolls out, hands each round's rewards to :meth:`FilterRound.add`
and reads back which groups to keep. A *group* is whatever the caller labels it with (by default its index in the
concatenation of all rounds' rollouts), so the same bookkeeping serves any rollout container.

Example::

    flt = DynamicFilter(max_rounds=10)
    acc = flt.start(batch_size=B)
    while not acc.done:
        rewards = roll_out(next_prompts(B))  # [B, G]
        acc.add(rewards)
    result = acc.finish()  # result.kept: labels of at most B kept groups
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from lit_rlft.core.advantages import keep_mask
from lit_rlft.selection.base import check_version

__all__ = ["DynamicFilter", "FilterResult", "FilterRound", "keep_mask"]

_TOTALS = ("total_steps", "total_rounds", "total_rolled_out", "total_kept", "total_discarded", "total_unfilled")



class FilterResult(NamedTuple):
    """Outcome of one step of dynamic sampling."""

    kept: list[Any]
    """Labels of the kept groups, at most ``batch_size``, in the order they were rolled out."""
    num_kept: int
    """``len(kept)``."""
    num_discarded: int
    """Groups rolled out and dropped for zero reward std."""
    num_surplus: int
    """Effective groups rolled out beyond ``batch_size`` and truncated away."""
    num_rolled_out: int
    """All groups rolled out this step (the generation cost, in groups)."""
    rounds: int
    """Rounds rolled out."""
    filled: bool
    """Whether ``batch_size`` effective groups were found within ``max_rounds``."""


class FilterRound:
    """Accumulates one step's rounds until ``batch_size`` groups are kept or ``max_rounds`` rounds ran.

    Args:
        batch_size: effective groups wanted.
        max_rounds: round limit (DAPO: 10; the DPS paper used 4 on MATH).
    """

    def __init__(self, batch_size: int, max_rounds: int, _owner: DynamicFilter | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {batch_size!r}")
        _check_max_rounds(max_rounds)
        self.batch_size = int(batch_size)
        self.max_rounds = int(max_rounds)
        self.kept: list[Any] = []
        self.num_discarded = 0
        self.num_rolled_out = 0
        self.rounds = 0
        self._owner = _owner
        self._finished = False

    @property
    def num_kept(self) -> int:
        """Effective groups kept so far (before truncation)."""
        return len(self.kept)

    @property
    def remaining(self) -> int:
        """Effective groups still missing (0 once enough were kept)."""
        return max(0, self.batch_size - self.num_kept)

    @property
    def done(self) -> bool:
        """Enough groups kept, or the round limit reached."""
        return self.num_kept >= self.batch_size or self.rounds >= self.max_rounds

    def add(self, rewards: np.ndarray, groups: Sequence[Any] | np.ndarray | None = None,
            members: np.ndarray | None = None) -> np.ndarray:
        """Take one round's rewards; return its ``[b]`` bool keep mask.

        Args:
            rewards: ``[b, G]`` rewards of the round's groups.
            groups: ``b`` labels of those groups (indices into the caller's rollout batch, prompt ids, ...).
                Default: their positions in the concatenation of all rounds' rollouts of this step.
            members: ``[b, G]`` bool, the real completions of groups of different sizes (None: all); a group's
                spread is taken over its members.
        """
        if self._finished:
            raise RuntimeError("this step's dynamic sampling was already finished")
        if self.done:
            raise RuntimeError(
                f"no more rounds needed: {self.num_kept} groups kept after {self.rounds} of {self.max_rounds} rounds"
            )
        mask = keep_mask(rewards, members)
        b = mask.size
        labels = list(range(self.num_rolled_out, self.num_rolled_out + b)) if groups is None else list(groups)
        if len(labels) != b:
            raise ValueError(f"got {len(labels)} group labels for {b} groups of rewards")
        self.kept.extend(label for label, keep in zip(labels, mask) if keep)
        self.num_discarded += int(b - mask.sum())
        self.num_rolled_out += b
        self.rounds += 1
        return mask

    def finish(self) -> FilterResult:
        """Truncate the kept groups to ``batch_size`` and report the step (may be called once)."""
        if self._finished:
            raise RuntimeError("finish() was already called for this step")
        self._finished = True
        kept = self.kept[: self.batch_size]
        result = FilterResult(
            kept=kept,
            num_kept=len(kept),
            num_discarded=self.num_discarded,
            num_surplus=self.num_kept - len(kept),
            num_rolled_out=self.num_rolled_out,
            rounds=self.rounds,
            filled=len(kept) == self.batch_size,
        )
        if self._owner is not None:
            self._owner._record(result)
        return result


class DynamicFilter:
    """Starts one :class:`FilterRound` per training step and keeps running totals for logging and resume.

    Args:
        max_rounds: rounds of rollouts allowed per step, >= 1 (DAPO's default 10; 4 in the DPS paper's MATH runs).
    """

    version = 1

    def __init__(self, max_rounds: int = 10) -> None:
        self.max_rounds = _check_max_rounds(max_rounds)
        self.total_steps = 0
        self.total_rounds = 0
        self.total_rolled_out = 0
        self.total_kept = 0
        self.total_discarded = 0
        self.total_unfilled = 0  # steps that ended short of batch_size

    keep_mask = staticmethod(keep_mask)

    def start(self, batch_size: int) -> FilterRound:
        """Begin a step that wants ``batch_size`` effective groups."""
        return FilterRound(batch_size, self.max_rounds, _owner=self)

    def _record(self, result: FilterResult) -> None:
        self.total_steps += 1
        self.total_rounds += result.rounds
        self.total_rolled_out += result.num_rolled_out
        self.total_kept += result.num_kept
        self.total_discarded += result.num_discarded
        self.total_unfilled += int(not result.filled)

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version, **{key: getattr(self, key) for key in _TOTALS}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_version(state, self.version, "DynamicFilter")
        for key in _TOTALS:
            setattr(self, key, int(state.get(key, 0)))


def _check_max_rounds(max_rounds: int) -> int:
    if int(max_rounds) != max_rounds or max_rounds < 1:
        raise ValueError(f"`max_rounds` must be an integer >= 1, got {max_rounds!r}")
    return int(max_rounds)
