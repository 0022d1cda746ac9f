"""Per-token log-probabilities and entropies from logits, without materialising a full ``[N, L, V]`` softmax; and from
hidden states and the LM head in chunks of positions, without materialising the logits at all.

Notation: ``N`` sequences, ``L`` completion length, ``V`` vocabulary size, ``K`` positions, ``H`` hidden size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint


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


#: ``logprob_chunk_tokens: auto``: chunks of at most this many logits (2**26 float32 values, 256 MiB).
AUTO_CHUNK_LOGITS = 2**26


def resolve_chunk_tokens(chunk_tokens: int | str | None, vocab_size: int) -> int | None:
    """Positions per chunk for ``chunk_tokens`` (an int, ``"auto"``: as many as fit :data:`AUTO_CHUNK_LOGITS`
    logits of ``vocab_size``, or None / 0: off)."""
    if chunk_tokens in (None, 0):
        return None
    if chunk_tokens == "auto":
        return max(1, AUTO_CHUNK_LOGITS // max(int(vocab_size), 1))
    return int(chunk_tokens)


def chunked_logprobs(hidden: Tensor, head: Callable[[Tensor], Tensor], targets: Tensor, temperature: float = 1.0,
                     chunk_tokens: int = 1024, with_entropy: bool = True,
                     entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """:func:`completion_logprobs` of ``head(hidden)`` without ever holding more than ``chunk_tokens`` rows of logits.

    Each chunk of positions goes through ``head`` (the model's output embedding: a plain, LoRA-wrapped or sharded
    linear layer), the temperature, the log-softmax and the entropy, and keeps only its ``[chunk]`` results. Under
    autograd each chunk is a non-reentrant activation checkpoint: the forward saves the chunk's hidden states, not
    its logits, and the backward recomputes the chunk's logits, takes their gradient and frees them, one chunk at a
    time. Every value is the one :func:`completion_logprobs` gives on the chunk's logits, so the only difference to
    the whole pass is the rounding of the head's product on fewer rows and of the gradient summed chunk by chunk.

    Args:
        hidden: ``[K, H]`` the hidden states that predict ``targets``.
        head: ``[k, H] -> [k, V]`` the output embedding.
        targets: ``[K]`` token ids.
        temperature: sampling temperature, ``> 0``.
        chunk_tokens: positions per chunk, ``>= 1``.
        with_entropy: compute the entropies (a diagnostic, or the loss's entropy mask or bonus).
        entropy_grad: keep the entropy's gradient (an entropy bonus in the loss).

    Returns:
        ``(logprobs [K], entropy [K] or None)``, float32; ``logprobs`` is differentiable when ``hidden`` or the head is.
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"expected `hidden` [K, H] and `targets` [K], got {tuple(hidden.shape)} and "
                         f"{tuple(targets.shape)}")
    if chunk_tokens < 1:
        raise ValueError(f"`chunk_tokens` must be >= 1, got {chunk_tokens}")
    if temperature <= 0:
        raise ValueError(f"`temperature` must be > 0, got {temperature!r}")

    def chunk(h: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
        logits = head(h)[None]  # [1, k, V]
        if not with_entropy:  # completion_logprobs' log-probs without its entropy pass
            scaled = logits / temperature if temperature != 1.0 else logits
            return selective_log_softmax(scaled, ids[None]).float()[0], ids.new_zeros(0, dtype=torch.float32)
        lp, ent = completion_logprobs(logits, ids[None], temperature, entropy_grad=entropy_grad)
        return lp[0], ent[0]

    grad = torch.is_grad_enabled()
    parts = [checkpoint(chunk, h, ids, use_reentrant=False) if grad else chunk(h, ids)
             for h, ids in zip(hidden.split(chunk_tokens), targets.split(chunk_tokens))]
    logprobs = torch.cat([lp for lp, _ in parts]) if parts else hidden.new_zeros(0, dtype=torch.float32)
    if not with_entropy:
        return logprobs, None
    entropy = torch.cat([ent for _, ent in parts]) if parts else hidden.new_zeros(0, dtype=torch.float32)
    return logprobs, entropy
