"""The GRPO step under Lightning Fabric: the same module, worker, updater, selection cores and callbacks, no Trainer.

    # train.py (see examples/fabric_countdown.py)
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp", loggers=TensorBoardLogger("runs/fabric"))
    fabric.launch()
    module = GRPOModule(model="tiny", reward_funcs=["lit_rlft.rewards.countdown_reward"], ...)
    data = PromptDataModule(train=CountdownTask(size=20_000), answer_field=None, batch_size=32)
    FabricLoop(fabric, max_steps=100, callbacks=[DPSCallback(), ReplayCallback()]).fit(module, data)

    fabric run --accelerator cpu --devices 2 --strategy ddp train.py     # or: torchrun --nproc-per-node 2 train.py

:class:`FabricLoop` plays the part of the Trainer for lit_rlft's code: it offers the attributes that ``GRPOModule``
and the callbacks read (``datamodule``, ``callbacks``, ``loggers``, ``should_stop``, ``max_steps``, ``global_step``,
``world_size``, ``is_global_zero``), calls the callbacks' hooks (``setup``, ``on_fit_start``, ``on_train_start``,
``on_train_batch_end``, ``on_train_end``) and runs :meth:`GRPOModule.grpo_step` with a Fabric backend for the
updater: ``fabric.backward``, ``fabric.no_backward_sync`` on all micro-batches but the last, ``fabric.clip_gradients``.
The policy itself is what Fabric wraps (DDP, or FSDP2 through ``ModelParallelStrategy(parallelize_fn=
fsdp2_parallelize)``), so every training forward goes through the wrapper.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from lit_rlft.lightning.checkpointing import check_checkpoint, is_local_checkpoint_path, use_atomic_checkpoint_io
from lit_rlft.models.sharding import fully_shard_policy, is_sharded

__all__ = ["FabricLoop", "fsdp2_parallelize"]


def fsdp2_parallelize(model: nn.Module, device_mesh: Any) -> nn.Module:
    """``parallelize_fn`` for Fabric's ``ModelParallelStrategy``: FSDP2 over the data-parallel mesh dimension."""
    mesh = device_mesh["data_parallel"] if "data_parallel" in (device_mesh.mesh_dim_names or ()) else device_mesh
    fully_shard_policy(model, mesh)
    return model


