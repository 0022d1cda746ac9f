"""Sampling groups of completions for measurement (held-out accuracy, pool reward, degeneracy), never charged to
a run's rollout budget and scored by a reward runner of its own (the run's reward counters stay untouched)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lit_rlft.rewards.runner import RewardRunner, resolve_reward
from lit_rlft.rollout.engines.base import SamplingConfig

REWARD = "lit_rlft.rewards.countdown_reward"


def countdown_rewards() -> RewardRunner:
    return RewardRunner([resolve_reward(REWARD)])


def sample_groups(
    engine: Any, tokenizer: Any, dm: Any, rewards: RewardRunner, ids: np.ndarray, split: str, num_generations: int,
    sampling: SamplingConfig, chunk: int = 256, success_threshold: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Roll out ``num_generations`` completions for each prompt id ``[n]`` of ``split``.

    Returns ``(rewards [n, G], correct [n, G])`` as numpy arrays.
    """
    ids = np.asarray(ids, dtype=np.int64)
    all_rewards: list[np.ndarray] = []
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        out = engine.generate(dm.prompt_tokens(part, split), num_generations, sampling)
        texts = tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
        cols = dm.reward_columns(part, split)
        cols = {k: [v for v in vals for _ in range(num_generations)] for k, vals in cols.items()}
        all_rewards.append(rewards(texts, cols).total.view(len(part), num_generations).numpy())
    r = np.concatenate(all_rewards) if all_rewards else np.zeros((0, num_generations))
    return r, r >= success_threshold
