"""The study's arms: the shipped strategies and a user's own overlay files of callbacks, and the settings every arm
records.

Every arm is an overlay file: ``trainer.callbacks`` as ``class_path`` / ``init_args``, as LightningCLI reads them.
The shipped strategies are the files of ``configs/study/`` (:data:`STRATEGIES`, found by name); a user's own is
any such file. :func:`load_overlay` reads one into :class:`CallbackSpec` (a callback class and the arguments the
file gives); :meth:`Arm.specs` adds the run's seed and cache folder, and :meth:`Arm.settings` resolves them against
each class's signature, defaults included. The settings are recorded in every run's JSON (``callbacks``), a
finished run is reused only while they still match, and the settings block of a report is generated from them,
never typed by hand. ``--set`` changes one argument (:mod:`lit_rlft.study.overrides`).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_rlft.callbacks import (
    AutoShareCallback,
    BatchCompositionLogger,
    CompletionLogger,
    RolloutHook,
    SelectionCallback,
    UniformHandbackCallback,
)
from lit_rlft.runtime.imports import import_object

#: Every shipped strategy, in table order: each is the overlay file ``configs/study/<name>.yaml``.
STRATEGIES: tuple[str, ...] = (
    "uniform", "dynamic_sampling", "history", "dots", "dots_replay", "dps", "dps_c8", "dps_replay", "dps_cold_start",
    "mopps", "greso", "screening", "sequential", "allocation_dps", "allocation_mopps", "allocation_dots",
    "allocation_dps_cold", "dps_content_prior", "allocation_dots_broad", "dps_c8_handback",
    "auto", "auto_dps_c8",
)

#: Where the shipped strategies' overlays live (the source checkout's ``configs/study``).
PRESETS = Path(__file__).resolve().parents[2] / "configs" / "study"


def preset_path(name: str) -> Path:
    """The overlay file of shipped strategy ``name``."""
    return PRESETS / f"{name}.yaml"


#: Arguments that say where a run keeps files, not what it does: left out of the recorded settings.
LOCATION_ARGS = frozenset({"cache_dir"})
#: Where the DOTS embedding cache goes when the study does not say (relative to the run's folder).
CACHE_DIR = ".cache/lit_rlft/embeddings"

#: Arguments added to a callback (or to its settings' dataclass) after runs were recorded, each with the value that
#: does what those runs did: a recorded run that lacks one matches a current setting at that value (so adding an
#: option does not re-run, or mark stale, every run recorded before it).
ADDED_LATER: dict[str, Any] = {"reference": "rollout"}


def settings_match(recorded: Any, now: Any) -> bool:
    """Whether recorded callback settings equal the current ones, arguments of :data:`ADDED_LATER` that the record
    lacks counting as their old-behaviour value."""
    if isinstance(recorded, dict) and isinstance(now, dict):
        if set(recorded) - set(now):
            return False
        if any(k not in ADDED_LATER or now[k] != ADDED_LATER[k] for k in set(now) - set(recorded)):
            return False
        return all(settings_match(recorded[k], now[k]) for k in recorded)
    if isinstance(recorded, list) and isinstance(now, list):
        return len(recorded) == len(now) and all(settings_match(a, b) for a, b in zip(recorded, now))
    return recorded == now


@dataclass(frozen=True)
class CallbackSpec:
    """One callback of a strategy: its class and the keyword arguments the study passes (the rest are defaults)."""

    cls: type
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Any:
        return self.cls(**self.kwargs)

    def settings(self) -> dict[str, Any]:
        """``{"callback": class name, "args": every argument, defaults included}`` (JSON-ready; no file locations)."""
        return {"callback": self.cls.__name__, "args": resolved_arguments(self.cls, self.kwargs)}

    def config(self) -> dict[str, Any]:
        """The callback as a LightningCLI config entry: ``{"class_path": ..., "init_args": {...}}`` (the arguments the
        study passes; dataclass arguments as their fields)."""
        return {"class_path": public_path(self.cls), "init_args": {k: _config_value(v) for k, v in self.kwargs.items()}}

    @property
    def is_strategy(self) -> bool:
        """Whether the callback chooses or reshapes batches (a selection callback or a rollout hook)."""
        return is_strategy_callback(self.cls)


def public_path(cls: type) -> str:
    """The shortest dotted path that names ``cls`` below its top package (``lit_rlft.callbacks.DPSCallback`` rather
    than ``lit_rlft.callbacks.dps.DPSCallback``)."""
    import importlib

    parts = cls.__module__.split(".")
    for n in range(min(2, len(parts)), len(parts) + 1):
        module = ".".join(parts[:n])
        try:
            if getattr(importlib.import_module(module), cls.__qualname__, None) is cls:
                return f"{module}.{cls.__qualname__}"
        except ImportError:
            continue
    return f"{cls.__module__}.{cls.__qualname__}"


def is_strategy_callback(cls: type) -> bool:
    """Whether callbacks of ``cls`` choose the next batch or reshape the rolled-out one: what makes an arm."""
    return issubclass(cls, (SelectionCallback, RolloutHook, UniformHandbackCallback, AutoShareCallback))


def _config_value(value: Any) -> Any:
    """A constructor argument as YAML can carry it: dataclasses as their fields (all of them), tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _config_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_config_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _config_value(v) for k, v in value.items()}
    return value


