"""Reward functions and probes for the multi-process tests (imported by dotted path in every rank)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch


def coin_reward(completions: list[str], **columns: Any) -> list[float]:
    """1 with probability 1/2 per completion, from torch's global generator (which GRPOModule re-seeds from
    ``(generation_seed, step, rank)`` every step): groups are a mix of effective and degenerate ones, the same in a
    resumed run as in the uninterrupted one."""
    return (torch.rand(len(completions)) < 0.5).float().tolist()


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def coin_reward_broken_on_rank_1(completions: list[str], **columns: Any) -> list[float]:
    """:func:`coin_reward`, except that on rank 1 it returns no scores at all (a contract violation that the reward
    runner turns into an error: the run must stop on every rank, naming rank 1)."""
    return [] if rank() == 1 else coin_reward(completions, **columns)


def digest(obj: Any) -> str:
    """A canonical sha256 of nested dicts / lists / tensors / arrays / numbers (order-independent for dict keys)."""
    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(f"k:{k};".encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            h.update(f"l{len(x)};".encode())
            for v in x:
                walk(v)
        elif isinstance(x, torch.Tensor):
            t = x.full_tensor() if hasattr(x, "full_tensor") else x
            h.update(f"t{t.dtype}{tuple(t.shape)};".encode())
            if t.numel():
                h.update(t.detach().cpu().clone().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(x, np.ndarray):
            h.update(f"a{x.dtype}{x.shape};".encode())
            h.update(np.ascontiguousarray(x).tobytes())
        else:
            h.update(repr(x).encode())

    walk(obj)
    return h.hexdigest()[:16]


def coin_reward_zero_on_rank_1(completions: list[str], **columns: Any) -> list[float]:
    """:func:`coin_reward` on rank 0, 0 for every completion on rank 1: rank 1's groups all have advantage 0, so the
    update leaves all its rows out and rank 1 only meets rank 0's collectives."""
    scores = coin_reward(completions, **columns)
    return [0.0] * len(scores) if rank() == 1 else scores


def coin_reward_raising_on_rank_1(completions: list[str], **columns: Any) -> list[float]:
    """:func:`coin_reward`, except that it raises on rank 1 (each of rank 1's completions then scores 0 alone and is
    counted; the run goes on, and rank 0 must still print the failure, naming rank 1 and this function)."""
    if rank() == 1:
        raise ValueError("cannot parse this completion")
    return coin_reward(completions, **columns)


class TinyRewardModel:
    """A seeded tiny sequence-classification reward model (the same weights in every process), as a reward."""

    def __new__(cls):
        from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_reward_model
        from lit_rlft.rewards import RewardModel

        tok = char_tokenizer()
        small = TinyConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                           intermediate_size=128, head_dim=64, seed=7)
        return RewardModel(tiny_reward_model(tok, small), tok, max_batch_tokens=96, name="tiny_rm")


class EchoEnv:
    """Multi-turn episodes for the 2-rank tests: the environment ends an episode after a turn with a number of
    distinct characters divisible by 3, and answers the other turns with ``ok`` (an observation inside the episode);
    stateless, so every rank and a resumed run see the same episodes. ``stop_on_rank``: on that rank every episode
    ends after its first turn (the other rank's go on: its generate calls outnumber this one's)."""

    def __new__(cls, stop_on_rank: int | None = None):
        from lit_rlft.envs import Environment, EnvStep

        class _Echo(Environment):
            name = "echo"

            def step(self, messages, row):
                if len(set(messages[-1]["content"])) % 3 == 0 or rank() == stop_on_rank:  # a third end here
                    return EnvStep(done=True)
                return EnvStep(observation=[{"role": "user", "content": "ok"}], tool_calls=1)

        return _Echo()
