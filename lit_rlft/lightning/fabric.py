"""The GRPO step under Lightning Fabric: the same module, step, callbacks and checkpoints, no Trainer.

    # train.py (see examples/fabric_countdown.py)
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp", loggers=TensorBoardLogger("runs/fabric"))
    fabric.launch()
    module = GRPOModule(model="tiny", reward_funcs=["lit_rlft.rewards.countdown_reward"], ...)
    data = PromptDataModule(train=CountdownTask(size=20_000), answer_field=None, batch_size=32)
    FabricLoop(fabric, max_steps=100, callbacks=[DPSCallback(), ReplayCallback()]).fit(module, data)

    torchrun --nproc-per-node 2 train.py                                     # or, for a script without launch():
    fabric run --accelerator cpu --devices 2 --strategy ddp train.py

:class:`FabricLoop` drives :class:`~lit_rlft.step.grpo.GRPOStep` (``module.grpo``): Fabric wraps the policy (DDP, or
FSDP2 through ``ModelParallelStrategy(parallelize_fn=fsdp2_parallelize)``) and its optimizer, the updater optimises
through :class:`~lit_rlft.lightning.backend.LightningBackend`, metrics go to Fabric's loggers at the rollout step,
and the callbacks' Lightning hooks are called with the loop in the Trainer's place (lit_rlft's callbacks only use
the step's context, so they behave exactly as under the Trainer).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from lit_rlft.callbacks.budget import training_ends
from lit_rlft.core.distributed import get_collective
from lit_rlft.lightning.backend import LightningBackend
from lit_rlft.lightning.checkpointing import check_checkpoint, is_local_checkpoint_path, use_atomic_checkpoint_io
from lit_rlft.lightning.module import log_text, rollout_hooks
from lit_rlft.models.sharding import data_parallel_mesh, fully_shard_policy
from lit_rlft.step.optim import configure_adamw

__all__ = ["FabricLoop", "fsdp2_parallelize"]


def fsdp2_parallelize(model: nn.Module, device_mesh: Any) -> nn.Module:
    """``parallelize_fn`` for Fabric's ``ModelParallelStrategy``: FSDP2 over the data-parallel mesh dimension."""
    fully_shard_policy(model, data_parallel_mesh(device_mesh))
    return model


