"""AllocationCallback: per-prompt rollout allocation under a budget, from a selection strategy's predicted success
(Knapsack RL's idea, valued as expected informative groups)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lit_rlft.callbacks.base import RolloutHook, StepCallback
from lit_rlft.callbacks.extend import check_first_hook, more_completions, sizes_and_spread, train_on_spread
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.selection.allocation import allocate
from lit_rlft.step.context import StepContext


class AllocationCallback(RolloutHook, StepCallback):
    """Give each prompt of the batch between ``min_generations`` and ``max_generations`` completions, so as to
    maximise the expected number of groups with both outcomes within a budget of completions per step.

    The probability that a prompt's group of ``n`` completions shows both outcomes comes from a selection callback
    bound in the same run whose strategy predicts success rates: ``DPSCallback`` (its state beliefs), ``MoPPSCallback``
    (its Beta posteriors) or ``DOTSCallback`` (its attention predictions); see :mod:`lit_rlft.selection.allocation`.
    Prompts believed always solved or never solved get ``min_generations``; the completions this saves go where a
    few more most raise the chance of a spread, and completions that would add less than ``min_gain`` expected
    informative groups each are not spent at all. One step:

    1. the planned batch is rolled out with ``min_generations`` completions each (the step asks its hooks for
       ``initial_generations``);
    2. the allocation, from the strategy's predictions made before any of this step's outcomes (the predictions the
       strategy selected the batch with), and one generation call per distinct number of extra completions
       (charged as ``budget/completions_allocation``), joined to each prompt's first ones;
    3. the groups with a reward spread are trained on, each with all its completions (groups of different sizes);
       the others have no gradient and are dropped unless ``keep_unresolved``.

    Logs ``allocation/{mean_generations, max_generations, expected_informative, informative_groups,
    planned_completions}``. On ``W`` ranks the allocation is computed from the global record (the same everywhere),
    each rank generates for its own prompts (see ``callbacks/extend.py``), and the ranks may train on different
    numbers of groups.

    It must be the first rollout hook; replay may follow it. The selection callback may come anywhere.

    Example::

        trainer = L.Trainer(callbacks=[AllocationCallback(min_generations=2, max_generations=16), DPSCallback()])

    Args:
        min_generations: completions every prompt gets (>= 1).
        max_generations: completions a prompt gets at most.
        budget_ratio: completions per step = ``budget_ratio * B * G`` (1: uniform GRPO's spend).
        granularity: completions are added in steps of this many (fewer, larger generation calls).
        min_gain: the least gain in expected informative groups per completion worth spending a completion on.
        keep_unresolved: also train on the groups without a reward spread (zero advantages).
    """

    prefix = "allocation"

    def __init__(self, min_generations: int = 2, max_generations: int = 16, budget_ratio: float = 1.0,
                 granularity: int = 2, min_gain: float = 0.01, keep_unresolved: bool = False):
        if min_generations < 1 or max_generations < min_generations or granularity < 1:
            raise ValueError(f"AllocationCallback needs 1 <= min_generations <= max_generations and granularity >= "
                             f"1, got {min_generations}, {max_generations}, {granularity}")
        if not budget_ratio > 0:
            raise ValueError(f"budget_ratio must be > 0, got {budget_ratio}")
        self.initial_generations = int(min_generations)
        self.min_generations, self.max_generations = int(min_generations), int(max_generations)
        self.budget_ratio, self.granularity = float(budget_ratio), int(granularity)
        self.min_gain, self.keep_unresolved = float(min_gain), bool(keep_unresolved)
        self._predictor: Any = None

    def setup_step(self, ctx: StepContext) -> None:
        self._predictor = next((cb for cb in ctx.callbacks if getattr(cb, "predicts_success", False)), None)
        if self._predictor is None:
            known = [type(cb).__name__ for cb in ctx.callbacks]
            raise ValueError(f"AllocationCallback needs a selection callback whose strategy predicts success "
                             f"(DPSCallback, MoPPSCallback or DOTSCallback) bound in the same run; got {known}")

    def allocation(self, ctx: StepContext, prompt_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``([B] completions per prompt, [B, n_max + 1] spread probabilities)`` for the global batch's prompts."""
        strategy = self._predictor.strategy
        spread = strategy.spread_probabilities(prompt_ids, self.max_generations, ctx.num_generations)
        budget = int(round(self.budget_ratio * len(prompt_ids) * ctx.num_generations))
        budget = max(budget, len(prompt_ids) * self.min_generations)
        n = allocate(spread, budget, self.min_generations, self.max_generations, self.granularity, self.min_gain)
        return n, spread

    def on_rollouts(self, ctx: StepContext, rollouts: Rollouts,
                    record: OutcomeRecord) -> tuple[Rollouts, OutcomeRecord]:
        check_first_hook(type(self).__name__, rollouts, record, self.initial_generations)
        n, spread = self.allocation(ctx, record.prompt_ids.numpy())
        local, more = more_completions(ctx, record, n - self.min_generations, self.prefix)
        joined = OutcomeRecord.join([record, *more])
        _, mixed = sizes_and_spread(joined)
        batch, out, _ = train_on_spread(ctx, type(self).__name__, Rollouts.join([rollouts, *local]), joined, mixed,
                                        self.keep_unresolved)
        ctx.log({
            f"{self.prefix}/mean_generations": float(n.mean()),
            f"{self.prefix}/max_generations": float(n.max()),
            f"{self.prefix}/expected_informative": float(spread[np.arange(len(n)), n].sum()),
            f"{self.prefix}/informative_groups": float(mixed.sum()),
            f"{self.prefix}/planned_completions": float(n.sum()),
        })
        return batch, out

