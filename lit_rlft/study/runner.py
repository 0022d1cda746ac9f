"""Executing a study's runs: subprocesses (at most ``jobs`` side by side, ``threads`` torch threads each), resumable,
with a progress bar over runs. A run that crashes (even hard) still ends with a record saying so; the study goes on.

A run never outlives the study: each runs in its own process group, with the parent-death signal (Linux) armed
before it starts; its group is killed when it ends or times out (whatever the run itself started goes with it: reward
workers, a generation process), and every running group is killed when the study stops on an exception (Ctrl-C
included: a new session does not get the terminal's SIGINT). If the study process dies outright, the kernel kills
the runs.

The start evaluation is shared (:class:`~lit_rlft.study.callback.StudyCallback`): while no run has written it, the
first run to go starts alone and the others wait for its file (or its end), so it is measured once, not ``jobs``
times.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from lit_rlft.runtime.processes import set_parent_death_signal

__all__ = ["PlannedRun", "RunProcesses", "execute", "run_env"]


@dataclass
class PlannedRun:
    """One run of a study: what to execute and where its files go.

    ``command``: the subprocess (``python -m lit_rlft.cli fit --config <run>/config.yaml``, or the TRL arm's);
    ``in_process``: the same run in this process (``jobs=0``: tests, debugging); ``collect``: turns the run's files
    into its record (``(run, return code or None, error or None, seconds) -> record``), written to ``record_path``.
    """

    name: str
    arm: str
    seed: int
    run_dir: Path
    record_path: Path
    fingerprint: str
    command: list[str]
    in_process: Callable[[], None]
    collect: Callable[[PlannedRun, int | None, str | None, float], dict[str, Any]]
    info: dict[str, Any] = field(default_factory=dict)
    progress: Callable[[], float] = lambda: 0.0
    """How far the run is, in [0, 1] (read from its files while it runs: the progress bar's fractions)."""

    @property
    def log_path(self) -> Path:
        return self.run_dir / "log.txt"


def run_env(threads: int) -> dict[str, str]:
    """The environment of a run process: ``threads`` torch / BLAS threads, no tokenizer threads."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def _die_with(study_pid: int) -> Callable[[], None]:
    """A ``preexec_fn``: the run gets ``SIGKILL`` when the study (the thread waiting for it) dies; a study that died
    before the signal was armed ends the run at once."""

    def arm() -> None:
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != study_pid:
            os._exit(1)

    return arm


class RunProcesses:
    """The run processes going on, each the leader of its own process group; :meth:`kill_all` ends them all and
    refuses new ones (threads still holding queued runs start nothing after it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen] = set()
        self._stopped = False

    def run(self, cmd: list[str], log: IO[str], env: dict[str, str], timeout_s: float | None,
            cwd: str | None = None) -> int | None:
        """Run ``cmd`` to its end and kill its group; returns the exit code, or None past ``timeout_s`` (or once
        :meth:`kill_all` was called)."""
        with self._lock:  # started under the lock: kill_all cannot miss a run that is being started
            if self._stopped:
                return None
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                    start_new_session=True, preexec_fn=_die_with(os.getpid()))
            self._live.add(proc)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            _kill_group(proc)  # the run's own children too (reward workers, ...), however it ended
            proc.wait()
            with self._lock:
                self._live.discard(proc)

    @property
    def stopped(self) -> bool:
        """Whether :meth:`kill_all` was called."""
        return self._stopped

    def kill_all(self) -> None:
        """Kill every run going on, with its group; start no more."""
        with self._lock:
            self._stopped = True
            for proc in self._live:
                _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already empty
        os.killpg(proc.pid, signal.SIGKILL)


def _subprocess_run(run: PlannedRun, threads: int, timeout_s: float | None, processes: RunProcesses) -> dict:
    run.run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    error = None
    resumed = "--ckpt_path" in run.command
    with run.log_path.open("a" if resumed else "w") as log:  # a resumed run keeps the log of its first part
        log.write("$ " + " ".join(run.command) + "\n")
        log.flush()
        rc = processes.run(run.command, log, run_env(threads), timeout_s)
        if rc is None:
            error = "stopped with the study" if processes.stopped else f"timed out after {timeout_s:.0f} s"
    return run.collect(run, rc, error, time.perf_counter() - t0)


def _in_process_run(run: PlannedRun) -> dict:
    import traceback

    run.run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        run.in_process()
        rc, error = 0, None
    except BaseException as exc:  # SystemExit of a CLI error too: recorded, the study goes on
        if isinstance(exc, KeyboardInterrupt):
            raise
        rc, error = 1, f"{type(exc).__name__}: {exc}"
        run.log_path.write_text(traceback.format_exc())
    return run.collect(run, rc, error, time.perf_counter() - t0)


def execute(runs: list[PlannedRun], jobs: int, threads: int, is_finished: Callable[[PlannedRun], bool],
            write: Callable[[PlannedRun, dict[str, Any]], None], start_file: Path | None = None,
            timeout_s: float | None = None, progress: bool = True) -> dict[str, Any]:
    """Run every run that ``is_finished`` says is not, ``jobs`` at a time (0: one after another in this process);
    ``write`` stores each record as it ends. Returns ``{"executed": n, "reused": n, "failed": [names]}``."""
    from tqdm.auto import tqdm

    todo = [r for r in runs if not is_finished(r)]
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc="study runs", unit="run", disable=not progress,
               dynamic_ncols=True, bar_format="{l_bar}{bar}| {n:.1f}/{total} runs [{elapsed}<{remaining}{postfix}]")
    failed: list[str] = []
    ended = len(runs) - len(todo)
    running: set[str] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def show() -> None:
        """The bar at finished runs plus the fractions of those running (their own progress files)."""
        with lock:
            fractions = sum(min(1.0, max(0.0, r.progress())) for r in todo if r.name in running)
            bar.n = ended + fractions
            bar.refresh()

    def monitor() -> None:
        while not stop.wait(5.0):
            show()

    def done(run: PlannedRun, record: dict[str, Any]) -> None:
        nonlocal ended
        write(run, record)
        if record.get("status") != "ok":
            failed.append(run.name)
        with lock:
            running.discard(run.name)
            ended += 1
        bar.set_postfix_str(f"last {run.name} {record.get('status')} {record.get('total_s', 0):.0f}s"
                            + (f", {len(failed)} failed" if failed else ""))
        show()

    watcher = threading.Thread(target=monitor, daemon=True)
    if progress:
        watcher.start()

    if jobs == 0:
        for run in todo:
            with lock:
                running.add(run.name)
            done(run, _in_process_run(run))
    else:
        processes = RunProcesses()
        first_done = threading.Event()
        lead = todo[0].name if todo and start_file is not None and not start_file.exists() else None

        def job(run: PlannedRun) -> dict[str, Any]:
            if lead is not None and run.name != lead:  # the start evaluation is measured once, by the first run
                while not first_done.is_set() and not start_file.exists() and not processes.stopped:
                    time.sleep(0.5)
            with lock:
                running.add(run.name)
            try:
                return _subprocess_run(run, threads, timeout_s, processes)
            finally:
                if run.name == lead:
                    first_done.set()

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(job, run): run for run in todo}
            try:
                for fut in as_completed(futures):
                    done(futures[fut], fut.result())
            except BaseException:  # Ctrl-C, a failed run: the runs going on must not outlive the study
                pool.shutdown(wait=False, cancel_futures=True)
                processes.kill_all()
                raise
            finally:
                stop.set()
    stop.set()
    bar.close()
    return {"executed": len(todo), "reused": len(runs) - len(todo), "failed": failed}


def python_command(*args: str) -> list[str]:
    """``[this Python, *args]``: a run process uses the study's own interpreter (its virtual environment)."""
    return [sys.executable, *args]
