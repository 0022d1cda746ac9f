"""Rewards scored over a whole batch in the training process: reward models, LLM judges, remote scorers.

A rule reward (``fn(completions, **columns)``) is untrusted code on untrusted text, so the
:class:`~lit_rlft.rewards.runner.RewardRunner` scores it one completion at a time in worker processes. A model, a
judge or a remote endpoint is the opposite: it runs best on many completions at once (a padded forward, a batched
request), it may hold a GPU, and its failures are of another kind (an unparsable judgement, a timeout, an HTTP 500),
which it can tell apart itself. Such a reward subclasses :class:`BatchedReward`: the runner calls its
:meth:`~BatchedReward.score` once per batch (or once per group, ``group_level``) in the training process, beside the
rule rewards' workers, and counts each :class:`Failure` it returns for that completion alone.

What a batched reward sees (``columns``): the data set's columns and ``prompts`` (the raw prompt), aligned with the
completions, plus ``completion_ids`` (each completion's token ids) and ``completion_length``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

__all__ = ["BatchedReward", "Failure", "FailureKind", "ScoreCache", "is_batched"]

FailureKind = Literal["error", "timeout", "unscored"]
"""``error``: the scorer failed (an exception, an HTTP error, a dropped connection); ``timeout``: past its bound;
``unscored``: it answered, but with no usable score (an unparsable judgement, a malformed response)."""

_COUNTER = {"error": "num_errors", "timeout": "num_timeouts", "unscored": "num_unscored"}


@dataclass(frozen=True)
class Failure:
    """One completion a batched reward could not score: it scores the runner's fallback (0) alone and is counted
    under ``rewards/num_<kind>s``; ``message`` (short) is shown on the console."""

    kind: FailureKind
    message: str

    def __post_init__(self) -> None:
        if self.kind not in _COUNTER:
            raise ValueError(f"Failure.kind must be one of {sorted(_COUNTER)}, got {self.kind!r}")

    @property
    def counter(self) -> str:
        """The :class:`~lit_rlft.rewards.runner.RewardResult` counter it adds to."""
        return _COUNTER[self.kind]


Score = float | None | Failure


class BatchedReward:
    """Base class of rewards scored over a batch in the training process (subclass it and implement :meth:`score`).

    Class attributes a subclass may set:
        group_level: :meth:`score` is called once per group (one prompt's completions generated together), for
            group-level or pairwise rewards; otherwise once per batch.
        cacheable: a frozen scorer (same text, same score): the runner keeps scores by (prompt, completion) and
            scores only what it has not seen (``cache_size`` entries, least recently used dropped).

    An instance is also a TRL-style reward function (``fn(completions, **columns) -> list[float | None]``, failures
    as None), so it can be called by hand or by code that knows only that convention.
    """

    batched: ClassVar[bool] = True
    group_level: bool = False
    cacheable: bool = False
    cache_size: int = 100_000

    def score(self, completions: list[str], columns: Mapping[str, Sequence[Any]]) -> list[Score]:
        """One score per completion: a float, None (no score; counted as unscored) or a :class:`Failure`.

        Args:
            completions: ``N`` texts.
            columns: lists aligned with ``completions`` (``prompts``, the data set's columns, ``completion_ids``...).

        Raising is for bugs and misconfiguration (it stops the step, with the message); a failure of one completion
        is returned as a :class:`Failure` for it.
        """
        raise NotImplementedError

    def __call__(self, completions: Sequence[str], **columns: Any) -> list[float | None]:
        return [None if isinstance(s, Failure) else s for s in self.score(list(completions), columns)]

    def close(self) -> None:
        """Release what the scorer holds (threads, connections); it starts again on the next call."""


def is_batched(func: Any) -> bool:
    """Whether ``func`` is scored over a batch in the training process (a :class:`BatchedReward`, or anything with a
    true ``batched`` attribute and a ``score`` method)."""
    return bool(getattr(func, "batched", False)) and callable(getattr(func, "score", None))


def cache_key(prompt: Any, completion: str) -> bytes:
    """A fixed-size key of one (prompt, completion) pair."""
    h = hashlib.blake2b(digest_size=16)
    h.update(str(prompt).encode("utf-8", "surrogatepass"))
    h.update(b"\x00")
    h.update(completion.encode("utf-8", "surrogatepass"))
    return h.digest()


class ScoreCache:
    """Scores by (prompt, completion), least recently used dropped past ``capacity``. Only scores are kept (never
    failures: a timeout or an unparsable judgement is tried again next time)."""

    def __init__(self, capacity: int = 100_000):
        if capacity < 1:
            raise ValueError(f"ScoreCache: capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._scores: OrderedDict[bytes, float | None] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._scores)

    def get(self, key: bytes) -> tuple[bool, float | None]:
        """``(found, score)``."""
        if key in self._scores:
            self._scores.move_to_end(key)
            self.hits += 1
            return True, self._scores[key]
        self.misses += 1
        return False, None

    def put(self, key: bytes, score: float | None) -> None:
        self._scores[key] = score
        self._scores.move_to_end(key)
        while len(self._scores) > self.capacity:
            self._scores.popitem(last=False)


def score_batched(reward: Any, completions: list[str], columns: Mapping[str, Sequence[Any]],
                  group_size: int | None, cache: ScoreCache | None) -> list[Score]:
    """Call a batched reward as it asks (per batch or per group, through its cache) and check its contract.

    Raises:
        ValueError: a group-level reward without a group size, or scores of the wrong number or type.
    """
    n = len(completions)
    todo = list(range(n))
    out: list[Score] = [None] * n
    keys: list[bytes] = []
    if cache is not None:
        prompts = columns.get("prompts")
        keys = [cache_key(prompts[i] if prompts is not None else "", completions[i]) for i in range(n)]
        todo = []
        for i, key in enumerate(keys):
            found, value = cache.get(key)
            if found:
                out[i] = value
            else:
                todo.append(i)
    if getattr(reward, "group_level", False):
        if not group_size:
            raise ValueError(f"reward {type(reward).__name__} is group-level but the caller gave no group size")
        if n % group_size:
            raise ValueError(f"{n} completions are not whole groups of {group_size}")
        calls = [list(range(s, s + group_size)) for s in range(0, n, group_size)]
        if cache is not None:  # a group is scored whole, or not at all
            missing = set(todo)
            calls = [c for c in calls if missing.intersection(c)]
    else:
        # a sharded scorer (every rank's forward is a collective) is called even with nothing new to score
        calls = [todo] if todo or getattr(reward, "collective", False) else []
    for rows in calls:
        scores = reward.score([completions[i] for i in rows], _take(columns, rows))
        if not isinstance(scores, (list, tuple)) or len(scores) != len(rows):
            got = len(scores) if hasattr(scores, "__len__") else type(scores).__name__
            raise ValueError(f"reward {type(reward).__name__} returned {got} scores for {len(rows)} completions")
        for i, s in zip(rows, scores):
            out[i] = _check(reward, s)
            if cache is not None and not isinstance(out[i], Failure):
                cache.put(keys[i], out[i])  # type: ignore[arg-type]
    return out


def _take(columns: Mapping[str, Sequence[Any]], rows: list[int]) -> dict[str, list[Any]]:
    return {k: [v[i] for i in rows] if isinstance(v, (list, tuple)) else v for k, v in columns.items()}


def _check(reward: Any, s: Any) -> Score:
    if s is None or isinstance(s, Failure):
        return s
    try:
        value = float(s)
    except (TypeError, ValueError):
        raise ValueError(f"reward {type(reward).__name__} returned a non-numeric score {str(s)[:80]!r}") from None
    return value if value == value and abs(value) != float("inf") else None
