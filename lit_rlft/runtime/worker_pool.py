"""Run jobs one at a time in worker processes that can be killed: isolation and a real time bound.

A job is untrusted code (a reward function, an environment's step) applied to untrusted text. Run over a whole batch
in the training process, one hostile input can make it raise (failing every other input) or run forever in C code
that no Python timeout interrupts. Here every (function, input) pair is its own :class:`Job`, and ``call`` (given
by the user of the pool: :func:`lit_rlft.rewards.score_job.score_job`, :func:`lit_rlft.rollout.episodes.step_job`)
turns one into a :class:`JobResult` inside a worker:

- a job that raises, or whose worker dies, fails alone;
- a job that runs past ``timeout_s`` gets its worker killed (``SIGKILL``) and replaced; the other jobs of the call
  go on in the other workers and in the replacement;
- workers are started once and reused across calls (fork by default, so closures and lambdas work), so a call costs
  one pipe round trip per chunk of jobs: a worker answers a chunk in one message (or a few, one per ``_FLUSH_S`` of
  work), and tells the pool which job it is running, and since when, through a shared-memory word that the pool
  reads when it decides a timeout. Jobs a killed worker had finished but not yet sent run again in another one
  (seeded alike, so they give alike).

The bound: a job finishes, or is abandoned and its process killed, within ``timeout_s`` plus the polling slack
(tens of milliseconds) of the moment its worker started it. A call with ``H`` hostile jobs on ``W`` workers takes
its normal time plus at most ``ceil(H / W) * timeout_s`` plus the replacements' start-up.

Lifetime: a worker, and every process it starts, never outlives the process that started it, however that process
ends (see :mod:`lit_rlft.runtime.processes`).

- On Linux every worker asks the kernel for ``SIGKILL`` when its parent dies (``prctl(PR_SET_PDEATHSIG)``), which
  also ends a job hung in C code; everywhere, an idle worker checks every ``_PARENT_POLL_S`` that its parent is
  still the one that started it, and exits otherwise.
- Every worker runs in a session of its own (``os.setsid()``, right after arming that signal): its process group
  holds whatever it starts (a reward function's forgotten ``subprocess.Popen``, a tool's server). A timeout kill, the
  replacement of a dead worker, :meth:`WorkerPool.close` (after the polite stop) and the finalizer kill the whole
  group, and the group is registered with this process's reaper, which kills it when this process dies (``SIGKILL``
  included). A process that leaves the group (its own ``setsid``) is not covered.
- A forked child (a worker, or any other) closes the pools' parent-side pipe ends it inherited and forgets their
  workers, so a worker's pipe reaches end-of-file as soon as its pool's process closes it or dies.
- The pool is closed when it is garbage-collected and at interpreter exit (``weakref.finalize``); :meth:`close`
  may be called any number of times.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import multiprocessing as mp
import os
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from lit_rlft.runtime.processes import kill_group, new_session, set_parent_death_signal, watch_group

__all__ = ["CONTRACT", "ERROR", "OK", "TIMEOUT", "Job", "JobCall", "JobResult", "WorkerPool", "default_num_workers"]

OK, ERROR, TIMEOUT, CONTRACT = "ok", "error", "timeout", "contract"
"""Job outcomes: a value (a score, an environment's answer), an exception, past the time bound, a broken contract."""

_MAX_CHUNK = 32
_FLUSH_S = 0.05
"""A worker sends the answers it holds before starting a job once they are this old (a kill loses less work)."""
_PARENT_POLL_S = 0.5
"""How often an idle worker checks that its parent is alive (the portable fallback to the parent-death signal)."""


@dataclass(frozen=True)
class Job:
    """One function on one input, run in a worker by the pool's ``call`` (for a reward,
    ``funcs[func](completions=[completion], **row)``); with a ``seed``, the worker seeds ``random``, numpy and torch
    with it first (a function that samples is reproducible)."""

    func: int
    completion: str
    row: dict[str, Any]
    seed: int | None = None


@dataclass(frozen=True)
class JobResult:
    """``outcome`` is OK (``value`` what the call gave), ERROR / CONTRACT (``value`` the message) or TIMEOUT."""

    outcome: str
    value: Any = None


JobCall = Callable[[Callable[..., Any], Job], JobResult]
"""How a worker runs one job: ``call(funcs[job.func], job) -> JobResult``; it catches the function's exceptions
itself (one that escapes kills its worker: the job then fails as "worker process died")."""


def _seed_everything(seed: int) -> None:
    """``random``, numpy and torch's CPU generator; CUDA's and XPU's where they are initialised in this process.

    Not ``torch.manual_seed``: it also queues lazy seeds for every accelerator backend, 60 us a call against 1 us,
    which at one call per job was a third of a cheap rule reward's cost. A function that runs on an accelerator
    inside a worker (possible with ``start_method="spawn"``) is seeded from its second job on, once the backend is
    initialised; initialise it when the function's module is imported to have every job seeded.
    """
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_initialized():
        xpu.manual_seed_all(seed)


def default_num_workers() -> int:
    """Workers for this process: the CPU cores shared among the node's ranks, between 1 and 4."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, min(4, cores // local_ranks))


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie counts as alive: only use it for processes that are not ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _orphaned(parent: int, owner: int) -> bool:
    """Whether the worker's parent (or the pool's process, when a fork server is the parent) is gone: a dead
    parent's children are re-parented, so ``getppid`` changes even while the dead parent is an unreaped zombie."""
    return os.getppid() != parent or (owner != parent and not _pid_alive(owner))


