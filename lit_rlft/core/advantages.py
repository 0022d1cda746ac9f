"""Group-relative advantages and per-group statistics (success rates, the effective share, reward spread).

Notation: ``B`` prompts (groups), ``G`` completions per prompt, ``N = B * G``.

GRPO replaces a learned value function with the group baseline: every completion is scored against the other
completions of the same prompt, ``A_i = r_i - mean(r)``, optionally divided by a standard deviation.

Groups of different sizes (per-prompt allocation) are laid out padded to the largest, ``[B, G_max]``, with a
``members`` mask ``[B, G_max]`` (True for a real completion): every statistic is then taken over each group's own
members, and a padded slot gets advantage 0. Without ``members`` (every group full) the functions compute exactly what
they computed before ragged groups existed.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
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


def masked_std(x: Tensor, members: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Unbiased std of the entries of ``x`` where ``members`` is True (over ``dim``, or all of them); zero where
    fewer than two are reduced."""
    m = members.to(x.dtype)
    count = m.sum() if dim is None else m.sum(dim=dim, keepdim=keepdim)
    keep = dim is not None and keepdim
    mean = (x * m).sum() / count.clamp(min=1) if dim is None else (x * m).sum(dim=dim, keepdim=True) / (
        m.sum(dim=dim, keepdim=True).clamp(min=1))
    square = ((x - mean) ** 2 * m).sum() if dim is None else ((x - mean) ** 2 * m).sum(dim=dim, keepdim=keep)
    return torch.where(count >= 2, (square / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(square))


def group_advantages(
    rewards: Tensor, scale_rewards: ScaleRewards = "group", eps: float = 1e-4, batch_rewards: Tensor | None = None,
    members: Tensor | None = None, batch_members: Tensor | None = None,
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
        members: ``[B, G]`` bool, the real completions of groups of different sizes (see the module docstring);
            None: every slot is one. A group needs at least one member.
        batch_members: ``[B_global, G]`` the members of ``batch_rewards`` (``"batch"`` with ``members``).

    Returns:
        ``[B, G]`` float32 advantages (0 at slots that are not members).

    Example:
        >>> group_advantages(torch.tensor([[0.0, 2.0, 4.0]]), eps=0.0)
        tensor([[-1.,  0.,  1.]])
    """
    if rewards.dim() != 2:
        raise ValueError(f"`rewards` must have shape [B, G], got {tuple(rewards.shape)}")
    if scale_rewards not in get_args(ScaleRewards):
        raise ValueError(f"`scale_rewards` must be one of {get_args(ScaleRewards)}, got {scale_rewards!r}")
    if members is not None:
        return _ragged_advantages(rewards.float(), members, scale_rewards, eps, batch_rewards, batch_members)
    rewards = rewards.float()  # [B, G]
    advantages = rewards - rewards.mean(dim=1, keepdim=True)  # [B, G]
    if scale_rewards == "group":
        advantages = advantages / (_std(rewards, dim=1, keepdim=True) + eps)  # [B, G] / [B, 1]
    elif scale_rewards == "batch":
        whole = rewards if batch_rewards is None else batch_rewards.float()  # [B_global, G]
        advantages = advantages / (_std(whole) + eps)  # [B, G] / []
    return advantages


def _check_members(members: Tensor, shape: torch.Size) -> Tensor:
    if tuple(members.shape) != tuple(shape):
        raise ValueError(f"`members` must have the shape of the rewards {tuple(shape)}, got {tuple(members.shape)}")
    members = members.bool()
    if members.shape[0] and not bool(members.any(dim=1).all()):
        raise ValueError("every group needs at least one member (a row of `members` is all False)")
    return members


def _ragged_advantages(rewards: Tensor, members: Tensor, scale_rewards: ScaleRewards, eps: float,
                       batch_rewards: Tensor | None, batch_members: Tensor | None) -> Tensor:
    """:func:`group_advantages` over each group's members (``rewards``, ``members``: ``[B, G_max]``)."""
    members = _check_members(members, rewards.shape)
    m = members.float()  # [B, G]
    mean = (rewards * m).sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True)  # [B, 1]
    advantages = (rewards - mean) * m  # [B, G]
    if scale_rewards == "group":
        advantages = advantages / (masked_std(rewards, members, dim=1, keepdim=True) + eps)  # [B, G] / [B, 1]
    elif scale_rewards == "batch":
        if batch_rewards is None:
            whole, whole_members = rewards, members
        elif batch_members is None:
            raise ValueError("`batch_rewards` of groups of different sizes need their `batch_members`")
        else:
            whole, whole_members = batch_rewards.float(), _check_members(batch_members, batch_rewards.shape)
        advantages = advantages / (masked_std(whole, whole_members) + eps)  # [B, G] / []
    return advantages


def success_rates(correct: Tensor, members: Tensor | None = None) -> Tensor:
    """Fraction of correct completions per prompt.

    Args:
        correct: ``[B, G]`` bool or 0/1 correctness of each completion.
        members: ``[B, G]`` bool, the real completions of groups of different sizes (None: all).

    Returns:
        ``[B]`` float32 success rate ``p_q`` per prompt (over its members).
    """
    if correct.dim() != 2:
        raise ValueError(f"`correct` must have shape [B, G], got {tuple(correct.shape)}")
    if members is None:
        return correct.float().mean(dim=1)  # [B]
    m = _check_members(members, correct.shape).float()  # [B, G]
    return (correct.float() * m).sum(dim=1) / m.sum(dim=1)  # [B]


def effective_ratio(success_rates: np.ndarray) -> float:
    """Fraction of groups with ``0 < p < 1`` (GRPO's informative groups); 0.0 for an empty batch."""
    p = np.asarray(success_rates, dtype=np.float64)
    if p.size == 0:
        return 0.0
    return float(np.mean((p > 0.0) & (p < 1.0)))


def keep_mask(rewards: np.ndarray, members: np.ndarray | None = None) -> np.ndarray:
    """Groups with non-zero reward std.

    Args:
        rewards: ``[b, G]`` rewards of ``b`` groups of ``G`` completions (shaped scores are fine: any spread counts).
        members: ``[b, G]`` bool, the real completions of groups of different sizes (None: all); the spread is
            taken over each group's members.

    Returns:
        ``[b]`` bool. Computed as ``max > min`` rather than ``std > 0``: the same set for finite rewards, but exact
        (a float std of equal non-integer rewards such as ``[0.1, 0.1, 0.1]`` need not come out exactly 0).
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError(f"rewards must have shape [b, G], got {r.shape}")
    if r.shape[1] == 0:
        return np.zeros(r.shape[0], dtype=bool)
    if members is not None:
        m = np.asarray(members, dtype=bool)
        if m.shape != r.shape:
            raise ValueError(f"members must have the shape of the rewards {r.shape}, got {m.shape}")
        return np.where(m, r, -np.inf).max(axis=1) > np.where(m, r, np.inf).min(axis=1)
    return r.max(axis=1) > r.min(axis=1)
