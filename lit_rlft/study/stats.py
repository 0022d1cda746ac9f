"""Small statistics for few seeds: first crossing of a target (censored when never), t-intervals, paired ratios.

Ratios are summarised as the geometric mean of per-seed ratios (runs paired by seed: same pool order seed,
same evaluation noise) with a Student-t interval on the log-ratios, ``exp(mean ± t_{n-1} * sd / sqrt(n))``.
With one usable seed there is no interval. No scipy: the t quantiles are tabulated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# Two-sided 95% Student-t quantiles t_{0.975, df}, df = 1..30; beyond, 1.96.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t_quantile(df: int, confidence: float = 0.95) -> float:
    """Two-sided Student-t quantile (tabulated for 95%; other levels fall back to the normal quantile)."""
    if abs(confidence - 0.95) > 1e-9:
        from statistics import NormalDist

        return NormalDist().inv_cdf(0.5 + confidence / 2)
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


def crossing(xs: Sequence[float], ys: Sequence[float], target: float) -> float | None:
    """First ``x`` at which the curve ``ys`` reaches ``target``, linearly interpolated between evaluation points;
    ``None`` (censored) when it never does. A curve that starts at or above the target crosses at ``xs[0]``."""
    found = crossing_bracket(xs, ys, target)
    return None if found is None else found[0]


def crossing_bracket(xs: Sequence[float], ys: Sequence[float], target: float
                     ) -> tuple[float, float, float] | None:
    """:func:`crossing` with the evaluations around it: ``(x, x_before, x_at)``, where ``x_before`` is the last
    evaluation below ``target`` and ``x_at`` the first at or above it (the crossing is only known to lie between
    them; ``x`` interpolates linearly: ``x_before + (target - y_before) / (y_at - y_before) * (x_at - x_before)``).
    A curve that starts at or above the target gives ``(xs[0], xs[0], xs[0])``; ``None`` when it never gets there."""
    prev_x = prev_y = None
    for x, y in zip(xs, ys):
        if y is None or not math.isfinite(y):
            continue
        if y >= target:
            if prev_y is None or y == prev_y:
                return float(x), float(x if prev_x is None else prev_x), float(x)
            return float(prev_x + (target - prev_y) / (y - prev_y) * (x - prev_x)), float(prev_x), float(x)
        prev_x, prev_y = x, y
    return None


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> dict[str, Any]:
    """Mean with a t-interval over seeds (``low``/``high`` None with fewer than 2 values)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if v.size == 0:
        return {"mean": None, "low": None, "high": None, "n": 0}
    if v.size == 1:
        return {"mean": float(v[0]), "low": None, "high": None, "n": 1}
    if np.all(v == v[0]):  # identical values: no spread (the float residue of std() would print one)
        return {"mean": float(v[0]), "low": float(v[0]), "high": float(v[0]), "n": int(v.size), "equal": True}
    half = t_quantile(v.size - 1, confidence) * v.std(ddof=1) / math.sqrt(v.size)
    return {"mean": float(v.mean()), "low": float(v.mean() - half), "high": float(v.mean() + half), "n": int(v.size)}


def median(values: Sequence[float]) -> float | None:
    """The median (the mean of the two middle values for an even count); None without values.

    >>> median([3.0, 1.0, 2.0]), median([4.0, 1.0, 3.0, 2.0]), median([])
    (2.0, 2.5, None)
    """
    v = sorted(values)
    if not v:
        return None
    mid = len(v) // 2
    return float(v[mid]) if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def ratio_summary(pairs: Sequence[tuple[float | None, float | None]], confidence: float = 0.95) -> dict[str, Any]:
    """Summarise per-seed ratios ``a / b`` from ``(a, b)`` pairs where ``None`` means "not reached" (censored).

    Returns the geometric mean and t-interval over the seeds where both reached, with ``n`` (pairs), ``n_used``,
    ``a_not_reached`` and ``b_not_reached`` counts and ``status``: ``ok`` (every pair usable), ``partial`` (some
    seeds censored: the estimate covers only the rest and is optimistic for whichever side was censored),
    ``not_reached`` (``a`` never reached the target in any seed), ``baseline_not_reached``, ``at_start`` (a cost
    of 0 on either side in every pair: the target was met before training, so no ratio exists) or ``no_data``.
    """
    a_nr = sum(1 for a, _ in pairs if a is None)
    b_nr = sum(1 for _, b in pairs if b is None)
    at_start = sum(1 for a, b in pairs if a is not None and b is not None and min(a, b) <= 0)
    used = [a / b for a, b in pairs if a is not None and b is not None and b > 0 and a > 0]
    out: dict[str, Any] = {"n": len(pairs), "n_used": len(used), "a_not_reached": a_nr, "b_not_reached": b_nr,
                           "at_start": at_start,
                           "per_seed": [None if a is None or b is None or b <= 0 or a <= 0 else a / b for a, b in pairs],
                           "ratio": None, "low": None, "high": None}
    if not pairs:
        out["status"] = "no_data"
    elif at_start == len(pairs):
        out["status"] = "at_start"
    elif a_nr == len(pairs):
        out["status"] = "not_reached"
    elif b_nr == len(pairs):
        out["status"] = "baseline_not_reached"
    elif not used:
        out["status"] = "not_reached"
    else:
        logs = np.log(np.asarray(used))
        out["ratio"] = float(np.exp(logs.mean()))
        if len(used) > 1:
            half = t_quantile(len(used) - 1, confidence) * logs.std(ddof=1) / math.sqrt(len(used))
            out["low"], out["high"] = float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))
        out["status"] = "ok" if len(used) == len(pairs) else "partial"
    return out
