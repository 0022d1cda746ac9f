"""One reward function on one completion, as a job of the worker pool (:mod:`lit_rlft.runtime.worker_pool`).

:class:`~lit_rlft.rewards.runner.RewardRunner` scores every (function, completion) pair on its own: a
:class:`~lit_rlft.runtime.worker_pool.Job` whose ``row`` holds the completion's data-set columns as one-element lists
(:func:`split_rows`), run by :func:`score_job` in a worker process (or inline, without a time bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from lit_rlft.runtime.worker_pool import CONTRACT, ERROR, OK, Job, JobResult

__all__ = ["score_job", "split_rows"]

_MAX_MESSAGE = 300


def _as_score(raw: Any) -> JobResult:
    """A function's return value for one completion: exactly one number (or None)."""
    if hasattr(raw, "detach") and hasattr(raw, "reshape"):  # a tensor
        raw = raw.detach().cpu().reshape(-1).tolist()
    if isinstance(raw, (str, bytes)) or not hasattr(raw, "__len__"):
        return JobResult(CONTRACT, f"returned {type(raw).__name__}, expected a list of scores")
    if len(raw) != 1:
        return JobResult(CONTRACT, f"returned {len(raw)} scores for 1 completion")
    value = raw[0]
    if value is None:
        return JobResult(OK, None)
    try:
        score = float(value)
    except (TypeError, ValueError, OverflowError):
        return JobResult(CONTRACT, f"returned a non-numeric score {str(value)[:80]!r}")
    return JobResult(OK, score if math.isfinite(score) else None)


def score_job(func: Callable[..., Any], job: Job) -> JobResult:
    """Score one completion, ``func(completions=[job.completion], **job.row)``, in this process: OK with a float
    (None for None / NaN / inf), CONTRACT for anything but one number, ERROR for an exception (the message cut)."""
    try:
        raw = func(completions=[job.completion], **job.row)
    except Exception as exc:  # untrusted input: any failure scores this completion alone
        return JobResult(ERROR, f"{type(exc).__name__}: {str(exc)[:_MAX_MESSAGE]}")
    return _as_score(raw)


def split_rows(columns: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """Per-completion keyword arguments: list / tuple columns are sliced to one-element lists, others passed."""
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, column in columns.items():
        for i in range(n):
            rows[i][key] = [column[i]] if isinstance(column, (list, tuple)) else column
    return rows
