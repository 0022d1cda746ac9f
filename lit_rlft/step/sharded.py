"""Every rollout of a step, over the ranks: :class:`ShardedRollouts` shards global prompt ids, asks this rank's
:class:`~lit_rlft.rollout.source.RolloutSource` for its share, gathers every rank's outcomes, charges the budget and
counts reward failures. It also keeps the ledger of training batches in flight: the same code for every kind of
source, synchronous or asynchronous.

One training batch (:meth:`ShardedRollouts.next_batch`, step ``t``, depth ``k``)::

    while fewer than k + 1 batches are in flight:        # k = 0: the planned batch alone, received at once
        ids = plan_batch()                                #   the callbacks' choice, the ids in flight excluded
        source.submit(this rank's slice of ids, seed)     #   returns at once (in process: generated now)
    reply = source.receive()                              # batch t: generated while steps t - k .. t - 1 trained
    record = gather(every rank's outcomes)                # a collective; a failure on any rank raises on every rank

so a trained row is at most ``k`` updates old (``async/staleness``), by admission: nothing is ever dropped. Every other
rollout (dynamic-sampling rounds, replay fill-ins, DOTS' reference sets, validation) is :meth:`~ShardedRollouts.rollout`:
through the same source, after what is in flight, so it samples from the current weights.

Selection: the ids in flight (:meth:`~ShardedRollouts.in_flight_ids`) are the step context's ``in_flight``; the
plan's uniform draws skip them (``plan.in_flight``, kept equal to the ledger here) and selection callbacks pass them
to their strategy as ``exclude``, so a prompt is never drawn again before its outcome has been observed. Callbacks
observe step ``t``'s outcomes after step ``t`` and plan batch ``t + k + 1``: what they see lags by ``k`` steps.

Resume: the checkpoint holds the ledger (every batch dispatched and not yet trained, with its step index); a resumed
run submits those batches again first (sampled from the restored weights), so no prompt is lost or trained twice.

Rows sampled by older weights are corrected in the loss like any engine mismatch: ``w = pi_old / mu`` with
``model.loss.mismatch_correction``, mu the generating weights' log-probs. For ``k >= 2`` this is AReaL's decoupled
objective: the surrogate clips against pi_old (the proximal policy), the weight corrects for mu.

Notation: ``b`` global prompt ids of a call, ``W`` ranks; rank ``r`` rolls out the ``r``-th slice.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.rollout.engines.base import SamplingConfig
from lit_rlft.rollout.source import RolloutReply, RolloutRequest, RolloutSource
from lit_rlft.rollout.worker import RolloutWorker
from lit_rlft.runtime.distributed import Collective, LocalCollective, padded_shard, shard_slice
from lit_rlft.step.budget import RolloutBudget
from lit_rlft.step.reward_failures import RewardFailureLog, episode_sums, failure_counts
from lit_rlft.step.seeding import StepSeeds

if TYPE_CHECKING:
    from lit_rlft.step.context import PromptData

__all__ = ["InFlight", "ShardedRollouts"]


@dataclass
class InFlight:
    """A training batch of the ledger: its step index and global ids ``[B]``, and whether this rank submitted it
    (a batch restored from a checkpoint is submitted again)."""

    index: int
    ids: np.ndarray
    submitted: bool = False


@dataclass
class StepCosts:
    """What the rollouts of one step cost, for its metrics (reset when a step starts)."""

    generation_s: float = 0.0
    episodes: dict[str, float] = field(default_factory=dict)
    wait_s: float = 0.0  # the trainer's wait for its training batch
    idle_s: float = 0.0  # the source's wait for work (a generation process's)


class ShardedRollouts:
    """This rank's share of every rollout, and what the ranks account together (see the module docstring).

    Args:
        source: this rank's rollout source.
        seeds: the run's sampling seeds.
        depth: ``k``, training batches in flight beyond the one being trained (0: synchronous).
    """

    def __init__(self, source: RolloutSource, seeds: StepSeeds, depth: int = 0):
        if depth < 0:
            raise ValueError(f"model.asynchronous.depth must be >= 0 (0 = synchronous), got {depth}")
        self.source, self.seeds, self.depth = source, seeds, depth
        self.budget = RolloutBudget()
        self.reward_failures = RewardFailureLog()
        self.collective: Collective = LocalCollective()
        self.data: PromptData | None = None
        self.sharded = False  # the policy is FSDP2-sharded (a rank that failed while generating must not gather)
        self.ledger: deque[InFlight] = deque()
        self.costs = StepCosts()

    @property
    def bound_data(self) -> PromptData:
        """The prompt data; an error before :meth:`bind`."""
        if self.data is None:
            raise RuntimeError("GRPOStep: no prompt data (call bind first; GRPOModule needs a PromptDataModule: "
                               "trainer.fit(module, datamodule=...))")
        return self.data

    def bind(self, data: PromptData, collective: Collective) -> None:
        """The prompt data and the ranks (handed to the source: the servers' source sends the weights from rank 0)."""
        self.data, self.collective = data, collective
        self.source.bind_ranks(collective)
        self._mirror()

    # -- any rollout -------------------------------------------------------------------------------------------
    def rollout(self, prompt_ids: np.ndarray, at_step: int, purpose: str = "train", split: str = "train",
                sampling: SamplingConfig | None = None, num_generations: int = 8,
                pad: bool = False) -> tuple[Rollouts, OutcomeRecord]:
        """Roll out the global prompt ids ``[b]`` now: this rank generates and scores its slice, every rank gathers the
        outcomes. A collective call: every rank makes it with the same ids.

        Returns this rank's :class:`Rollouts` and the :class:`OutcomeRecord` of all ``b`` prompts; the call is charged
        to the budget under ``purpose`` unless ``purpose == "eval"``. ``b`` must divide by the number of ranks, unless
        ``pad``: then each rank rolls out ``ceil(b / W)`` prompts (a rank short of them repeats its last one; the
        repeats are generated and charged but left out of the record), and this rank's real rows are the first
        ``padded_shard(prompt_ids, rank, W)[1]`` groups of its rollouts. ``at_step``: the trainer's rollout step (the
        weights' version, and the seed's step).
        """
        coll = self.collective
        ids = np.asarray(prompt_ids, dtype=np.int64)
        if pad:
            local_ids, valid = padded_shard(ids, coll.rank, coll.world_size)
        else:
            local_ids = ids[shard_slice(len(ids), coll.rank, coll.world_size, what=f"{purpose} batch")]
            valid = len(local_ids)
        payload = error = reply = None
        seed = self.seeds.engine_seed(at_step, coll.rank)
        try:
            reply = self.source.rollout(self._request(local_ids, num_generations, sampling, split, seed, at_step,
                                                      purpose))
            payload = self._payload(reply, valid)
        except Exception as exc:
            error = exc
        return (reply.rollouts if reply is not None else None), self._gathered(payload, error, purpose)

    def success_rates(self, prompt_ids: np.ndarray, at_step: int, purpose: str = "reference",
                      num_generations: int = 8, sampling: SamplingConfig | None = None) -> np.ndarray:
        """Roll out ``prompt_ids`` ``[K]`` (any ``K``, a collective call); their success rates ``[K]``.

        Re-seeded from ``(seed, step, rank)`` first, so a resumed run labels the same; charged under ``purpose``."""
        self.seeds.reseed(at_step, salt=1, rank=self.collective.rank)
        _, record = self.rollout(prompt_ids, at_step, purpose=purpose, sampling=sampling,
                                 num_generations=num_generations, pad=True)
        return record.success_rates.numpy()

    # -- training batches ------------------------------------------------------------------------------------
    def next_batch(self, at_step: int, plan_batch: Callable[[], np.ndarray], num_generations: int,
                   sampling: SamplingConfig) -> tuple[Rollouts, OutcomeRecord]:
        """Submit what is planned up to ``depth + 1`` batches in flight, then receive the oldest (step ``at_step``):
        this rank's rollouts and every rank's outcome record.

        The plans come first, alike on every rank (drawing one is a collective on several ranks); what may fail on
        one rank only (the source, a request) runs inside ``try`` and reaches the others through the gather."""
        while len(self.ledger) <= self.depth:  # the batch of step at_step first, when none is in flight
            index = self.ledger[-1].index + 1 if self.ledger else at_step
            self.ledger.append(InFlight(index, np.asarray(plan_batch(), dtype=np.int64)))
            self._mirror()  # the next draw skips it
        payload = error = reply = None
        t0 = time.perf_counter()
        try:
            for batch in self.ledger:
                if not batch.submitted:
                    self._submit(batch, num_generations, sampling, at_step)
            head = self.ledger.popleft()
            self._mirror()
            if head.index != at_step:
                raise RuntimeError(f"rollouts out of order: received the batch of step {head.index} at step "
                                   f"{at_step}")
            reply = self.source.receive()
            payload = self._payload(reply)
            self.costs.idle_s += reply.idle_s
        except Exception as exc:
            error = exc
        self.costs.wait_s += time.perf_counter() - t0
        return (reply.rollouts if reply is not None else None), self._gathered(payload, error, "train")

    def _submit(self, batch: InFlight, num_generations: int, sampling: SamplingConfig, at_step: int) -> None:
        """Submit this rank's slice of ``batch`` (seeded by its step index, so it samples alike whenever it is
        submitted: the synchronous step's seed is its first engine call's)."""
        coll = self.collective
        local = batch.ids[shard_slice(len(batch.ids), coll.rank, coll.world_size, what="train batch")]
        seed = self.seeds.dispatch_seed(batch.index, coll.rank) if self.depth else \
            self.seeds.engine_seed(at_step, coll.rank)
        self.source.submit(self._request(local, num_generations, sampling, "train", seed, at_step, "train"))
        batch.submitted = True

    def in_flight_ids(self) -> np.ndarray:
        """``[n]`` global ids dispatched and not yet received (every rank alike)."""
        parts = [batch.ids for batch in self.ledger]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def _mirror(self) -> None:
        """The plan's uniform draws skip the ledger's ids (``plan.in_flight`` is the ledger's, written here only)."""
        plan = self.data.plan if self.data is not None else None  # None: no training pool (validation only)
        if plan is None:
            return
        plan.in_flight.clear()
        for batch in self.ledger:
            plan.in_flight.update(batch.ids.tolist())

    # -- outcomes --------------------------------------------------------------------------------------------
    def _request(self, local_ids: np.ndarray, num_generations: int, sampling: SamplingConfig | None, split: str,
                 seed: int | None, at_step: int, purpose: str) -> RolloutRequest:
        return RolloutRequest.render(self.bound_data, local_ids, num_generations, sampling, split, seed, at_step, purpose)

    @staticmethod
    def _payload(reply: RolloutReply, valid: int | None = None) -> tuple[Any, ...]:
        """What a rank sends about its rollouts: the outcome record of its first ``valid`` groups (all: None), the
        cost, the reward failure counts, the episodes' sums."""
        local = reply.rollouts
        cost = {"prompts": local.num_groups, "completions": local.num_completions,
                "tokens": int(local.loss_mask.sum()), "seconds": local.generation_s}
        kept = local.select_groups(torch.arange(valid)) if valid is not None and valid < local.num_groups else local
        return OutcomeRecord.from_rollouts(kept), cost, failure_counts(reply.scores), reply.episodes

    def _gathered(self, payload: Any, error: BaseException | None, purpose: str) -> OutcomeRecord:
        """Every rank's payload (a collective; a failure on any rank raises on every rank), charged to the budget
        under ``purpose`` (not ``eval``): the outcome record of the call."""
        coll = self.collective
        # a rank that failed while generating with an FSDP2-sharded policy must not join the gather: the others are
        # still inside the forward passes' all-gathers (they stop when their collective breaks, from the board)
        join = not (error is not None and self.sharded and RolloutWorker.failed_in_generation(error))
        parts = coll.gather_checked(payload, error, f"generating and scoring {purpose} rollouts", join=join)
        record = OutcomeRecord.concat([p[0] for p in parts])
        seconds = max(p[1]["seconds"] for p in parts)  # wall time: the ranks generate side by side
        episodes = episode_sums([p[3] for p in parts])
        if purpose != "eval":
            self.budget.add(sum(p[1]["prompts"] for p in parts), sum(p[1]["completions"] for p in parts),
                            sum(p[1]["tokens"] for p in parts), seconds, purpose,
                            tool_calls=int(episodes.get("tool_calls", 0)))
            self.costs.generation_s += seconds
            for k, v in episodes.items():
                self.costs.episodes[k] = self.costs.episodes.get(k, 0.0) + v
        self.reward_failures.add([p[2] for p in parts])
        self.reward_failures.warn(coll.rank == 0, self.source.scorer.fallback)
        return record

    # -- metrics and state -----------------------------------------------------------------------------------
    def async_metrics(self, rollouts: Rollouts, step_index: int) -> dict[str, float]:
        """``async/*`` of the step that trained ``rollouts`` (asynchronous runs; empty at depth 0)."""
        if not self.depth:
            return {}
        fresh = ~rollouts.is_replay
        lag = (step_index - rollouts.birth_step[fresh]).float()
        return {"async/staleness": float(lag.mean()) if lag.numel() else 0.0,
                "async/staleness/max": float(lag.max()) if lag.numel() else 0.0,
                "async/trainer_wait_s": self.costs.wait_s, "async/generation_idle_s": self.costs.idle_s,
                "async/in_flight": float(len(self.ledger))}

    def state_dict(self) -> dict[str, Any]:
        """The budget, the reward-failure totals and, asynchronous, the ledger (plain types)."""
        state: dict[str, Any] = {"budget": self.budget.state_dict(), "reward_totals": self.reward_failures.state_dict()}
        if self.depth:
            state["async"] = {"ledger": [[batch.index, batch.ids.tolist()] for batch in self.ledger]}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the ledger's batches are submitted again, first, by the next
        :meth:`next_batch` (the source is closed: what it held is dropped)."""
        self.budget.load_state_dict(state.get("budget", {}))
        self.reward_failures.load_state_dict(state.get("reward_totals", {}))
        if self.depth:
            self.source.close()
            self.ledger = deque(InFlight(int(i), np.asarray([int(x) for x in ids], dtype=np.int64))
                                for i, ids in state.get("async", {}).get("ledger", []))
            self._mirror()

    def close(self) -> None:
        """Close the source; the ledger's batches are submitted again by the next :meth:`next_batch`."""
        self.source.close()
        for batch in self.ledger:
            batch.submitted = False
