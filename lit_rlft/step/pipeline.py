"""Asynchronous rollouts: the next batches generate in a separate process while the trainer updates on this one.

With ``model.generation.async_depth = k >= 1`` a :class:`GRPOStep` keeps up to ``k`` batches in flight beyond the
one it trains. Step ``t`` (``GRPOStep.run``)::

    dispatch the planned batch (t + k)           # what the callbacks chose after step t - 1 (none in flight again)
    receive batch t, gather its outcomes          # generated while steps t - k .. t - 1 trained (weights t - k)
    hooks, advantages, update                     # meanwhile the process generates batches t + 1 .. t + k
    push the weights (version t + 1)              # shared memory; requests submitted later sample from them

so a trained row is at most ``k`` updates old (``async/staleness``), by admission: nothing is ever dropped. At the
start the plan's batch and ``k`` uniform ones (no outcome has been observed yet) are dispatched. ``k = 0`` is the
synchronous step (no process, nothing here runs). Every other rollout (dynamic-sampling rounds, replay fill-ins,
DOTS' reference sets, validation) goes through the same process in order, so it samples from the current weights.

Selection: the ids in flight are the step context's ``in_flight``; the plan's uniform draws skip them and selection
callbacks pass them to their strategy as ``exclude``, so a prompt is never drawn again before its outcome has been
observed. Callbacks observe step ``t``'s outcomes in ``after_step(t)`` and plan batch ``t + k + 1``: the lag of what
they see is ``k`` steps (``ctx.async_depth``).

Resume: the checkpoint holds the ledger of batches dispatched and not yet trained; a resumed run dispatches them again
first (sampled from the restored weights), so no prompt is lost or trained twice.

Rows sampled by older weights are corrected in the loss like any engine mismatch: ``w = pi_old / mu`` with
``model.loss.mismatch_correction`` (truncated per token or masked per sequence), pi_old the trainer's weights before
this step's update, mu the generating weights' log-probs (``behaviour_logprobs``). For ``k >= 2`` this is AReaL's
decoupled objective: the surrogate clips against pi_old (the proximal policy), the weight corrects for mu.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from lit_rlft.core.distributed import shard_slice
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.step.generation_process import GenerationError, GenerationProcess, GenerationRequest

if TYPE_CHECKING:
    from torch import nn

    from lit_rlft.rollout.base import SamplingConfig
    from lit_rlft.step.grpo import GRPOStep

__all__ = ["AsyncRollouts", "default_threads"]


def default_threads() -> int:
    """The generation process's torch threads: half the cores of this rank's share of the node (at least 1)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, (os.cpu_count() or 2) // (2 * local))


