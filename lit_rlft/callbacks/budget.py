"""RolloutBudgetStop: end training once a rollout budget is spent, so strategies are compared at equal cost."""

from __future__ import annotations

from typing import Any

import lightning as L


class RolloutBudgetStop(L.Callback):
    """Stop after the step in which the run's cumulative completions reach ``max_completions``.

    Every completion counts (training, reference sets, dynamic-sampling rounds), so strategies that spend extra
    rollouts are charged for them.

    Example::

        trainer = L.Trainer(max_steps=10_000, callbacks=[DPSCallback(), RolloutBudgetStop(max_completions=50_000)])

    Args:
        max_completions: total completions the run may generate.
    """

    def __init__(self, max_completions: int):
        if max_completions < 1:
            raise ValueError(f"RolloutBudgetStop: max_completions must be >= 1, got {max_completions}")
        self.max_completions = max_completions

    def exhausted(self, pl_module: L.LightningModule) -> bool:
        return pl_module.budget.completions >= self.max_completions

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.exhausted(pl_module):
            trainer.should_stop = True


def training_ends_after_this_step(trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
    """Whether the step that just ran is the last: ``max_steps`` reached, a stop requested, or a rollout budget
    spent. Selection callbacks then skip planning (DOTS would otherwise roll out a reference set nobody uses)."""
    if trainer.should_stop or (trainer.max_steps and 0 < trainer.max_steps <= trainer.global_step):
        return True
    return any(isinstance(cb, RolloutBudgetStop) and cb.exhausted(pl_module) for cb in trainer.callbacks)
