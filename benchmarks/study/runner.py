"""Executing the study's runs: subprocesses (at most ``jobs`` side by side, one thread each), resumable, with a
tqdm bar over runs. A run that crashes (even hard) still ends with a JSON saying so; the study goes on.

A run never outlives the study: each runs in its own process group, with the parent-death signal (Linux) armed
before it starts; its group is killed when it ends or times out (whatever the run itself started goes with it), and
every running group is killed when the study stops on an exception (Ctrl-C included: a new session does not get
the terminal's SIGINT). If the study process dies outright, the kernel kills the runs.
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
from pathlib import Path
from typing import IO, Any

from tqdm.auto import tqdm

from benchmarks.study.config import RunSpec, StudyConfig
from benchmarks.study.jsonio import read_json, write_json
from benchmarks.study.run_one import is_finished, run_and_write, run_json_path
from lit_rlft.core.processes import set_parent_death_signal

REPO = Path(__file__).resolve().parents[2]


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
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

    def run(self, cmd: list[str], log: IO[str], env: dict[str, str], timeout_s: float) -> int | None:
        """Run ``cmd`` to its end and kill its group; returns the exit code, or None past ``timeout_s`` (or once
        :meth:`kill_all` was called)."""
        with self._lock:  # started under the lock: kill_all cannot miss a run that is being started
            if self._stopped:
                return None
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=_die_with(os.getpid()))
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


def _subprocess_run(cfg: StudyConfig, spec: RunSpec, warm_start: str, out: Path, config_path: Path,
                    processes: RunProcesses) -> dict:
    log = out / "logs" / f"{spec.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    path = run_json_path(out, spec)
    path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.study.run_one", "--config", str(config_path), "--strategy", spec.strategy,
           "--pool-size", str(spec.pool_size), "--seed", str(spec.seed), "--warm-start", warm_start,
           "--out-dir", str(out)]
    t0 = time.perf_counter()
    error = None
    with log.open("w") as f:
        rc = processes.run(cmd, f, _env(cfg.threads), cfg.run_timeout_s)
        if rc is None:
            error = "stopped with the study" if processes.stopped else f"timed out after {cfg.run_timeout_s:.0f} s"
    record = read_json(path)
    if record is None:  # the process died before writing its JSON (killed, out of memory, import error, ...)
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        record = {"run": spec.name, "strategy": spec.strategy, "pool_size": spec.pool_size, "seed": spec.seed,
                  "status": "failed", "fingerprint": cfg.run_fingerprint(), "total_s": time.perf_counter() - t0,
                  "error": error or f"process exited with code {rc} without writing its result", "log_tail": tail}
        write_json(path, record)
    return record


def execute_runs(cfg: StudyConfig, warm_start: str, out: Path, progress: bool = True) -> dict[str, Any]:
    """Run every spec of ``cfg`` not finished yet; returns ``{"records": [...], "executed": n, "reused": n}``."""
    config_path = write_json(out / "study_config.json", cfg.to_dict())
    fingerprint = cfg.run_fingerprint()
    specs = cfg.runs()
    todo = [s for s in specs if not is_finished(run_json_path(out, s), fingerprint)]
    bar = tqdm(total=len(specs), initial=len(specs) - len(todo), desc="bench runs", unit="run", disable=not progress,
               dynamic_ncols=True)
    failures = 0

    def done(record: dict) -> None:
        nonlocal failures
        failures += record.get("status") != "ok"
        bar.set_postfix_str(f"last {record['run']} {record.get('status')} {record.get('total_s', 0):.0f}s"
                            + (f", {failures} failed" if failures else ""))
        bar.update(1)

    if cfg.jobs == 0:  # in-process, one after the other (debugging, tests)
        for spec in todo:
            done(run_and_write(cfg, spec, warm_start, out))
    else:
        processes = RunProcesses()
        with ThreadPoolExecutor(max_workers=cfg.jobs) as pool:
            futures = [pool.submit(_subprocess_run, cfg, spec, warm_start, out, config_path, processes)
                       for spec in todo]
            try:
                for fut in as_completed(futures):
                    done(fut.result())
            except BaseException:  # Ctrl-C, a failed run: the runs going on must not outlive the study
                pool.shutdown(wait=False, cancel_futures=True)
                processes.kill_all()
                raise
    bar.close()
    records = [read_json(run_json_path(out, s)) or {"run": s.name, "strategy": s.strategy, "pool_size": s.pool_size,
                                                    "seed": s.seed, "status": "failed", "error": "no result file"}
               for s in specs]
    return {"records": records, "executed": len(todo), "reused": len(specs) - len(todo)}