class AsyncRollouts:
    """The in-flight batches of one rank and its generation process (see the module docstring).

    Args:
        depth: ``k``, batches in flight beyond the one being trained.
        timeout_s: longest a wait for the generation process may last.
        threads: its torch threads (None: :func:`default_threads`).
        device: its device (None: ``"cpu"``).
    """

    def __init__(self, depth: int, timeout_s: float = 600.0, threads: int | None = None, device: str | None = None):
        self.depth, self.timeout_s = depth, timeout_s
        self.threads, self.device = threads or default_threads(), device or "cpu"
        self.process: GenerationProcess | None = None
        self.in_flight: deque[tuple[int, np.ndarray, int]] = deque()  # (step index, global ids, ticket)
        self._ledger: list[tuple[int, list[int]]] = []  # restored from a checkpoint, dispatched first
        self._next_index = 0  # the step index of the next batch dispatched
        self.stats = {"wait_s": 0.0, "idle_s": 0.0}

    # -- the process ------------------------------------------------------------------------------------
    def ensure(self, step: GRPOStep) -> GenerationProcess:
        """The generation process, started (with the trainer's current weights) if there is none; one that died is
        an error (:class:`GenerationError`), never silently replaced: the requests it held would never be answered."""
        if self.process is not None and not self.process.alive:
            raise GenerationError(f"the generation process (pid {self.process.pid}) died (exit code "
                                  f"{self.process.process.returncode}) between steps")
        if self.process is None:
            if step.config is None:
                raise ValueError("model.generation.async_depth > 0 needs a step built by build_step(GRPOConfig(...)) "
                                 "(the generation process builds its copy of the policy from the config)")
            self.process = GenerationProcess(step.config, step.engine, step.rewards, step.tokenizer,
                                             step.worker.success_threshold, threads=self.threads, device=self.device,
                                             timeout_s=self.timeout_s)
            self.process.push(step.policy, step.rollout_step, full=True)
        return self.process

    def push(self, step: GRPOStep, policy: nn.Module, version: int, full: bool) -> None:
        """Weights ``version`` to the process, which starts with the current weights if there is none (every rank
        calls this: an FSDP2 shard is gathered)."""
        if self.process is None:
            self.ensure(step)
        else:
            self.process.push(policy, version, full=full)

    def close(self) -> None:
        """Stop the process; batches in flight are dropped (they are in the ledger of the last checkpoint)."""
        if self.process is not None:
            self.process.close()
        self.process = None
        self._ledger = [(i, ids.tolist()) for i, ids, _ in self.in_flight] + self._ledger
        self.in_flight.clear()

    # -- batches ------------------------------------------------------------------------------------------
    def next_batch(self, step: GRPOStep) -> tuple[Rollouts, OutcomeRecord]:
        """Dispatch what is planned up to ``depth + 1`` batches in flight, then receive the oldest (step
        ``step.rollout_step``): this rank's rollouts and every rank's outcome record.

        The plans come first, alike on every rank (drawing one is a collective on several ranks); what may fail on
        one rank only (the process, a request) runs inside ``try`` and reaches the others through the gather."""
        plan = step.data.plan
        if not self.in_flight and not self._ledger:
            self._next_index = step.rollout_step
        batches = [(index, np.asarray(ids, dtype=np.int64)) for index, ids in self._ledger]
        self._ledger = []
        while len(self.in_flight) + len(batches) <= self.depth:
            batches.append((batches[-1][0] + 1 if batches else self._next_index, step.plan_batch()))
            plan.in_flight.update(batches[-1][1].tolist())  # the next draw skips it
        local = payload = error = None
        t0 = time.perf_counter()
        try:
            self.ensure(step)
            for index, ids in batches:
                self._dispatch(step, index, ids)
            index, ids, ticket = self.in_flight.popleft()
            plan.in_flight.difference_update(ids.tolist())
            if index != step.rollout_step:
                raise RuntimeError(f"asynchronous rollouts out of order: received the batch of step {index} at step "
                                   f"{step.rollout_step}")
            reply = self.process.result(ticket)
            local, payload = reply.rollouts, step.payload(reply.rollouts, reply.failures)
            self.stats["idle_s"] += reply.idle_s
        except Exception as exc:
            error = exc
        self.stats["wait_s"] += time.perf_counter() - t0
        return local, step.gathered(payload, error, "train")

    def request(self, step: GRPOStep, local_ids: np.ndarray, num_generations: int, sampling: SamplingConfig,
                split: str, seed: int | None) -> tuple[Rollouts, dict[str, Any]]:
        """Roll out ``local_ids`` now (after what is in flight): this rank's rollouts and failure counts."""
        process = self.ensure(step)
        reply = process.result(process.submit(self._request(step, local_ids, num_generations, sampling, split,
                                                            seed)))
        return reply.rollouts, reply.failures

    def _dispatch(self, step: GRPOStep, index: int, ids: np.ndarray) -> None:
        """Submit this rank's slice of the global ``ids`` of step ``index``."""
        coll = step.collective
        local = ids[shard_slice(len(ids), coll.rank, coll.world_size, what="train batch")]
        seed = step.seeds.dispatch_seed(index, coll.rank)
        ticket = self.process.submit(self._request(step, local, step.planned_generations(),
                                                   step.generation.sampling, "train", seed))
        self.in_flight.append((index, ids, ticket))
        step.data.plan.in_flight.update(ids.tolist())
        self._next_index = index + 1

    @staticmethod
    def _request(step: GRPOStep, local_ids: np.ndarray, num_generations: int, sampling: SamplingConfig, split: str,
                 seed: int | None) -> GenerationRequest:
        data = step.data
        return GenerationRequest(local_ids, data.prompt_tokens(local_ids, split), data.prompt_texts(local_ids, split),
                                 data.reward_columns(local_ids, split), num_generations, sampling, split, seed)

    # -- context ------------------------------------------------------------------------------------------
    def in_flight_ids(self) -> np.ndarray:
        """``[n]`` global ids dispatched and not yet received (every rank alike)."""
        parts = [ids for _, ids, _ in self.in_flight] + [np.asarray(ids) for _, ids in self._ledger]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def metrics(self, rollouts: Rollouts, step_index: int) -> dict[str, float]:
        """``async/*`` of the step that trained ``rollouts`` (then reset)."""
        fresh = ~rollouts.is_replay
        lag = (step_index - rollouts.birth_step[fresh]).float()
        out = {"async/staleness": float(lag.mean()) if lag.numel() else 0.0,
               "async/staleness/max": float(lag.max()) if lag.numel() else 0.0,
               "async/trainer_wait_s": self.stats["wait_s"], "async/generation_idle_s": self.stats["idle_s"],
               "async/in_flight": float(len(self.in_flight))}
        self.stats = {"wait_s": 0.0, "idle_s": 0.0}
        return out

    # -- checkpoints --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The ledger: every batch dispatched and not yet trained, with its step index."""
        return {"ledger": [[i, ids.tolist()] for i, ids, _ in self.in_flight] + [[i, ids] for i, ids in self._ledger]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the ledger (dispatched again, first, by the next :meth:`next_batch`)."""
        self.close()
        self._ledger = [(int(i), [int(x) for x in ids]) for i, ids in state.get("ledger", [])]
