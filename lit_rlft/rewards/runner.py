"""Run several reward functions on a batch of completions, with weights, isolation, a time bound and accounting.

A reward function follows TRL's convention: ``fn(completions: list[str], **columns) -> list[float | None]``.
Training must go on when a reward function misbehaves on one completion, so the runner scores each completion on
its own, in worker processes (:mod:`lit_rlft.runtime.worker_pool`): a completion whose scoring raises, runs past
``timeout_s`` or gives None / NaN / inf scores the fallback (0) alone and is counted. A function that returns the
wrong number of scores, or a non-number, breaks the contract itself and raises ``ValueError``.

Reward models, LLM judges and remote scorers (:class:`~lit_rlft.rewards.batched.BatchedReward`) are scored the other
way: over the whole batch (or each group) in this process, each in a thread of its own while the rule rewards'
workers run, so that several scorers cost the slowest of them, not their sum. Their per-completion failures
(:class:`~lit_rlft.rewards.batched.Failure`) are counted like the rule rewards' ones.
"""

from __future__ import annotations

import inspect
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lit_rlft.rewards.batched import Failure, ScoreCache, is_batched, score_batched
from lit_rlft.rewards.score_job import score_job, split_rows
from lit_rlft.runtime.imports import import_object
from lit_rlft.runtime.worker_pool import CONTRACT, ERROR, OK, TIMEOUT, Job, JobResult, WorkerPool

__all__ = ["RewardFunc", "RewardResult", "RewardRunner", "resolve_reward", "reward_name"]

RewardFunc = Callable[..., Sequence[float | None]]
"""``fn(completions: list[str], **columns) -> list[float | None]``."""

_COUNTERS = ("num_calls", "num_errors", "num_timeouts", "num_unscored")


@dataclass
class RewardResult:
    """Scores of one batch of ``N`` completions.

    Attributes:
        total: ``[N]`` float32, weighted sum over functions (failed scores count as the runner's fallback, 0).
        per_func: function name -> ``[N]`` float32 unweighted scores (same fallback).
        num_errors: (function, completion) scorings that raised, summed over functions.
        num_timeouts: (function, completion) scorings that ran past the bound, summed over functions.
        num_unscored: None (or NaN / infinite) scores returned, summed over functions.
        failures: function name -> ``{"num_errors": n, "num_timeouts": n, "num_unscored": n}`` (functions that
            failed on at least one completion).
        examples: function name -> one failure of it, in words (the exception, the bound).
    """

    total: torch.Tensor
    per_func: dict[str, torch.Tensor] = field(default_factory=dict)
    num_errors: int = 0
    num_timeouts: int = 0
    num_unscored: int = 0
    failures: dict[str, dict[str, int]] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)


def reward_name(func: Callable[..., Any]) -> str:
    """Display name of a reward function: its ``name`` attribute, ``__name__``, wrapped function's name
    (``functools.partial``) or class name, in that order."""
    name = getattr(func, "name", None)
    if isinstance(name, str) and name:
        return name
    name = getattr(func, "__name__", None)
    if isinstance(name, str) and name:
        return name
    inner = getattr(func, "func", None)
    if inner is not None and callable(inner):
        return reward_name(inner)
    return type(func).__name__


