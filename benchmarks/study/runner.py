"""Executing the study's runs: subprocesses (at most ``jobs`` side by side, one thread each), resumable, with a
tqdm bar over runs. A run that crashes (even hard) still ends with a JSON saying so; the study goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from benchmarks.study.config import RunSpec, StudyConfig
from benchmarks.study.jsonio import read_json, write_json
from benchmarks.study.run_one import is_finished, run_and_write, run_json_path

REPO = Path(__file__).resolve().parents[2]


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _subprocess_run(cfg: StudyConfig, spec: RunSpec, warm_start: str, out: Path, config_path: Path) -> dict:
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
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(cfg.threads),
                                  timeout=cfg.run_timeout_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc, error = None, f"timed out after {cfg.run_timeout_s:.0f} s"
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
        with ThreadPoolExecutor(max_workers=cfg.jobs) as pool:
            futures = [pool.submit(_subprocess_run, cfg, spec, warm_start, out, config_path) for spec in todo]
            for fut in as_completed(futures):
                done(fut.result())
    bar.close()
    records = [read_json(run_json_path(out, s)) or {"run": s.name, "strategy": s.strategy, "pool_size": s.pool_size,
                                                    "seed": s.seed, "status": "failed", "error": "no result file"}
               for s in specs]
    return {"records": records, "executed": len(todo), "reused": len(specs) - len(todo)}