class FabricLoop:
    """Train a :class:`~lit_rlft.lightning.module.GRPOModule` with Fabric.

    Args:
        fabric: a launched ``lightning.Fabric`` (its loggers receive the metrics, at the rollout step).
        max_steps: optimizer steps (as ``Trainer(max_steps=...)``: ``num_iterations * num_mini_batches`` per rollout
            step); training also ends when a callback sets ``should_stop`` (e.g. ``RolloutBudgetStop``).
        callbacks: Lightning callbacks (lit_rlft's selection, replay, logging and budget callbacks).
        val_every_n_steps: rollout steps between validations (None: never during training).
        checkpoint_dir: where ``step=<n>.ckpt`` is written every ``checkpoint_every_n_steps`` rollout steps.
        checkpoint_every_n_steps: None: only when :meth:`save` is called.
        progress_bar: a progress bar of rollout steps on rank 0.

    Single-file checkpoints are written atomically, and :meth:`load` reports a missing, truncated or unfinished
    checkpoint in one line naming it (:class:`~lit_rlft.lightning.checkpointing.CheckpointError`).
    """

    def __init__(self, fabric: L.Fabric, max_steps: int, callbacks: Sequence[L.Callback] = (),
                 val_every_n_steps: int | None = None, checkpoint_dir: str | None = None,
                 checkpoint_every_n_steps: int | None = None, progress_bar: bool = True):
        if max_steps < 1:
            raise ValueError(f"FabricLoop: max_steps must be >= 1, got {max_steps}")
        self.fabric = fabric
        use_atomic_checkpoint_io(fabric.strategy)
        self.max_steps = max_steps
        self.callbacks = list(callbacks)
        self.val_every_n_steps = val_every_n_steps
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every_n_steps = checkpoint_every_n_steps
        self.progress_bar = progress_bar
        self.should_stop = False
        self.global_step = 0  # optimizer steps
        self.datamodule: Any = None
        self.module: Any = None
        self.model: Any = None  # the Fabric-wrapped policy
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.backend: LightningBackend | None = None

    # -- what other Lightning callbacks may read from "the trainer" ---------------------------------------------
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
        return getattr(self.fabric.logger, "log_dir", None) if self.fabric.loggers else None

    # -- the loop ------------------------------------------------------------------------------------------------
    def fit(self, module: Any, datamodule: Any, ckpt_path: str | None = None) -> None:
        """Set up the model, optimizer and callbacks, optionally resume from ``ckpt_path``, and train. The reward
        worker processes are stopped when it returns or raises."""
        try:
            self._fit(module, datamodule, ckpt_path)
        finally:
            module.grpo.close()

    def _fit(self, module: Any, datamodule: Any, ckpt_path: str | None) -> None:
        self.setup(module, datamodule)
        if ckpt_path is not None:
            self.load(ckpt_path)
        step = module.grpo
        self._call("on_fit_start")
        self._call("on_train_start")
        hooks = rollout_hooks(self.callbacks)
        bar = self._progress_bar(step.rollout_step)
        while self.global_step < self.max_steps and not self.should_stop:
            out = step.run(self.backend, hooks)
            self.global_step += out.optimizer_steps
            self._log_scalars(out.metrics, out.step)
            for cb in self.callbacks:
                cb.on_train_batch_end(self, module, out, None, out.step)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{out.metrics['reward']:.3f}", completions=step.budget.completions)
            if self.val_every_n_steps and step.rollout_step % self.val_every_n_steps == 0:
                self.validate()
            if self.checkpoint_every_n_steps and step.rollout_step % self.checkpoint_every_n_steps == 0:
                self.save(str(Path(self.default_root_dir) / f"step={step.rollout_step}.ckpt"))
        if bar is not None:
            bar.close()
        self._call("on_train_end")
        self._call("on_fit_end")

    def setup(self, module: Any, datamodule: Any) -> None:
        """What the Trainer does before its first step: data and step binding, callback ``setup``, the policy (wrapped
        by Fabric's strategy, then handed to the step, which sets the engine up once), the optimizer, and the
        module's ``on_fit_start``."""
        self.module, self.datamodule = module, datamodule
        datamodule.setup("fit")
        module.grpo.bind(datamodule, get_collective(), sink=self._log_scalars, text_sink=self._log_text,
                         ends=lambda: training_ends(self.should_stop, self.max_steps, self.global_step,
                                                    self.callbacks, module.grpo),
                         log_dir=self.log_dir or self.default_root_dir)
        for cb in self.callbacks:
            cb.setup(self, module, "fit")
        if module.policy is None:
            module.build_policy(mesh=None)  # Fabric's ModelParallelStrategy shards in setup_module (parallelize_fn)
        self.model = self.fabric.setup_module(module.policy)
        module.to(self.fabric.device)
        module.grpo.attach(module.policy, module.reference)
        config = configure_adamw(module.policy, module.grpo.optim, self.max_steps)
        self.optimizer = self.fabric.setup_optimizers(config["optimizer"])
        self.scheduler = config["lr_scheduler"]["scheduler"]  # steps the param groups the wrapper shares
        self.backend = LightningBackend.for_fabric(self.fabric, self.model, module.policy, self.optimizer,
                                                   self.scheduler)
        module.on_fit_start()

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Run the validation pool through the step (every rank its share); log and return the synced metrics."""
        step = self.module.grpo
        if step.val_metrics is None:
            return {}
        self.module.on_validation_start()
        for batch in self.datamodule.val_dataloader():
            step.validation_batch(batch.numpy())
        metrics = step.validation_results()
        self._log_scalars(metrics, max(step.rollout_step - 1, 0))
        self.module.last_eval = metrics
        return metrics

    def _log_scalars(self, metrics: Mapping[str, float], step: int) -> None:
        self.fabric.log_dict({k: float(v) for k, v in metrics.items()}, step=step)

    def _log_text(self, tag: str, text: str, step: int) -> None:
        log_text(self.fabric.loggers, tag, text, step)

    def _progress_bar(self, start: int) -> Any:
        if not (self.progress_bar and self.fabric.is_global_zero):
            return None
        from tqdm.auto import tqdm

        o = self.module.grpo.optim
        total = math.ceil(self.max_steps / (o.num_iterations * o.num_mini_batches))
        return tqdm(total=total, initial=min(start, total), desc="rollout steps", dynamic_ncols=True)

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a checkpoint holds: model and optimizer (through Fabric), scheduler, the step's counters, the plan,
        every callback's state (keyed by ``state_key``) and the loop's step."""
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler.state_dict(),
            "module": self.module.grpo.state_dict(),
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
        self.module.grpo.load_state_dict(state["module"])
        self.datamodule.load_state_dict(state["datamodule"])
        for cb in self.callbacks:
            if cb.state_key in state["callbacks"]:
                cb.load_state_dict(state["callbacks"][cb.state_key])
        self.global_step = int(state["global_step"])
        self.module.grpo.sync_engine()  # the restored weights, not those the engine was set up with

    def _call(self, hook: str) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(self, self.module)
