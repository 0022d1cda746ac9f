"""Checkpoints: one layout for the Trainer and ``FabricLoop``, state that loads weights-only, files written atomically,
and unreadable files reported in one line.

- One layout: Lightning's own. ``FabricLoop`` writes what the Trainer writes (``state_dict`` with the policy under
  ``policy.``, ``optimizer_states``, ``lr_schedulers``, ``callbacks`` by ``state_key``, the datamodule under its class
  name, ``global_step``) and the step's counters under :data:`STEP_KEY` in both, so a run checkpointed by either
  resumes under the other (:func:`trainer_checkpoint`, :func:`restore_from_checkpoint`). The Trainer's loop state
  is the one thing a ``FabricLoop`` checkpoint lacks: :func:`restore_trainer_counters` sets the optimizer-step and
  rollout-step counters it would have held. The frozen reference policy is never saved; the keys lit_rlft <= 0.3
  saved it under are dropped on load (:func:`drop_reference_weights`). Distributed (FSDP2) checkpoints keep each
  driver's own sharded writer, so they resume under the driver that wrote them.
- Lightning loads checkpoints with ``torch.load(weights_only=True)``, which refuses numpy arrays: strategy cores'
  numpy state goes through :func:`lit_rlft.core.state.encode_state` / ``decode_state``.
- :class:`AtomicCheckpointIO` writes a single-file checkpoint to ``<path>.tmp-<pid>``, fsyncs it and renames it over
  ``<path>``: a run killed mid-save leaves the previous checkpoint (or none), never a truncated one.
  :func:`use_atomic_checkpoint_io` installs it on a Trainer's or Fabric's strategy (``lit-rlft`` does by default).
  Distributed checkpoints (FSDP2 through ``ModelParallelStrategy``) are directories: ``torch.distributed.checkpoint``
  writes the shards, then its ``.metadata`` file (through a temporary name), then Lightning's rank 0 writes
  ``meta.pt`` (the non-tensor state, a plain ``torch.save``). A directory missing either, or with a truncated
  ``meta.pt``, is an unfinished save, which :func:`check_checkpoint` reports.
- :func:`check_checkpoint` and :func:`describe_load_error` turn a missing, truncated or foreign checkpoint into one
  line naming the path (:class:`CheckpointError`), instead of torch's unpickling message.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from torch import nn

if TYPE_CHECKING:
    from lit_rlft.step.grpo import GRPOStep

# ------------------------------------------------------------------------------------------ one layout
STEP_KEY = "lit_rlft"
"""Where every checkpoint holds the step's own state (:meth:`GRPOStep.state_dict`: rollout step, budget, ...)."""
POLICY_PREFIX = "policy."
"""The policy's weights in ``state_dict``: ``GRPOModule.policy``'s, as the Trainer names them."""
_REFERENCE_PREFIXES = ("_reference.", "ref_model.")  # where lit_rlft <= 0.3 saved the frozen reference


def drop_reference_weights(state_dict: dict[str, Any] | None) -> int:
    """Remove the frozen reference's weights that checkpoints of lit_rlft <= 0.3 held (it is rebuilt from the model
    instead); how many keys were dropped."""
    if not isinstance(state_dict, dict):
        return 0
    keys = [k for k in state_dict if k.startswith(_REFERENCE_PREFIXES)]
    for key in keys:
        del state_dict[key]
    return len(keys)


def run_state(scheduler: Any, step: GRPOStep, datamodule: Any, callbacks: Sequence[Any], global_step: int) -> dict[str, Any]:
    """Everything of a checkpoint but the weights and the optimizer, in the Trainer's layout."""
    import lightning

    return {
        "epoch": 0, "global_step": int(global_step), "pytorch-lightning_version": lightning.__version__,
        "lr_schedulers": [scheduler.state_dict()], "callbacks": {cb.state_key: cb.state_dict() for cb in callbacks},
        type(datamodule).__qualname__: datamodule.state_dict(), STEP_KEY: step.state_dict(),
    }


def trainer_checkpoint(policy: nn.Module, optimizer: Any, scheduler: Any, step: GRPOStep, datamodule: Any,
                       callbacks: Sequence[Any], global_step: int) -> dict[str, Any]:
    """The checkpoint the Trainer would write at this point of a ``GRPOModule`` run, without its loop state: what
    ``FabricLoop`` saves for single-file strategies."""
    inner = getattr(optimizer, "optimizer", optimizer)  # Fabric's wrapper
    return {"state_dict": {POLICY_PREFIX + k: v for k, v in policy.state_dict().items()},
            "optimizer_states": [inner.state_dict()], **run_state(scheduler, step, datamodule, callbacks, global_step)}


