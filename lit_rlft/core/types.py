"""Typed containers that flow between the stages of a GRPO step.

Notation: ``B`` groups (prompts), ``G`` completions per group, ``N = B * G`` sequences, ``P`` prompt length
(left-padded), ``L`` completion length (right-padded). Completions of group ``b`` are rows ``b*G .. b*G+G-1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

from lit_rlft.core.advantages import success_rates


def pad_to(x: Tensor, length: int, value: float, left: bool = False) -> Tensor:
    """Pad the last dim of ``x`` ``[..., T]`` to ``[..., length]`` (``length >= T``)."""
    extra = length - x.shape[-1]
    if extra <= 0:
        return x
    pad = x.new_full((*x.shape[:-1], extra), value)
    return torch.cat([pad, x] if left else [x, pad], dim=-1)


_GROUP_FIELDS = ("prompt_ids", "rewards", "correct", "birth_step", "is_replay")


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token lists -> ``(ids [n, T], mask [n, T])`` left-padded to the longest row (``T``)."""
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, length - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, length - len(r):] = 1
    return ids, mask


@dataclass
class Rollouts:
    """One rollout batch: ``B`` groups of ``G`` completions, fresh or replayed.

    ``behaviour_logprobs`` are the per-token log-probs of the policy that generated each sequence (pi_old for
    fresh rows, the stored mu for replayed ones); ``None`` until the module computes them.
    """

    prompt_ids: Tensor  # [B] long, stable pool ids
    prompt_tokens: Tensor  # [N, P] long, left-padded with pad_id
    prompt_mask: Tensor  # [N, P] long
    completion_tokens: Tensor  # [N, L] long, right-padded with pad_id
    completion_mask: Tensor  # [N, L] long, 1 on generated tokens (EOS included)
    rewards: Tensor  # [B, G] float32, total (possibly shaped) reward
    correct: Tensor  # [B, G] bool, reward >= success_threshold
    birth_step: Tensor  # [B] long, step that generated the group
    is_replay: Tensor  # [B] bool
    truncated: Tensor  # [N] bool, stopped by max_new_tokens rather than EOS
    behaviour_logprobs: Tensor | None = None  # [N, L] float32, mu of replayed rows (fresh rows: unused)
    old_logprobs: Tensor | None = None  # [N, L] float32, pi_old of this step (filled by the module's update)
    completions: list[str] = field(default_factory=list)  # [N] decoded text, for logging
    prompts: list[str] = field(default_factory=list)  # [B] prompt text, for logging
    pad_id: int = 0

    @property
    def num_groups(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.rewards.shape[1])

    @property
    def success_rates(self) -> Tensor:
        """``[B]`` fraction of each group's completions that are correct."""
        return success_rates(self.correct)

    def select_groups(self, index: Tensor | list[int]) -> Rollouts:
        """The groups at ``index`` (``[b]``), in that order."""
        idx = torch.as_tensor(index, dtype=torch.long)
        g = self.group_size
        rows = (idx[:, None] * g + torch.arange(g)[None, :]).reshape(-1)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("pad_id",):
                out[f.name] = v
            elif f.name == "completions":
                out[f.name] = [v[i] for i in rows.tolist()] if v else []
            elif f.name == "prompts":
                out[f.name] = [v[i] for i in idx.tolist()] if v else []
            elif v is None:
                out[f.name] = None
            elif f.name in _GROUP_FIELDS:
                out[f.name] = v[idx]
            else:
                out[f.name] = v[rows]
        return Rollouts(**out)

    @staticmethod
    def concat(parts: list[Rollouts]) -> Rollouts:
        """Concatenate rollout batches along groups, re-padding prompts (left) and completions (right)."""
        parts = [p for p in parts if p.num_groups > 0] or parts[:1]
        if len(parts) == 1:
            return parts[0]
        pad = parts[0].pad_id
        p_len = max(p.prompt_tokens.shape[1] for p in parts)
        c_len = max(p.completion_tokens.shape[1] for p in parts)
        cat = torch.cat

        def cat_optional(name: str) -> Tensor | None:
            values = [getattr(p, name) for p in parts]
            if all(v is None for v in values):
                return None
            return cat([
                pad_to(v, c_len, 0.0) if v is not None else torch.zeros(p.completion_tokens.shape[0], c_len)
                for v, p in zip(values, parts)
            ])

        return Rollouts(
            prompt_ids=cat([p.prompt_ids for p in parts]),
            prompt_tokens=cat([pad_to(p.prompt_tokens, p_len, pad, left=True) for p in parts]),
            prompt_mask=cat([pad_to(p.prompt_mask, p_len, 0, left=True) for p in parts]),
            completion_tokens=cat([pad_to(p.completion_tokens, c_len, pad) for p in parts]),
            completion_mask=cat([pad_to(p.completion_mask, c_len, 0) for p in parts]),
            rewards=cat([p.rewards for p in parts]),
            correct=cat([p.correct for p in parts]),
            birth_step=cat([p.birth_step for p in parts]),
            is_replay=cat([p.is_replay for p in parts]),
            truncated=cat([p.truncated for p in parts]),
            behaviour_logprobs=cat_optional("behaviour_logprobs"),
            old_logprobs=cat_optional("old_logprobs"),
            completions=[c for p in parts for c in p.completions],
            prompts=[c for p in parts for c in p.prompts],
            pad_id=pad,
        )

    def with_behaviour(self, logprobs: Tensor) -> Rollouts:
        """A copy whose ``behaviour_logprobs`` are ``logprobs`` ``[N, L]``."""
        return replace(self, behaviour_logprobs=logprobs)