def _instantiate(obj: Any, path: str, init_args: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """Turn what a path named into a reward callable: a class is instantiated, a module gives ``<name>_reward``."""
    if inspect.ismodule(obj):
        short = obj.__name__.rsplit(".", 1)[-1]
        func = getattr(obj, f"{short}_reward", None)
        if func is None or not callable(func):
            raise ValueError(f"cannot resolve reward function {path!r}: it is a module without a {short}_reward")
        return func
    if inspect.isclass(obj):
        return obj(**dict(init_args or {}))
    if init_args:
        raise ValueError(f"reward {path!r} is not a class, it takes no init_args")
    if not callable(obj):
        raise ValueError(f"cannot resolve reward function {path!r}: {type(obj).__name__} is not callable")
    return obj


def resolve_reward(obj: Any) -> Callable[..., Sequence[Any]]:
    """A reward callable from a callable, a dotted path or a ``{"class_path", "init_args"}`` mapping.

    - a callable (not a class) is returned as is;
    - ``"lit_rlft.rewards.math_reward"``: the module is imported and the attribute returned;
    - a path naming a class (``"lit_rlft.rewards.CountdownReward"``) or a class: instantiated without arguments;
    - a path naming a module (``"lit_rlft.rewards.countdown"``): its ``countdown_reward`` function;
    - ``{"class_path": "lit_rlft.rewards.CountdownReward", "init_args": {"format_reward": 0.1}}``: instantiated.
    - TRL's convention: a string that names a directory (``runs/rm``), or that is not a dotted path but looks like a
      hub id (``org/name``), loads a sequence-classification reward model
      (:class:`~lit_rlft.rewards.model.RewardModel` with its defaults).

    Raises:
        ValueError: the path, or what it names, does not resolve to a callable (the message names the path).
    """
    if isinstance(obj, str):
        text = obj.strip()
        if _names_reward_model(text):
            from lit_rlft.rewards.model import RewardModel

            return RewardModel(text)
        return _instantiate(import_object(text, "reward function"), obj)
    if isinstance(obj, Mapping):
        if "class_path" not in obj:
            raise ValueError(f"a reward given as a mapping needs a 'class_path' key, got keys {sorted(obj)}")
        path = str(obj["class_path"])
        return _instantiate(import_object(path, "reward function"), path, obj.get("init_args"))
    if inspect.isclass(obj):
        return obj()
    if callable(obj):
        return obj
    raise ValueError(f"a reward must be a callable or a dotted path, got {type(obj).__name__}: {obj!r}")


def _names_reward_model(text: str) -> bool:
    """Whether a reward string names a reward model (TRL's convention) rather than a dotted path: a directory, or
    ``org/name`` (a hub id; dotted paths have no ``/``)."""
    from pathlib import Path

    return "/" in text or Path(text).expanduser().is_dir()


def _unique_names(funcs: Sequence[Callable[..., Any]]) -> list[str]:
    """Display names, with ``_2``, ``_3``... appended to repeats."""
    names: list[str] = []
    for func in funcs:
        base = reward_name(func)
        name, k = base, 1
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.append(name)
    return names


class RewardRunner:
    """Score completions with several reward functions and combine them with weights, one completion at a time.

    Every (function, completion) pair is scored on its own (the function is called with one-element lists), so a
    completion that makes a function raise, run past ``timeout_s`` or return None / NaN / inf scores ``fallback``
    alone, is counted, and changes no other completion's score. With ``timeout_s`` set, the calls run in worker
    processes (:class:`~lit_rlft.runtime.worker_pool.WorkerPool`, started on first use and reused) and a call past the
    bound has its process killed and replaced: the bound is real, and nothing keeps running after it.

    Args:
        funcs: reward functions (callables, or anything :func:`resolve_reward` accepts).
        weights: one weight per function (default: all 1.0).
        timeout_s: longest one function may spend on one completion, in seconds. None scores in the calling
            process without a bound (debugging; still isolates exceptions per completion).
        num_workers: reward processes (default: the CPU cores shared among the node's ranks, 1 to 4).
        fallback: the score of a completion that raised, timed out or got no finite score.
        warn_interval_s: failures are reported as a console warning (rank 0) at most this often, with counts.
        report: print failures at all (a :class:`~lit_rlft.step.grpo.GRPOStep` turns this off: it gathers every
            rank's counts from :class:`RewardResult` and prints them itself, naming the rank).
        start_method: ``fork`` (default on Linux: closures work), ``forkserver`` or ``spawn``.

    Example:
        >>> runner = RewardRunner(["lit_rlft.rewards.exact_match_reward"], timeout_s=None)
        >>> runner(["4", "5"], {"answer": ["4", "4"]}).total
        tensor([1., 0.])
    """

    def __init__(
        self,
        funcs: Sequence[Callable[..., Any] | str],
        weights: Sequence[float] | None = None,
        timeout_s: float | None = 10.0,
        num_workers: int | None = None,
        fallback: float = 0.0,
        warn_interval_s: float = 60.0,
        report: bool = True,
        start_method: str | None = None,
    ) -> None:
        if isinstance(funcs, (str, Mapping)) or callable(funcs):
            funcs = [funcs]  # type: ignore[list-item]
        if not funcs:
            raise ValueError("RewardRunner needs at least one reward function")
        self.funcs: list[Callable[..., Any]] = [resolve_reward(f) for f in funcs]
        self.names: list[str] = _unique_names(self.funcs)
        if weights is None:
            weights = [1.0] * len(self.funcs)
        if len(weights) != len(self.funcs):
            raise ValueError(f"{len(weights)} reward weights for {len(self.funcs)} reward functions")
        self.weights: list[float] = [float(w) for w in weights]
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive or None, got {timeout_s}")
        if not math.isfinite(fallback):
            raise ValueError(f"fallback must be a finite score, got {fallback}")
        self.timeout_s = timeout_s
        self.fallback = float(fallback)
        self.warn_interval_s = float(warn_interval_s)
        self.report = report
        self.batched: list[int] = [i for i, f in enumerate(self.funcs) if is_batched(f)]
        """Indices of the functions scored over the batch in this process (reward models, judges, remote)."""
        self.isolated: list[int] = [i for i in range(len(self.funcs)) if i not in self.batched]
        """Indices of the rule rewards, scored one completion at a time (in worker processes with ``timeout_s``)."""
        self.caches: dict[int, ScoreCache] = {
            i: ScoreCache(int(getattr(self.funcs[i], "cache_size", 100_000)))
            for i in self.batched if getattr(self.funcs[i], "cacheable", False)}
        self.pool: WorkerPool | None = (
            None if timeout_s is None or not self.isolated
            else WorkerPool([self.funcs[i] for i in self.isolated], timeout_s, num_workers, start_method,
                            call=score_job, name="lit-rlft-reward")
        )
        self._threads: ThreadPoolExecutor | None = None
        self.totals: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        """Cumulative counters over all calls: num_calls, num_errors, num_timeouts, num_unscored."""
        self._unreported: dict[str, int] = dict.fromkeys(("num_scorings", *_COUNTERS[1:]), 0)
        self._examples: dict[str, str] = {}
        self._last_warning: float | None = None
        self._seed_base: int | None = None
        self._seed_calls = 0

    # ------------------------------------------------------------------------------------------- reporting
    def _report(self, result: RewardResult, examples: dict[str, str]) -> None:
        """Warn (rank 0) about failures, at most once per ``warn_interval_s``, with the counts since the last one."""
        if not self.report:
            return
        self._unreported["num_scorings"] += len(self.funcs) * int(result.total.numel())
        self._unreported["num_errors"] += result.num_errors
        self._unreported["num_timeouts"] += result.num_timeouts
        self._unreported["num_unscored"] += result.num_unscored
        for kind, example in examples.items():
            self._examples.setdefault(kind, example)
        now = time.monotonic()
        if not (self._unreported["num_errors"] or self._unreported["num_timeouts"] or self._unreported["num_unscored"]):
            return
        if self._last_warning is not None and now - self._last_warning < self.warn_interval_s:
            return
        since = "since the start" if self._last_warning is None else f"in the last {now - self._last_warning:.0f} s"
        self._last_warning = now
        counts = self._unreported
        parts = [
            f"{counts['num_errors']} raised" if counts["num_errors"] else "",
            f"{counts['num_timeouts']} timed out (> {self.timeout_s} s)" if counts["num_timeouts"] else "",
            f"{counts['num_unscored']} unscored (None / NaN / inf)" if counts["num_unscored"] else "",
        ]
        details = "; ".join(self._examples.values())
        message = (f"rewards: of {counts['num_scorings']} completion scorings {since}, "
                   f"{', '.join(p for p in parts if p)}; each scored {self.fallback:g} alone, the others kept their "
                   f"scores ({details}). Counted in rewards/num_errors, rewards/num_timeouts, rewards/num_unscored.")
        self._unreported = dict.fromkeys(("num_scorings", *_COUNTERS[1:]), 0)
        self._examples = {}
        if _is_rank_zero():
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    # ----------------------------------------------------------------------------------------------- scoring
    def _check_columns(self, n: int, columns: Mapping[str, Any]) -> None:
        """Column lists must align with the completions; ``completions`` cannot be a column."""
        if "completions" in columns:
            raise ValueError("'completions' cannot be a column name: it is the first argument of reward functions")
        for key, column in columns.items():
            if isinstance(column, (list, tuple)) and len(column) != n:
                raise ValueError(f"column {key!r} has {len(column)} rows for {n} completions")

    def _task_seeds(self, count: int) -> list[int | None]:
        """Per-task seeds for the worker processes, from torch's current seed (which ``GRPOModule`` sets from
        ``(generation_seed, step, rank)`` every step, without drawing from it) and the calls made since it was set:
        a reward that samples gives the same scores in a resumed run. Inline scoring draws from the caller's own
        generators, as a direct call would, and gets no seeds."""
        if self.pool is None:
            return [None] * count
        base = torch.initial_seed()
        if base != self._seed_base:
            self._seed_base, self._seed_calls = base, 0
        call = self._seed_calls
        self._seed_calls += 1
        states = np.random.SeedSequence([base, call]).generate_state(count, np.uint64)  # well mixed, [count]
        return [int(v) % 2**63 for v in states]

    def _run(self, jobs: list[Job]) -> list[JobResult]:
        """Score rule-reward jobs (``job.func`` indexes :attr:`isolated`)."""
        if self.pool is not None:
            return self.pool.run(jobs)
        return [score_job(self.funcs[self.isolated[job.func]], job) for job in jobs]

    def _start_batched(self, completions: list[str], columns: dict[str, Any],
                       group_size: int | None) -> dict[int, Future | list[Any]]:
        """Start the batched rewards: each in a thread of its own when anything else runs beside it (the rule rewards'
        workers or another batched reward), inline otherwise."""
        def job(f: int) -> list[Any]:
            return score_batched(self.funcs[f], completions, columns, group_size, self.caches.get(f))

        if len(self.batched) == 1 and not self.isolated:
            return {self.batched[0]: job(self.batched[0])}
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=len(self.batched), thread_name_prefix="lit_rlft-reward")
        return {f: self._threads.submit(job, f) for f in self.batched}

    def __call__(self, completions: Sequence[str], columns: Mapping[str, Any] | None = None, *,
                 group_size: int | None = None) -> RewardResult:
        """Score ``N`` completions.

        Args:
            completions: ``N`` generated texts.
            columns: data set fields as lists aligned with ``completions`` (``answer``, ``prompts``...), passed to
                every function as keyword arguments (rule rewards: one-element lists, one completion per call;
                batched rewards: the whole lists). ``completion_ids`` (token ids) goes to batched rewards only.
            group_size: completions per prompt, consecutive (``G``); needed by group-level rewards.

        Raises:
            ValueError: a function broke its contract (a number of scores other than one per completion, or a
                non-numeric score), or a column is misaligned.
        """
        completions = [str(c) for c in completions]
        columns = dict(columns or {})
        n = len(completions)
        self._check_columns(n, columns)
        if self.batched and self.pool is not None:
            self.pool.start()  # fork the rule workers before the scoring threads exist
        started = self._start_batched(completions, columns, group_size) if self.batched else {}
        rule_columns = {k: v for k, v in columns.items() if k != "completion_ids"}
        rows = split_rows(rule_columns, n)
        seeds = self._task_seeds(len(self.isolated) * n)
        jobs = [Job(j, completions[i], rows[i], seeds[j * n + i]) for j in range(len(self.isolated))
                for i in range(n)]
        try:
            outcomes = self._run(jobs) if jobs else []
        finally:
            batched = {f: r.result() if isinstance(r, Future) else r for f, r in started.items()}
        per_func: dict[int, list[JobResult]] = {f: outcomes[j * n:(j + 1) * n] for j, f in enumerate(self.isolated)}
        for f, scores in batched.items():
            per_func[f] = [_as_result(s) for s in scores]
        result = RewardResult(total=torch.zeros(n, dtype=torch.float32))
        examples: dict[str, str] = {}
        for f, (name, weight) in enumerate(zip(self.names, self.weights)):
            scores = []
            for i in range(n):
                outcome = per_func[f][i]
                if outcome.outcome == CONTRACT:
                    raise ValueError(f"reward function {name!r} {outcome.value} (it must return one score per "
                                     "completion: a float, or None for 'cannot score')")
                if outcome.outcome == OK and outcome.value is not None:
                    scores.append(outcome.value)
                    continue
                scores.append(self.fallback)
                if isinstance(outcome.value, Failure):
                    failure = outcome.value
                    kind, example = failure.counter, failure.message
                    examples.setdefault(failure.kind, f"reward {name!r}: {example}")
                elif outcome.outcome == ERROR:
                    kind, example = "num_errors", f"raised {outcome.value}"
                    examples.setdefault("error", f"reward function {name!r} {example}")
                elif outcome.outcome == TIMEOUT:
                    kind, example = "num_timeouts", f"ran past {self.timeout_s} s"
                    examples.setdefault("timeout", f"reward function {name!r} {example}")
                else:
                    kind, example = "num_unscored", "gave no finite score"
                    examples.setdefault("unscored", f"reward function {name!r} {example}")
                setattr(result, kind, getattr(result, kind) + 1)
                counts = result.failures.setdefault(name, {})
                counts[kind] = counts.get(kind, 0) + 1
                result.examples.setdefault(name, example)
            tensor = torch.tensor(scores, dtype=torch.float32)
            result.per_func[name] = tensor
            result.total += weight * tensor
        self.totals["num_calls"] += 1
        self.totals["num_errors"] += result.num_errors
        self.totals["num_timeouts"] += result.num_timeouts
        self.totals["num_unscored"] += result.num_unscored
        self._report(result, examples)
        return result

    def close(self) -> None:
        """Stop the worker processes; idempotent (call it any number of times), and a later call starts them again.

        Not calling it leaks nothing: the workers are also stopped when the runner is garbage-collected, at
        interpreter exit, and they die with this process however it ends (see :mod:`lit_rlft.runtime.worker_pool`).
        """
        if self.pool is not None:
            self.pool.close()
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        for f in self.batched:
            self.funcs[f].close()

    def shard(self, mesh: Any) -> list[str]:
        """Shard the batched rewards that can be (reward models) like the policy, over ``mesh``; their names."""
        done = []
        for f in self.batched:
            shard = getattr(self.funcs[f], "shard", None)
            if callable(shard):
                shard(mesh)
                done.append(self.names[f])
        return done

    @property
    def scores_batches(self) -> bool:
        """Whether a reward scores over the whole batch (a reward model, judge or remote scorer): the rollout worker
        then also passes the completions' token ids and the group size."""
        return bool(self.batched)

    @property
    def uses_global_rng(self) -> bool:
        """Whether a batched reward samples from torch's global generator (an :class:`~lit_rlft.rollout.EngineJudge`),
        so it must not score while the policy generates."""
        return any(getattr(self.funcs[f], "uses_global_rng", False) for f in self.batched)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_threads"] = None  # a thread pool does not cross processes; the copy starts its own
        return state

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        funcs = ", ".join(f"{name}*{weight:g}" for name, weight in zip(self.names, self.weights))
        workers = "inline" if self.pool is None else f"{self.pool.num_workers} processes"
        if self.batched:
            workers += f", {len(self.batched)} batched"
        return f"RewardRunner([{funcs}], timeout_s={self.timeout_s}, {workers})"


def _as_result(score: Any) -> JobResult:
    """A batched reward's score for one completion as a job result (a :class:`Failure` kept as the value)."""
    if isinstance(score, Failure):
        return JobResult(ERROR, score)
    return JobResult(OK, score)


def _is_rank_zero() -> bool:
    """Whether this process is global rank 0: the initialised process group's rank, else the launcher's ``RANK``
    variable (set by torchrun, Lightning and Fabric before the group exists)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0") or 0) == 0