def restore_from_checkpoint(checkpoint: dict[str, Any], policy: nn.Module, optimizer: Any, scheduler: Any,
                            step: GRPOStep, datamodule: Any, callbacks: Sequence[Any]) -> int:
    """Load a Trainer-layout checkpoint (written by the Trainer or :func:`trainer_checkpoint`) into a set-up run;
    its optimizer-step count."""
    checkpoint = _from_fabric_03(checkpoint)
    missing = [k for k in ("state_dict", "optimizer_states") if k not in checkpoint]
    if missing:
        raise CheckpointError(f"the checkpoint has no {', '.join(missing)}: not a GRPOModule / FabricLoop checkpoint "
                              "(it holds " + ", ".join(sorted(map(str, checkpoint))[:8]) + ")")
    weights = dict(checkpoint["state_dict"])
    drop_reference_weights(weights)
    policy.load_state_dict({k[len(POLICY_PREFIX):]: v for k, v in weights.items() if k.startswith(POLICY_PREFIX)})
    optimizer.load_state_dict(checkpoint["optimizer_states"][0])
    return restore_run_state(checkpoint, scheduler, step, datamodule, callbacks)


def restore_run_state(checkpoint: dict[str, Any], scheduler: Any, step: GRPOStep, datamodule: Any,
                      callbacks: Sequence[Any]) -> int:
    """:func:`run_state`'s part of a checkpoint restored; its optimizer-step count. Callbacks the checkpoint does
    not know start fresh, as under the Trainer."""
    if checkpoint.get("lr_schedulers"):
        scheduler.load_state_dict(checkpoint["lr_schedulers"][0])
    step.load_state_dict(checkpoint.get(STEP_KEY, {}))
    datamodule.load_state_dict(checkpoint.get(type(datamodule).__qualname__, checkpoint.get("datamodule", {})))
    states = checkpoint.get("callbacks", {})
    for cb in callbacks:
        if cb.state_key in states:
            cb.load_state_dict(states[cb.state_key])
    return int(checkpoint.get("global_step", 0))


def _from_fabric_03(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A single-file ``FabricLoop`` checkpoint of lit_rlft 0.3 (``model``, ``optimizer``, ``scheduler``, ``module``,
    ``datamodule``) in the layout of today; any other checkpoint unchanged."""
    if not {"model", "module", "datamodule"} <= set(checkpoint) or "state_dict" in checkpoint:
        return checkpoint
    return {"state_dict": {POLICY_PREFIX + k: v for k, v in checkpoint["model"].items()},
            "optimizer_states": [checkpoint["optimizer"]], "lr_schedulers": [checkpoint["scheduler"]],
            STEP_KEY: checkpoint["module"], "datamodule": checkpoint["datamodule"],
            "callbacks": checkpoint.get("callbacks", {}), "global_step": checkpoint.get("global_step", 0)}


def step_counters(checkpoint: dict[str, Any]) -> tuple[int, int]:
    """``(optimizer steps, rollout steps)`` a checkpoint was written at."""
    return int(checkpoint.get("global_step", 0)), int(checkpoint.get(STEP_KEY, {}).get("rollout_step", 0))


def restore_trainer_counters(trainer: Any, optimizer_steps: int, rollout_steps: int) -> None:
    """Set what the Trainer's loop state would have restored, for a checkpoint that has none (``FabricLoop``'s):
    ``trainer.global_step`` (optimizer steps, which ``max_steps`` counts under manual optimisation) and the step
    loggers use (rollout steps)."""
    loop = trainer.fit_loop.epoch_loop
    progress = loop.manual_optimization.optim_step_progress.total
    progress.ready = progress.completed = int(optimizer_steps)
    loop._batches_that_stepped = int(rollout_steps)


# ------------------------------------------------------------------------------------------ unreadable checkpoints
class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, unfinished or not a lit_rlft / Lightning checkpoint; the message is
    one line naming the path."""


#: ``ckpt_path`` values Lightning resolves itself (not file paths).
SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")
_DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index, written after every shard
_LIGHTNING_META = "meta.pt"  # Lightning's non-tensor state beside the shards, written last


