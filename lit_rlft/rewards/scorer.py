"""What a rollout may call of the thing that scores its completions: the :class:`Scorer` Protocol.

:class:`~lit_rlft.rewards.runner.RewardRunner` is the scorer the builder makes (rule rewards in killable workers,
reward models, judges and remote scorers in threads). A plain callable ``(completions, columns) -> RewardResult``
(a test's coin flip, a hand-written scorer) is wrapped by :func:`as_scorer` into a :class:`FunctionScorer` that
declares the defaults, so the rollout worker and the step call every member plainly, never through ``getattr``.

Notation: ``N`` completions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from lit_rlft.rewards.runner import RewardResult

__all__ = ["FunctionScorer", "Scorer", "as_scorer"]


@runtime_checkable
class Scorer(Protocol):
    """Scores ``N`` completions; what the rollout worker and the step may use of it."""

    fallback: float
    """The score of a completion whose scoring failed (said in the step's failure warnings)."""

    report: bool
    """Whether it prints its own failure warnings (a step turns this off: it gathers every rank's counts and prints
    them itself, naming the rank)."""

    def __call__(self, completions: Sequence[str], columns: Mapping[str, Any] | None = None, *,
                 group_size: int | None = None) -> RewardResult:
        """Scores of ``completions`` ``[N]`` (``columns``: data-set fields aligned with them)."""
        ...

    @property
    def scores_batches(self) -> bool:
        """Whether it scores over the whole batch (reward models, judges, remote scorers): it is then also given
        ``completion_ids`` (token ids) and ``group_size``."""
        ...

    @property
    def uses_global_rng(self) -> bool:
        """Whether it samples from torch's global generator (an engine judge): it must not score while the policy
        generates."""
        ...

    def shard(self, mesh: Any) -> list[str]:
        """Shard what can be sharded (reward models) like an FSDP2 policy, over ``mesh``; the names of what was."""
        ...

    def close(self) -> None:
        """Stop its worker processes and threads (idempotent; a later call starts them again)."""
        ...


class FunctionScorer:
    """A plain ``(completions, columns) -> RewardResult`` callable as a :class:`Scorer`: scored in the calling process,
    over the batch as one call, nothing to shard or close.

    Args:
        func: the callable (called with the completions and the columns only).
    """

    fallback: float = 0.0
    report: bool = False
    scores_batches: bool = False
    uses_global_rng: bool = False

    def __init__(self, func: Callable[..., RewardResult]):
        self.func = func

    def __call__(self, completions: Sequence[str], columns: Mapping[str, Any] | None = None, *,
                 group_size: int | None = None) -> RewardResult:
        return self.func(completions, dict(columns or {}))

    def shard(self, mesh: Any) -> list[str]:
        return []

    def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"FunctionScorer({self.func!r})"


def as_scorer(scorer: Scorer | Callable[..., RewardResult]) -> Scorer:
    """``scorer`` itself when it declares the :class:`Scorer` members, else a plain callable wrapped in a
    :class:`FunctionScorer`."""
    if isinstance(scorer, Scorer):
        return scorer
    if not callable(scorer):
        raise TypeError(f"a reward scorer must be callable as scorer(completions, columns), got "
                        f"{type(scorer).__name__}")
    return FunctionScorer(scorer)
