"""How a micro-batch's sequences reach the model: the forward layouts (padded, packed, shared-prompt), their
attention masks, and the log-probs from the full logits or in chunks. The micro-batches themselves are
:mod:`lit_rlft.step.batching`'s.

Notation: ``n`` rows of a micro-batch, ``P`` / ``L`` the batch's prompt / completion widths (left- / right-padded),
``p_i`` / ``l_i`` row ``i``'s real prompt / completion tokens, ``T = sum_i (p_i + l_i)``, ``V`` the vocabulary.

- Padded passes (``[n, P + L]`` with an attention mask), optionally trimmed to the micro-batch's own longest prompt
  and completion, or packed passes (``padding_free``): the rows' real tokens packed first-fit into bins as long as
  the longest row (``[n_bins, C]``), positions restarting at each row, from which transformers builds a
  block-diagonal causal mask (sdpa and flash attention; it needs ``use_cache=False`` and no attention mask). Bins,
  rather than one ``[1, T]`` sequence, keep attention at ``C^2`` per bin where no varlen kernel exists (CPU, sdpa).
  Both return log-probs in the ``[n, L]`` layout. A packed pass computes logits only at the ``sum_i l_i`` positions
  that predict completion tokens (``[1, sum_i l_i, V]``: a pre-hook on the output embedding gathers them), not at
  every position of every bin: prompts and bin tails cost no ``V``-wide logits.
- Shared-prompt passes (``shared_prompt``, the grouped layout of Prefix Grouper): the rows of one group in a
  micro-batch share one prompt, so each group becomes one segment ``[prompt, completion_1, ..., completion_k]`` in
  which the prompt is computed once and each completion attends to the prompt and to itself only (a block mask,
  positions continuing from the prompt in every completion). The ``k`` completions' gradients all reach the one
  prompt. Segments are packed into bins as rows are; ``sum_groups (p_g + sum_i l_i)`` positions instead of
  ``sum_i (p_i + l_i)`` (Countdown: 13 + 8 x 28 against 8 x 41 positions per group). It needs an attention that takes a
  4-D mask (sdpa and eager take it dense, flex_attention as a ``BlockMask`` whose kernel skips the blocks no query
  attends in: :func:`grouped_attention_supported`). Logits only at the completion-predicting positions.
- Chunked log-probs (``model.optim.logprob_chunk_tokens``): in any of these layouts, a pass over
  more than that many completion positions never holds their ``[K, V]`` logits. The output embedding's
  forward is swapped, for the one call, for :func:`~lit_rlft.core.logprobs.chunked_logprobs` of its input (the
  hidden states at the completion-predicting positions): the model's forward returns the log-probs in place of
  the logits, each chunk's logits are computed, reduced and freed in turn, and recomputed chunk by chunk in the
  backward. The head still runs inside the model's own forward, so FSDP2 has its parameters gathered, and a LoRA
  or tied head is what is called. A model whose forward changes its head's output (soft-capping, scaling) is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from lit_rlft.core.logprobs import chunked_logprobs, completion_logprobs, resolve_chunk_tokens
from lit_rlft.core.types import Rollouts
from lit_rlft.step.batching import pack_rows

__all__ = ["group_segments", "grouped_attention_supported", "grouping_pays", "head_logprobs", "sequence_logprobs"]


def sequence_logprobs(
    model: nn.Module, rollouts: Rollouts, rows: Tensor, temperature: float, device: torch.device | str,
    with_entropy: bool = False, packed: bool = False, trim: bool = False, entropy_grad: bool = False,
    grouped: bool = False, logprob_chunk_tokens: int | str | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs ``[n, L]`` (and entropy ``[n, L]``) of the completions at ``rows`` ``[n]`` under ``model``.

    Positions are computed as ``generate`` computes them under left padding, so these match the sampling log-probs.
    ``packed``: one padding-free sequence (see the module docstring); ``trim``: a padded pass cut to the rows' own
    longest prompt and completion. Both give the untrimmed pass's values up to float rounding; positions past a
    row's completion are 0. ``entropy_grad``: the entropy keeps its gradient (an entropy bonus in the loss).
    ``grouped``: shared-prompt segments (see the module docstring; it takes precedence over ``packed`` and ``trim``).
    ``logprob_chunk_tokens``: log-probs from the hidden states in chunks of this many positions (``"auto"``: chunks of at
    most :data:`~lit_rlft.core.logprobs.AUTO_CHUNK_LOGITS` logits; None: the full logits) when the pass has more.
    """
    chunk = resolve_chunk_tokens(logprob_chunk_tokens, _vocab_size(model)) if logprob_chunk_tokens else None
    if grouped:
        return _grouped_logprobs(model, rollouts, rows, temperature, device, with_entropy, entropy_grad, chunk)
    if packed:
        return _packed_logprobs(model, rollouts, rows, temperature, device, with_entropy, entropy_grad, chunk)
    prompt, comp = rollouts.prompt_tokens[rows], rollouts.completion_tokens[rows]  # [n, P], [n, L]
    p_mask, c_mask = rollouts.prompt_mask[rows], rollouts.completion_mask[rows]  # [n, P], [n, L]
    width = comp.shape[1]
    if trim:
        p_keep, c_keep = max(int(p_mask.sum(1).max()), 1), max(int(c_mask.sum(1).max()), 1)
        prompt, p_mask = prompt[:, prompt.shape[1] - p_keep :], p_mask[:, p_mask.shape[1] - p_keep :]
        comp, c_mask = comp[:, :c_keep], c_mask[:, :c_keep]
    attn = torch.cat([p_mask, c_mask], dim=1).to(device)  # [n, P' + L']
    input_ids = torch.cat([prompt, comp], dim=1).to(device)  # [n, P' + L']
    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)  # [n, P' + L']
    length = comp.shape[1]

    def forward() -> object:
        return model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids, use_cache=False,
                     logits_to_keep=length + 1)

    targets = comp.to(device)  # [n, L']
    if chunk is not None and targets.numel() > chunk:
        lp, ent = head_logprobs(model, forward, lambda h: h[:, :-1].reshape(-1, h.shape[-1]), targets.reshape(-1),
                                temperature, chunk, with_entropy, entropy_grad)  # [n L'] each
        logprobs = lp.reshape(targets.shape)
        entropy = ent.reshape(targets.shape) if ent is not None else torch.zeros_like(logprobs)
    else:
        logits = forward().logits[:, :-1]  # [n, L', V]
        logprobs, entropy = completion_logprobs(logits, targets, temperature, entropy_grad=entropy_grad)
    if length < width:  # back to the batch's layout
        logprobs = torch.nn.functional.pad(logprobs, (0, width - length))
        entropy = torch.nn.functional.pad(entropy, (0, width - length))
    return logprobs, (entropy if with_entropy else None)