class FabricLoop:
    """Train a :class:`~lit_rlft.lightning.module.GRPOModule` with Fabric.

    Args:
        fabric: a launched ``lightning.Fabric`` (its loggers receive the metrics, at the rollout step).
        max_steps: optimizer steps (as ``Trainer(max_steps=...)``: ``num_iterations * num_mini_batches`` per rollout
            step); training also ends when a callback sets ``should_stop`` (e.g. ``RolloutBudgetStop``).
        callbacks: Lightning callbacks (lit_rlft's selection, replay, logging and budget callbacks).
        val_every_n_steps: rollout steps between validations (``None``: never).
        checkpoint_dir: where :meth:`save` writes ``step=<n>.ckpt`` every ``checkpoint_every_n_steps`` rollout steps.
        checkpoint_every_n_steps: ``None``: only when :meth:`save` is called.

    Single-file checkpoints are written atomically (:class:`~lit_rlft.lightning.checkpointing.AtomicCheckpointIO` is installed
    on the Fabric's strategy unless it has a custom checkpoint IO), and :meth:`load` reports a missing, truncated or
    unfinished checkpoint in one line naming it (:class:`~lit_rlft.lightning.checkpointing.CheckpointError`).
    """

    def __init__(self, fabric: L.Fabric, max_steps: int, callbacks: Sequence[L.Callback] = (),
                 val_every_n_steps: int | None = None, checkpoint_dir: str | None = None,
                 checkpoint_every_n_steps: int | None = None):
        if max_steps < 1:
            raise ValueError(f"FabricLoop: max_steps must be >= 1, got {max_steps}")
        self.fabric = fabric
        use_atomic_checkpoint_io(fabric.strategy)
        self.max_steps = max_steps
        self.callbacks = list(callbacks)
        self.val_every_n_steps = val_every_n_steps
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every_n_steps = checkpoint_every_n_steps
        self.should_stop = False
        self.global_step = 0  # optimizer steps
        self.datamodule: Any = None
        self.module: Any = None
        self.model: Any = None  # the Fabric-wrapped policy
        self.optimizer: Any = None
        self.scheduler: Any = None
        self._log_step = 0

    # -- what callbacks read from "the trainer" -----------------------------------------------------------------
    @property
    def loggers(self) -> list[Any]:
        return list(self.fabric.loggers)

    @property
    def world_size(self) -> int:
        return self.fabric.world_size

    @property
    def global_rank(self) -> int:
        return self.fabric.global_rank

    @property
    def is_global_zero(self) -> bool:
        return self.fabric.is_global_zero

    @property
    def default_root_dir(self) -> str:
        return self.checkpoint_dir or "."

    @property
    def log_dir(self) -> str | None:
        logger = self.fabric.logger if self.fabric.loggers else None
        return getattr(logger, "log_dir", None)

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        """Write ``metrics`` to Fabric's loggers at the current rollout step (rank 0's loggers write)."""
        self.fabric.log_dict({k: float(v) for k, v in metrics.items()}, step=self._log_step)

    # -- the loop ------------------------------------------------------------------------------------------------
    def fit(self, module: Any, datamodule: Any, ckpt_path: str | None = None) -> None:
        """Set up the model, optimizer and callbacks, optionally resume from ``ckpt_path``, and train."""
        self.setup(module, datamodule)
        if ckpt_path is not None:
            self.load(ckpt_path)
        self._call("on_fit_start")
        self._call("on_train_start")
        while self.global_step < self.max_steps and not self.should_stop:
            self._log_step = module.rollout_step
            backend = FabricBackend(self.fabric, self.model, self.optimizer, self.scheduler, module)
            steps_before = backend.steps
            outputs = module.grpo_step(backend)
            self.global_step += backend.steps - steps_before
            batch_idx = module.rollout_step - 1
            for cb in self.callbacks:
                cb.on_train_batch_end(self, module, outputs, batch_idx, batch_idx)
            if self.val_every_n_steps and module.rollout_step % self.val_every_n_steps == 0:
                self.validate()
            if self.checkpoint_every_n_steps and module.rollout_step % self.checkpoint_every_n_steps == 0:
                self.save(str(Path(self.default_root_dir) / f"step={module.rollout_step}.ckpt"))
        self._call("on_train_end")
        self._call("on_fit_end")

    def setup(self, module: Any, datamodule: Any) -> None:
        """What the Trainer does before its first step: data, module and callback ``setup``, the model (wrapped by
        Fabric's strategy), the optimizer and scheduler, and the module's ``on_fit_start``."""
        self.module, self.datamodule = module, datamodule
        module._loop = self
        datamodule.setup("fit")
        module.setup("fit")
        for cb in self.callbacks:
            cb.setup(self, module, "fit")
        if module.policy is None:
            module.build_policy(mesh=None)  # Fabric's ModelParallelStrategy shards in setup_module (parallelize_fn)
        self.model = self.fabric.setup_module(module.policy)
        module.to(self.fabric.device)
        module.engine.setup(module.policy, module.tokenizer, sharded=is_sharded(module.policy))
        config = module.configure_optimizers()
        self.optimizer = self.fabric.setup_optimizers(config["optimizer"])
        self.scheduler = config["lr_scheduler"]["scheduler"]  # steps the param groups the wrapper shares
        module.on_fit_start()

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Run the validation pool through the module (every rank its share); return the synced metrics."""
        module = self.module
        if module.val_metrics is None or self.datamodule.val_pool is None:
            return {}
        module.on_validation_start()
        for i, batch in enumerate(self.datamodule.val_dataloader()):
            module.validation_step(batch, i)
        module.on_validation_epoch_end()
        return module.last_eval

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a checkpoint holds: model and optimizer (through Fabric), scheduler, module counters, the plan,
        every callback's state (keyed by ``state_key``) and the loop's step."""
        lit_rlft: dict[str, Any] = {}
        self.module.on_save_checkpoint(lit_rlft)
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler.state_dict(),
            "module": lit_rlft["lit_rlft"],
            "datamodule": self.datamodule.state_dict(),
            "callbacks": {cb.state_key: cb.state_dict() for cb in self.callbacks},
            "global_step": self.global_step,
        }

    def save(self, path: str) -> None:
        """Write a checkpoint (every rank calls this; Fabric decides who writes what)."""
        self.fabric.save(path, self.state())

    def load(self, path: str) -> None:
        """Restore :meth:`save`'s checkpoint into the set-up loop (callbacks restore before ``on_fit_start``)."""
        if is_local_checkpoint_path(path):
            check_checkpoint(path)
        state = self.state()
        self.fabric.load(path, state)
        self.scheduler.load_state_dict(state["scheduler"])
        self.module.on_load_checkpoint({"lit_rlft": state["module"]})
        self.datamodule.load_state_dict(state["datamodule"])
        for cb in self.callbacks:
            if cb.state_key in state["callbacks"]:
                cb.load_state_dict(state["callbacks"][cb.state_key])
        self.global_step = int(state["global_step"])

    def _call(self, hook: str) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(self, self.module)


class FabricBackend:
    """How the updater optimises under Fabric (see :class:`lit_rlft.step.update.UpdateBackend`)."""

    def __init__(self, fabric: L.Fabric, model: nn.Module, optimizer: Any, scheduler: Any, module: Any):
        self.fabric, self._model, self.optimizer, self.scheduler, self.module = (fabric, model, optimizer, scheduler,
                                                                                 module)
        self.steps = 0

    @property
    def model(self) -> nn.Module:
        return self._model

    @property
    def device(self) -> torch.device:
        return self.fabric.device

    @property
    def world_size(self) -> int:
        return self.fabric.world_size

    def backward(self, loss: Tensor) -> None:
        self.fabric.backward(loss, model=self._model)

    def no_sync(self) -> AbstractContextManager:
        return _fabric_no_sync(self.fabric, self._model)

    def clip_grad_norm(self, max_norm: float) -> float:
        total = self.fabric.clip_gradients(self._model, self.optimizer, max_norm=max_norm, error_if_nonfinite=False)
        if hasattr(total, "full_tensor"):
            total = total.full_tensor()
        return float(total)

    @property
    def scaler_skips_nonfinite(self) -> bool:
        """Under 16-mixed the GradScaler skips steps with infinite gradients itself (and lowers its scale)."""
        return getattr(self.fabric.strategy.precision, "scaler", None) is not None

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.scheduler.step()
        self.steps += 1

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def learning_rate(self) -> float:
        return float(self.scheduler.get_last_lr()[0])


@contextmanager
def _fabric_no_sync(fabric: L.Fabric, model: nn.Module) -> Iterator[None]:
    if fabric.world_size == 1:
        yield
        return
    with fabric.no_backward_sync(model, enabled=True):
        yield