def is_local_checkpoint_path(ckpt_path: Any) -> bool:
    """Whether ``ckpt_path`` names a local file or directory (not ``last`` / ``best`` / ``registry:...`` or a URL)."""
    text = str(ckpt_path)
    return bool(text) and text.split(":", 1)[0] not in SPECIAL_CKPT_PATHS and "://" not in text


def check_checkpoint(path: str | os.PathLike) -> None:
    """Cheap structural check before loading: the path exists; a file is a complete torch zip archive; a directory
    is a finished distributed (DCP) checkpoint. Nothing is unpickled.

    Raises:
        CheckpointError: one line naming the path and what is wrong.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if p.is_dir():
        _check_directory(p, str(path))
        return
    reason = _file_problem(p)
    if reason:
        raise CheckpointError(_unreadable(path, reason))


def _check_directory(path: Path, shown: str) -> None:
    """A distributed checkpoint: DCP's ``.metadata`` and Lightning's ``meta.pt``, the latter a complete file."""
    for name in (_DCP_METADATA, _LIGHTNING_META):
        if not (path / name).is_file():
            raise CheckpointError(
                f"checkpoint directory {shown!r} has no {name} file: not a Lightning distributed (FSDP2 / DCP) "
                "checkpoint, or its save did not finish"
            )
    reason = _file_problem(path / _LIGHTNING_META)
    if reason:
        raise CheckpointError(_unreadable(f"{shown}/{_LIGHTNING_META}", reason))


def _file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a torch checkpoint, or ``None`` when it looks like one."""
    size = path.stat().st_size
    if size == 0:
        return "the file is empty"
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            return f"bad zip archive: {e}"
        if not any(name.endswith("data.pkl") for name in names):
            return "a zip archive without torch's data.pkl"
        return None
    with path.open("rb") as f:
        if f.read(1) == b"\x80":  # torch's legacy (non-zip) format starts with a pickle protocol byte
            return None
    return f"no zip end-of-archive record in its {size} bytes"


def _unreadable(path: str | os.PathLike, reason: str) -> str:
    return f"checkpoint {str(path)!r} is not a lit_rlft / Lightning checkpoint, or is truncated ({reason})"


_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def describe_load_error(path: str | os.PathLike, error: BaseException) -> str:
    """One line for ``torch.load``'s failure on ``path``; never advises ``weights_only=False``."""
    text = str(error)
    found = _UNSUPPORTED_GLOBAL.search(text)
    if found:
        return (f"checkpoint {str(path)!r} holds a {found.group(1)} object, which a weights-only load refuses: it was "
                "not written by lit_rlft (a callback or module that stores custom objects in its state?)")
    first = text.strip().splitlines()[0][:160] if text.strip() else ""
    return _unreadable(path, f"{type(error).__name__}: {first}" if first else type(error).__name__)


# ------------------------------------------------------------------------------------------ atomic writes
def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj)`` to ``<path>.tmp-<pid>``, fsync, then ``os.replace`` onto ``path`` (and fsync the folder).

    A failure or a kill before the rename leaves ``path`` as it was; the temporary file is removed on any exception.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (best effort: not every OS or file system lets a directory be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` with atomic, fsynced local writes (:func:`atomic_save`) and one-line errors
    for unreadable checkpoints (:func:`check_checkpoint`, :func:`describe_load_error`). Remote paths (``s3://``...)
    go through Lightning's own code."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not is_local_checkpoint_path(path):
            super().save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if not is_local_checkpoint_path(path):
            return super().load_checkpoint(path, *args, **kwargs)
        check_checkpoint(path)
        try:
            return super().load_checkpoint(path, *args, **kwargs)
        except (RuntimeError, pickle.UnpicklingError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as e:
            raise CheckpointError(describe_load_error(path, e)) from e


def use_atomic_checkpoint_io(strategy: Any) -> None:
    """Install :class:`AtomicCheckpointIO` on a Trainer's or Fabric's ``strategy`` where it would use Lightning's
    plain ``TorchCheckpointIO`` (also inside a wrapper such as ``AsyncCheckpointIO``); a custom one is kept.
    Strategies that write distributed checkpoints themselves (Fabric's ``ModelParallelStrategy`` raises on
    ``checkpoint_io``) are left as they are."""
    try:
        io = getattr(strategy, "checkpoint_io", None)
    except NotImplementedError:
        return
    if type(io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
    elif type(getattr(io, "checkpoint_io", None)) is TorchCheckpointIO:
        io.checkpoint_io = AtomicCheckpointIO()
