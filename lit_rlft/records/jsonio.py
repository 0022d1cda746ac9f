"""Atomic JSON files: a reader never sees a half-written file, so an interrupted study resumes cleanly.

:func:`write_result` is the one writer of a benchmark's or a study's result: the data plus the environment it was
measured in (:func:`~lit_rlft.records.environment.environment`)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from lit_rlft.records.environment import PACKAGES, environment


def _clean(obj: Any) -> Any:
    """NaN and infinities become null (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(_clean(data), f, indent=1, allow_nan=False)
        os.chmod(tmp, 0o644)  # mkstemp makes the file private
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def write_result(path: str | Path, data: dict[str, Any], *, packages: tuple[str, ...] | None = None) -> Path:
    """Write a result: ``data`` with an ``"environment"`` key (package versions, torch's threads when torch is
    imported, CPU model and count, the commit: :func:`~lit_rlft.records.environment.environment` of ``packages``, by
    default :data:`~lit_rlft.records.environment.PACKAGES`), atomically (:func:`write_json`); returns ``path``.

    An ``"environment"`` already in ``data`` is the caller's and is kept as given (a result rewritten from an earlier
    file, or a record whose environment was taken where it was measured); ``data`` itself is not changed. The
    environment is taken at the call: call it where the measurement ran, after the thread settings."""
    record = dict(data)
    if "environment" not in record:
        record["environment"] = environment(PACKAGES if packages is None else tuple(packages))
    return write_json(path, record)


def read_json(path: str | Path) -> Any | None:
    """The file's content, or None when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
