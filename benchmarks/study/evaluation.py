"""EvalCallback: the study's learning curves, measured at equal rollout marks and kept out of training time."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import numpy as np
import torch

from benchmarks.study.rollouts import countdown_rewards, sample_groups
from lit_rlft.rollout import HFEngine, InProcessRollouts, RolloutEngine, SamplingConfig

#: torch seed of every evaluation: all runs and points see the same sampling noise (common random numbers).
EVAL_SEED = 1234


class EvalCallback(L.Callback):
    """Evaluate at the start of training and whenever cumulative completions cross one of ``marks``.

    Each point: ``step`` (rollout steps done), ``completions`` (cumulative, all purposes), ``wall_s`` (training
    wall time since :meth:`start`, minus all evaluation time), held-out accuracy sampled at ``sampling`` with
    ``k`` samples per prompt (``val/accuracy``, per difficulty ``val/accuracy/difficulty_<d>``, and
    ``val/accuracy/learnable`` pooling the ``learnable`` difficulties) and ``train_pool_reward``, the mean reward
    of the fixed training-pool subset ``train_ids`` sampled with ``train_generations`` completions each (also per
    difficulty). Place it last in the callbacks, after the budget stop.

    Args:
        marks: completion counts (increasing) at which to evaluate; the last one is usually the budget.
        train_ids: ``[n]`` training-pool ids of the fixed subset.
        k: held-out samples per prompt.
        train_generations: samples per training-subset prompt.
        learnable: difficulties pooled into ``val/accuracy/learnable``.
        chunk: sequences per generation call (prompts x samples).
    """

    def __init__(self, marks: list[int], train_ids: np.ndarray, k: int, train_generations: int,
                 learnable: list[int], chunk: int = 256):
        self.marks, self.train_ids, self.k = list(marks), np.asarray(train_ids), k
        self.train_generations, self.learnable, self.chunk = train_generations, set(learnable), chunk
        self.curve: list[dict[str, Any]] = []
        self.eval_s = 0.0
        self.t0: float | None = None
        self._next = 0
        self._rewards = countdown_rewards()
        self.eval_counts: dict[str, int] = {}
        self._engine: HFEngine | None = None

    def local_engine(self, step: Any) -> RolloutEngine:
        """An engine that samples from the trainer's own policy in this process: the in-process source's, or (a
        generation process has its own copy of the weights) an HF engine bound to the policy, made once."""
        if isinstance(step.source, InProcessRollouts):
            return step.source.engine
        if self._engine is None or self._engine.model is not step.policy:
            self._engine = HFEngine.bound(step.policy, step.tokenizer)
        return self._engine

    def start(self) -> None:
        """Start the training clock (call right before ``trainer.fit``)."""
        self.t0 = time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.t0 is None:
            self.start()
        self.evaluate(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        done = pl_module.grpo.budget.completions
        crossed = False
        while self._next < len(self.marks) and done >= self.marks[self._next]:
            self._next += 1
            crossed = True
        if crossed:
            self.evaluate(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.curve or self.curve[-1]["step"] != pl_module.grpo.rollout_step:
            self.evaluate(trainer, pl_module)  # stopped before the last mark (max_steps): the final point

    # ------------------------------------------------------------------------------------------------------
    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        step = pl_module.grpo
        return self.record(self.local_engine(step), pl_module.tokenizer, trainer.datamodule,
                           step.generation.eval_sampling, step.generation.sampling,
                           pl_module.hparams.success_threshold, int(step.rollout_step), int(step.budget.completions))

    def record(self, engine: RolloutEngine, tokenizer: Any, dm: Any, sampling: SamplingConfig,
               train_sampling: SamplingConfig, threshold: float, step: int, completions: int) -> dict[str, Any]:
        """Measure the policy ``engine`` samples from and append the point to :attr:`curve` (any trainer's policy:
        ``benchmarks/time_to_trl.py`` measures TRL's with it). ``dm``: the study's datamodule, set up, with its
        tokenizer."""
        wall = time.perf_counter() - self.t0 - self.eval_s
        t = time.perf_counter()
        point: dict[str, Any] = {"step": step, "completions": completions, "wall_s": wall}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(EVAL_SEED)
            val_ids = dm.pool("val").ids
            _, correct = sample_groups(engine, tokenizer, dm, self._rewards, val_ids, "val",
                                       self.k, sampling, max(1, self.chunk // self.k), threshold)
            point.update(self._by_difficulty("val/accuracy", correct.mean(axis=1),
                                             dm.reward_columns(val_ids, "val")["difficulty"], learnable=True))
            torch.manual_seed(EVAL_SEED + 1)
            rewards, _ = sample_groups(engine, tokenizer, dm, self._rewards, self.train_ids,
                                       "train", self.train_generations, train_sampling,
                                       max(1, self.chunk // self.train_generations), threshold)
            point.update(self._by_difficulty("train_pool_reward", rewards.mean(axis=1),
                                             dm.reward_columns(self.train_ids, "train")["difficulty"]))
        point["eval_s"] = time.perf_counter() - t
        self.eval_s += point["eval_s"]
        self.curve.append(point)
        return point

    def _by_difficulty(self, name: str, values: np.ndarray, difficulty: list[int],
                       learnable: bool = False) -> dict[str, float]:
        d = np.asarray(difficulty)
        out = {name: float(values.mean())}
        for b in sorted(set(d.tolist())):
            out[f"{name}/difficulty_{b}"] = float(values[d == b].mean())
            self.eval_counts[f"{name}/difficulty_{b}"] = int((d == b).sum())
        if learnable:
            mask = np.isin(d, sorted(self.learnable))
            if mask.any():
                out[f"{name}/learnable"] = float(values[mask].mean())
                self.eval_counts[f"{name}/learnable"] = int(mask.sum())
        self.eval_counts[name] = len(values)
        return out