def _packed_logprobs(model: nn.Module, rollouts: Rollouts, rows: Tensor, temperature: float,
                     device: torch.device | str, with_entropy: bool, entropy_grad: bool,
                     chunk: int | None = None) -> tuple[Tensor, Tensor | None]:
    """The rows' real tokens packed into bins as long as the longest row (``[n_bins, C]``), positions restarting at
    each row: the attention of each bin is block-diagonal, and no position is spent on padding but a bin's tail."""
    p_mask, c_mask = rollouts.prompt_mask[rows].bool(), rollouts.completion_mask[rows].bool()  # [n, P], [n, L]
    prompts, comps = rollouts.prompt_tokens[rows], rollouts.completion_tokens[rows]
    seqs = [(prompts[i][p_mask[i]], comps[i][c_mask[i]]) for i in range(len(rows))]  # ([p_i], [l_i])
    bins = pack_rows([len(p) + len(c) for p, c in seqs])
    capacity = max(len(p) + len(c) for p, c in seqs)
    input_ids = torch.full((len(bins), capacity), rollouts.pad_id, dtype=torch.long)  # [n_bins, C]
    position_ids = torch.zeros((len(bins), capacity), dtype=torch.long)  # [n_bins, C]
    where: list[tuple[int, int, int]] = []  # (bin, first position predicting the completion, row)
    for b, members in enumerate(bins):
        offset = 0
        for i in members:
            p, c = seqs[i]
            n = len(p) + len(c)
            input_ids[b, offset : offset + n] = torch.cat([p, c])
            position_ids[b, offset : offset + n] = torch.arange(n)
            where.append((b, offset + len(p) - 1, i))  # logits at t predict token t + 1
            offset += n
        position_ids[b, offset:] = torch.arange(capacity - offset)  # the tail: a segment of its own, unused
    where.sort(key=lambda w: w[2])  # back to row order
    pos_b = torch.cat([torch.full((len(seqs[i][1]),), b) for b, _, i in where]).to(device)  # [sum l_i]
    pos_t = torch.cat([torch.arange(start, start + len(seqs[i][1])) for _, start, i in where]).to(device)
    targets = torch.cat([seqs[i][1] for _, _, i in where])[None].to(device)  # [1, sum l_i]
    lp, ent = _completion_at(model, input_ids.to(device), position_ids.to(device), pos_b, pos_t, targets,
                             temperature, with_entropy, entropy_grad, chunk)  # [1, sum l_i] each
    shape = (len(rows), comps.shape[1])
    mask = c_mask.to(device)  # [n, L]; completions are a prefix of each row
    logprobs = torch.zeros(shape, dtype=lp.dtype, device=device).masked_scatter(mask, lp[0])
    entropy = torch.zeros(shape, dtype=ent.dtype, device=device).masked_scatter(mask, ent[0])
    return logprobs, (entropy if with_entropy else None)


