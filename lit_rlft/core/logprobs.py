"""Per-token log-probabilities and entropies from logits, without materialising a full ``[N, L, V]`` softmax.

Notation: ``N`` sequences, ``L`` completion length, ``V`` vocabulary size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def selective_log_softmax(logits: Tensor, index: Tensor, *, chunk_size: int = 128) -> Tensor:
    """``log_softmax(logits).gather(-1, index)`` without holding the full log-softmax in memory.

    float32/float64 logits: the selected logit minus the row's ``logsumexp``, computed ``chunk_size`` rows at a
    time; autograd keeps nothing of size ``V`` beyond the logits themselves. Lower precision (bf16, fp16): the
    difference of two large rounded numbers loses too much, so each chunk of rows goes through ``log_softmax``
    (which accumulates in float32) and is then gathered, as TRL does.

    Args:
        logits: ``[..., V]`` unnormalised scores.
        index: ``[...]`` token ids in ``[0, V)``, same leading shape as ``logits``.
        chunk_size: rows (positions) processed at once; trades peak memory for speed.

    Returns:
        ``[...]`` log-probability of each ``index``, in the dtype of ``logits``.
    """
    if index.shape != logits.shape[:-1]:
        raise ValueError(f"`index` must have shape {tuple(logits.shape[:-1])}, got {tuple(index.shape)}")
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)  # [M, V]
    flat_index = index.reshape(-1, 1).long()  # [M, 1]
    if logits.dtype in (torch.float32, torch.float64):
        selected = flat_logits.gather(-1, flat_index).squeeze(-1)  # [M]
        lse = torch.cat([torch.logsumexp(chunk, dim=-1) for chunk in flat_logits.split(chunk_size)])  # [M]
        out = selected - lse  # [M]
    else:
        out = torch.cat(
            [
                F.log_softmax(chunk, dim=-1).gather(-1, idx).squeeze(-1)  # [chunk]
                for chunk, idx in zip(flat_logits.split(chunk_size), flat_index.split(chunk_size))
            ]
        )
    return out.reshape(index.shape)


def entropy_from_logits(logits: Tensor, chunk_size: int = 128) -> Tensor:
    """Entropy ``-sum_v p_v log p_v`` of the softmax of each row, ``chunk_size`` rows at a time.

    Args:
        logits: ``[..., V]`` unnormalised scores; ``-inf`` entries (masked vocabulary) contribute 0.
        chunk_size: rows processed at once.

    Returns:
        ``[...]`` entropy in nats, in the dtype of ``logits``. Differentiable; call it under ``torch.no_grad()``
        when it is only logged, since autograd would keep each chunk's ``[chunk, V]`` log-softmax.
    """
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)  # [M, V]
    entropies = []
    for chunk in flat_logits.split(chunk_size):
        logp = F.log_softmax(chunk, dim=-1)  # [chunk, V]
        # p * log p is 0 * -inf = NaN where a logit is -inf; its true contribution is 0
        entropies.append(-(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1))  # [chunk]
    return torch.cat(entropies).reshape(logits.shape[:-1])


def completion_logprobs(logits: Tensor, completion_ids: Tensor, temperature: float = 1.0,
                        entropy_grad: bool = False) -> tuple[Tensor, Tensor]:
    """Log-probability and entropy of each completion token under the (temperature-scaled) policy.

    Dividing by the sampling temperature makes the log-probs those of the distribution the tokens were drawn
    from, so they are comparable with the behaviour log-probs stored at generation time.

    Args:
        logits: ``[N, L, V]`` already aligned: ``logits[:, t]`` predicts ``completion_ids[:, t]`` (i.e. the
            model's output shifted by one and cut to the completion).
        completion_ids: ``[N, L]`` sampled token ids (padding ids are fine; mask them in the loss).
        temperature: sampling temperature, ``> 0``.
        entropy_grad: keep the entropy's gradient (an entropy bonus in the loss); by default it is a diagnostic,
            computed without gradient to keep memory flat.

    Returns:
        ``(logprobs, entropy)``, both ``[N, L]`` float32; ``logprobs`` is differentiable.
    """
    if logits.dim() != 3 or completion_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"expected `logits` [N, L, V] and `completion_ids` [N, L], got {tuple(logits.shape)} "
            f"and {tuple(completion_ids.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"`temperature` must be > 0, got {temperature!r}")
    if temperature != 1.0:
        logits = logits / temperature  # [N, L, V]
    logprobs = selective_log_softmax(logits, completion_ids).float()  # [N, L]
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = entropy_from_logits(logits).float()  # [N, L]
    return logprobs, entropy
