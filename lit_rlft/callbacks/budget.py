"""RolloutBudgetStop: end training once a rollout budget is spent, so strategies are compared at equal cost."""

from __future__ import annotations

from lit_rlft.callbacks.base import StepCallback
from lit_rlft.step.context import StepContext, StopCondition


class RolloutBudgetStop(StepCallback, StopCondition):
    """Stop after the step in which the run's cumulative completions reach ``max_completions``.

    Every completion counts (training, reference sets, dynamic-sampling rounds), so strategies that spend extra
    rollouts are charged for them. A :class:`~lit_rlft.step.context.StopCondition`: the step asks it whenever
    anyone asks whether training ends, so it works under the Trainer, ``FabricLoop`` and a plain loop alike, and a
    selection callback listed before it already knows not to plan a step that will not run.

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

    def stop_reason(self, ctx: StepContext) -> str | None:
        if not self.exhausted(ctx):
            return None
        return (f"RolloutBudgetStop: {ctx.budget.completions} completions generated, max_completions="
                f"{self.max_completions}")