def jsonable(value: Any) -> Any:
    """A JSON-ready copy: dataclasses become their fields (minus locations), tuples lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in LOCATION_ARGS}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def resolved_arguments(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every constructor argument of ``cls`` as called with ``kwargs``: the given ones and the signature's defaults
    (``inspect.signature(cls).bind(**kwargs).apply_defaults()``), without :data:`LOCATION_ARGS`."""
    bound = inspect.signature(cls).bind(**kwargs)
    bound.apply_defaults()
    return {k: jsonable(v) for k, v in bound.arguments.items() if k not in LOCATION_ARGS}


# -- arms: a shipped strategy or a user's overlay file ------------------------------------------------------------
#: Callbacks the study itself adds to every arm (never an arm's own): left out of an overlay's strategy.
NOT_STRATEGY = (BatchCompositionLogger, CompletionLogger)


class ArmError(ValueError):
    """A strategy name, overlay file or setting the study cannot use (the message names it)."""


@dataclass(frozen=True)
class Arm:
    """One arm of a study: a name and its callbacks, as an overlay file gives them.

    ``overlay``: the file's callbacks (``CallbackSpec`` with the file's arguments as YAML gives them: a dataclass
    argument as a mapping); ``path``: the file; ``shipped``: a shipped strategy (:data:`STRATEGIES`).
    """

    name: str
    overlay: tuple[CallbackSpec, ...] = ()
    path: str | None = None
    shipped: bool = False

    def specs(self, seed: int, cache_dir: str = CACHE_DIR) -> list[CallbackSpec]:
        """The arm's callbacks at ``seed``, ready to build: a callback (or a dataclass argument of one) that takes a
        ``seed`` or a ``cache_dir`` and was not given one gets the run's seed and ``cache_dir``; mappings given for
        dataclass arguments become the dataclass."""
        return [CallbackSpec(spec.cls, _constructor_args(spec.cls, spec.kwargs, seed, cache_dir))
                for spec in self.overlay]

    def settings(self, seed: int) -> list[dict[str, Any]]:
        """What the arm runs with at ``seed``: ``[{"callback": ..., "args": {...}}]``, every argument of every
        callback, defaults included (what a run records in its JSON as ``callbacks``)."""
        return [spec.settings() for spec in self.specs(seed)]

    def selection_name(self) -> str | None:
        """The ``SelectionCallback.name`` the arm logs its ``<name>/overhead_s`` under (None: no selection)."""
        for spec in self.overlay:
            if issubclass(spec.cls, SelectionCallback):
                return getattr(spec.cls, "name", None)
        return None


def resolve_arm(text: str) -> Arm:
    """The arm a ``--strategies`` entry names: a shipped strategy (its overlay in ``configs/study``), or a YAML
    overlay file (its stem names the arm).

    Raises:
        ArmError: neither a shipped strategy nor an existing file, or a file that is not a callbacks overlay.
    """
    if text in STRATEGIES:
        return dataclasses.replace(load_overlay(preset_path(text)), shipped=True)
    path = Path(text)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return load_overlay(path)
    raise ArmError(f"unknown strategy {text!r}: choose from {', '.join(STRATEGIES)}, or give a YAML overlay file "
                   "(trainer.callbacks as class_path / init_args, as in configs/study/*.yaml)")


