"""How a mini-batch is cut into micro-batches, and how rows are packed into bins (the packed and shared-prompt
layouts of :mod:`lit_rlft.step.passes` use the bins).

Micro-batches by rows (``micro_batch_size``) or by a token budget (``micro_batch_tokens``, as verl's dynamic batch
size): rows sorted by length and packed next-fit so that each micro-batch's forward holds at most the budget
(a single row longer than the budget is a micro-batch of its own). The loss normalisation does not depend on the
split (the updater normalises by the mini-batch's global weight), so any split gives the same update.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlft.core.types import Rollouts

__all__ = ["pack_rows", "padding_share", "teaching_rows", "token_budget_micro_batches"]


def teaching_rows(rollouts: Rollouts, advantages: Tensor) -> Tensor:
    """``[N]`` bool: the real rows of the groups that have a member whose advantage is not exactly 0 (a NaN counts
    as not 0: it stays in, as it would without the skip). A group whose members' advantages are all 0 (every reward
    equal) leaves the update whole; a mixed group stays whole, so that every fresh row the update trains on gets
    its behaviour log-probs from the pass.

    Args:
        rollouts: the batch, ``B`` groups of width ``G`` (``members``: the real rows of each).
        advantages: ``[N]`` (``N = B * G``) or ``[B, G]``.
    """
    members = rollouts.member_mask()  # [B, G]
    adv = advantages.detach().reshape(members.shape).cpu()  # [B, G]
    live = ((adv != 0) & members).any(1)  # [B]
    return (live[:, None] & members).reshape(-1)  # [N]


def token_budget_micro_batches(rows: Tensor, prompt_lengths: Tensor, completion_lengths: Tensor, budget: int,
                               packed: bool) -> list[Tensor]:
    """Split ``rows`` ``[m]`` into micro-batches whose forward holds at most ``budget`` tokens.

    A micro-batch's size is ``sum_i (p_i + l_i)`` when ``packed``, else ``n * (max p_i + max l_i)`` (a padded pass
    trimmed to the micro-batch). Rows are taken longest first (so padded micro-batches hold rows of similar length)
    and each micro-batch is filled until the next row would exceed the budget.

    Args:
        rows: ``[m]`` the mini-batch's row indices.
        prompt_lengths / completion_lengths: ``[m]`` real tokens of each row.
        budget: tokens per micro-batch at most.
        packed: whether the forward is packed (no padding).
    """
    if budget < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1, got {budget}")
    order = torch.argsort(prompt_lengths + completion_lengths, descending=True, stable=True)
    out: list[list[int]] = []
    size = p_max = l_max = 0
    for k in order.tolist():
        p, lc = int(prompt_lengths[k]), int(completion_lengths[k])
        rows_then = len(out[-1]) + 1 if out else 1
        grown = size + p + lc if packed else rows_then * (max(p_max, p) + max(l_max, lc))
        if out and grown <= budget:
            out[-1].append(k)
            size, p_max, l_max = grown, max(p_max, p), max(l_max, lc)
        else:
            out.append([k])
            size, p_max, l_max = p + lc, p, lc
    return [rows[torch.tensor(group, dtype=torch.long)] for group in out]


def padding_share(rollouts: Rollouts, micro_batches: list[Tensor], packed: bool, trimmed: bool) -> float:
    """The share of the positions the forward passes of ``micro_batches`` spend on padding."""
    p_len, c_len = rollouts.prompt_mask.sum(1), rollouts.completion_mask.sum(1)  # [N] each
    real = total = 0
    for rows in micro_batches:
        lengths = (p_len[rows] + c_len[rows]).tolist()
        real += sum(lengths)
        if packed:
            total += len(pack_rows(lengths)) * max(lengths)
        elif trimmed:
            total += len(rows) * int(p_len[rows].max() + c_len[rows].max())
        else:
            total += len(rows) * (rollouts.prompt_tokens.shape[1] + rollouts.completion_tokens.shape[1])
    return 1.0 - real / max(total, 1)


def pack_rows(lengths: list[int]) -> list[list[int]]:
    """Rows of ``lengths`` packed first-fit decreasing into bins as long as the longest row: ``[[row, ...], ...]``."""
    capacity = max(lengths, default=0)
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        b = next((k for k, r in enumerate(room) if r >= lengths[i]), None)
        if b is None:
            bins.append([i])
            room.append(capacity - lengths[i])
        else:
            bins[b].append(i)
            room[b] -= lengths[i]
    return bins
