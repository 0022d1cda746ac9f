"""Group-relative advantages and per-prompt success rates.

Notation: ``B`` prompts (groups), ``G`` completions per prompt, ``N = B * G``.

GRPO replaces a learned value function with the group baseline: every completion is scored against the other
completions of the same prompt, ``A_i = r_i - mean(r)``, optionally divided by a standard deviation.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

ScaleRewards = Literal["group", "batch", "none"]
"""How advantages are scaled: ``"group"`` by each group's std (original GRPO), ``"batch"`` by the std of all
rewards in the batch (TRL's ``scale_rewards="batch"``), ``"none"`` not at all (Dr. GRPO, the DOTS paper)."""


def _std(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Unbiased std (``torch.std``'s default, as TRL uses), or zero when fewer than two values are reduced."""
    count = x.numel() if dim is None else x.shape[dim]
    if count < 2:  # unbiased std of one value is NaN; its deviation from the mean is 0 anyway
        return torch.zeros_like(x.mean(dim=dim, keepdim=keepdim) if dim is not None else x.mean())
    return x.std() if dim is None else x.std(dim=dim, keepdim=keepdim)


def group_advantages(
    rewards: Tensor, scale_rewards: ScaleRewards = "group", eps: float = 1e-4, batch_rewards: Tensor | None = None
) -> Tensor:
    """Group-relative advantages ``A = (r - mean_group(r)) / (std + eps)``.

    The std is the *unbiased* one (``torch.std`` with ``correction=1``, TRL's choice): per group for
    ``"group"``, over all ``B * G`` rewards for ``"batch"``; ``"none"`` skips the division (Dr. GRPO). A group
    whose rewards are all equal gets zero advantages (no gradient), whatever the scaling.

    Args:
        rewards: ``[B, G]`` one scalar reward per completion, groups along dim 0.
        scale_rewards: ``"group"``, ``"batch"`` or ``"none"``; see :data:`ScaleRewards`.
        eps: added to the std so that zero-variance groups divide by ``eps`` instead of 0.
        batch_rewards: ``[B_global, G]`` rewards of the whole batch whose std ``"batch"`` divides by, when
            ``rewards`` is one rank's slice of it (default: ``rewards`` itself). Ignored by the other scalings.

    Returns:
        ``[B, G]`` float32 advantages.

    Example:
        >>> group_advantages(torch.tensor([[0.0, 2.0, 4.0]]), eps=0.0)
        tensor([[-1.,  0.,  1.]])
    """
    if rewards.dim() != 2:
        raise ValueError(f"`rewards` must have shape [B, G], got {tuple(rewards.shape)}")
    if scale_rewards not in get_args(ScaleRewards):
        raise ValueError(f"`scale_rewards` must be one of {get_args(ScaleRewards)}, got {scale_rewards!r}")
    rewards = rewards.float()  # [B, G]
    advantages = rewards - rewards.mean(dim=1, keepdim=True)  # [B, G]
    if scale_rewards == "group":
        advantages = advantages / (_std(rewards, dim=1, keepdim=True) + eps)  # [B, G] / [B, 1]
    elif scale_rewards == "batch":
        whole = rewards if batch_rewards is None else batch_rewards.float()  # [B_global, G]
        advantages = advantages / (_std(whole) + eps)  # [B, G] / []
    return advantages


def success_rates(correct: Tensor) -> Tensor:
    """Fraction of correct completions per prompt.

    Args:
        correct: ``[B, G]`` bool or 0/1 correctness of each completion.

    Returns:
        ``[B]`` float32 success rate ``p_q`` per prompt.
    """
    if correct.dim() != 2:
        raise ValueError(f"`correct` must have shape [B, G], got {tuple(correct.shape)}")
    return correct.float().mean(dim=1)  # [B]
