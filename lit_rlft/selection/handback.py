"""Handing the batch back to uniform sampling as the pool is used up (Lightning-free).

A selector that ranks prompts by their predicted informativeness leads uniform GRPO early and can fall behind it
once the pool has been passed over several times: it keeps drawing the prompts it has learned to call informative,
which the policy then fits (training-pool reward rises, held-out accuracy does not), while uniform keeps its breadth.
The schedule here hands a growing share of each batch back to uniform sampling as the run's passes over the pool
grow: none before ``start`` passes, all of it from ``end`` passes on, linearly in between.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def handback_share(passes: float, start: float, end: float) -> float:
    """The share of a batch drawn uniformly after ``passes`` passes over the pool (prompt draws / pool size).

    ``0`` up to ``start``, ``1`` from ``end`` on, linear in between (a step at ``start`` when ``end == start``).
    """
    if start < 0 or end < start:
        raise ValueError(f"need 0 <= start <= end (in passes over the pool), got start={start}, end={end}")
    if passes < start:
        return 0.0
    if passes >= end:
        return 1.0
    return (passes - start) / (end - start)


def hand_back(selected: np.ndarray, share: float, rng: np.random.Generator,
              draw_uniform: Callable[[int, set[int]], np.ndarray]) -> np.ndarray:
    """``selected`` ``[B]`` with ``round(share * B)`` of its ids, chosen at random, replaced by uniform draws.

    Args:
        selected: the selector's batch ``[B]`` (distinct prompt ids).
        share: the share to hand back, in ``[0, 1]``.
        rng: chooses which of the selector's ids give way.
        draw_uniform: ``(n, used) -> ids [<= n]``: the next ids of the uniform order that are not in ``used``
            (:meth:`lit_rlft.data.plan.BatchPlan.draw_unused`).

    Returns:
        ``[B]`` distinct ids: the kept selections (in their order) then the uniform draws. When the uniform order
        has fewer unused ids than asked (a tiny pool), the selector's ids fill the rest.
    """
    selected = np.asarray(selected, dtype=np.int64)
    n = int(round(share * selected.size))
    if n <= 0:
        return selected
    order = rng.permutation(selected.size)
    kept, dropped = selected[np.sort(order[n:])], selected[np.sort(order[:n])]
    drawn = np.asarray(draw_uniform(n, set(kept.tolist())), dtype=np.int64)
    short = n - drawn.size
    return np.concatenate([kept, drawn, dropped[:short]]) if short > 0 else np.concatenate([kept, drawn])
