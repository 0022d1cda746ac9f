"""The selection-strategy protocol and the helpers every strategy shares.

Notation (see ``docs/design.md``): ``S`` is the pool size, ``B`` the number of prompts (groups) in a step's batch,
``G`` the completions per prompt. A prompt is known to a strategy by its stable int64 id in ``0 .. S-1``.

A prompt's *state* after a step is computed from the correctness of its group (success rate ``p``, the fraction of
the ``G`` completions that were correct): the papers number the states 1 / 2 / 3, the code uses 0-based indices

====  ===========  ==========================
code  paper        meaning
====  ===========  ==========================
0     1            unsolved, ``p == 0``
1     2            partially solved, ``0 < p < 1`` (an *effective* group: GRPO gets a gradient from it)
2     3            solved, ``p == 1``
====  ===========  ==========================
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from lit_rlft.core.advantages import effective_ratio  # noqa: F401  (re-exported for the strategies)

NUM_STATES = 3
UNSOLVED, PARTIAL, SOLVED = 0, 1, 2
STATE_NAMES = ("unsolved", "partial", "solved")


@runtime_checkable
class SelectionStrategy(Protocol):
    """What a data-selection strategy offers the training loop.

    The loop calls, once per training step ``t``: ``select(B, t, rng)`` for the ids of the prompts to roll out,
    then, once their groups are scored, ``observe(ids, success_rates, t)``. The caller owns ``rng`` (a
    ``numpy.random.Generator``) and checkpoints its ``bit_generator.state`` next to ``state_dict()``, so a resumed
    run draws exactly what the uninterrupted run would have drawn. With asynchronous rollouts the caller passes
    ``exclude``, the ids in flight: none of them may be selected (an empty or None ``exclude`` selects exactly as
    without it).
    """

    def observe(self, prompt_ids: np.ndarray, success_rates: np.ndarray, step: int) -> None:
        """Record one step's outcomes: ``prompt_ids`` ``[B]`` int64, ``success_rates`` ``[B]`` floats in [0, 1]."""
        ...

    def select(self, batch_size: int, step: int, rng: np.random.Generator,
               exclude: np.ndarray | None = None) -> np.ndarray:
        """Return ``[batch_size]`` int64 ids (no duplicates, none in ``exclude``) of the prompts for the next step."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Plain types and numpy arrays only (``torch.save``-able), with a ``version`` key."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s output; missing optional keys keep their defaults."""
        ...


def state_of(success_rates: np.ndarray) -> np.ndarray:
    """Map success rates to 0-based states: 0 unsolved (``p == 0``), 1 partial, 2 solved (``p == 1``).

    Args:
        success_rates: ``[B]`` floats in [0, 1], the fraction of each group's completions that were correct.

    Returns:
        ``[B]`` int8 states.
    """
    p = np.asarray(success_rates, dtype=np.float64)
    if p.size and (not np.all(np.isfinite(p)) or p.min() < 0.0 or p.max() > 1.0):
        raise ValueError(f"success rates must lie in [0, 1], got values in [{p.min()}, {p.max()}]")
    states = np.full(p.shape, PARTIAL, dtype=np.int8)
    states[p <= 0.0] = UNSOLVED
    states[p >= 1.0] = SOLVED
    return states



def validate_batch_size(batch_size: int, num_prompts: int, option: str = "batch_size") -> int:
    """Check ``1 <= batch_size <= num_prompts``; the error names ``option``, the setting the user should change."""
    if int(batch_size) != batch_size or not 1 <= batch_size <= num_prompts:
        raise ValueError(
            f"`{option}` must be an integer in [1, {num_prompts}] (the pool holds {num_prompts} prompts), "
            f"got {batch_size!r}"
        )
    return int(batch_size)


def validate_num_prompts(num_prompts: int) -> int:
    """Check that a pool size is a positive integer."""
    if int(num_prompts) != num_prompts or num_prompts < 1:
        raise ValueError(f"`num_prompts` must be a positive integer, got {num_prompts!r}")
    return int(num_prompts)


