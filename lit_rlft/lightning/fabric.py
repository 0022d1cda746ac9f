"""The GRPO step under Lightning Fabric: no Trainer, no LightningModule, the same step, callbacks and checkpoints.

    # train.py (see examples/fabric_countdown.py)
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp", loggers=TensorBoardLogger("runs/fabric"))
    fabric.launch()
    config = GRPOConfig(model="tiny", reward_funcs=["lit_rlft.rewards.countdown_reward"], ...)
    data = PromptDataModule(train=CountdownTask(size=20_000), answer_field=None, batch_size=32)
    step = FabricLoop(fabric, max_steps=100, callbacks=[DPSCallback(), ReplayCallback()]).fit(config, data)

    torchrun --nproc-per-node 2 train.py                                     # or, for a script without launch():
    fabric run --accelerator cpu --devices 2 --strategy ddp train.py

:class:`FabricLoop` builds the :class:`~lit_rlft.step.grpo.GRPOStep` from a :class:`~lit_rlft.step.config.GRPOConfig`,
lets Fabric wrap the policy (DDP, or FSDP2 through ``ModelParallelStrategy(parallelize_fn=fsdp2_parallelize)``) and
its optimizer, and drives the step and the callbacks' context methods (``setup_step``, ``before_first_step``,
``after_step``) through the one loop (:func:`lit_rlft.step.loop.train`); metrics go to Fabric's loggers at the rollout step, checkpoints through ``fabric.save`` in the
Trainer's layout (:mod:`lit_rlft.lightning.checkpointing`), so either driver resumes the other's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from torch import nn

from lit_rlft.lightning.backend import LightningBackend
from lit_rlft.lightning.checkpointing import (
    check_checkpoint,
    is_local_checkpoint_path,
    restore_from_checkpoint,
    restore_run_state,
    run_state,
    trainer_checkpoint,
    use_atomic_checkpoint_io,
)
from lit_rlft.lightning.module import log_text
from lit_rlft.models.sharding import data_parallel_mesh, fully_shard_policy, is_sharded
from lit_rlft.runtime.distributed import get_collective
from lit_rlft.step.builder import build_models, build_step
from lit_rlft.step.config import GRPOConfig
from lit_rlft.step.context import StepOutput
from lit_rlft.step.grpo import GRPOStep
from lit_rlft.step.loop import train
from lit_rlft.step.optim import configure_adamw

__all__ = ["FabricLoop", "fsdp2_parallelize"]

_CONTEXT_METHODS = ("setup_step", "before_first_step", "after_step")  # what train() calls of a callback


def fsdp2_parallelize(model: nn.Module, device_mesh: Any) -> nn.Module:
    """``parallelize_fn`` for Fabric's ``ModelParallelStrategy``: FSDP2 over the data-parallel mesh dimension."""
    fully_shard_policy(model, data_parallel_mesh(device_mesh))
    return model


