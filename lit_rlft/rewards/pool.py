"""Score completions one at a time in worker processes that can be killed: isolation and a real time bound.

A reward function is untrusted code applied to untrusted text. Called over a whole batch in the training process,
one hostile completion can make it raise (scoring every other completion 0) or run forever in C code that no Python
timeout interrupts. Here every (function, completion) pair is its own task:

- a task that raises, or whose worker dies, scores the fallback alone;
- a task that runs past ``timeout_s`` gets its worker killed (``SIGKILL``) and replaced; the other tasks of the call
  go on in the other workers and in the replacement;
- workers are started once and reused across calls (fork by default, so closures and lambdas work), so a call costs
  one pipe round trip per chunk of tasks.

The bound: a task finishes, or is abandoned and its process killed, within ``timeout_s`` plus the polling slack
(tens of milliseconds) of the moment its worker started it. A call with ``H`` hostile tasks on ``W`` workers takes
its normal time plus at most ``ceil(H / W) * timeout_s`` plus the replacements' start-up.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["OK", "ERROR", "TIMEOUT", "CONTRACT", "Task", "TaskResult", "WorkerPool", "default_num_workers", "score_task"]

OK, ERROR, TIMEOUT, CONTRACT = "ok", "error", "timeout", "contract"
"""Task outcomes: a score (float, or None for unscored), an exception, past the time bound, a broken contract."""

_MAX_CHUNK = 32
_MAX_MESSAGE = 300


@dataclass(frozen=True)
class Task:
    """One function on one completion: ``funcs[func](completions=[completion], **row)``; with a ``seed``, the
    worker seeds ``random``, numpy and torch with it first (a reward that samples is reproducible)."""

    func: int
    completion: str
    row: dict[str, Any]
    seed: int | None = None


def _seed_everything(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass(frozen=True)
class TaskResult:
    """``outcome`` is OK (``value`` a float or None), ERROR / CONTRACT (``value`` the message) or TIMEOUT."""

    outcome: str
    value: Any = None


def default_num_workers() -> int:
    """Reward workers for this process: the CPU cores shared among the node's ranks, between 1 and 4."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, min(4, cores // local_ranks))


def _as_score(raw: Any) -> TaskResult:
    """A function's return value for one completion: exactly one number (or None)."""
    if hasattr(raw, "detach") and hasattr(raw, "reshape"):  # a tensor
        raw = raw.detach().cpu().reshape(-1).tolist()
    if isinstance(raw, (str, bytes)) or not hasattr(raw, "__len__"):
        return TaskResult(CONTRACT, f"returned {type(raw).__name__}, expected a list of scores")
    if len(raw) != 1:
        return TaskResult(CONTRACT, f"returned {len(raw)} scores for 1 completion")
    value = raw[0]
    if value is None:
        return TaskResult(OK, None)
    try:
        score = float(value)
    except (TypeError, ValueError, OverflowError):
        return TaskResult(CONTRACT, f"returned a non-numeric score {str(value)[:80]!r}")
    return TaskResult(OK, score if math.isfinite(score) else None)


def score_task(func: Callable[..., Any], task: Task) -> TaskResult:
    """Run one task in this process; exceptions become ERROR results (the message is truncated)."""
    try:
        raw = func(completions=[task.completion], **task.row)
    except Exception as exc:  # untrusted input: any failure scores this completion alone
        return TaskResult(ERROR, f"{type(exc).__name__}: {str(exc)[:_MAX_MESSAGE]}")
    return _as_score(raw)