def validate_observation(
    prompt_ids: np.ndarray, success_rates: np.ndarray, num_prompts: int
) -> tuple[np.ndarray, np.ndarray]:
    """Check one step's outcomes and return them as ``([B] int64, [B] float64)`` arrays.

    Ids must be unique and lie in ``0 .. num_prompts-1``; rates must lie in [0, 1].
    """
    ids = np.asarray(prompt_ids).reshape(-1)
    rates = np.asarray(success_rates, dtype=np.float64).reshape(-1)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"prompt ids must be integers, got dtype {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    if ids.shape != rates.shape:
        raise ValueError(f"got {ids.size} prompt ids but {rates.size} success rates")
    if ids.size:
        if ids.min() < 0 or ids.max() >= num_prompts:
            raise ValueError(f"prompt ids must lie in [0, {num_prompts - 1}], got [{ids.min()}, {ids.max()}]")
        if np.unique(ids).size != ids.size:
            raise ValueError("prompt ids of one step must be unique")
        if not np.all(np.isfinite(rates)) or rates.min() < 0.0 or rates.max() > 1.0:
            raise ValueError(f"success rates must lie in [0, 1], got values in [{rates.min()}, {rates.max()}]")
    return ids, rates


def check_version(state: dict[str, Any], version: int, owner: str) -> None:
    """Refuse a checkpoint written by a newer format than this code understands."""
    found = int(state.get("version", 1))
    if found > version:
        raise ValueError(f"{owner} state has version {found}; this code reads versions <= {version}")


def check_num_prompts(state: dict[str, Any], num_prompts: int, owner: str) -> None:
    """Refuse a checkpoint written for a pool of a different size (the ids would point at other prompts)."""
    found = state.get("num_prompts")
    if found is not None and int(found) != num_prompts:
        raise ValueError(
            f"{owner} checkpoint was written for a pool of {int(found)} prompts, but this run's pool holds "
            f"{num_prompts}: resume with the same data set (and filters) or start the selection state afresh"
        )


def top_k_random_ties(score: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Positions ``[k]`` of the ``k`` highest ``score`` ``[n]`` values, ties at the threshold drawn at random.

    O(n): one ``np.partition`` finds the k-th best score; every entry strictly above it is taken (in descending
    score order), and the rest is drawn without replacement from the entries exactly equal to it.
    """
    # partitioning the negated values at k-1 stays fast when most scores are tied (argpartition at n-k does not)
    threshold = -np.partition(-score, k - 1)[k - 1]
    above = np.flatnonzero(score > threshold)  # fewer than k
    above = above[np.argsort(-score[above], kind="stable")]
    ties = np.flatnonzero(score == threshold)  # at least k - len(above)
    drawn = rng.choice(ties, size=k - above.size, replace=False)
    return np.concatenate([above, drawn]).astype(np.int64, copy=False)


def excluding(exclude: np.ndarray | None) -> set[int]:
    """``exclude`` as a set of ids (empty for None)."""
    return set() if exclude is None else {int(i) for i in np.asarray(exclude).reshape(-1)}


def allowed_ids(num_prompts: int, exclude: np.ndarray | None, need: int) -> np.ndarray:
    """``[S - |exclude|]`` ids of the pool that are not excluded; at least ``need`` of them (else a ValueError that
    says why: too many prompts in flight for the pool)."""
    ids = np.setdiff1d(np.arange(num_prompts, dtype=np.int64), np.asarray(exclude, dtype=np.int64))
    if ids.size < need:
        raise ValueError(f"only {ids.size} of {num_prompts} prompts are not in flight, fewer than the {need} to "
                         "select: lower model.asynchronous.depth or the batch size")
    return ids


def draw_excluding(draw: Any, k: int, exclude: np.ndarray | None, num_prompts: int) -> np.ndarray:
    """``[k]`` distinct ids from a stream ``draw(n) -> [n] ids``, skipping the ``exclude`` ones (they are consumed
    from the stream, as candidates already taken); with nothing to exclude, exactly ``draw(k)``."""
    skip = excluding(exclude)
    if not skip:
        return draw(k)
    out: list[int] = []
    drawn = 0
    while len(out) < k:
        if drawn > 2 * num_prompts:
            raise ValueError(f"the stream cannot give {k} prompts that are not in flight ({len(skip)} are): lower "
                             "model.asynchronous.depth or the batch size")
        batch = [int(i) for i in draw(min(k - len(out), num_prompts))]
        drawn += len(batch)
        for i in batch:
            if i not in skip:
                skip.add(i)  # taken: never twice
                out.append(i)
    return np.asarray(out[:k], dtype=np.int64)


def validate_candidate_ratio(candidate_ratio: int | None, option: str = "candidate_ratio") -> int | None:
    """``None`` (rank the whole pool) or an integer >= 1."""
    if candidate_ratio is None:
        return None
    if int(candidate_ratio) != candidate_ratio or candidate_ratio < 1:
        raise ValueError(f"`{option}` must be an integer >= 1 or None (the whole pool), got {candidate_ratio!r}")
    return int(candidate_ratio)