def _completion_at(model: nn.Module, input_ids: Tensor, position_ids: Tensor, pos_b: Tensor, pos_t: Tensor,
                   targets: Tensor, temperature: float, with_entropy: bool, entropy_grad: bool, chunk: int | None,
                   attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Log-probs and entropies ``[1, K]`` of ``targets`` ``[1, K]`` predicted at the ``K`` positions ``(pos_b[k],
    pos_t[k])`` of a ``[n_bins, C]`` packed forward: from the ``[1, K, V]`` logits (:func:`_logits_at`), or, with
    ``chunk`` and more than ``chunk`` positions, from the hidden states in chunks (:func:`head_logprobs`)."""
    if chunk is None or targets.numel() <= chunk:
        logits = _logits_at(model, input_ids, position_ids, pos_b, pos_t, attention_mask)  # [1, K, V]
        return completion_logprobs(logits, targets, temperature, entropy_grad=entropy_grad)
    extra = {} if attention_mask is None else {"attention_mask": attention_mask}

    def forward() -> object:
        return model(input_ids=input_ids, position_ids=position_ids, use_cache=False, logits_to_keep=0, **extra)

    lp, ent = head_logprobs(model, forward, lambda h: h[pos_b, pos_t], targets[0], temperature, chunk,
                            with_entropy, entropy_grad)  # [K] each
    return lp[None], (ent[None] if ent is not None else torch.zeros_like(lp[None]))


def _output_embedding(model: nn.Module) -> nn.Module | None:
    """The output embedding (``lm_head``) of ``model``, through data-parallel wrappers and peft; None without one."""
    inner = model
    while not hasattr(inner, "get_output_embeddings") and isinstance(getattr(inner, "module", None), nn.Module):
        inner = inner.module
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    return head if isinstance(head, nn.Module) else None


def _vocab_size(model: nn.Module) -> int:
    """The vocabulary ``V`` of ``model``'s logits (its config's, else its output embedding's rows)."""
    size = getattr(_config(model), "vocab_size", None)
    if size:
        return int(size)
    head = _output_embedding(model)
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else 1


def head_logprobs(model: nn.Module, forward: Callable[[], object], select: Callable[[Tensor], Tensor],
                  targets: Tensor, temperature: float, chunk_tokens: int, with_entropy: bool,
                  entropy_grad: bool) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) ``[K]`` of ``targets`` ``[K]`` from ``forward()`` (one call of ``model``) without its
    logits: for that call the output embedding's forward is :func:`~lit_rlft.core.logprobs.chunked_logprobs` of
    ``select(hidden)`` ``[K, H]`` (its input cut to the positions that predict ``targets``).

    Raises:
        ValueError: ``model`` has no output embedding.
        RuntimeError: the model's forward did not return its output embedding's output as its logits (a
            soft-capped or scaled head): chunked log-probs cannot be taken from it.
    """
    head = _output_embedding(model)
    if head is None:
        raise ValueError(f"model.optim.logprob_chunk_tokens: {type(model).__name__} has no output embedding "
                         "(get_output_embeddings()) to take chunked log-probs from; set it to null")
    call = head.forward
    held: dict[str, Tensor | None] = {}

    def chunked(hidden: Tensor, *args: object, **kwargs: object) -> Tensor:
        lp, ent = chunked_logprobs(select(hidden), call, targets, temperature, chunk_tokens, with_entropy,
                                   entropy_grad)
        held["logprobs"], held["entropy"] = lp, ent
        return lp

    own = head.__dict__.get("forward")  # an instance forward (a hook library's) is put back as it was
    head.forward = chunked
    try:
        out = forward()
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own
    if "logprobs" not in held or getattr(out, "logits", None) is not held["logprobs"]:
        raise RuntimeError(f"model.optim.logprob_chunk_tokens: {type(model).__name__}'s forward does not return its "
                           "output embedding's output as its logits (soft-capping or scaling after the head?), so "
                           "log-probs cannot be taken in chunks from the hidden states; set it to null")
    return held["logprobs"], held["entropy"]


def _logits_at(model: nn.Module, input_ids: Tensor, position_ids: Tensor, pos_b: Tensor, pos_t: Tensor,
               attention_mask: Tensor | None = None) -> Tensor:
    """Logits ``[1, K, V]`` at the ``K`` positions ``(pos_b[k], pos_t[k])`` of a ``[n_bins, C]`` packed forward
    (``attention_mask``: a 4-D ``[n_bins, 1, C, C]`` mask, True where a position may attend; None: the
    block-diagonal causal mask transformers builds from restarting positions).

    A forward pre-hook on the model's output embedding (``get_output_embeddings()``, the ``lm_head``) gathers the
    hidden states ``[n_bins, C, H] -> [1, K, H]`` before the head runs, so only ``K`` rows of ``V`` logits are ever
    computed. The hook runs inside the model's own forward, so FSDP2 has the head's parameters gathered, and peft
    wrappers and tied embeddings are unaffected. A model without an output embedding gets the full logits, gathered.
    """
    extra = {} if attention_mask is None else {"attention_mask": attention_mask}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Module):
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False, logits_to_keep=0,
                       **extra).logits
        return logits[pos_b, pos_t][None]  # [1, K, V]

    def gather(_module: nn.Module, args: tuple) -> tuple:
        return (args[0][pos_b, pos_t][None], *args[1:])  # [n_bins, C, H] -> [1, K, H]

    handle = head.register_forward_pre_hook(gather)
    try:
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False, logits_to_keep=0,
                       **extra).logits
    finally:
        handle.remove()
    if logits.shape[:2] != (1, pos_b.numel()):
        raise RuntimeError(f"packed pass: the output embedding gave logits of shape {tuple(logits.shape)}, expected "
                           f"[1, {pos_b.numel()}, V]; the model's forward does not end with its output embedding")
    return logits


#: Attention implementations that take a 4-D mask (transformers' names): a dense boolean one for sdpa and eager, a
#: FlexAttention ``BlockMask`` for flex_attention.
_MASKED_ATTENTION = ("sdpa", "eager", "flex_attention")
#: Model families whose shared-prompt passes the tests prove equal to the per-row pass (RoPE positions taken from
#: ``position_ids``, attention through the 4-D mask): ``shared_prompt: auto`` turns the passes on for these only.
VERIFIED_FAMILIES = ("qwen2", "qwen3", "llama", "mistral")


def _config(model: nn.Module) -> object | None:
    """The HF config of ``model``, through data-parallel wrappers (DDP, Fabric's) and peft."""
    from lit_rlft.models.sharding import hf_model

    inner = model
    while isinstance(getattr(inner, "module", None), nn.Module) and not hasattr(inner, "config"):
        inner = inner.module
    return getattr(hf_model(inner), "config", None)


def grouping_pays(model: nn.Module, rollouts: Rollouts, rows: Tensor, packed: bool = False,
                  trim: bool = False) -> bool:
    """Whether the shared-prompt pass over ``rows`` costs fewer FLOPs than the per-row pass it replaces (padded, or
    ``trim``-med, or ``packed``): what ``shared_prompt: auto`` asks of every micro-batch.

    Per decoder layer and position the linear layers cost ``c_lin = 2 (2 h^2 + 2 h d_kv + 3 h I)`` (q and o, k and
    v, the gated MLP), and attention ``c_att = 4 H d`` per query-key pair. A pass over ``b`` sequences of width
    ``w`` costs ``b (w c_lin + w^2 c_att)``: the padded per-row pass ``n`` rows of ``P + L`` (trimmed: the rows' own
    longest prompt and completion), the packed one its bins, the shared-prompt one its bins of segments, computed
    whole since the block mask does not skip the pairs it masks. Long prompts and short completions favour it; long
    completions in large groups do not: one segment of ``p + G L`` tokens attends to itself whole (G = 16
    completions of 1,024 tokens after 256 prompt tokens, hidden 896: 2.1x the per-row FLOPs). Countdown's step
    (16 x 8 rows, prompts of 10 tokens padded to 13, completions of 28 padded to 32, the tiny policy): 0.77x;
    prompts of 253 tokens and completions of 60, hidden 256: 0.34x.
    """
    config = _config(model)
    h = getattr(config, "hidden_size", None)
    if not h:
        return True
    heads = getattr(config, "num_attention_heads", 1) or 1
    head_dim = getattr(config, "head_dim", None) or h // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    inter = getattr(config, "intermediate_size", None) or 4 * h
    c_lin, c_att = 2 * (2 * h * h + 2 * h * kv + 3 * h * inter), 4 * heads * head_dim

    def cost(sequences: int, width: int) -> float:
        return sequences * (width * c_lin + width**2 * c_att)

    p, l_ = rollouts.prompt_mask[rows].sum(1), rollouts.completion_mask[rows].sum(1)  # [n] each
    if packed:
        spans = (p + l_).tolist()
        per_row = cost(len(pack_rows(spans)), max(spans))
    elif trim:
        per_row = cost(len(rows), int(p.max()) + int(l_.max()))
    else:
        per_row = cost(len(rows), rollouts.prompt_tokens.shape[1] + rollouts.completion_tokens.shape[1])
    segments = group_segments(rollouts, rows)
    lengths = [len(q) + sum(len(c) for _, c in comps) for q, comps in segments]
    return cost(len(pack_rows(lengths)), max(lengths)) < per_row


def grouped_attention_supported(model: nn.Module, verified_only: bool = False) -> tuple[bool, str]:
    """Whether shared-prompt passes can run on ``model`` (its attention takes a 4-D mask; with ``verified_only``,
    also one of :data:`VERIFIED_FAMILIES`), and why not."""
    config = _config(model)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in _MASKED_ATTENTION:
        return False, (f"its attention implementation is {implementation!r}, which takes no 4-D mask (shared-prompt "
                       f"passes need one of {', '.join(_MASKED_ATTENTION)})")
    family = getattr(config, "model_type", None)
    if verified_only and family not in VERIFIED_FAMILIES:
        return False, (f"auto turns them on for the model families proven exact ({', '.join(VERIFIED_FAMILIES)}), "
                       f"not {family!r}; shared_prompt: true runs them on any model whose attention takes a 4-D mask")
    return True, ""


def group_segments(rollouts: Rollouts, rows: Tensor) -> list[tuple[Tensor, list[tuple[int, Tensor]]]]:
    """The shared-prompt segments of ``rows`` ``[n]``: per group (in order of first appearance), its prompt's real
    tokens ``[p]`` and ``(position in rows, completion's real tokens [l_i])`` of its rows there. Rows of one group
    whose prompts differ (not a GRPO batch) get segments of their own: sharing is never assumed, only found."""
    G = rollouts.group_size
    p_mask, c_mask = rollouts.prompt_mask[rows].bool(), rollouts.completion_mask[rows].bool()  # [n, P], [n, L]
    prompts, comps = rollouts.prompt_tokens[rows], rollouts.completion_tokens[rows]
    segments: dict[tuple[int, tuple[int, ...]], tuple[Tensor, list[tuple[int, Tensor]]]] = {}
    for k, row in enumerate(rows.tolist()):
        prompt = prompts[k][p_mask[k]]
        key = (row // G, tuple(prompt.tolist()))
        segments.setdefault(key, (prompt, []))[1].append((k, comps[k][c_mask[k]]))
    return list(segments.values())


def _grouped_logprobs(model: nn.Module, rollouts: Rollouts, rows: Tensor, temperature: float,
                      device: torch.device | str, with_entropy: bool, entropy_grad: bool,
                      chunk: int | None = None) -> tuple[Tensor, Tensor | None]:
    """Shared-prompt segments packed into bins (``[n_bins, C]``) with a block mask ``[n_bins, 1, C, C]``: in a segment
    the prompt attends causally to itself, each completion to the whole prompt and causally to itself; positions
    continue from the prompt in every completion, as in the per-row pass."""
    segments = group_segments(rollouts, rows)
    lengths = [len(p) + sum(len(c) for _, c in comps) for p, comps in segments]
    bins = pack_rows(lengths)
    capacity = max(lengths)
    input_ids = torch.full((len(bins), capacity), rollouts.pad_id, dtype=torch.long)  # [n_bins, C]
    position_ids = torch.zeros((len(bins), capacity), dtype=torch.long)  # [n_bins, C]
    part = torch.full((len(bins), capacity), -1, dtype=torch.long)  # [n_bins, C] the prompt (0) or completion (1..)
    segment = torch.full((len(bins), capacity), -1, dtype=torch.long)  # [n_bins, C] the segment id in its bin
    where: list[tuple[int, int, int, int, int]] = []  # (row position k, bin, prompt's last position, start, length)
    for b, members in enumerate(bins):
        offset = 0
        for s_id, g in enumerate(members):
            prompt, comps = segments[g]
            p = len(prompt)
            input_ids[b, offset : offset + p] = prompt
            position_ids[b, offset : offset + p] = torch.arange(p)
            part[b, offset : offset + p], segment[b, offset : offset + p] = 0, s_id
            start = offset + p
            for j, (k, comp) in enumerate(comps, start=1):
                n = len(comp)
                input_ids[b, start : start + n] = comp
                position_ids[b, start : start + n] = torch.arange(p, p + n)
                part[b, start : start + n], segment[b, start : start + n] = j, s_id
                if n:  # logits at the prompt's last token predict comp[0]; at comp[:-1], comp[1:]
                    where.append((k, b, offset + p - 1, start, n))
                start += n
            offset = start
    if getattr(_config(model), "_attn_implementation", None) == "flex_attention":
        attention = _block_mask(segment.to(device), part.to(device))  # skips the blocks nothing attends in
    else:
        attention = _dense_block_mask(segment, part)[:, None].to(device)  # [n_bins, 1, C, C]
    where.sort()
    pos_b = torch.cat([torch.full((n,), b) for _, b, _, _, n in where]).to(device)  # [sum l_i]
    pos_t = torch.cat([torch.cat([torch.tensor([last]), torch.arange(start, start + n - 1)])
                       for _, _, last, start, n in where]).to(device)  # [sum l_i]
    targets = torch.cat([input_ids[b, start : start + n] for _, b, _, start, n in where])[None].to(device)
    lp, ent = _completion_at(model, input_ids.to(device), position_ids.to(device), pos_b, pos_t, targets,
                             temperature, with_entropy, entropy_grad, chunk,
                             attention_mask=attention)  # [1, sum l_i] each
    shape = (len(rows), rollouts.completion_tokens.shape[1])
    c_mask = rollouts.completion_mask[rows].bool().to(device)  # [n, L]; completions are a prefix of each row
    logprobs = torch.zeros(shape, dtype=lp.dtype, device=device).masked_scatter(c_mask, lp[0])
    entropy = torch.zeros(shape, dtype=ent.dtype, device=device).masked_scatter(c_mask, ent[0])
    return logprobs, (entropy if with_entropy else None)


def _attends(segment: Tensor, part: Tensor, b: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    """Whether query ``q`` may attend to key ``kv`` in bin ``b``: causally within its segment, to the prompt (part 0)
    and to its own completion; a bin's tail (segment -1) attends to itself only (no empty softmax)."""
    same = (segment[b, q] == segment[b, kv]) & (segment[b, q] >= 0)
    visible = (part[b, kv] == 0) | (part[b, q] == part[b, kv])
    return ((q >= kv) & same & visible) | (q == kv)


def _dense_block_mask(segment: Tensor, part: Tensor) -> Tensor:
    """The shared-prompt mask ``[n_bins, C, C]`` (True where a position may attend) of bins whose positions belong
    to ``segment`` and ``part`` ``[n_bins, C]`` (the prompt 0, completions 1..; -1 past the bin's segments)."""
    n_bins, capacity = segment.shape
    b = torch.arange(n_bins)[:, None, None]
    q, kv = torch.arange(capacity)[None, :, None], torch.arange(capacity)[None, None, :]
    return _attends(segment, part, b, q, kv)


def _block_mask(segment: Tensor, part: Tensor) -> object:
    """The same mask as FlexAttention's ``BlockMask``, whose kernel skips the blocks in which no query attends to
    any key (a completion's blocks against the other completions'): on a GPU the grouped pass then computes about
    the pairs it needs instead of every pair of the segment."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return _attends(segment, part, b, q, kv)

    n_bins, capacity = segment.shape
    return create_block_mask(mask_mod, B=n_bins, H=None, Q_LEN=capacity, KV_LEN=capacity, device=segment.device)
