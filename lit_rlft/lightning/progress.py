"""Lightning's progress bar, counting rollout steps.

Lightning sizes the training bar from ``trainer.max_steps`` as if every batch made one optimizer step, and Rich
shows ``Epoch 0/-2`` when ``max_epochs`` is -1 (the default with ``max_steps``). A GRPO batch is one rollout step of
``num_iterations * num_mini_batches`` optimizer steps: :func:`rollout_progress_bar` gives the Trainer's own bar (same
settings) a total in rollout steps and drops the ``/-2``. ``GRPOModule.configure_callbacks`` installs it; a custom
progress bar is left alone.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


class _RolloutSteps:
    """Mixin for Lightning's progress bars: the epoch's total in rollout steps."""

    optimizer_steps_per_batch = 1

    @property
    def total_train_batches(self) -> int | float:
        trainer = self.trainer  # type: ignore[attr-defined]
        if trainer.max_epochs == -1 and trainer.max_steps is not None and trainer.max_steps > 0:
            remaining = math.ceil((trainer.max_steps - trainer.global_step) / self.optimizer_steps_per_batch)
            return min(trainer.num_training_batches, remaining)
        return trainer.num_training_batches


class RolloutTQDMProgressBar(_RolloutSteps, TQDMProgressBar):
    """``TQDMProgressBar`` counting rollout steps."""


class RolloutRichProgressBar(_RolloutSteps, RichProgressBar):
    """``RichProgressBar`` counting rollout steps, without ``/-2`` when training is bounded by ``max_steps``."""

    def _get_train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs == -1:
            return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"
        return super()._get_train_description(current_epoch)


def rollout_progress_bar(bar: Any, optimizer_steps_per_batch: int) -> Any:
    """A copy of Lightning's default ``bar`` (same settings) that counts rollout steps; None for any other bar."""
    kinds = {TQDMProgressBar: RolloutTQDMProgressBar, RichProgressBar: RolloutRichProgressBar}
    kind = kinds.get(type(bar))
    if kind is None:
        return None
    out = copy.copy(bar)
    out.__class__ = kind  # the subclass adds behaviour only: the instance's settings carry over as they are
    out.optimizer_steps_per_batch = optimizer_steps_per_batch
    return out
