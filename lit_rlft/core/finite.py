"""Refuse NaN and infinite settings where they are given, naming the option: ``temperature: nan`` passes a ``<= 0``
check (every comparison with NaN is False) and gives NaN log-probs later, silently.

    check_finite(self, "model.generation")     # in a config dataclass's __post_init__

No Lightning, no torch: every config (generation, optimizer, loss, LoRA, the strategies' settings) calls it, and the
command line checks the whole parsed config once more, naming the YAML key.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["check_finite", "nonfinite_paths"]


def nonfinite_paths(value: Any, path: str) -> Iterator[str]:
    """The dotted paths of every NaN or infinite float in ``value`` (a number, a sequence, a mapping or a dataclass,
    nested), ``path`` naming ``value`` itself; list items as ``path[i]``."""
    if isinstance(value, bool):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            yield path
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from nonfinite_paths(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from nonfinite_paths(v, f"{path}[{i}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from nonfinite_paths(getattr(value, f.name), f"{path}.{f.name}" if path else f.name)


def check_finite(obj: Any, prefix: str) -> None:
    """Raise ValueError naming the first of ``obj``'s fields (a dataclass) that holds a NaN or infinite float, as
    ``<prefix>.<field>``.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Sampling:
    ...     temperature: float = 1.0
    >>> check_finite(Sampling(float("nan")), "model.generation")
    Traceback (most recent call last):
    ...
    ValueError: model.generation.temperature must be a finite number, got nan
    """
    for path in nonfinite_paths(obj, prefix):
        value = _at(obj, path[len(prefix):].lstrip("."))
        raise ValueError(f"{path} must be a finite number, got {value}")


def _at(obj: Any, rest: str) -> Any:
    """The value at ``rest`` (``a.b[2]``) below ``obj`` (for the message)."""
    for part in rest.replace("[", ".[").split("."):
        if not part:
            continue
        if part.startswith("["):
            obj = obj[int(part[1:-1])]
        elif isinstance(obj, Mapping):
            obj = obj[part]
        else:
            obj = getattr(obj, part)
    return obj
