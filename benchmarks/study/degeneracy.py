"""How degenerate the training pool is under the warm start: the share of all-correct / all-wrong / mixed groups."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks.study.config import StudyConfig
from benchmarks.study.rollouts import countdown_rewards, sample_groups
from benchmarks.study.tasks import datamodule


def group_fractions(correct: np.ndarray) -> dict[str, float]:
    """``correct`` ``[n, G]`` bool -> fractions of all-correct, all-wrong, mixed and degenerate groups."""
    rate = correct.mean(axis=1)
    n = max(len(rate), 1)
    solved, unsolved = float((rate == 1).sum() / n), float((rate == 0).sum() / n)
    return {"n": int(len(rate)), "all_correct": solved, "all_wrong": unsolved, "mixed": 1 - solved - unsolved,
            "degenerate": solved + unsolved, "mean_success": float(rate.mean()) if len(rate) else float("nan")}


def measure_degeneracy(cfg: StudyConfig, pool_size: int, warm_start: str, threads: int = 1) -> dict[str, Any]:
    """Roll out every pool prompt (or a ``degeneracy_sample`` uniform sample of a bigger pool) ``G`` times at the
    training temperature under the warm start; fractions overall and per difficulty."""
    import torch

    from lit_rlft.models.loading import load_policy
    from lit_rlft.models.tiny import TinyConfig
    from lit_rlft.rollout.engines.base import SamplingConfig
    from lit_rlft.rollout.engines.hf import HFEngine

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    policy, tok = load_policy(warm_start, tiny=TinyConfig(**(cfg.tiny or {})) if warm_start == "tiny" else None)
    engine = HFEngine.bound(policy, tok)
    dm = datamodule(cfg, pool_size, seed=0, with_eval=False)
    dm.setup("fit")
    dm.set_tokenizer(tok)
    rng = np.random.default_rng(20_011 + cfg.pool_seed)
    n = min(pool_size, cfg.degeneracy_sample)
    ids = np.arange(pool_size) if n == pool_size else np.sort(rng.choice(pool_size, size=n, replace=False))
    sampling = SamplingConfig(cfg.temperature, 1.0, 0, cfg.max_completion_length)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4321)
        _, correct = sample_groups(engine, tok, dm, countdown_rewards(), ids, "train", cfg.degeneracy_generations,
                                   sampling, chunk=max(1, cfg.generation_chunk // cfg.degeneracy_generations))
    difficulty = np.asarray(dm.reward_columns(ids, "train")["difficulty"])
    out: dict[str, Any] = {"pool_size": pool_size, "sampled": int(n), "G": cfg.degeneracy_generations,
                           "overall": group_fractions(correct)}
    out["by_difficulty"] = {str(d): group_fractions(correct[difficulty == d]) for d in sorted(set(difficulty.tolist()))}
    out["composition"] = {str(k): v for k, v in cfg.pool_composition.items()}
    out["seconds"] = time.perf_counter() - t0
    return out
