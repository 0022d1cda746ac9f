"""RolloutBudgetStop: end training once a rollout budget is spent, so strategies are compared at equal cost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lit_rlft.callbacks.base import StepCallback, step_context
from lit_rlft.step.context import StepContext, StepOutput


class RolloutBudgetStop(StepCallback):
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

    def exhausted(self, ctx: StepContext) -> bool:
        return ctx.budget.completions >= self.max_completions

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: StepOutput, batch: Any,
                           batch_idx: int) -> None:
        if self.exhausted(step_context(pl_module)):
            trainer.should_stop = True


def training_ends(should_stop: bool, max_steps: int | None, global_step: int, callbacks: Sequence[Any],
                  ctx: StepContext) -> bool:
    """Whether the step that just ran is the last: a stop requested, ``max_steps`` (optimizer steps) reached, or a
    :class:`RolloutBudgetStop` among ``callbacks`` spent (it may run after the callback asking). The Trainer and the
    Fabric loop answer :meth:`StepContext.ends_after_this_step` with it."""
    if should_stop or (max_steps and 0 < max_steps <= global_step):
        return True
    return any(isinstance(cb, RolloutBudgetStop) and cb.exhausted(ctx) for cb in callbacks)
