"""The step's evaluation seam: roll a split out for a measurement with seeds and a scorer of its own, and put
everything back afterwards (:meth:`~lit_rlft.step.grpo.GRPOStep.evaluating`, :meth:`~lit_rlft.step.grpo.GRPOStep.evaluate`).

    with step.evaluating(seeds, scorer):          # policy in eval mode, sampling on `seeds`, scored by `scorer`
        reply = step.rollouts.rollout(ids, step.rollout_step, purpose="eval", split="train", ...)
    metrics = step.evaluate(seeds, scorer)        # the held-out split through Validation, as `lit-rlft validate`

A measurement beside training (the study's held-out accuracy, its training-pool reward) thus leaves the run as it
found it: the policy's mode, the rollouts' seeds, the source's scorer (:meth:`RolloutSource.scored_by`, which each
source implements: one in another process refuses, naming itself) and torch's random state are restored, and
nothing is charged to the rollout budget (``purpose="eval"``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import torch

from lit_rlft.step.seeding import StepSeeds
from lit_rlft.step.validation import Validation

if TYPE_CHECKING:
    from torch import nn

    from lit_rlft.rewards.scorer import Scorer
    from lit_rlft.step.config import GenerationConfig
    from lit_rlft.step.sharded import ShardedRollouts

__all__ = ["Evaluated", "evaluate", "evaluating"]


class Evaluated(Protocol):
    """What a measurement needs of the step (a :class:`~lit_rlft.step.grpo.GRPOStep` with its policy attached and
    its data bound)."""

    policy: nn.Module
    rollouts: ShardedRollouts
    generation: GenerationConfig
    rollout_step: int

    @property
    def device(self) -> torch.device: ...

    def begin_validation(self) -> None: ...


@contextlib.contextmanager
def evaluating(step: Evaluated, seeds: StepSeeds, scorer: Scorer | None = None) -> Iterator[None]:
    """Within the block: ``step``'s policy in eval mode, its rollouts re-seeded by ``seeds``, their completions
    scored by ``scorer`` (None: the run's own), torch's random state forked; all restored afterwards."""
    policy, rollouts = step.policy, step.rollouts
    was_training = policy.training
    saved = rollouts.seeds
    device = step.device
    devices = [device.index or 0] if device.type == "cuda" else []
    scoring = rollouts.source.scored_by(scorer) if scorer is not None else contextlib.nullcontext()
    with torch.random.fork_rng(devices=devices), scoring:
        rollouts.seeds = seeds
        policy.eval()
        try:
            yield
        finally:
            rollouts.seeds = saved
            policy.train(was_training)


@torch.no_grad()
def evaluate(step: Evaluated, seeds: StepSeeds, scorer: Scorer | None = None) -> dict[str, float]:
    """The bound data's held-out split (``data.val``) through a :class:`~lit_rlft.step.validation.Validation` of its
    own, within :func:`evaluating`: the ``val/...`` metrics ``lit-rlft validate`` computes, over all ranks."""
    data = step.rollouts.bound_data
    if data.val_pool is None:
        raise ValueError("the evaluation measures the config's held-out data: give data.val")
    with evaluating(step, seeds, scorer):
        step.begin_validation()  # the source on the current weights
        validation = Validation(step.rollouts, seeds, step.generation)
        validation.bind(data)
        validation.begin()
        for batch in data.val_dataloader():
            validation.batch(batch, step.rollout_step, step.device)
        return validation.results()
