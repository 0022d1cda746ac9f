"""The study's one evaluator: held-out accuracy from the run's own validation (its ``data.val`` and its reward), with
a seed of its own, so that one model and one seed give one figure, whichever arm, step or process measures it.

    evaluator = HeldOutEvaluator(EvalSettings(seed=0, train_subset=256))
    metrics = evaluator.measure(step)        # a GRPOStep with its policy attached and its data bound

What it measures (every figure over all ranks' prompts):

- ``val/accuracy`` (mean@k over ``eval_num_generations`` samples per held-out prompt at the eval temperature),
  ``val/pass@k``, ``val/reward``, ``val/accuracy/difficulty_<d>`` per value of a ``difficulty`` column, and each
  pooled group of difficulties (``groups={"learnable": [3, 4]}`` gives ``val/accuracy/learnable``): the step's
  :class:`~lit_rlft.step.validation.Validation`, exactly what ``lit-rlft validate`` computes;
- with ``train_subset = n``: ``train_pool_reward``, the mean reward of a fixed ``n``-prompt subset of the training
  pool (``train_generations`` samples each, at the training temperature), also per difficulty.

Seeds: sampling is re-seeded from ``(seed, batch)`` only (:class:`EvalSeeds`), never from the step the evaluation
runs at nor from the run's own generation seed, so every evaluation of every arm and seed draws the same random
numbers (paired comparisons: common random numbers). The training's random state is restored afterwards, and nothing
is charged to the rollout budget (``purpose="eval"``).
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from lit_rlft.rewards.runner import RewardRunner
from lit_rlft.step.context import StepContext
from lit_rlft.step.seeding import StepSeeds

if TYPE_CHECKING:
    from lit_rlft.rewards.scorer import Scorer
    from lit_rlft.step.config import GenerationConfig
    from lit_rlft.step.sharded import ShardedRollouts

__all__ = ["EvalSeeds", "EvalSettings", "HeldOutEvaluator", "StudyContext", "policy_probe"]


class StudyContext(StepContext, Protocol):
    """What a study's measurement uses of the running step: the declared step context, its evaluation seam
    (:mod:`lit_rlft.step.evaluation`) and the rollouts and sampling a training-pool measurement goes through.
    :class:`~lit_rlft.step.grpo.GRPOStep` is one, under the Trainer, ``FabricLoop`` and a plain loop."""

    rollouts: ShardedRollouts
    generation: GenerationConfig

    def evaluating(self, seeds: StepSeeds,
                   scorer: Scorer | None = None) -> contextlib.AbstractContextManager[None]: ...

    def evaluate(self, seeds: StepSeeds, scorer: Scorer | None = None) -> dict[str, float]: ...

#: Where the training-subset measurement's seeds start (validation batch ``i`` uses salt ``2 + i``).
TRAIN_SUBSET_SALT = 1_000_000
#: Seed of the fixed training-pool subset's choice (the same subset for every arm and seed of a pool).
SUBSET_SEED = 10_008


class EvalSeeds(StepSeeds):
    """Seeds that ignore the step an evaluation runs at: evaluation ``i``'s batch ``j`` draws what every other
    evaluation's batch ``j`` draws (torch's generator, and an engine's own seed for engines that take one)."""

    def reseed(self, step: int, salt: int, rank: int) -> None:
        super().reseed(0, salt, rank)

    def engine_seed(self, step: int, rank: int) -> int | None:
        return super().engine_seed(0, rank)


@dataclass
class EvalSettings:
    """How a study evaluates (the same for every arm).

    Attributes:
        seed: the evaluation's sampling seed (independent of the runs' seeds: common random numbers).
        train_subset: prompts of the fixed training-pool subset whose reward is tracked (0: none).
        train_generations: samples per training-subset prompt.
        groups: pooled difficulty groups, e.g. ``{"learnable": [3, 4]}`` (``val/accuracy/learnable``).
        reward_funcs: score the evaluation with these rewards (dotted paths) instead of the run's own: e.g. the
            ground-truth rule while the run trains on a learned reward model (in-process rollouts only).
    """

    seed: int = 0
    train_subset: int = 0
    train_generations: int = 4
    groups: dict[str, list[Any]] = field(default_factory=dict)
    reward_funcs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.train_subset < 0 or self.train_generations < 1:
            raise ValueError(f"train_subset must be >= 0 and train_generations >= 1, got {self.train_subset}, "
                             f"{self.train_generations}")
        self.groups = {str(k): list(v) for k, v in (self.groups or {}).items()}
        self.reward_funcs = [str(f) for f in self.reward_funcs or []]

    def key(self) -> dict[str, Any]:
        out = asdict(self)
        if not out["reward_funcs"]:  # added later: studies without an override keep their key
            del out["reward_funcs"]
        return out


