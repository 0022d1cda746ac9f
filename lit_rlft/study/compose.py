"""Each run's config: the user's own run config, the arm's callbacks and the study's measurement, in one YAML file
that ``lit-rlft fit --config`` runs as it would run the user's.

    base = load_config(["my_run.yaml"])                        # the files merged in order, as --config a --config b
    config = run_config(base, arm_callbacks, study_callbacks, seed=0, run_dir="runs/study/arms/dps-seed0",
                        max_steps=3000)

What the study changes in the user's config, and why:

- ``trainer.callbacks``: the config's own callbacks, minus those that would change what an arm is or stop it early
  (selection callbacks and rollout hooks: the arm brings its own; budget stops, checkpointing and early stopping: the
  study sets the budget and measures itself), then the arm's callbacks, then the study's (:data:`REPLACED` says which
  and :func:`dropped_callbacks` names them);
- ``seed_everything``, ``model.generation.seed`` and ``data.seed`` (the uniform batch order): the run's seed;
- ``trainer.logger``: TensorBoard under the run's folder (``<run>/tb``), ``trainer.default_root_dir`` the folder;
- ``trainer.max_steps``: a backstop far past the budget (the budget stop ends the run), no epoch or time limit;
- Lightning's own validation and checkpointing off (``limit_val_batches: 0``; the study evaluates at its marks,
  with the config's ``data.val`` and reward), no progress bar (the study shows one over runs).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lit_rlft.runtime.imports import import_object

__all__ = ["ConfigError", "build_cli", "dropped_callbacks", "fingerprint", "load_config", "merge", "run_config", "write_config"]

#: Callbacks of the user's config that the study removes from every run (class paths; subclasses included).
REPLACED = (
    "lit_rlft.callbacks.SelectionCallback", "lit_rlft.callbacks.RolloutHook",
    "lit_rlft.callbacks.UniformHandbackCallback", "lit_rlft.callbacks.AutoShareCallback",
    "lit_rlft.callbacks.RolloutBudgetStop",
    "lightning.pytorch.callbacks.ModelCheckpoint", "lightning.pytorch.callbacks.EarlyStopping",
)
#: Trainer keys the study sets or removes (``None``: removed, the Trainer's default applies).
TRAINER_SET: dict[str, Any] = {
    "max_epochs": -1, "max_time": None, "limit_val_batches": 0, "num_sanity_val_steps": 0,
    "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
    "val_check_interval": None,
    "check_val_every_n_epoch": None,
}


class ConfigError(ValueError):
    """A run config the study cannot use (the message names the file and the key)."""


def merge(base: Any, override: Any) -> Any:
    """``override`` merged into ``base`` as jsonargparse merges ``--config`` files: mappings key by key, anything else
    (lists included) replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(override)


def load_config(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The run config files merged in order (later files win, as ``--config a --config b``).

    Raises:
        ConfigError: a file is missing, is not YAML, or is not a mapping.
    """
    import yaml

    if not paths:
        raise ConfigError("give the run config: --config my_run.yaml (a lit-rlft fit config)")
    merged: dict[str, Any] = {}
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise ConfigError(f"--config {path}: no such file")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise ConfigError(f"--config {path}: not valid YAML ({e})") from e
        if data is None:
            continue
        if not isinstance(data, dict):
            raise ConfigError(f"--config {path}: expected a mapping of trainer / model / data, got "
                              f"{type(data).__name__}")
        if "fit" in data and not ({"trainer", "model", "data"} & set(data)):
            raise ConfigError(f"--config {path}: a config for `lit-rlft fit` without the subcommand level is "
                              "needed (trainer:, model:, data: at the top)")
        merged = merge(merged, data)
    return merged


def _class_of(entry: Any) -> type | None:
    path = entry.get("class_path") if isinstance(entry, dict) else entry if isinstance(entry, str) else None
    if not path:
        return None
    try:
        obj = import_object(str(path), "callback")
    except (ImportError, ValueError, AttributeError):
        return None
    return obj if isinstance(obj, type) else None


def _replaced_classes() -> tuple[type, ...]:
    return tuple(import_object(p, "callback") for p in REPLACED)


def dropped_callbacks(base: dict[str, Any]) -> list[str]:
    """The class paths of the config's callbacks that the study removes from every run."""
    replaced = _replaced_classes()
    out = []
    for entry in (base.get("trainer") or {}).get("callbacks") or []:
        cls = _class_of(entry)
        if cls is not None and issubclass(cls, replaced):
            out.append(entry["class_path"] if isinstance(entry, dict) else str(entry))
    return out


def run_config(base: dict[str, Any], arm_callbacks: Sequence[dict[str, Any]],
               study_callbacks: Sequence[dict[str, Any]], seed: int, run_dir: str | Path,
               max_steps: int) -> dict[str, Any]:
    """The config of one run (see the module docstring): ``arm_callbacks`` and ``study_callbacks`` are LightningCLI
    entries (``class_path`` / ``init_args``)."""
    config = copy.deepcopy(base)
    run_dir = str(run_dir)
    trainer = dict(config.get("trainer") or {})
    replaced = _replaced_classes()
    kept = []
    for entry in trainer.get("callbacks") or []:
        cls = _class_of(entry)
        if cls is None or not issubclass(cls, replaced):
            kept.append(entry)
    trainer["callbacks"] = [*kept, *copy.deepcopy(list(arm_callbacks)), *copy.deepcopy(list(study_callbacks))]
    trainer["logger"] = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                         "init_args": {"save_dir": run_dir, "name": "tb", "version": ""}}
    trainer["default_root_dir"] = run_dir
    trainer["max_steps"] = int(max_steps)
    for key, value in TRAINER_SET.items():
        if value is None:
            trainer.pop(key, None)
        else:
            trainer[key] = value
    config["trainer"] = trainer
    config["seed_everything"] = int(seed)
    model = dict(config.get("model") or {})
    model["generation"] = {**(model.get("generation") or {}), "seed": int(seed)}
    config["model"] = model
    config["data"] = {**(config.get("data") or {}), "seed": int(seed)}
    return config


def build_cli(config: dict[str, Any]) -> Any:
    """``config`` through LightningCLI without running it (``run=False``), as ``lit-rlft fit`` would build it: the
    CLI object, with ``.model`` (the ``GRPOModule``) and ``.datamodule``. A parse or constructor error becomes a
    :class:`ConfigError` with the CLI's one-line message."""
    import contextlib
    import io
    import tempfile

    from lit_rlft.cli.lightning_cli import USER_ERRORS, grpo_cli

    with tempfile.TemporaryDirectory() as tmp:
        path = write_config(config, Path(tmp) / "config.yaml")
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                return grpo_cli(["--config", str(path)], run=False)
        except SystemExit as e:
            message = err.getvalue().strip().splitlines()
            raise ConfigError(f"the run config does not build: {message[-1] if message else e}") from None
        except USER_ERRORS as e:
            raise ConfigError(f"the run config does not build: {e}") from None


def fingerprint(*parts: Any) -> str:
    """A short hash of JSON-ready ``parts`` (what makes a run what it is)."""
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def write_config(config: dict[str, Any], path: str | Path, header: str = "") -> Path:
    """Write ``config`` as YAML (with ``header`` as comment lines)."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    path.write_text(comment + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path
