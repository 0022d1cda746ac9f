"""The study's prompts: the Countdown training pool, the held-out set and the fixed training-pool subset."""

from __future__ import annotations

import numpy as np

from benchmarks.study.config import StudyConfig
from lit_rlft.data import CountdownTask, PromptDataModule


def pool_task(cfg: StudyConfig, size: int) -> CountdownTask:
    """The training pool of ``size`` prompts (the same for every strategy and seed)."""
    return CountdownTask(size=size, num_numbers=cfg.pool_num_numbers, weights=cfg.bucket_weights, split="train",
                         seed=cfg.pool_seed)


def eval_task(cfg: StudyConfig) -> CountdownTask:
    """The held-out set: 2-4 numbers, instances never in any training pool (the task's fixed hash)."""
    return CountdownTask(size=cfg.eval_size, num_numbers=[2, 3, 4], split="test", seed=cfg.eval_seed)


def datamodule(cfg: StudyConfig, pool_size: int, seed: int, with_eval: bool = True) -> PromptDataModule:
    """The run's datamodule (``seed`` sets the uniform batch order)."""
    return PromptDataModule(train=pool_task(cfg, pool_size), val=eval_task(cfg) if with_eval else None,
                            answer_field=None, batch_size=cfg.batch_size, seed=seed)


def train_subset_ids(cfg: StudyConfig, pool_size: int) -> np.ndarray:
    """The fixed subset of training-pool ids whose reward is tracked (same for every run of a pool size)."""
    n = min(cfg.train_subset_size, pool_size)
    rng = np.random.default_rng(10_007 + cfg.pool_seed)
    return np.sort(rng.choice(pool_size, size=n, replace=False)).astype(np.int64)
