"""ScreeningCallback: per-prompt allocation by screening (SPEED-RL), a few completions first, the rest only where
they are informative."""

from __future__ import annotations

import warnings

import numpy as np

from lit_rlft.callbacks.rounds import SpreadRounds
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.step.context import StepContext


class ScreeningCallback(SpreadRounds):
    """Screen each candidate prompt with ``initial_generations`` completions; complete to ``G`` only the prompts whose
    screening outcomes are mixed, keeping the screening completions in their group.

    A group with both outcomes among its first ``g0`` completions keeps them with any more, so every trained group is
    informative, while a prompt the policy always or never solves costs ``g0`` completions instead of ``G``. One step:

    1. the planned batch of ``B`` prompts is rolled out with ``g0`` completions each (the step asks its hooks for
       ``initial_generations``);
    2. rounds of ``B`` fresh candidates, ``g0`` completions each, until ``B`` mixed prompts are found or
       ``max_rounds`` rounds ran (dynamic sampling's rounds, at ``g0``; charged as ``budget/completions_screening``);
    3. the kept prompts get ``G - g0`` more completions (charged as ``train``), joined to their screening ones.

    Every completion is charged once (``budget/completions``); ``budget/prompts`` counts generation requests, so a kept
    prompt counts twice (its screening and its completion).

    Screened-out groups stay in the step's record (``trained = False``, ``g0`` wide: ``OutcomeRecord.members``), so a
    selection callback stacked with this one observes what each screening cost, as with dynamic sampling. When no
    candidate is mixed, the first group of the planned batch on each rank is completed (its zero advantages give no
    gradient), so the step still trains on full groups. Logs ``screening/{rounds, kept_groups, discarded_groups,
    rolled_out_groups, filled}``. On ``W`` ranks the keep decisions are taken on the gathered outcomes and the kept
    screening groups move to the rank that completes them (``r``-th slice of the kept prompts), as dynamic sampling's
    kept groups do.

    It must be the first rollout hook (it reads the planned batch as rolled out); replay may follow it.

    Example::

        trainer = L.Trainer(callbacks=[ScreeningCallback(initial_generations=2, max_rounds=4)])

    Args:
        initial_generations: ``g0``, completions per candidate in the screening round (``1 <= g0 < G``; 1 keeps
            nothing, since one completion cannot show both outcomes).
        max_rounds: screening rounds per step at most, the planned batch included.
    """

    prefix = "screening"

    def __init__(self, initial_generations: int = 2, max_rounds: int = 4):
        if initial_generations < 2:
            raise ValueError(f"initial_generations must be >= 2 (one completion cannot show both outcomes), got "
                             f"{initial_generations}")
        super().__init__(max_rounds=max_rounds)
        self.initial_generations = int(initial_generations)

    def on_rollouts(self, ctx: StepContext, rollouts: Rollouts,
                    record: OutcomeRecord) -> tuple[Rollouts, OutcomeRecord]:
        g0, G = self.initial_generations, ctx.num_generations
        if g0 >= G:
            raise ValueError(f"ScreeningCallback(initial_generations={g0}) needs more completions per prompt than it "
                             f"screens with: model.generation.num_generations is {G}")
        if rollouts.group_size != g0 or bool(record.is_replay.any()):
            raise RuntimeError(f"ScreeningCallback must be the first rollout hook: it got groups of "
                               f"{rollouts.group_size} completions (expected its {g0} screening ones), "
                               f"{int(record.is_replay.sum())} of them replayed; list it before the others")
        coll = ctx.collective
        kept, locals_, records = self._rounds(ctx, rollouts, record, num_generations=g0)
        if not kept:
            kept = [(0, j) for j in range(coll.world_size)]  # one group per rank: a full batch with no gradient
            if coll.rank == 0:
                warnings.warn("ScreeningCallback: no screened prompt had both outcomes; completing one group per "
                              "rank (no gradient this step)", UserWarning, stacklevel=2)
        screened, full = self._kept(kept, locals_, records, coll)
        chosen = full.trained_batch()  # the kept groups' screening outcomes, in kept order (rank 0's slice first)
        ids = np.asarray(chosen.prompt_ids, dtype=np.int64)
        more, more_record = ctx.rollout(ids, purpose="train", num_generations=G - g0)
        batch = screened.extend_groups(more)  # [B_local groups of G]
        trained = chosen.extend_groups(more_record).with_trained(True)
        return batch, OutcomeRecord.concat([trained, full.select(~full.trained)])