def load_overlay(path: str | Path) -> Arm:
    """An overlay file as an arm named after the file: its ``trainer.callbacks`` that choose or reshape batches
    (selection callbacks, rollout hooks); loggers such as ``CompletionLogger`` are left to the base config.

    Raises:
        ArmError: the file is missing or unreadable, has no ``trainer.callbacks``, names a class that cannot be
            imported, or arguments its class (or a dataclass argument) does not take (the message names the file
            and the entry).
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ArmError(f"strategy overlay {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ArmError(f"strategy overlay {path}: not valid YAML ({e})") from e
    entries = (data.get("trainer") or {}).get("callbacks") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ArmError(f"strategy overlay {path}: no trainer.callbacks list (an overlay holds the arm's callbacks as "
                       "class_path / init_args, as configs/study/*.yaml do)")
    specs = []
    for i, entry in enumerate(entries):
        where = f"strategy overlay {path}: trainer.callbacks[{i}]"
        if not isinstance(entry, dict) or "class_path" not in entry:
            raise ArmError(f"{where}: expected a mapping with class_path (and init_args), got {entry!r}")
        try:
            cls = import_object(str(entry["class_path"]), "callback")
        except (ImportError, ValueError, AttributeError) as e:
            raise ArmError(f"{where}: {e}") from e
        if not isinstance(cls, type):
            raise ArmError(f"{where}: {entry['class_path']} is not a class")
        kwargs = dict(entry.get("init_args") or {})
        check_arguments(cls, kwargs, where)
        if not issubclass(cls, NOT_STRATEGY):
            specs.append(CallbackSpec(cls, kwargs))
    return Arm(name=path.stem, overlay=tuple(specs), path=str(path))


def check_arguments(cls: type, kwargs: dict[str, Any], where: str) -> None:
    """Raise :class:`ArmError` (``where`` first) unless ``cls`` takes ``kwargs``, a mapping given for a dataclass
    argument included."""
    try:
        inspect.signature(cls).bind(**kwargs)
        _constructor_args(cls, kwargs, 0, CACHE_DIR)
    except TypeError as e:
        raise ArmError(f"{where}: {cls.__name__} {e}") from e


def dataclass_argument(cls: type, name: str) -> type | None:
    """The dataclass that argument ``name`` of ``cls`` takes (``X`` or ``X | None``), or None."""
    hint = _hint(cls, name)
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _constructor_args(cls: type, kwargs: dict[str, Any], seed: int, cache_dir: str) -> dict[str, Any]:
    """``kwargs`` as ``cls`` takes them: the run's ``seed`` and ``cache_dir`` where taken and not given (in a dataclass
    argument too), mappings as their dataclass, lists as tuples where the signature says ``tuple``."""
    params = inspect.signature(cls).parameters
    out = dict(kwargs)
    for key, value in kwargs.items():
        kind = dataclass_argument(cls, key)
        if kind is not None and isinstance(value, dict):
            fields = {f.name for f in dataclasses.fields(kind)}
            unknown = sorted(set(value) - fields)
            if unknown:
                raise TypeError(f"argument {key!r}: {kind.__name__} has no field {', '.join(map(repr, unknown))} "
                                f"(fields: {', '.join(sorted(fields))})")
            out[key] = kind(**({"cache_dir": cache_dir} if "cache_dir" in fields else {}), **value)
        elif isinstance(value, list) and typing.get_origin(_hint(cls, key)) is tuple:
            out[key] = tuple(value)
    if "seed" in params and "seed" not in out:
        out["seed"] = seed
    if "cache_dir" in params and "cache_dir" not in out:
        out["cache_dir"] = cache_dir
    return out


def _hint(cls: type, name: str) -> Any:
    """The type hint of argument ``name`` of ``cls`` (None where it has none or it cannot be resolved)."""
    try:
        return typing.get_type_hints(cls.__init__).get(name)
    except (NameError, TypeError):
        return None
