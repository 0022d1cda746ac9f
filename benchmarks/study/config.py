"""StudyConfig: the whole Countdown study in one dataclass (serialised into ``study.json``), one run's identity, and
what the study is to the product: a ``lit-rlft fit`` run config per pool size (:meth:`StudyConfig.run_config`) and
the :class:`~lit_rlft.study.StudySettings` that run it (:meth:`StudyConfig.study_settings`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from lit_rlft.study.strategies import STRATEGIES

#: The Countdown study's targets (kind -> curve key): held-out accuracy on 3 and 4 numbers, training-pool reward.
TARGETS = {"accuracy": "val/accuracy/learnable", "train_reward": "train_pool_reward"}
#: Extra paired comparisons besides "vs uniform": (strategy, baseline).
COMPARISONS = (("dps", "dynamic_sampling"), ("dps_c8", "dynamic_sampling"), ("dps_c8", "dps"),
               # what the allocation and the content priors add to the strategy they are built on
               ("allocation_dps", "dps_c8"), ("allocation_mopps", "mopps"), ("allocation_dots", "dots"),
               ("allocation_dps_cold", "dps_cold_start"), ("dps_cold_start", "dps"), ("dps_content_prior", "dps_c8"))
#: Baselines of the "completions to reach a baseline's final accuracy" table (the DPS paper's own metric).
FINAL_BASELINES = ("dynamic_sampling", "uniform")
#: The Countdown rule, the held-out evaluation's reward whatever the training reward.
COUNTDOWN_REWARD = "lit_rlft.rewards.countdown_reward"

#: The skewed pool's settings (:meth:`StudyConfig.skewed`, ``--skewed``).
SKEWED_POOL: dict[str, Any] = {"five_numbers": True, "bucket_weights": [0.3, 0.1, 0.3, 0.3], "degenerate_target": 0.7}

#: The strategies of the multi-epoch setting (the pools after the first), per the study's design.
SWEEP_STRATEGIES: tuple[str, ...] = ("uniform", "dynamic_sampling", "dps", "dps_c8", "mopps", "greso", "dots_replay")


@dataclass
class StudyConfig:
    """Everything that defines a study. Runs differ only in (strategy, pool size, seed).

    Pools and seeds: the first entry of ``pool_sizes`` is the main comparison (every strategy, every seed in
    ``seeds``); the other pool sizes get the strategies of ``sweep_strategies`` (``None``: all) with the first
    ``sweep_seeds`` seeds. The default second pool, 1,000 prompts under the same budget (4.8 passes over the pool),
    is the multi-epoch setting, closer to the papers' regime of many passes. ``strategy_seeds`` runs some strategies
    on fewer seeds (the first N of ``seeds``), e.g. 5 seeds for the strategies whose differences are small and 3 for
    the rest; paired differences use the seeds both strategies ran.

    Task: the training pool is ``CountdownTask(size=N, num_numbers=num_numbers (+ [5] with five_numbers),
    weights=bucket_weights, split="train", seed=pool_seed)``: ``bucket_weights`` (one per entry of
    :attr:`pool_num_numbers`, ``None``: equal parts) sets the pool's composition; the measured share of degenerate
    groups at the warm start is checked against ``degenerate_target`` (:meth:`skewed`: at least 70%); the held-out set is ``CountdownTask(size=eval_size, num_numbers=[2, 3, 4],
    split="test", seed=eval_seed)`` (the task's fixed hash keeps the two disjoint), evaluated at the training
    temperature with ``eval_num_generations`` samples per prompt. ``learnable_buckets`` are pooled into the
    "learnable" accuracy.

    Warm start: ``warm_start`` is an HF checkpoint directory, ``"tiny"`` (a freshly initialised tiny policy of size
    ``tiny``, for tests), or ``None`` (run the SFT of ``configs/sft_countdown_tiny.yaml`` into ``<out>/sft/model``
    once, ``sft_steps`` overriding its max_steps).

    Measurement rollouts (held-out set, training subset, degeneracy) are generated ``generation_chunk`` sequences
    per ``generate`` call on one thread: on this machine bigger calls, and 2 threads while another process
    computes, are several times slower.

    Budget: every run stops after the step in which its cumulative completions (all purposes) reach
    ``budget_completions``; it is evaluated at the start and whenever its completions cross one of
    ``num_evals`` equally spaced marks (the last one is the budget).
    """

    # -- which runs ------------------------------------------------------------------------------------------
    strategies: list[str] = field(default_factory=lambda: list(STRATEGIES))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    pool_sizes: list[int] = field(default_factory=lambda: [4000, 1000])
    sweep_seeds: int = 3
    strategy_seeds: dict[str, int] | None = None  # strategy -> how many of the seeds it runs (None/absent: all)
    sweep_strategies: list[str] | None = field(default_factory=lambda: list(SWEEP_STRATEGIES))
    # -- task ------------------------------------------------------------------------------------------------
    num_numbers: list[int] = field(default_factory=lambda: [2, 3, 4])
    five_numbers: bool = False
    bucket_weights: list[float] | None = None  # the pool's composition: a weight per entry of pool_num_numbers
    degenerate_target: float = 0.5  # the share of degenerate groups at the warm start the pool is meant to have
    pool_seed: int = 1
    eval_size: int = 1800
    eval_seed: int = 2
    eval_num_generations: int = 2
    learnable_buckets: list[int] = field(default_factory=lambda: [3, 4])
    train_subset_size: int = 256
    train_subset_generations: int = 4
    generation_chunk: int = 256
    degeneracy_sample: int = 1024
    degeneracy_generations: int = 8
    # -- warm start ------------------------------------------------------------------------------------------
    warm_start: str | None = None
    tiny: dict[str, Any] | None = None
    sft_steps: int | None = None
    sft_threads: int = 1
    # -- GRPO (configs/countdown_tiny.yaml) ------------------------------------------------------------------
    batch_size: int = 32
    num_generations: int = 8
    temperature: float = 1.0
    max_completion_length: int = 16
    learning_rate: float = 1e-4
    warmup_steps: int = 20
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    reward: str | None = None  # the training reward (None: the Countdown rule), e.g. a reward-model directory
    epsilon: float = 0.2
    adam_betas: tuple[float, float] = (0.9, 0.99)
    max_grad_norm: float = 1.0
    async_depth: int = 0  # model.asynchronous.depth: batches generated ahead, in a process of one thread
    # -- budget and evaluation -------------------------------------------------------------------------------
    budget_completions: int = 38_400
    num_evals: int = 6
    max_steps_factor: int = 10
    # -- strategies: configs/study/<name>.yaml, with these changes (lit-rlft study's --set, in order) -----------
    overrides: list[str] = field(default_factory=list)  # [ARM:]Callback.argument[.field]=VALUE each
    # -- execution and statistics ----------------------------------------------------------------------------
    jobs: int = 2
    threads: int = 1
    run_timeout_s: float = 3600.0
    confidence: float = 0.95

    def __post_init__(self) -> None:
        self.adam_betas = tuple(self.adam_betas)
        unknown = [s for s in [*self.strategies, *(self.sweep_strategies or [])] if s not in STRATEGIES]
        if unknown:
            raise ValueError(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")
        if not self.strategies or not self.seeds or not self.pool_sizes:
            raise ValueError("strategies, seeds and pool_sizes must be non-empty")
        if self.strategy_seeds is not None:
            self.strategy_seeds = {str(k): int(v) for k, v in self.strategy_seeds.items()}
            wrong = [k for k in self.strategy_seeds if k not in STRATEGIES]
            if wrong:
                raise ValueError(f"strategy_seeds names unknown strategies {wrong}; choose from {', '.join(STRATEGIES)}")
            small = {k: v for k, v in self.strategy_seeds.items() if v < 1}
            if small:
                raise ValueError(f"strategy_seeds must give each strategy at least 1 seed, got {small}")
        if self.budget_completions < self.batch_size * self.num_generations:
            raise ValueError(f"budget_completions ({self.budget_completions}) is less than one step "
                             f"({self.batch_size} x {self.num_generations})")
        if not 0 <= self.jobs <= 2:
            raise ValueError(f"jobs must be 0 (in-process), 1 or 2 on this 2-core machine, got {self.jobs}")
        if self.num_evals < 1:
            raise ValueError(f"num_evals must be >= 1, got {self.num_evals}")
        if self.bucket_weights is not None:
            self.bucket_weights = [float(w) for w in self.bucket_weights]
            buckets = self.pool_num_numbers
            if len(self.bucket_weights) != len(buckets):
                raise ValueError(f"bucket_weights has {len(self.bucket_weights)} entries for the pool's "
                                 f"{len(buckets)} number counts {buckets}: give one weight per count")
            if min(self.bucket_weights) < 0 or sum(self.bucket_weights) <= 0:
                raise ValueError(f"bucket_weights must be >= 0 with a positive sum, got {self.bucket_weights}")
        if not 0.0 <= self.degenerate_target <= 1.0:
            raise ValueError(f"degenerate_target must lie in [0, 1], got {self.degenerate_target}")

    # -- variants ---------------------------------------------------------------------------------------------
    @classmethod
    def quick(cls, **fields: Any) -> StudyConfig:
        """Every strategy once, pool 1000, a 12,288-completion budget (48 uniform steps), 300 held-out prompts:
        a smoke test of the whole pipeline in under 15 minutes (no confidence intervals with one seed)."""
        kw: dict[str, Any] = dict(seeds=[0], pool_sizes=[1000], budget_completions=12_288, num_evals=3,
                                  eval_size=300, degeneracy_sample=256, train_subset_size=128)
        kw.update(fields)
        return cls(**kw)

    @classmethod
    def skewed(cls, **fields: Any) -> StudyConfig:
        """A pool that wastes most rollouts, as real pools do for a given model: 2-number prompts the warm start
        already solves, 4- and 5-number prompts beyond it, few 3-number ones (weights 0.3, 0.1, 0.3, 0.3 over 2, 3,
        4 and 5 numbers), meant to leave at least 70% of groups degenerate at the warm start (measured and reported
        with every study). The held-out set stays 2-4 numbers in equal parts, as in the balanced study."""
        kw: dict[str, Any] = dict(SKEWED_POOL)
        kw.update(fields)
        return cls(**kw)

    @property
    def pool_composition(self) -> dict[int, float]:
        """Number count -> its expected share of the training pool."""
        buckets = self.pool_num_numbers
        weights = self.bucket_weights or [1.0] * len(buckets)
        return {k: w / sum(weights) for k, w in zip(buckets, weights)}

    # -- derived ----------------------------------------------------------------------------------------------
    @property
    def pool_num_numbers(self) -> list[int]:
        return sorted(set(self.num_numbers) | ({5} if self.five_numbers else set()))

    def eval_marks(self) -> list[int]:
        """The completion counts at which a run is evaluated (after the one at the start): ``num_evals`` equally
        spaced marks, the last one the budget."""
        return [math.ceil(self.budget_completions * (i + 1) / self.num_evals) for i in range(self.num_evals)]

    def runs(self) -> list[RunSpec]:
        """All runs, main pool first (seed-major, so every strategy gets seed 0 early), then the sweep."""
        main, *sweep = self.pool_sizes
        specs = [RunSpec(s, main, seed) for seed in self.seeds for s in self.strategies if seed in self.seeds_of(s)]
        for size in sweep:
            specs += [RunSpec(s, size, seed) for seed in self.seeds[: self.sweep_seeds] for s in self.strategies_at(size)
                      if seed in self.seeds_of(s)]
        return specs

    def seeds_of(self, strategy: str) -> list[int]:
        """The seeds ``strategy`` runs: the first ``strategy_seeds[strategy]`` of ``seeds`` (all without an entry).
        Paired comparisons use the seeds two strategies share."""
        count = (self.strategy_seeds or {}).get(strategy)
        return list(self.seeds) if count is None else list(self.seeds[:count])

    def strategies_at(self, pool_size: int) -> list[str]:
        """The strategies run at ``pool_size`` (all of them at the main pool)."""
        if pool_size == self.pool_sizes[0] or self.sweep_strategies is None:
            return list(self.strategies)
        return [s for s in self.strategies if s in self.sweep_strategies]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # -- the study as the product runs it ---------------------------------------------------------------------
    def run_config(self, pool_size: int, warm_start: str) -> dict[str, Any]:
        """The ``lit-rlft fit`` config every run of pool ``pool_size`` shares (``configs/countdown_tiny.yaml``'s GRPO
        with the study's pool, held-out set and warm start); the study adds each arm's callbacks and seed."""
        model: dict[str, Any] = {"model": warm_start}
        if warm_start == "tiny" and self.tiny:
            model["tiny"] = dict(self.tiny)
        reward: Any = COUNTDOWN_REWARD
        if self.reward:  # a learned reward model (a directory): its probability of "correct"
            reward = {"class_path": "lit_rlft.rewards.RewardModel",
                      "init_args": {"model": self.reward, "sigmoid": True, "max_batch_tokens": 8192,
                                    "device": "cpu"}}
        model.update(
            reward_funcs=[reward], scale_rewards=self.scale_rewards,
            generation={"num_generations": self.num_generations, "temperature": self.temperature,
                        "max_completion_length": self.max_completion_length,
                        "eval_num_generations": self.eval_num_generations},
            asynchronous={"depth": self.async_depth, "threads": 1},
            loss={"loss_type": self.loss_type, "epsilon": self.epsilon, "beta": 0.0},
            optim={"learning_rate": self.learning_rate, "adam_betas": list(self.adam_betas),
                   "warmup_steps": self.warmup_steps, "max_grad_norm": self.max_grad_norm})
        train = {"size": pool_size, "num_numbers": self.pool_num_numbers, "split": "train", "seed": self.pool_seed}
        if self.bucket_weights is not None:
            train["weights"] = list(self.bucket_weights)
        return {
            "seed_everything": 0,
            "trainer": {"accelerator": "cpu", "devices": 1, "log_every_n_steps": 1},
            "model": model,
            "data": {"train": {"class_path": "lit_rlft.data.CountdownTask", "init_args": train},
                     "val": {"class_path": "lit_rlft.data.CountdownTask",
                             "init_args": {"size": self.eval_size, "num_numbers": [2, 3, 4], "split": "test",
                                           "seed": self.eval_seed}},
                     "answer_field": None, "batch_size": self.batch_size,
                     "val_batch_size": max(1, self.generation_chunk // self.eval_num_generations)},
        }

    def study_settings(self, pool_size: int, config_path: str, out: str) -> Any:
        """The product's settings for pool ``pool_size``: its strategies and seeds, the budget, the marks, the
        evaluation (held-out accuracy pooled over ``learnable_buckets``, the training-pool subset)."""
        from lit_rlft.study import StudySettings

        main = pool_size == self.pool_sizes[0]
        seeds = list(self.seeds) if main else list(self.seeds[: self.sweep_seeds])
        return StudySettings(
            configs=[config_path], strategies=self.strategies_at(pool_size), seeds=seeds,
            completions=self.budget_completions, eval_every=math.ceil(self.budget_completions / self.num_evals),
            out=out, jobs=self.jobs, threads=self.threads, train_subset=self.train_subset_size,
            train_generations=self.train_subset_generations, groups={"learnable": list(self.learnable_buckets)},
            eval_reward=[COUNTDOWN_REWARD] if self.reward else [],
            arm_seeds={k: v for k, v in (self.strategy_seeds or {}).items()}, metric=TARGETS["accuracy"],
            overrides=list(self.overrides), confidence=self.confidence,
            max_steps_factor=self.max_steps_factor, run_timeout_s=self.run_timeout_s)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudyConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def run_fingerprint(self) -> str:
        """Hash of the settings every run shares (not the run list, jobs, statistics, nor the strategies'
        ``overrides``): a finished run is reused on a re-run only when this matches *and* its
        recorded callback settings match what the study passes now (``benchmarks.study.study.retire_stale_runs``),
        so changing one strategy's setting re-runs that strategy only."""
        skip = {"strategies", "seeds", "pool_sizes", "sweep_seeds", "strategy_seeds", "sweep_strategies", "jobs", "run_timeout_s",
                "confidence", "sft_threads", "degeneracy_sample", "degeneracy_generations", "degenerate_target",
                "overrides"}
        data = {k: v for k, v in self.to_dict().items() if k not in skip}
        for added in ("async_depth", "bucket_weights", "reward"):  # added later: runs without them keep theirs
            if not data.get(added):
                data.pop(added, None)
        return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class RunSpec:
    """One training run of the study."""

    strategy: str
    pool_size: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.strategy}-pool{self.pool_size}-seed{self.seed}"
