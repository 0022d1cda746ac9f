"""SequentialSamplingCallback: per-prompt allocation by sequential sampling (Reinforce-Ada), more completions for a
prompt until its group shows both outcomes, up to a cap."""

from __future__ import annotations

import numpy as np

from lit_rlft.callbacks.base import RolloutHook, StepCallback
from lit_rlft.callbacks.extend import check_first_hook, more_completions, sizes_and_spread, train_on_spread
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.step.context import StepContext


class SequentialSamplingCallback(RolloutHook, StepCallback):
    """Sample each prompt of the batch in rounds until its group has a reward spread (pass/fail rewards: both a correct
    and an incorrect completion), or ``max_generations`` completions were spent on it; groups end up of different
    sizes.

    One step:

    1. the planned batch of ``B`` prompts is rolled out with ``initial_generations`` completions each (the step asks
       its hooks for ``initial_generations``);
    2. while some prompt has a group without both outcomes and fewer than ``max_generations`` completions, those
       prompts get ``round_generations`` more (the last round cut to the cap), charged as
       ``budget/completions_sequential``;
    3. the groups with both outcomes are trained on, each with all its completions (``Rollouts.members``; advantages
       are each group's own statistics); a group still without both outcomes at the cap has no gradient and is
       dropped, unless ``keep_unresolved``.

    Easy and impossible prompts cost the cap, so on a pool full of them this spends more than uniform GRPO: it finds
    the signal of rarely solved (or rarely failed) prompts, and pairs with a selection callback that keeps such
    prompts out of the batch. ``budget/completions`` charges every completion; ``budget/prompts`` counts generation
    requests (a prompt sampled in three rounds counts three times).

    On ``W`` ranks the decisions are taken on the gathered outcomes; each rank samples more for its own prompts (a
    prompt's completions stay on the rank that started it), and a rank with fewer prompts needing a round than
    another repeats its last one so that every rank makes the same generation call (the repeats are charged and
    left out). Ranks may then train on different numbers of groups and completions: the update normalises over the
    global batch. A rank left with no group with both outcomes trains on its first group (no gradient) so that it
    still joins the update. Logs ``sequential/{rounds, resolved_groups, unresolved_groups, mean_group_size,
    max_group_size}``.

    It must be the first rollout hook (it reads the planned batch as rolled out); replay may follow it.

    Example::

        trainer = L.Trainer(callbacks=[SequentialSamplingCallback(initial_generations=4, max_generations=16)])

    Args:
        initial_generations: completions per prompt in the first round (>= 1).
        round_generations: completions added per round to a prompt still without both outcomes (>= 1).
        max_generations: completions per prompt at most (>= ``initial_generations``).
        keep_unresolved: also train on the groups that never showed both outcomes (they have zero advantages, but
            count in the loss's normaliser, as uniform GRPO's degenerate groups do).
    """

    prefix = "sequential"

    def __init__(self, initial_generations: int = 4, round_generations: int = 4, max_generations: int = 16,
                 keep_unresolved: bool = False):
        if initial_generations < 1 or round_generations < 1:
            raise ValueError(f"initial_generations and round_generations must be >= 1, got {initial_generations} "
                             f"and {round_generations}")
        if max_generations < initial_generations:
            raise ValueError(f"max_generations ({max_generations}) must be >= initial_generations "
                             f"({initial_generations})")
        self.initial_generations = int(initial_generations)
        self.round_generations = int(round_generations)
        self.max_generations = int(max_generations)
        self.keep_unresolved = bool(keep_unresolved)

    def on_rollouts(self, ctx: StepContext, rollouts: Rollouts,
                    record: OutcomeRecord) -> tuple[Rollouts, OutcomeRecord]:
        check_first_hook(type(self).__name__, rollouts, record, self.initial_generations)
        parts, records, joined, rounds = [rollouts], [record], record, 1
        while True:
            sizes, spread = sizes_and_spread(joined)
            need = ~spread & (sizes < self.max_generations)
            if not need.any():
                break
            g = min(self.round_generations, self.max_generations - int(sizes[need].max()))
            local, more = more_completions(ctx, joined, np.where(need, g, 0), self.prefix)
            parts += local
            records += more
            joined = OutcomeRecord.join(records)
            rounds += 1
        sizes, spread = sizes_and_spread(joined)
        batch, out, train = train_on_spread(ctx, type(self).__name__, Rollouts.join(parts), joined, spread,
                                            self.keep_unresolved)
        ctx.log({
            f"{self.prefix}/rounds": float(rounds),
            f"{self.prefix}/resolved_groups": float(spread.sum()),
            f"{self.prefix}/unresolved_groups": float((~spread).sum()),
            f"{self.prefix}/mean_group_size": float(sizes[train].mean()),
            f"{self.prefix}/max_group_size": float(sizes[train].max()),
        })
        return batch, out
