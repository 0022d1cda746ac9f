"""DynamicSamplingCallback: DAPO's dynamic sampling, the oracle filter that DPS approximates."""

from __future__ import annotations

from lit_rlft.callbacks.rounds import SpreadRounds
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.step.context import StepContext


class DynamicSamplingCallback(SpreadRounds):
    """Keep only groups with non-zero reward spread, rolling out more rounds of fresh prompts until ``B`` are kept.

    Every candidate is generated (and charged to the budget: ``budget/completions_dynamic_sampling`` counts the
    extra rounds); groups with equal rewards are discarded. When ``max_rounds`` rounds do not find ``B`` effective
    groups, the step trains on what was kept and warns, instead of crashing; when none was kept it trains on the
    first round (whose zero advantages give no gradient). Logs ``dynamic_sampling/{rounds, kept_groups,
    discarded_groups, rolled_out_groups, filled}``. Discarded groups stay in the step's record (not trained on), so
    a selection callback stacked with this one observes every outcome it paid for.

    On ``W`` ranks every round is global (``B`` candidates, each rank rolling out ``B / W``), the keep decision is
    taken on the gathered rewards, and the kept groups are redistributed so that rank ``r`` trains on the ``r``-th
    slice of them; a short batch is rounded down to a multiple of ``W``.

    Example::

        trainer = L.Trainer(callbacks=[DynamicSamplingCallback(max_rounds=10)])

    Args:
        max_rounds: rounds per step at most, the first included (DAPO: 10; the DPS paper used 4 on MATH).
    """

    prefix = "dynamic_sampling"

    def on_rollouts(self, ctx: StepContext, rollouts: Rollouts,
                    record: OutcomeRecord) -> tuple[Rollouts, OutcomeRecord]:
        kept, locals_, records = self._rounds(ctx, rollouts, record)
        if not kept:  # nothing to train on: the first round (zero advantages, no gradient)
            return rollouts, OutcomeRecord.concat([records[0], *(r.with_trained(False) for r in records[1:])])
        return self._kept(kept, locals_, records, ctx.collective)