def subset_ids(pool_ids: np.ndarray, n: int) -> np.ndarray:
    """The fixed ``n``-prompt subset of a training pool's ids (sorted; the whole pool when it is smaller)."""
    ids = np.asarray(pool_ids, dtype=np.int64)
    if n >= len(ids):
        return np.sort(ids)
    rng = np.random.default_rng(SUBSET_SEED)
    return np.sort(rng.choice(ids, size=n, replace=False)).astype(np.int64)


def pooled(metrics: dict[str, float], groups: dict[str, list[Any]], prefix: str = "val/accuracy") -> dict[str, float]:
    """``<prefix>/<group>`` for each group: its difficulties' accuracies weighted by their prompt counts
    (``val/n/accuracy/difficulty_<d>``); a group with no such prompt is left out."""
    out = {}
    for name, members in groups.items():
        num = den = 0.0
        for d in members:
            key = f"{prefix}/difficulty_{d}"
            n = metrics.get(f"val/n/{key.removeprefix('val/')}")
            if key in metrics and n:
                num += metrics[key] * n
                den += n
        if den:
            out[f"{prefix}/{name}"] = num / den
            out[f"val/n/{prefix.removeprefix('val/')}/{name}"] = den
    return out


class HeldOutEvaluator:
    """Measure a step's policy (see the module docstring). ``step``: a :class:`StudyContext` (a
    :class:`~lit_rlft.step.grpo.GRPOStep`) with its policy attached and its prompt data bound (a ``data.val`` pool is
    required)."""

    def __init__(self, settings: EvalSettings | None = None):
        self.settings = settings or EvalSettings()
        self._scorer: Any = None

    def scorer(self) -> Any:
        """The evaluation's own reward runner (None: the run's), made once."""
        if self.settings.reward_funcs and self._scorer is None:
            self._scorer = RewardRunner(list(self.settings.reward_funcs))
        return self._scorer

    @torch.no_grad()
    def measure(self, step: StudyContext) -> dict[str, float]:
        data = step.rollouts.bound_data
        if data.val_pool is None:
            raise ValueError("the study evaluates on the config's held-out data: give data.val")
        seeds = EvalSeeds(self.settings.seed)
        metrics = step.evaluate(seeds, self.scorer())
        metrics.update(pooled(metrics, self.settings.groups))
        if self.settings.train_subset:
            with step.evaluating(seeds, self.scorer()):
                metrics.update(self._train_pool(step, data, seeds))
        return metrics

    def _train_pool(self, step: StudyContext, data: Any, seeds: StepSeeds) -> dict[str, float]:
        """``train_pool_reward`` (and per difficulty) of the fixed training subset, sampled at the training
        temperature in batches of ``data.val_batch_size`` prompts."""
        ids = subset_ids(data.pool("train").ids, self.settings.train_subset)
        rank = step.rollouts.collective.rank
        chunk = max(1, int(getattr(data, "val_batch_size", 128)))
        rows: list[np.ndarray] = []
        for i, start in enumerate(range(0, len(ids), chunk)):
            part = ids[start:start + chunk]
            seeds.reseed(0, salt=TRAIN_SUBSET_SALT + i, rank=rank)
            _, record = step.rollouts.rollout(part, step.rollout_step, purpose="eval", split="train",
                                              sampling=step.generation.sampling,
                                              num_generations=self.settings.train_generations, pad=True)
            order = {int(p): k for k, p in enumerate(record.prompt_ids.tolist())}
            rewards = record.rewards.float().mean(dim=1).numpy()
            rows.append(np.asarray([rewards[order[int(p)]] for p in part]))
        values = np.concatenate(rows)
        out = {"train_pool_reward": float(values.mean())}
        difficulty = data.reward_columns(ids, "train").get("difficulty")
        if difficulty is not None:
            d = np.asarray(difficulty)
            for b in sorted(set(d.tolist()), key=str):
                out[f"train_pool_reward/difficulty_{b}"] = float(values[d == b].mean())
        return out


@torch.no_grad()
def policy_probe(step: StudyContext) -> str:
    """A fingerprint of the function the policy computes: a hash of its logits on the first held-out prompt (at
    most 64 tokens). Two runs whose policies give the same probe start from the same model (a LoRA adapter whose
    ``B`` is zero leaves the base model's logits bit for bit), so one start evaluation serves both."""
    data = step.rollouts.bound_data
    ids = data.pool("val").ids[:1]
    tokens = data.prompt_tokens(ids, "val")[0][:64]
    policy = step.policy
    was_training = policy.training
    policy.eval()
    try:
        logits = policy(input_ids=torch.tensor([tokens], device=step.device)).logits[0, -1]
    finally:
        policy.train(was_training)
    return hashlib.sha1(logits.detach().float().cpu().numpy().tobytes()).hexdigest()[:16]
