"""SequentialSamplingCallback: per-prompt allocation by sequential sampling (Reinforce-Ada), more completions for a
prompt until its group shows both outcomes, up to a cap."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from lit_rlft.callbacks.base import RolloutHook, StepCallback
from lit_rlft.core.advantages import keep_mask
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
        if rollouts.group_size != self.initial_generations or bool(record.is_replay.any()):
            raise RuntimeError(f"SequentialSamplingCallback must be the first rollout hook: it got groups of "
                               f"{rollouts.group_size} completions (expected its first round's "
                               f"{self.initial_generations}), {int(record.is_replay.sum())} of them replayed; list it "
                               "before the others")
        coll = ctx.collective
        world, rank = coll.world_size, coll.rank
        per_rank = record.num_groups // world
        owner = np.arange(record.num_groups) // max(per_rank, 1)  # [B] the rank holding each prompt's completions
        parts, records, joined, rounds = [rollouts], [record], record, 1
        while True:
            sizes, mixed = _sizes_and_spread(joined)
            need = ~mixed & (sizes < self.max_generations)
            needs = [np.flatnonzero(need & (owner == q)) for q in range(world)]
            k = max(len(n) for n in needs)
            if k == 0:
                break
            g = min(self.round_generations, self.max_generations - int(sizes[need].max()))
            rows = [np.resize(n if len(n) else np.array([q * per_rank]), k) for q, n in enumerate(needs)]
            ids = joined.prompt_ids.numpy()[np.concatenate(rows)]  # rank-major: rank q's slice is its own prompts
            local, more = ctx.rollout(ids, purpose=self.prefix, num_generations=g)
            if len(needs[rank]):
                parts.append(local.select_groups(torch.arange(len(needs[rank]))) if len(needs[rank]) < k else local)
            records.append(more.select([q * k + i for q in range(world) for i in range(len(needs[q]))]))
            joined = OutcomeRecord.join(records)
            rounds += 1
        sizes, mixed = _sizes_and_spread(joined)
        train = mixed | self.keep_unresolved
        for q in range(world):  # every rank trains on at least one group
            if not train[q * per_rank : (q + 1) * per_rank].any():
                train[q * per_rank] = True
                if rank == 0:
                    warnings.warn(f"SequentialSamplingCallback: no group of rank {q} has a reward spread within "
                                  f"{self.max_generations} completions; training on its first group (no gradient)",
                                  UserWarning, stacklevel=2)
        batch = Rollouts.join(parts)
        mine = train[rank * per_rank : (rank + 1) * per_rank]
        if not mine.all():
            batch = batch.select_groups(torch.from_numpy(np.flatnonzero(mine)))
        trained_sizes = sizes[train]
        ctx.log({
            f"{self.prefix}/rounds": float(rounds),
            f"{self.prefix}/resolved_groups": float(mixed.sum()),
            f"{self.prefix}/unresolved_groups": float((~mixed).sum()),
            f"{self.prefix}/mean_group_size": float(trained_sizes.mean()),
            f"{self.prefix}/max_group_size": float(trained_sizes.max()),
        })
        flags = torch.from_numpy(train)
        out = OutcomeRecord.concat([joined.select(flags).with_trained(True), joined.select(~flags).with_trained(False)])
        return batch, out


def _sizes_and_spread(record: OutcomeRecord) -> tuple[np.ndarray, np.ndarray]:
    """``[n]`` completions of each group and whether its rewards have a spread (both outcomes, for 0/1 rewards)."""
    members = record.member_mask().numpy()
    return members.sum(1), keep_mask(record.rewards.numpy(), members)
