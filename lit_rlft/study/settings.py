"""StudySettings: everything a study is, in one dataclass (``lit-rlft study`` builds one from its options; it is
written into ``<out>/settings.json`` and ``study.json``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from lit_rlft.study.evaluation import EvalSettings
from lit_rlft.study.strategies import resolve_arm

__all__ = ["LOOPS", "TRL_ARM", "StudySettings", "arm_name"]

#: What can drive a study's lit_rlft runs (``--loop``).
LOOPS = ("trainer", "fabric")

#: The arm name of TRL's ``GRPOTrainer`` on the same config (``--baseline trl`` or ``--strategies ...,trl``).
TRL_ARM = "trl"

def arm_name(text: str) -> str:
    """The name of the arm a ``--strategies`` entry gives (a shipped strategy, an overlay file's stem, ``trl``)."""
    return TRL_ARM if text == TRL_ARM else resolve_arm(text).name


@dataclass
class StudySettings:
    """Everything a study is (``lit-rlft study`` builds one from its options; every field has its option).

    Attributes:
        configs: the run config file(s), merged in order: a normal ``lit-rlft fit`` config (model, data with
            ``data.val``, reward, engine, settings).
        strategies: the arms: shipped strategies (:data:`~lit_rlft.study.strategies.STRATEGIES`), YAML overlay
            files of callbacks, or ``trl`` (TRL's ``GRPOTrainer`` on the same config).
        seeds: each arm runs once per seed (paired comparisons use the seeds both arms ran).
        completions: the budget of every run: completions of every purpose (reference sets, filtered rounds).
        eval_every: completions between evaluations (None: a quarter of the budget); the last mark is the budget.
        out: the study's folder.
        jobs: runs side by side (0: one after another in this process).
        threads: torch threads per run (None: the cores divided by ``jobs``).
        baseline: the arm the others are compared with (its final accuracy is the target).
        eval_seed: the evaluation's sampling seed, the same for every arm and seed.
        train_subset: prompts of a fixed training-pool subset whose reward is also tracked (0: none).
        train_generations: samples per training-subset prompt.
        groups: pooled held-out difficulty groups, e.g. ``{"learnable": [3, 4]}``.
        eval_reward: score the evaluation with these rewards (dotted paths) instead of the config's (e.g. the rule
            while the config trains on a reward model).
        arm_seeds: arm -> how many of ``seeds`` it runs (the first ones; absent: all), e.g. more seeds for the arms
            whose differences are small.
        metric: the held-out curve key the report is about (``val/accuracy``; e.g. ``val/accuracy/learnable``).
        overrides: ``--set`` changes to the arms' callbacks, ``[ARM:]Callback.argument[.field]=VALUE`` each
            (:mod:`~lit_rlft.study.overrides`), applied in order.
        confidence: of every interval.
        max_steps_factor: ``trainer.max_steps`` backstop, in multiples of the budget's uniform steps.
        run_timeout_s: a run past this many seconds is killed and recorded as failed (None: no limit).
        probe: run ``lit-rlft probe`` on the config before any run (its verdict heads the report; cached in
            ``<out>/probe`` for the same config).
        probe_prompts: training-pool prompts the probe samples (as many held-out ones).
        loop: what drives each lit_rlft run: ``trainer`` (``lit-rlft fit``, Lightning's Trainer) or ``fabric``
            (:class:`~lit_rlft.lightning.fabric.FabricLoop`, :mod:`~lit_rlft.study.fabric_arm`); the same step,
            callbacks and measurement either way.
        checkpoints: save each run after every evaluation but the last, so that a killed study resumes its
            unfinished runs from their last mark instead of from the start (the checkpoint is deleted when the run
            finishes).
    """

    configs: list[str]
    strategies: list[str] = field(default_factory=lambda: ["uniform", "dps"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    completions: int = 40_000
    eval_every: int | None = None
    out: str = "runs/study"
    jobs: int = 1
    threads: int | None = None
    baseline: str = "uniform"
    eval_seed: int = 0
    train_subset: int = 0
    train_generations: int = 4
    groups: dict[str, list[Any]] = field(default_factory=dict)
    eval_reward: list[str] = field(default_factory=list)
    arm_seeds: dict[str, int] = field(default_factory=dict)
    metric: str = "val/accuracy"
    overrides: list[str] = field(default_factory=list)
    confidence: float = 0.95
    max_steps_factor: int = 10
    run_timeout_s: float | None = None
    checkpoints: bool = True
    loop: str = "trainer"
    probe: bool = True
    probe_prompts: int = 32

    def __post_init__(self) -> None:
        if self.loop not in LOOPS:
            raise ValueError(f"the study's loop must be one of {', '.join(LOOPS)}; got {self.loop!r}")
        self.configs = [str(c) for c in self.configs]
        self.seeds = [int(s) for s in self.seeds]
        self.overrides = [str(o) for o in self.overrides]

    @property
    def marks(self) -> list[int]:
        """The completion counts after which every run is evaluated (after the start): every ``eval_every``, the
        last one the budget."""
        every = self.eval_every or math.ceil(self.completions / 4)
        marks = list(range(every, self.completions, every))
        return [*marks, self.completions]

    @property
    def arm_names(self) -> list[str]:
        """The arms in order, the baseline included (added first when not listed)."""
        names = [self.baseline, *self.strategies] if self.baseline not in self.strategies else list(self.strategies)
        return [arm_name(n) for n in names]

    @property
    def eval_settings(self) -> EvalSettings:
        return EvalSettings(seed=self.eval_seed, train_subset=self.train_subset,
                            train_generations=self.train_generations, groups=self.groups,
                            reward_funcs=self.eval_reward)

    def seeds_of(self, arm: str) -> list[int]:
        """The seeds ``arm`` runs: the first ``arm_seeds[arm]`` of ``seeds`` (all without an entry)."""
        count = self.arm_seeds.get(arm)
        return list(self.seeds) if count is None else list(self.seeds[:count])

    def targets(self) -> dict[str, str]:
        """The report's targets (kind -> curve key): held-out accuracy, and the training-pool reward if tracked."""
        out = {"accuracy": self.metric}
        if self.train_subset:
            out["train_reward"] = "train_pool_reward"
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudySettings:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _arm_name(text: str) -> str:
    return TRL_ARM if text == TRL_ARM else resolve_arm(text).name
