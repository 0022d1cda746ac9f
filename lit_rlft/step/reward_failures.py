"""Reward failures counted over every rank, and printed once on rank 0 naming the rank and the function.

A reward function that raises, runs past its bound or gives no finite score on one completion scores the fallback
(0) for that completion alone (see :class:`~lit_rlft.rewards.runner.RewardRunner`). The step gathers each rank's
counts with the outcome record, so the totals (``rewards/num_errors``, ``rewards/num_timeouts``,
``rewards/num_unscored``, and per reward ``rewards/<name>/num_errors``... once it has failed; checkpointed) and the
console warning cover every rank, not only rank 0's.
"""

from __future__ import annotations

import time
import warnings
from collections import defaultdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lit_rlft.rewards.runner import RewardResult

__all__ = ["RewardFailureLog", "episode_metrics", "episode_sums", "failure_counts"]

KINDS = {"num_errors": "raised", "num_timeouts": "timed out", "num_unscored": "gave no finite score"}


def failure_counts(result: RewardResult) -> dict[str, Any]:
    """What one rank sends about one scoring call: ``{"num_calls": 1, "functions": {name: {kind: n}},
    "examples": {name: text}}`` (from a :class:`~lit_rlft.rewards.runner.RewardResult`)."""
    functions = {name: {k: int(v) for k, v in counts.items() if v} for name, counts in result.failures.items()}
    return {"num_calls": 1, "functions": {n: c for n, c in functions.items() if c}, "examples": dict(result.examples)}


class RewardFailureLog:
    """Totals of reward failures over all ranks, and a rate-limited warning (rank 0) naming rank and function.

    Args:
        warn_interval_s: at most one warning this often, with the counts since the previous one.
    """

    def __init__(self, warn_interval_s: float = 60.0):
        self.warn_interval_s = warn_interval_s
        self.totals: dict[str, int] = {}
        self._pending: dict[tuple[int, str, str], int] = defaultdict(int)  # (rank, function, kind) -> count
        self._examples: dict[tuple[int, str], str] = {}
        self._last: float | None = None

    def add(self, per_rank: list[dict[str, Any]]) -> None:
        """Count one gathered call: ``per_rank[r]`` is rank ``r``'s :func:`failure_counts`."""
        for rank, part in enumerate(per_rank):
            self.totals["num_calls"] = self.totals.get("num_calls", 0) + int(part.get("num_calls", 0))
            for kind in KINDS:
                self.totals.setdefault(kind, 0)
            for name, counts in part.get("functions", {}).items():
                for kind, n in counts.items():
                    self.totals[kind] = self.totals.get(kind, 0) + int(n)
                    self.totals[f"{name}/{kind}"] = self.totals.get(f"{name}/{kind}", 0) + int(n)  # per reward
                    self._pending[(rank, name, kind)] += int(n)
                example = part.get("examples", {}).get(name)
                if example:
                    self._examples.setdefault((rank, name), example)

    def warn(self, is_global_zero: bool, fallback: float = 0.0) -> str | None:
        """Print (rank 0) and return the pending failures, at most once per ``warn_interval_s``."""
        if not self._pending:
            return None
        now = time.monotonic()
        if self._last is not None and now - self._last < self.warn_interval_s:
            return None
        since = "since the start" if self._last is None else f"in the last {now - self._last:.0f} s"
        self._last = now
        parts = []
        for (rank, name, kind), n in sorted(self._pending.items()):
            example = self._examples.get((rank, name))
            parts.append(f"rank {rank}: reward function {name!r} {KINDS.get(kind, kind)} on {n} completion(s)"
                         + (f" ({example})" if example else ""))
        self._pending.clear()
        self._examples.clear()
        message = (f"reward failures {since}: {'; '.join(parts)}. Each failed completion scored {fallback:g} alone, "
                   "the others kept their scores; counted in rewards/num_errors, rewards/num_timeouts, "
                   "rewards/num_unscored.")
        if is_global_zero:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return message

    def state_dict(self) -> dict[str, int]:
        return dict(self.totals)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.totals = {k: int(v) for k, v in state.items()}


def episode_sums(parts: list[dict[str, float] | None]) -> dict[str, float]:
    """Every rank's multi-turn episode sums (:meth:`~lit_rlft.rollout.episodes.EpisodeOutput.stats`) added up; empty
    without an environment."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in (part or {}).items():
            out[k] = out.get(k, 0.0) + float(v)
    return out


def episode_metrics(sums: dict[str, float]) -> dict[str, float]:
    """TensorBoard scalars under ``episodes/`` from a step's summed episode counts (empty without an environment):
    means per episode of turns, tool calls, policy and observation tokens; the tool failure rate; the share of
    episodes the environment ended (the rest hit ``max_turns`` or the token budget) and of truncated ones; the
    environment steps that raised or timed out."""
    n = sums.get("episodes", 0.0)
    if not n:
        return {}
    calls = sums.get("tool_calls", 0.0)
    return {
        "episodes/turns_mean": sums.get("turns", 0.0) / n,
        "episodes/tool_calls_mean": calls / n,
        "episodes/tool_failure_rate": sums.get("tool_failures", 0.0) / calls if calls else 0.0,
        "episodes/policy_tokens_mean": sums.get("policy_tokens", 0.0) / n,
        "episodes/observation_tokens_mean": sums.get("observation_tokens", 0.0) / n,
        "episodes/ended_by_env": sums.get("ended_by_env", 0.0) / n,
        "episodes/truncated": sums.get("truncated", 0.0) / n,
        "episodes/env_errors": sums.get("env_errors", 0.0),
        "episodes/env_timeouts": sums.get("env_timeouts", 0.0),
    }
