"""Rounds of fresh candidates within one step, kept by reward spread: the machinery that dynamic sampling and
screening share (a base of the callbacks package)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from lit_rlft.callbacks.base import RolloutHook, StepCallback
from lit_rlft.core.state import decode_state, encode_state
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.selection.dynamic import DynamicFilter
from lit_rlft.step.context import StepContext


class SpreadRounds(RolloutHook, StepCallback):
    """A rollout hook that rolls out rounds of ``B`` fresh candidates until ``B`` groups with a reward spread are kept
    or ``max_rounds`` rounds ran (:class:`~lit_rlft.selection.dynamic.DynamicFilter`'s bookkeeping); subclasses decide
    what to do with the kept groups (``DynamicSamplingCallback``: train on them; ``ScreeningCallback``: complete them).

    Args:
        max_rounds: rounds per step at most, the first included.
    """

    prefix = "rounds"
    """Where the callback logs (``<prefix>/rounds`` ...) and what its extra rounds are charged as."""

    def __init__(self, max_rounds: int = 10):
        self.filter = DynamicFilter(max_rounds=max_rounds)
        self.max_rounds = max_rounds

    def _rounds(self, ctx: StepContext, rollouts: Rollouts, record: OutcomeRecord,
                num_generations: int | None = None) -> tuple[list[tuple[int, int]], list[Rollouts],
                                                             list[OutcomeRecord]]:
        """Rounds of ``B`` fresh candidates (``num_generations`` completions each, default ``G``) until ``B`` groups
        with a reward spread are kept or ``max_rounds`` ran: the kept ``(round, row)`` labels (a multiple of the
        ranks), every round's local rollouts and global records; logged under :attr:`prefix`."""
        coll = ctx.collective
        batch_size = record.num_groups  # global
        round_ = self.filter.start(batch_size)
        locals_, records = [rollouts], [record]
        round_.add(record.rewards.numpy(), groups=[(0, j) for j in range(record.num_groups)],
                   members=None if record.members is None else record.members.numpy())
        used = set(record.prompt_ids.tolist())
        plan = ctx.data.plan
        while not round_.done:
            ids = plan.draw_unused(batch_size, used)
            ids = ids[: len(ids) // coll.world_size * coll.world_size]
            if ids.size == 0:
                break
            used.update(ids.tolist())
            local, more = ctx.rollout(ids, purpose=self.prefix, num_generations=num_generations)
            round_.add(more.rewards.numpy(), groups=[(len(records), j) for j in range(more.num_groups)],
                       members=None if more.members is None else more.members.numpy())
            locals_.append(local)
            records.append(more)
        result = round_.finish()
        kept = result.kept[: len(result.kept) // coll.world_size * coll.world_size]
        ctx.log({
            f"{self.prefix}/rounds": float(result.rounds),
            f"{self.prefix}/kept_groups": float(result.num_kept),
            f"{self.prefix}/discarded_groups": float(result.num_discarded),
            f"{self.prefix}/rolled_out_groups": float(result.num_rolled_out),
            f"{self.prefix}/filled": float(result.filled),
        })
        if not result.filled and coll.rank == 0:
            warnings.warn(
                f"{type(self).__name__}: {result.num_kept} of {batch_size} effective groups after "
                f"{result.rounds} rounds (max_rounds={self.max_rounds}); training on what was kept",
                UserWarning, stacklevel=3,
            )
        return kept, locals_, records

    @staticmethod
    def _kept(kept: list[tuple[int, int]], locals_: list[Rollouts], records: list[OutcomeRecord],
              coll: Any) -> tuple[Rollouts, OutcomeRecord]:
        """This rank's slice of the kept groups, and the step's record (the kept rows trained, in kept order)."""
        trained = {label: i for i, label in enumerate(kept)}
        flags = [torch.tensor([(k, j) in trained for j in range(r.num_groups)], dtype=torch.bool)
                 for k, r in enumerate(records)]
        full = OutcomeRecord.concat([replace_trained(r, f) for r, f in zip(records, flags)])
        return _redistribute(kept, locals_, records, coll), full

    def state_dict(self) -> dict:
        return {"filter": encode_state(self.filter.state_dict())}

    def load_state_dict(self, state_dict: dict) -> None:
        if "filter" in state_dict:
            self.filter.load_state_dict(decode_state(state_dict["filter"]))



def replace_trained(record: OutcomeRecord, trained: torch.Tensor) -> OutcomeRecord:
    """``record`` with its ``trained`` flags ``[n]`` replaced."""
    return dataclasses.replace(record, trained=trained)


def _redistribute(kept: list[tuple[int, int]], locals_: list[Rollouts], records: list[OutcomeRecord],
                  coll: Any) -> Rollouts:
    """This rank's slice of the kept groups, in kept order, fetching from other ranks the groups they hold.

    ``kept`` lists ``(round, global row)`` labels. Which rank holds a row is looked up by its prompt id (unique within
    a step) in every rank's local groups of that round: a round's record need not be one block in rank order (the
    first round holds, after a replay hook, the fresh, replayed and filled groups, each block split over the ranks).
    """
    world, rank = coll.world_size, coll.rank
    per_rank = len(kept) // world
    mine = kept[rank * per_rank : (rank + 1) * per_rank]
    if world == 1:
        return Rollouts.concat([locals_[k].select_groups([j]) for k, j in mine])
    where: dict[tuple[int, int], tuple[int, int]] = {}  # (round, prompt id) -> (rank, local index)
    for r, ids in enumerate(coll.all_gather([part.prompt_ids.tolist() for part in locals_])):
        where.update({(k, pid): (r, i) for k, round_ids in enumerate(ids) for i, pid in enumerate(round_ids)})

    def owner(label: tuple[int, int]) -> tuple[int, int]:  # (rank, local index)
        k, j = label
        return where[(k, int(records[k].prompt_ids[j]))]

    if not _any_remote(kept, owner, world):  # every rank holds its own slice: no exchange
        return Rollouts.concat([locals_[k].select_groups([owner((k, j))[1]]) for k, j in mine])
    held = {label: locals_[label[0]].select_groups([owner(label)[1]]) for label in kept if owner(label)[0] == rank}
    everything: dict[tuple[int, int], Rollouts] = {}
    for part in coll.all_gather(held):
        everything.update(part)
    return Rollouts.concat([everything[label] for label in mine])


def _any_remote(kept: list[tuple[int, int]], owner: Any, world: int) -> bool:
    """Whether any rank trains on a group that another rank rolled out (the same answer on every rank)."""
    per_rank = len(kept) // world
    return any(owner(label)[0] != r for r in range(world) for label in kept[r * per_rank : (r + 1) * per_rank])
