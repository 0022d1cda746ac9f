"""Validation of a GRPO step: the held-out pool sampled at the eval temperature, every rank its share, metrics synced.

    validation = Validation(rollouts, seeds, generation)     # GRPOStep makes one (step.validation)
    validation.bind(data)                                    # the metrics' difficulty buckets, from the pool
    validation.begin()                                       # (the step first makes the engine current)
    for batch in data.val_dataloader():
        validation.batch(batch, step.rollout_step, step.device)
    metrics = validation.results()                           # val/accuracy, val/pass@k, ..., the same on every rank

Sampling is re-seeded from ``(seed, batch, rank)``: a validation depends on the weights and the seed only, never on
what the process did before (a warm start in the same process, an earlier validation) nor on the step it runs at, so
``lit-rlft validate`` of a saved model gives what the run's own validation gave, and every validation of a run draws
the same random numbers (before / after comparisons are paired).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_rlft.runtime.distributed import padded_shard
from lit_rlft.step.config import GenerationConfig
from lit_rlft.step.metrics import ValidationMetrics
from lit_rlft.step.seeding import StepSeeds
from lit_rlft.step.sharded import ShardedRollouts

__all__ = ["Validation"]


class Validation:
    """The validation pool's rollouts and metrics.

    Args:
        rollouts: the step's sharded rollouts (validation goes through the same source, uncharged).
        seeds: the run's sampling seeds.
        generation: the eval sampling and ``eval_num_generations`` (``k``).
    """

    def __init__(self, rollouts: ShardedRollouts, seeds: StepSeeds, generation: GenerationConfig):
        self.rollouts, self.seeds, self.generation = rollouts, seeds, generation
        self.metrics: ValidationMetrics | None = None  # None: the data have no validation pool
        self.last: dict[str, float] = {}  # the metrics of the latest validation
        self._calls = 0

    def bind(self, data: Any) -> None:
        """Metrics for ``data``'s validation pool (its difficulty values are the buckets), or none without one."""
        self.metrics = None
        if data.val_pool is not None:
            difficulty = data.reward_columns(data.val_pool.ids, "val").get("difficulty")
            buckets = sorted(set(difficulty), key=str) if difficulty is not None else []
            self.metrics = ValidationMetrics(self.generation.eval_num_generations, buckets)

    def begin(self) -> None:
        """Before a validation: its batches are numbered from 0 (their seeds)."""
        self._calls = 0

    @torch.no_grad()
    def batch(self, prompt_ids: Any, at_step: int, device: torch.device) -> None:
        """Sample the global validation ids ``[b]`` at the eval temperature; each rank rolls out its share and
        updates its metric states (synced across ranks by :meth:`results`). ``at_step``: the trainer's rollout step
        (the weights' version; an engine with its own random state also seeds its call from it)."""
        coll = self.rollouts.collective
        ids = np.asarray(prompt_ids.cpu() if isinstance(prompt_ids, Tensor) else prompt_ids, dtype=np.int64)
        self.seeds.reseed(0, salt=2 + self._calls, rank=coll.rank)
        self._calls += 1
        k = self.generation.eval_num_generations
        local_ids, valid = padded_shard(ids, coll.rank, coll.world_size)
        roll, _ = self.rollouts.rollout(ids, at_step, purpose="eval", split="val", sampling=self.generation.eval_sampling,
                                        num_generations=k, pad=True)
        roll = roll.select_groups(torch.arange(valid))
        data = self.rollouts.data
        difficulty = data.reward_columns(local_ids[:valid], "val").get("difficulty") if valid else None
        # The step is not an nn.Module, so no driver's .to(device) reaches these metrics: they follow the policy here
        # (NCCL syncs their states in results() and has no CPU tensors).
        self.metrics.to(device)
        self.metrics.update(roll.correct, roll.rewards, difficulty)

    def results(self) -> dict[str, float]:
        """``val/...`` metrics over every rank's validation prompts since the last call (then reset)."""
        if self.metrics is None:
            return {}
        metrics = {f"val/{k}": v for k, v in self.metrics.compute().items()}
        self.metrics.reset()
        self.last = metrics
        return metrics
