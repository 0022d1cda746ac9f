"""The rollout worker: prompt ids in, scored :class:`~lit_rlft.core.types.Rollouts` out. No Lightning, no collectives.

It owns the two things a rollout needs besides data: the engine (chosen in YAML, HF by default) and the reward
functions. The prompt source (the datamodule) resolves ids to tokens, texts and reward columns. What the worker
returns carries everything the step needs downstream as fields: generation time, per-function rewards and the
engine's own log-probs.

Notation: ``B`` prompts, ``G`` completions per prompt, ``N = B * G``, ``P`` prompt length, ``L`` completion length.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

import numpy as np
import torch

from lit_rlft.core.types import Rollouts, left_pad
from lit_rlft.rollout.base import RolloutEngine, SamplingConfig

Split = Literal["train", "val"]

#: Set to True on an exception raised by the engine's ``generate`` inside :meth:`RolloutWorker.rollout` (the
#: exception itself, type and message unchanged, is re-raised): a failure while generating, when the other ranks of a
#: sharded policy may be inside the forward passes' collectives. Read it with
#: :meth:`RolloutWorker.failed_in_generation`.
GENERATION_FAILED_ATTR = "lit_rlft_during_generation"


class PromptSource(Protocol):
    """What the worker reads prompts from (``PromptDataModule`` is one)."""

    def prompt_tokens(self, ids: np.ndarray, split: Split = "train") -> list[list[int]]: ...

    def prompt_texts(self, ids: np.ndarray, split: Split = "train") -> list[str]: ...

    def reward_columns(self, ids: np.ndarray, split: Split = "train") -> dict[str, list[Any]]: ...


class RolloutWorker:
    """Generate ``G`` completions per prompt with an engine and score them with the reward functions.

    Args:
        engine: a :class:`~lit_rlft.rollout.base.RolloutEngine` already ``setup`` with the policy.
        rewards: ``(completions [N], columns) -> RewardResult`` (a :class:`~lit_rlft.rewards.runner.RewardRunner`).
        tokenizer: decodes completions for the reward functions.
        success_threshold: a completion is correct when its total reward is at least this.
    """

    def __init__(self, engine: RolloutEngine, rewards: Callable[..., Any], tokenizer: Any,
                 success_threshold: float = 1.0):
        self.engine = engine
        self.rewards = rewards
        self.tokenizer = tokenizer
        self.success_threshold = success_threshold

    @staticmethod
    def failed_in_generation(exc: BaseException) -> bool:
        """Whether ``exc`` was raised by the engine's ``generate`` in :meth:`rollout` (rather than by scoring)."""
        return bool(getattr(exc, GENERATION_FAILED_ATTR, False))

    def rollout(
        self,
        source: PromptSource,
        prompt_ids: np.ndarray,
        num_generations: int,
        sampling: SamplingConfig,
        step: int,
        split: Split = "train",
        seed: int | None = None,
    ) -> tuple[Rollouts, Any]:
        """Roll out the prompts ``prompt_ids`` ``[B]`` of ``split`` and score every completion (``seed``: the engine
        call's seed, see :meth:`RolloutEngine.generate`).

        Returns the :class:`Rollouts` and the scorer's result (a :class:`~lit_rlft.rewards.runner.RewardResult`,
        whose failure counts the step gathers). An exception raised by the engine's ``generate`` propagates as it
        is, marked (:meth:`failed_in_generation` is True for it)."""
        G = num_generations
        ids = np.asarray(prompt_ids, dtype=np.int64)
        prompts = source.prompt_tokens(ids, split)
        t0 = time.perf_counter()
        try:
            out = self.engine.generate(prompts, G, sampling, seed=seed)
        except Exception as exc:
            setattr(exc, GENERATION_FAILED_ATTR, True)  # every exception has a __dict__ (BaseException's)
            raise
        seconds = time.perf_counter() - t0
        texts = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
        columns = {k: [v for v in vals for _ in range(G)] for k, vals in source.reward_columns(ids, split).items()}
        # tokens of each completion, for length-aware rewards (DAPO's soft overlong punishment)
        columns.setdefault("completion_length", out.completion_mask.sum(-1).tolist())
        if getattr(self.rewards, "batched", None):  # reward models, judges, remote scorers: token ids, whole groups
            lengths = out.completion_mask.sum(-1).tolist()
            columns["completion_ids"] = [row[:n] for row, n in zip(out.completion_ids.tolist(), lengths)]
            scored = self.rewards(texts, columns, group_size=G)
        else:
            scored = self.rewards(texts, columns)
        rewards = scored.total.view(len(ids), G)  # [B, G]
        p_tok, p_mask = left_pad(prompts, self.tokenizer.pad_token_id)  # [B, P] each
        rollouts = Rollouts(
            prompt_ids=torch.as_tensor(ids),
            prompt_tokens=p_tok.repeat_interleave(G, dim=0),  # [N, P]
            prompt_mask=p_mask.repeat_interleave(G, dim=0),  # [N, P]
            completion_tokens=out.completion_ids,  # [N, L]
            completion_mask=out.completion_mask,  # [N, L]
            rewards=rewards,
            correct=rewards >= self.success_threshold,
            birth_step=torch.full((len(ids),), step, dtype=torch.long),
            is_replay=torch.zeros(len(ids), dtype=torch.bool),
            truncated=torch.tensor([r == "length" for r in out.finish_reasons]),
            engine_logprobs=out.logprobs,
            reward_per_func={k: v.float().view(len(ids), G) for k, v in scored.per_func.items()},
            completions=texts,
            prompts=source.prompt_texts(ids, split),
            pad_id=self.tokenizer.pad_token_id,
            generation_s=seconds,
        )
        return rollouts, scored
