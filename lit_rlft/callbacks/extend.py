"""More completions for prompts already rolled out in a step, on the rank that holds each prompt's group, and the
choice of the groups to train on: what per-prompt allocation (sequential sampling, budgeted allocation) shares (a
base of the callbacks package)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from lit_rlft.core.advantages import keep_mask
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.step.context import StepContext


def check_first_hook(name: str, rollouts: Rollouts, record: OutcomeRecord, initial: int) -> None:
    """Raise unless the batch is the planned one as rolled out: ``initial`` completions per group, none replayed."""
    if rollouts.group_size != initial or rollouts.members is not None or bool(record.is_replay.any()):
        raise RuntimeError(f"{name} must be the first rollout hook: it got groups of {rollouts.group_size} "
                           f"completions (expected its first round's {initial}), {int(record.is_replay.sum())} of "
                           "them replayed; list it before the others")


def sizes_and_spread(record: OutcomeRecord) -> tuple[np.ndarray, np.ndarray]:
    """``[n]`` completions of each group and whether its rewards have a spread (both outcomes, for 0/1 rewards)."""
    members = record.member_mask().numpy()
    return members.sum(1), keep_mask(record.rewards.numpy(), members)


def more_completions(ctx: StepContext, record: OutcomeRecord, extra: np.ndarray,
                     purpose: str) -> tuple[list[Rollouts], list[OutcomeRecord]]:
    """``extra[b]`` more completions for the prompt of row ``b`` of ``record`` (the step's planned batch, rank-major:
    rank ``q`` holds rows ``q * B/W .. (q+1) * B/W - 1``), generated on the rank that holds that prompt's group.

    One generation call per distinct positive count (a collective: every rank makes it). A rank with fewer prompts
    in a call than another repeats its last one (or, with none, its first prompt) so that every rank generates alike;
    the repeats are charged to the budget and left out of what is returned.

    Returns:
        This rank's new rollouts (its own prompts only, one part per call it had prompts in) and each call's
        global record (repeats removed), for :meth:`Rollouts.join` / :meth:`OutcomeRecord.join`.
    """
    coll = ctx.collective
    world, rank = coll.world_size, coll.rank
    per_rank = max(record.num_groups // world, 1)
    owner = np.arange(record.num_groups) // per_rank  # [B]
    extra = np.asarray(extra, dtype=np.int64)
    parts: list[Rollouts] = []
    records: list[OutcomeRecord] = []
    for count in sorted({int(c) for c in extra if c > 0}, reverse=True):
        needs = [np.flatnonzero((extra == count) & (owner == q)) for q in range(world)]
        k = max(len(n) for n in needs)
        rows = [np.resize(n if len(n) else np.array([q * per_rank]), k) for q, n in enumerate(needs)]
        ids = record.prompt_ids.numpy()[np.concatenate(rows)]  # rank-major: rank q's slice is its own prompts
        local, more = ctx.rollout(ids, purpose=purpose, num_generations=count)
        mine = len(needs[rank])
        if mine:
            parts.append(local.select_groups(torch.arange(mine)) if mine < k else local)
        records.append(more.select([q * k + i for q in range(world) for i in range(len(needs[q]))]))
    return parts, records


def train_on_spread(ctx: StepContext, name: str, batch: Rollouts, joined: OutcomeRecord, spread: np.ndarray,
                    keep_unresolved: bool) -> tuple[Rollouts, OutcomeRecord, np.ndarray]:
    """Keep the groups with a reward spread (all, with ``keep_unresolved``), at least one per rank (a rank with none
    trains on its first group, which has no gradient, so that it still joins the update).

    ``batch`` is this rank's slice of the planned batch (its groups complete), ``joined`` the global record of the
    same groups (rank-major), ``spread`` ``[B]`` whether each has a reward spread (:func:`sizes_and_spread`). Returns this rank's trained groups, the step's record (trained groups first, in global
    order, then the others, not trained) and the ``[B]`` train flags."""
    coll = ctx.collective
    world, rank = coll.world_size, coll.rank
    per_rank = joined.num_groups // world
    train = spread | keep_unresolved
    for q in range(world):
        if not train[q * per_rank : (q + 1) * per_rank].any():
            train[q * per_rank] = True
            if rank == 0:
                warnings.warn(f"{name}: no group of rank {q} has a reward spread this step; training on its first "
                              "group (no gradient)", UserWarning, stacklevel=3)
    mine = train[rank * per_rank : (rank + 1) * per_rank]
    if not mine.all():
        batch = batch.select_groups(torch.from_numpy(np.flatnonzero(mine)))
    flags = torch.from_numpy(train)
    out = OutcomeRecord.concat([joined.select(flags).with_trained(True), joined.select(~flags).with_trained(False)])
    return batch, out, train