class FabricLoop:
    """Train a GRPO step with Fabric.

    Args:
        fabric: a launched ``lightning.Fabric`` (its loggers receive the metrics, at the rollout step).
        max_steps: optimizer steps (as ``Trainer(max_steps=...)``: ``num_iterations * num_mini_batches`` per rollout
            step); training also ends when a callback asks for a stop (e.g. ``RolloutBudgetStop``).
        callbacks: lit_rlft callbacks (selection, replay, logging, budget): anything with the context methods
            ``setup_step``, ``before_first_step`` and ``after_step``.
        val_every_n_steps: rollout steps between validations (None: never during training).
        checkpoint_dir: where ``step=<n>.ckpt`` is written every ``checkpoint_every_n_steps`` rollout steps.
        checkpoint_every_n_steps: None: only when :meth:`save` is called.
        progress_bar: a progress bar of rollout steps on rank 0.

    Single-file checkpoints are written atomically, and :meth:`load` reports a missing, truncated or unfinished
    checkpoint in one line naming it (:class:`~lit_rlft.lightning.checkpointing.CheckpointError`).
    """

    def __init__(self, fabric: L.Fabric, max_steps: int, callbacks: Sequence[Any] = (),
                 val_every_n_steps: int | None = None, checkpoint_dir: str | None = None,
                 checkpoint_every_n_steps: int | None = None, progress_bar: bool = True):
        if max_steps < 1:
            raise ValueError(f"FabricLoop: max_steps must be >= 1, got {max_steps}")
        for cb in callbacks:
            missing = [m for m in _CONTEXT_METHODS if not callable(getattr(cb, m, None))]
            if missing:
                raise TypeError(f"FabricLoop: callback {type(cb).__name__} has no {', '.join(missing)}: FabricLoop "
                                "drives lit_rlft's step callbacks (lit_rlft.callbacks.base.StepCallback), not "
                                "Trainer-only Lightning callbacks")
        self.fabric = fabric
        use_atomic_checkpoint_io(fabric.strategy)
        self.max_steps, self.callbacks = max_steps, list(callbacks)
        self.val_every_n_steps, self.progress_bar = val_every_n_steps, progress_bar
        self.checkpoint_dir, self.checkpoint_every_n_steps = checkpoint_dir, checkpoint_every_n_steps
        self.global_step = 0  # optimizer steps
        self.step: GRPOStep | None = None
        self.data: Any = None
        self.model: Any = None  # the Fabric-wrapped policy
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.backend: LightningBackend | None = None

    # -- the loop ------------------------------------------------------------------------------------------------
    def fit(self, grpo: GRPOConfig | GRPOStep, data: Any, ckpt_path: str | None = None) -> GRPOStep:
        """Build (from a config) or take the step, set it up, optionally resume from ``ckpt_path``, and train until
        ``max_steps`` or a requested stop (the one loop, :func:`lit_rlft.step.loop.train`); the step. The reward
        worker processes are stopped when it returns or raises."""
        step = self.setup(grpo, data)
        try:
            if ckpt_path is not None:
                self.load(ckpt_path)
            bar = self._progress_bar(step.rollout_step)
            for out in train(step, self.backend, self.callbacks, on_output=self._count_and_log):
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{out.metrics['reward']:.3f}", completions=step.budget.completions)
                if self.val_every_n_steps and step.rollout_step % self.val_every_n_steps == 0:
                    self.validate()
                if self.checkpoint_every_n_steps and step.rollout_step % self.checkpoint_every_n_steps == 0:
                    self.save(str(Path(self.checkpoint_dir or ".") / f"step={step.rollout_step}.ckpt"))
            if bar is not None:
                bar.close()
            if step.stop_requested:
                self.fabric.print(f"lit_rlft: training stops at rollout step {step.rollout_step}: "
                                  f"{step.stop_requested}")
        finally:
            step.close()
        return step

    def _count_and_log(self, out: StepOutput) -> None:
        """Before the callbacks see a step: its optimizer steps counted (``max_steps``), its metrics logged."""
        self.global_step += out.optimizer_steps
        self._log(out.metrics, out.step)

    def setup(self, grpo: GRPOConfig | GRPOStep, data: Any) -> GRPOStep:
        """What a Trainer does before its first step: the step bound to the data, the ranks, the callbacks and
        Fabric's logging; the policy built (unless the step has one), wrapped by Fabric's strategy, then attached
        (which sets the engine up, once); the optimizer."""
        if not isinstance(grpo, (GRPOConfig, GRPOStep)):
            raise TypeError(f"FabricLoop.fit takes a GRPOConfig or a GRPOStep, got {type(grpo).__name__} (for a "
                            "GRPOModule, pass module.config)")
        step = self.step = grpo if isinstance(grpo, GRPOStep) else build_step(grpo, models=False)
        self.data = data
        data.setup("fit")
        step.bind(data, get_collective(), callbacks=self.callbacks, sink=self._log, text_sink=self._log_text,
                  ends=lambda: self.global_step >= self.max_steps, log_dir=self._log_dir(),
                  saver=self.save)
        policy, reference = step.policy, step.reference
        if policy is None:
            if step.config is None:
                raise ValueError("FabricLoop: the GRPOStep has no policy and no config to build one from (use "
                                 "build_step(config, models=False), or attach a policy first)")
            policy, reference = build_models(step.config)  # Fabric's ModelParallelStrategy shards in setup_module
        self.model = self.fabric.setup_module(policy)
        step.attach(policy, reference)
        config = configure_adamw(policy, step.optim, self.max_steps)
        self.optimizer = self.fabric.setup_optimizers(config["optimizer"])
        self.scheduler = config["lr_scheduler"]["scheduler"]  # steps the param groups the wrapper shares
        self.backend = LightningBackend.for_fabric(self.fabric, self.model, policy, self.optimizer, self.scheduler)
        return step

    def validate(self) -> dict[str, float]:
        """Run the validation pool through the step (every rank its share); log and return the synced metrics."""
        step = self.step
        metrics = step.validate(self.data.val_dataloader()) if step.validation.metrics is not None else {}
        if metrics:
            self._log(metrics, max(step.rollout_step - 1, 0))
        return metrics

    def _log(self, metrics: Mapping[str, float], step: int) -> None:
        self.fabric.log_dict({k: float(v) for k, v in metrics.items()}, step=step)

    def _log_text(self, tag: str, text: str, step: int) -> None:
        log_text(self.fabric.loggers, tag, text, step)

    def _log_dir(self) -> str:
        return (getattr(self.fabric.logger, "log_dir", None) if self.fabric.loggers else None) or \
            self.checkpoint_dir or "."

    def _progress_bar(self, start: int) -> Any:
        if not (self.progress_bar and self.fabric.is_global_zero):
            return None
        from tqdm.auto import tqdm

        o = self.step.optim
        total = math.ceil(self.max_steps / (o.num_iterations * o.num_mini_batches))
        return tqdm(total=total, initial=min(start, total), desc="rollout steps", dynamic_ncols=True)

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Write a checkpoint in the Trainer's layout (every rank calls this; Fabric decides who writes what). A
        sharded (FSDP2) policy and its optimizer go through Fabric's distributed writer instead."""
        step, parts = self.step, (self.scheduler, self.step, self.data, self.callbacks, self.global_step)
        if is_sharded(step.policy):
            self.fabric.save(path, {"model": self.model, "optimizer": self.optimizer, **run_state(*parts)})
        else:
            self.fabric.save(path, trainer_checkpoint(step.policy, self.optimizer, *parts))

    def load(self, path: str) -> None:
        """Restore a checkpoint of :meth:`save` or of a Trainer run into the set-up loop (before the callbacks'
        ``setup_step``, as under the Trainer)."""
        if is_local_checkpoint_path(path):
            check_checkpoint(path)
        parts = (self.scheduler, self.step, self.data, self.callbacks)
        if is_sharded(self.step.policy):
            rest = self.fabric.load(path, {"model": self.model, "optimizer": self.optimizer})
            self.global_step = restore_run_state(rest, *parts)
        else:
            checkpoint = self.fabric.load(path)
            self.global_step = restore_from_checkpoint(checkpoint, self.step.policy, self.optimizer, *parts)