def _worker_main(
    conn: Connection, funcs: Sequence[Callable[..., Any]], owner: int, parent: int | None, death_signal: bool,
    progress: Any, call: JobCall,
) -> None:
    """Worker loop: receive a chunk of jobs, send their results in order (all at the end of the chunk, or those
    held for ``_FLUSH_S`` before the next job starts), until ``None``, EOF or the death of the parent.

    Args:
        conn: this worker's end of its pipe.
        funcs: the callables the jobs index.
        owner: pid of the pool's process.
        parent: the expected parent pid (the owner; None under a fork server: the parent is whoever forked us).
        death_signal: arm the parent-death signal; only when the forking thread lives as long as its process (the
            signal follows the thread that forked, not the process).
        progress: shared ``[position in the chunk, time.monotonic() when it started]`` of the running job (the
            start written first, so that a reader who sees the same position twice around its read of the start
            never pairs a position with an earlier job's start).
        call: runs one job.
    """
    parent = os.getppid() if parent is None else parent
    if death_signal:
        set_parent_death_signal()
    new_session()  # a group of our own: whatever a job starts is killed with us (the death signal survives setsid)
    if _orphaned(parent, owner):  # the parent died before the signal was armed: nothing would ever send it
        return
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
        # Polling (not a blocking recv) is the portable fallback: EOF may never come if a process that outlives
        # the parent still holds the parent's end of the pipe.
        if not conn.poll(_PARENT_POLL_S):
            if _orphaned(parent, owner):
                return
            continue
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        held: list[JobResult] = []
        flushed = time.monotonic()
        for position, job in enumerate(chunk):
            now = time.monotonic()
            if held and now - flushed >= _FLUSH_S:
                conn.send(held)
                held, flushed = [], now
            progress[1] = now
            progress[0] = position
            if job.seed is not None:
                _seed_everything(job.seed)
            held.append(call(funcs[job.func], job))
        conn.send(held)


@dataclass
class _Worker:
    process: Any
    conn: Connection
    progress: Any  # shared [position in `sent`, start time] of the running job (see _worker_main)
    sent: list[int] = field(default_factory=list)  # job indices of the chunk sent last, in order
    chunk: list[int] = field(default_factory=list)  # those not answered yet, in order (a suffix of `sent`)

    def running(self) -> tuple[int, float]:
        """``(index into sent, start time)`` of the job the worker is running (``(0, the chunk's send time)``
        before it starts one); a start read while the worker moves on is taken as now (it is not stuck)."""
        for _ in range(3):
            before, started, after = self.progress[0], self.progress[1], self.progress[0]
            if before == after:
                return int(before), started
        return int(self.progress[0]), time.monotonic()

    def blame(self) -> tuple[int, list[int]]:
        """The job the worker was running when it was stopped, and the chunk's other unanswered jobs (those it
        finished without sending them included: they run again)."""
        position, _ = self.running()
        job = self.sent[position] if position < len(self.sent) else self.chunk[0]
        if job not in self.chunk:  # answered already: the worker was between jobs
            job = self.chunk[0]
        return job, [i for i in self.chunk if i != job]


def _kill(process: Any) -> None:
    """``SIGKILL`` a worker and every process of its group (what its jobs started); before it is reaped."""
    kill_group(process.pid)
    with contextlib.suppress(OSError, ValueError, AssertionError):  # not our child (a forked copy of the pool)
        if process.is_alive():  # the group did not exist yet (a fork server's worker before its setsid)
            process.kill()


def _stop_workers(workers: list[_Worker]) -> None:
    """Ask every worker to stop, kill those still running after a second, reap them, kill what they left in their
    groups, and empty ``workers``.

    A module-level function over the list (not a method) so that ``weakref.finalize`` can call it after the pool
    itself is gone; an empty list makes it a no-op, so it may run any number of times.
    """
    for worker in workers:
        with contextlib.suppress(OSError, ValueError):
            worker.conn.send(None)
    deadline = time.monotonic() + 1.0
    for worker in workers:
        with contextlib.suppress(OSError, ValueError, AssertionError):  # not our child (a forked copy of the pool)
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                _kill(worker.process)
                worker.process.join(timeout=5)
        kill_group(worker.process.pid)  # processes its jobs started and left behind (the group outlives its leader)
        worker.conn.close()
    workers.clear()