def _worker_main(conn: Connection, funcs: Sequence[Callable[..., Any]]) -> None:
    """Worker loop: receive a chunk of tasks, send one result per task as it finishes, until ``None`` or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # A forked child inherits the trainer's Python handlers (Lightning catches SIGTERM); multiprocessing stops
    # daemonic children with SIGTERM at exit, and a worker that survived it would hang the parent's exit.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import torch

        torch.set_num_threads(1)  # a forked child must not use the parent's OpenMP pool
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for task in chunk:
            if task.seed is not None:
                _seed_everything(task.seed)
            conn.send(score_task(funcs[task.func], task))


@dataclass
class _Worker:
    process: Any
    conn: Connection
    chunk: list[int] = field(default_factory=list)  # task indices sent, not yet answered, in order
    started: float = 0.0  # when the task at chunk[0] started (the previous answer, or the send)


class WorkerPool:
    """Worker processes scoring :class:`Task` lists with per-task isolation and a per-task time bound.

    Args:
        funcs: the reward callables; with ``start_method="fork"`` (default on Linux) they reach the workers by
            inheritance, so closures work; other start methods need picklable functions.
        timeout_s: the per-task bound, in seconds.
        num_workers: processes (default :func:`default_num_workers`).
        start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"`` (default: fork where available).
    """

    def __init__(
        self,
        funcs: Sequence[Callable[..., Any]],
        timeout_s: float,
        num_workers: int | None = None,
        start_method: str | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.funcs = list(funcs)
        self.timeout_s = float(timeout_s)
        self.num_workers = default_num_workers() if num_workers is None else int(num_workers)
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if start_method is None:
            start_method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        self._ctx = mp.get_context(start_method)
        self._workers: list[_Worker] = []
        self.restarts = 0
        """Workers killed (timeouts) or found dead, and replaced, since the pool started."""

    # ------------------------------------------------------------------------------------------- processes
    def _start_worker(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=_worker_main, args=(child, self.funcs), daemon=True, name="lit-rlft-reward")
        process.start()
        child.close()
        return _Worker(process, parent)

    def _ensure_started(self) -> None:
        while len(self._workers) < self.num_workers:
            self._workers.append(self._start_worker())

    def _replace(self, index: int) -> None:
        """Kill worker ``index`` (if alive), reap it and start a fresh one in its place."""
        worker = self._workers[index]
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=5)
        worker.conn.close()
        self._workers[index] = self._start_worker()
        self.restarts += 1

    def close(self) -> None:
        """Stop every worker (idempotent); a later :meth:`run` starts new ones."""
        for worker in self._workers:
            with contextlib.suppress(OSError, ValueError):
                worker.conn.send(None)
        deadline = time.monotonic() + 1.0
        for worker in self._workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5)
            worker.conn.close()
        self._workers = []

    def pids(self) -> list[int]:
        """Process ids of the current workers."""
        return [worker.process.pid for worker in self._workers]

    # ------------------------------------------------------------------------------------------------- run
    def run(self, tasks: Sequence[Task]) -> list[TaskResult]:
        """Score every task; results in task order."""
        results: list[TaskResult | None] = [None] * len(tasks)
        if not tasks:
            return []
        self._ensure_started()
        size = max(1, min(_MAX_CHUNK, math.ceil(len(tasks) / (4 * self.num_workers))))
        pending: deque[list[int]] = deque(list(range(i, min(i + size, len(tasks)))) for i in range(0, len(tasks), size))
        while pending or any(worker.chunk for worker in self._workers):
            self._dispatch(tasks, pending)
            self._collect(results, pending)
            self._enforce_timeouts(results, pending)
        return [result if result is not None else TaskResult(ERROR, "lost") for result in results]

    def _dispatch(self, tasks: Sequence[Task], pending: deque[list[int]]) -> None:
        """Give the next chunk to every idle worker; a worker found dead is replaced first."""
        for index in range(len(self._workers)):
            if self._workers[index].chunk or not pending:
                continue
            chunk = pending.popleft()
            for _attempt in range(2):
                worker = self._workers[index]
                try:
                    worker.conn.send([tasks[i] for i in chunk])
                except (OSError, ValueError):
                    self._replace(index)
                    continue
                worker.chunk, worker.started = list(chunk), time.monotonic()
                break
            else:
                pending.appendleft(chunk)
                raise RuntimeError("reward worker processes cannot be started")

    def _collect(self, results: list[TaskResult | None], pending: deque[list[int]]) -> None:
        """Wait (until the earliest deadline) for answers and record them."""
        busy = [worker for worker in self._workers if worker.chunk]
        if not busy:
            return
        now = time.monotonic()
        wait_s = max(0.0, min(worker.started + self.timeout_s for worker in busy) - now)
        ready = set(wait([worker.conn for worker in busy], timeout=wait_s))
        for index, worker in enumerate(self._workers):
            if worker.conn not in ready:
                continue
            while worker.chunk and worker.conn.poll():
                try:
                    result = worker.conn.recv()
                except (EOFError, OSError):  # died mid-task (segfault, out of memory)
                    results[worker.chunk.pop(0)] = TaskResult(ERROR, "reward worker process died")
                    rest = worker.chunk
                    worker.chunk = []
                    self._replace(index)
                    if rest:
                        pending.appendleft(rest)
                    break
                results[worker.chunk.pop(0)] = result
                worker.started = time.monotonic()

    def _enforce_timeouts(self, results: list[TaskResult | None], pending: deque[list[int]]) -> None:
        """Kill and replace every worker whose current task ran past the bound; requeue the rest of its chunk."""
        now = time.monotonic()
        for index, worker in enumerate(self._workers):
            if worker.chunk and now - worker.started >= self.timeout_s:
                results[worker.chunk.pop(0)] = TaskResult(TIMEOUT)
                rest = worker.chunk
                worker.chunk = []
                self._replace(index)
                if rest:
                    pending.appendleft(rest)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_workers"] = []  # processes do not travel; they restart on first use
        state["_ctx"] = self._ctx.get_start_method()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["_ctx"] = mp.get_context(state["_ctx"])
        self.__dict__.update(state)

    def __del__(self) -> None:
        try:  # noqa: SIM105 - contextlib may already be gone at interpreter shutdown
            self.close()
        except Exception:  # interpreter shutdown
            pass


def split_rows(columns: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """Per-completion keyword arguments: list / tuple columns are sliced to one-element lists, others passed."""
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, column in columns.items():
        for i in range(n):
            rows[i][key] = [column[i]] if isinstance(column, (list, tuple)) else column
    return rows