_LIVE_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()
"""Every pool of this process, for the at-fork hook."""


def _forget_inherited_workers() -> None:
    """In a forked child: close the parent-side pipe ends inherited from every pool and forget their workers.

    Those ends are the parent's: a child holding them keeps a worker's pipe open after the parent dies (no EOF),
    and a child using them would talk to the parent's workers. A pool used in the child starts its own workers.
    """
    try:
        pools = list(_LIVE_POOLS)
    except Exception:  # never break a fork  # pragma: no cover
        return
    for pool in pools:
        with contextlib.suppress(Exception):
            pool._forget_workers()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited_workers)


class WorkerPool:
    """Worker processes running :class:`Job` lists with per-job isolation and a per-job time bound.

    Args:
        funcs: the callables that jobs index (``job.func``); with ``start_method="fork"`` (default on Linux) they
            reach the workers by inheritance, so closures work; other start methods need picklable functions.
        timeout_s: the per-job bound, in seconds.
        num_workers: processes (default :func:`default_num_workers`).
        start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"`` (default: fork where available).
        call: how a worker runs one job, ``call(funcs[job.func], job) -> JobResult``
            (:func:`lit_rlft.rewards.score_job.score_job` for a reward's one score); a module-level function (it
            reaches the workers as their target's argument).
        name: the workers' process name.

    Example:
        >>> def apply(func, job):
        ...     return JobResult(OK, func(job.completion))
        >>> pool = WorkerPool([str.upper], timeout_s=5.0, num_workers=1, call=apply)
        >>> [r.value for r in pool.run([Job(0, "a", {}), Job(0, "b", {})])]
        ['A', 'B']
        >>> pool.close()
    """

    def __init__(
        self,
        funcs: Sequence[Callable[..., Any]],
        timeout_s: float,
        num_workers: int | None = None,
        start_method: str | None = None,
        *,
        call: JobCall,
        name: str = "lit-rlft-worker",
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.funcs = list(funcs)
        self.call, self.name = call, name
        self.timeout_s = float(timeout_s)
        self.num_workers = default_num_workers() if num_workers is None else int(num_workers)
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if start_method is None:
            start_method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        self._ctx = mp.get_context(start_method)
        self.restarts = 0
        """Workers killed (timeouts) or found dead, and replaced, since the pool started."""
        self._track([])

    def _track(self, workers: list[_Worker]) -> None:
        """Adopt ``workers`` (always mutated in place, never rebound) and close them at garbage collection and at
        interpreter exit, whichever comes first."""
        self._workers = workers
        self._opening: Connection | None = None  # the parent end of the worker being started
        self._finalizer = weakref.finalize(self, _stop_workers, workers)
        _LIVE_POOLS.add(self)

    # ------------------------------------------------------------------------------------------- processes
    def _start_worker(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        forkserver = self._ctx.get_start_method() == "forkserver"
        # The parent-death signal follows the thread that forked: from a thread that may end before the process,
        # it would kill a healthy worker, so there the polling fallback alone applies. A fork server forks from its
        # main thread.
        death_signal = forkserver or threading.current_thread() is threading.main_thread()
        progress = self._ctx.RawArray(ctypes.c_double, 2)
        args = (child, self.funcs, os.getpid(), None if forkserver else os.getpid(), death_signal, progress, self.call)
        process = self._ctx.Process(target=_worker_main, args=args, daemon=True, name=self.name)
        self._opening = parent  # the at-fork hook closes it in the child: a worker must not hold its own pipe open
        try:
            process.start()
        except BaseException:
            parent.close()
            raise
        finally:
            self._opening = None
            child.close()
        watch_group(process.pid)  # its group (its pid, once it has called setsid) dies with this process
        return _Worker(process, parent, progress)

    def start(self) -> None:
        """Start the workers now (otherwise on the first :meth:`run`): a caller about to start threads forks first."""
        self._ensure_started()

    def _ensure_started(self) -> None:
        while len(self._workers) < self.num_workers:
            self._workers.append(self._start_worker())

    def _replace(self, index: int) -> None:
        """Kill worker ``index`` and its group, reap it and start a fresh one in its place."""
        worker = self._workers[index]
        _kill(worker.process)  # a dead worker's group too: what its jobs started outlives it otherwise
        worker.process.join(timeout=5)
        worker.conn.close()
        self._workers[index] = self._start_worker()
        self.restarts += 1

    def close(self) -> None:
        """Stop every worker and every process they started; idempotent, and a later :meth:`run` starts new ones."""
        _stop_workers(self._workers)

    def _forget_workers(self) -> None:
        """In a forked child (see :func:`_forget_inherited_workers`): close the inherited pipe ends, forget the
        workers (they are the parent's to stop)."""
        for conn in [worker.conn for worker in self._workers] + [self._opening]:
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        self._workers.clear()
        self._opening = None

    def pids(self) -> list[int]:
        """Process ids of the current workers (each also the id of its process group)."""
        return [worker.process.pid for worker in self._workers]

    # ------------------------------------------------------------------------------------------------- run
    def run(self, jobs: Sequence[Job]) -> list[JobResult]:
        """Run every job; results in job order."""
        results: list[JobResult | None] = [None] * len(jobs)
        if not jobs:
            return []
        self._ensure_started()
        size = max(1, min(_MAX_CHUNK, math.ceil(len(jobs) / (4 * self.num_workers))))
        pending: deque[list[int]] = deque(list(range(i, min(i + size, len(jobs)))) for i in range(0, len(jobs), size))
        while pending or any(worker.chunk for worker in self._workers):
            self._dispatch(jobs, pending)
            self._collect(results, pending)
            self._enforce_timeouts(results, pending)
        return [result if result is not None else JobResult(ERROR, "lost") for result in results]

    def _dispatch(self, jobs: Sequence[Job], pending: deque[list[int]]) -> None:
        """Give the next chunk to every idle worker; a worker found dead is replaced first."""
        for index in range(len(self._workers)):
            if self._workers[index].chunk or not pending:
                continue
            chunk = pending.popleft()
            for _attempt in range(2):
                worker = self._workers[index]
                worker.progress[1] = time.monotonic()  # the first job's bound runs from the send
                worker.progress[0] = 0
                try:
                    worker.conn.send([jobs[i] for i in chunk])
                except (OSError, ValueError):
                    self._replace(index)
                    continue
                worker.sent, worker.chunk = list(chunk), list(chunk)
                break
            else:
                pending.appendleft(chunk)
                raise RuntimeError(f"{self.name} worker processes cannot be started")

    def _collect(self, results: list[JobResult | None], pending: deque[list[int]]) -> None:
        """Wait (until the earliest deadline) for answers and record them."""
        busy = [worker for worker in self._workers if worker.chunk]
        if not busy:
            return
        now = time.monotonic()
        wait_s = max(0.0, min(worker.running()[1] + self.timeout_s for worker in busy) - now)
        ready = set(wait([worker.conn for worker in busy], timeout=wait_s))
        for index, worker in enumerate(self._workers):
            if worker.conn in ready and not self._receive(worker, results):  # died mid-chunk (segfault, OOM)
                self._stop(index, results, pending, JobResult(ERROR, "worker process died"))

    def _receive(self, worker: _Worker, results: list[JobResult | None]) -> bool:
        """Record every answer waiting on ``worker``'s pipe; False when the pipe is closed (the worker died)."""
        while worker.chunk and worker.conn.poll():
            try:
                answers = worker.conn.recv()
            except (EOFError, OSError):
                return False
            for result in answers:
                results[worker.chunk.pop(0)] = result
        return True

    def _stop(self, index: int, results: list[JobResult | None], pending: deque[list[int]],
              outcome: JobResult) -> None:
        """Give the job worker ``index`` was running ``outcome``, requeue the rest of its chunk, replace it."""
        worker = self._workers[index]
        job, rest = worker.blame()
        results[job] = outcome
        worker.chunk = []
        self._replace(index)
        if rest:
            pending.appendleft(rest)

    def _overdue(self, worker: _Worker) -> bool:
        """Whether ``worker`` has unanswered jobs and the one it runs started at least ``timeout_s`` ago."""
        return bool(worker.chunk) and time.monotonic() - worker.running()[1] >= self.timeout_s

    def _enforce_timeouts(self, results: list[JobResult | None], pending: deque[list[int]]) -> None:
        """Kill and replace every worker whose current job ran past the bound; requeue the rest of its chunk."""
        for index, worker in enumerate(self._workers):
            if not self._overdue(worker):
                continue
            if not self._receive(worker, results):  # answers sent just before the bound are kept
                self._stop(index, results, pending, JobResult(ERROR, "worker process died"))
            elif self._overdue(worker):  # still: the drained answers did not move it on
                self._stop(index, results, pending, JobResult(TIMEOUT))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_workers", "_opening", "_finalizer"):  # processes do not travel; they restart on first use
            del state[key]
        state["_ctx"] = self._ctx.get_start_method()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["_ctx"] = mp.get_context(state["_ctx"])
        self.__dict__.update(state)
        self._track([])
