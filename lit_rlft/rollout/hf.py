"""HFEngine: batched sampling with the trainer's own HF model (``model.generate`` with KV cache)."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlft.core.distributed import split_to
from lit_rlft.core.types import left_pad, pad_to
from lit_rlft.models.sharding import hf_model
from lit_rlft.rollout.base import FinishReason, GenerationOutput, RolloutEngine, SamplingConfig, stop_token_ids


class HFEngine(RolloutEngine):
    """Sample with the policy itself (``model.generate`` with KV cache). Shares the model, so ``sync_weights`` has
    nothing to do. The default engine.

    Under FSDP the policy's parameters are sharded and every forward pass gathers them from all ranks, so the ranks
    must run the same number of decoding steps: a sharded policy generates with ``synced_gpus=True`` (a rank that
    has finished keeps stepping until all have), and with ``max_batch_size`` / ``max_batch_tokens`` /
    ``drop_finished_every`` the ranks also agree on the number of ``generate`` calls (a rank with fewer rows, as in
    multi-turn episodes, makes throw-away calls).

    Args:
        max_batch_size: sequences per ``generate`` call, to bound memory (``None`` = all at once).
        max_batch_tokens: a token budget per ``generate`` call (``None`` = off, today's behaviour: the rows in
            their order, ``max_batch_size`` at a time). On: the ``N`` rows are sorted by prompt length (longest
            first, groups kept together) and cut into chunks whose padded size ``rows x (longest prompt in the chunk
            + max_new_tokens)`` stays within the budget (and at most ``max_batch_size`` rows), so that short prompts
            are not left-padded to the longest of the whole batch and the KV cache of a call is bounded in tokens,
            not rows. Completions come back in the original order. A row longer than the budget gets a chunk of its
            own. With a fixed seed (``torch.manual_seed``) the results are reproducible; they are not the same
            samples as with the option off (the random stream is consumed in another order).
        drop_finished_every: ``None`` = off (today's behaviour: ``generate`` keeps computing rows that have stopped
            until the last row of the call stops). On: ``generate`` runs in windows of this many new tokens, each
            continuing from the KV cache of the last, and between windows the rows that have stopped leave the batch
            and the cache, so that short completions stop costing compute (what vLLM's scheduler does every step).
            Greedy results equal those with it off; sampled ones are reproducible with a fixed seed but not equal
            (fewer rows draw from the random stream). Smaller windows drop rows sooner but pay ``generate``'s
            per-call overhead more often (16-64 is a sensible range). Sharded (FSDP), the ranks agree before every
            window whether any of them still generates (one all-reduce); a rank that is done runs a throw-away
            one-row window meanwhile.
        return_logprobs: also return the sampling distribution's per-token log-probs. This keeps every step's
            processed scores (``[n, V]`` per token) until the end of ``generate``: fine for small models, far too
            much memory for a real vocabulary and long completions. GRPOModule does not need them (it computes
            pi_old with a forward pass), so the default is off and ``GenerationOutput.logprobs`` is ``None``.
    """

    def __init__(self, max_batch_size: int | None = None, return_logprobs: bool = False,
                 max_batch_tokens: int | None = None, drop_finished_every: int | None = None):
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"HFEngine: max_batch_size must be >= 1 or null, got {max_batch_size}")
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ValueError(f"HFEngine: max_batch_tokens must be >= 1 or null, got {max_batch_tokens}")
        self.max_batch_size = max_batch_size
        if drop_finished_every is not None and drop_finished_every < 1:
            raise ValueError(f"HFEngine: drop_finished_every must be >= 1 or null, got {drop_finished_every}")
        self.max_batch_tokens = max_batch_tokens
        self.drop_finished_every = drop_finished_every
        self.return_logprobs = return_logprobs
        self.model: nn.Module | None = None
        self.pad_token_id = 0
        self.eos_token_ids: list[int] = []
        self.synced = False

    @classmethod
    def bound(cls, model: nn.Module, tokenizer: Any, **kwargs: Any) -> HFEngine:
        """An engine already set up with ``model`` and ``tokenizer`` (for loops outside ``GRPOModule``)."""
        engine = cls(**kwargs)
        engine.setup(model, tokenizer)
        return engine

    def setup(self, model: nn.Module, tokenizer: Any, sharded: bool = False) -> None:
        """Bind the policy, the pad id and the stop ids (any of them ends a completion and is part of its loss)."""
        self.model = model
        self.pad_token_id = tokenizer.pad_token_id
        self.eos_token_ids = stop_token_ids(hf_model(model), tokenizer)
        self.synced = sharded

    def sync_weights(self, model: nn.Module) -> None:
        self.model = model

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], num_generations: int, sampling: SamplingConfig,
                 seed: int | None = None) -> GenerationOutput:
        if self.model is None:
            raise RuntimeError("HFEngine.generate before setup(model, tokenizer)")
        rows = [p for p in prompts for _ in range(num_generations)]  # N prompts, grouped
        if self.max_batch_tokens is None:  # rows in order, max_batch_size at a time (the behaviour before the option)
            chunk = self.max_batch_size or len(rows)
            starts = range(0, len(rows), chunk)
            # ranks with fewer rows (multi-turn episodes) agree on the number of calls first, then keep in step
            extra = self._max_over_ranks(len(starts), next(self.model.parameters()).device) - len(starts) \
                if self.max_batch_size else 0
            parts = [self._generate_chunk(rows[i : i + chunk], sampling) for i in starts]
            for _ in range(extra):
                self._generate_chunk([min(rows, key=len)], sampling)  # a throw-away call
            length = max(p[0].shape[1] for p in parts)
            ids = torch.cat([pad_to(p[0], length, self.pad_token_id) for p in parts])
            mask = torch.cat([pad_to(p[1], length, 0) for p in parts])
            logprobs = torch.cat([pad_to(p[2], length, 0.0) for p in parts]) if self.return_logprobs else None
            reasons: list[FinishReason] = [r for p in parts for r in p[3]]
            return GenerationOutput(ids, mask, logprobs, reasons)
        return self._generate_by_tokens(rows, sampling)

    def _generate_by_tokens(self, rows: list[list[int]], sampling: SamplingConfig) -> GenerationOutput:
        """Chunks of rows sorted by prompt length within ``max_batch_tokens``; results put back in row order."""
        plan = plan_chunks([len(r) for r in rows], sampling.max_new_tokens, self.max_batch_tokens,
                           self.max_batch_size)
        # every rank must call generate (a collective under FSDP) as often as the others
        plan = split_to(plan, self._max_over_ranks(len(plan), next(self.model.parameters()).device))
        n = len(rows)
        parts = []
        for chunk in plan:
            if chunk:
                parts.append((chunk, self._generate_chunk([rows[i] for i in chunk], sampling)))
            else:  # a rank with fewer rows than chunks: a throw-away call that keeps the collectives in step
                self._generate_chunk([min(rows, key=len)], sampling)
        length = max(part[0].shape[1] for _, part in parts)
        ids = torch.full((n, length), self.pad_token_id, dtype=torch.long)  # [N, L]
        mask = torch.zeros((n, length), dtype=torch.long)  # [N, L]
        logprobs = torch.zeros((n, length), dtype=torch.float32) if self.return_logprobs else None  # [N, L]
        reasons: list[FinishReason | None] = [None] * n
        for chunk, (c_ids, c_mask, c_logprobs, c_reasons) in parts:
            index = torch.tensor(chunk, dtype=torch.long)
            width = c_ids.shape[1]
            ids[index, :width] = c_ids
            mask[index, :width] = c_mask
            if logprobs is not None:
                logprobs[index, :width] = c_logprobs
            for i, r in zip(chunk, c_reasons):
                reasons[i] = r
        return GenerationOutput(ids, mask, logprobs, [r for r in reasons if r is not None])

    def _generate_chunk(
        self, rows: list[list[int]], sampling: SamplingConfig
    ) -> tuple[Tensor, Tensor, Tensor | None, list[FinishReason]]:
        device = next(self.model.parameters()).device
        input_ids, attn = left_pad(rows, self.pad_token_id)  # [n, P] each
        was_training = self.model.training
        self.model.eval()
        try:
            if self.drop_finished_every is None:
                out = self.model.generate(input_ids=input_ids.to(device), attention_mask=attn.to(device),
                                          **self._generate_kwargs(sampling, sampling.max_new_tokens))
                completion = out.sequences[:, input_ids.shape[1]:].cpu()  # [n, L]
                scores = torch.stack(out.scores, dim=1).float().cpu() if self.return_logprobs else None  # [n, L, V]
            else:
                completion, scores = self._generate_dropping_finished(input_ids.to(device), attn.to(device), sampling)
        finally:
            self.model.train(was_training)
        is_eos = torch.isin(completion, torch.tensor(self.eos_token_ids))
        # Tokens after the first EOS are padding added by generate.
        after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
        mask = (~after_eos).long()
        completion = torch.where(mask.bool(), completion, torch.full_like(completion, self.pad_token_id))
        logprobs = None
        if scores is not None:
            # Processed scores = the distribution actually sampled from (temperature, top-p applied).
            logprobs = torch.log_softmax(scores, dim=-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
            logprobs = torch.where(mask.bool(), logprobs, torch.zeros_like(logprobs))
        reasons: list[FinishReason] = ["stop" if e else "length" for e in is_eos.any(dim=1).tolist()]
        return completion, mask, logprobs, reasons

    def _generate_kwargs(self, sampling: SamplingConfig, max_new_tokens: int) -> dict[str, Any]:
        """``model.generate``'s settings: plain sampling from the policy, whatever its generation config says."""
        return dict(
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,  # 0 disables; never inherit a checkpoint's generation_config.json
            repetition_penalty=1.0,  # likewise: the policy's own distribution, as the loss assumes
            min_p=None,
            typical_p=1.0,
            no_repeat_ngram_size=0,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            output_scores=self.return_logprobs,
            return_dict_in_generate=True,
            use_cache=True,
            synced_gpus=self.synced,
        )

    def _generate_dropping_finished(self, input_ids: Tensor, attn: Tensor,
                                    sampling: SamplingConfig) -> tuple[Tensor, Tensor | None]:
        """``generate`` in windows of ``drop_finished_every`` new tokens, each continuing from the KV cache of the
        last; between windows the rows that have stopped leave the batch and the cache.

        Args:
            input_ids, attn: ``[n, P]`` left-padded prompts and their mask, on the model's device.

        Returns:
            ``(completion [n, L], scores [n, L, V] or None)`` on the CPU: generated ids (anything after a row's stop
            is pad) and, with ``return_logprobs``, the processed scores (zeros after a row's stop).
        """
        n, total = input_ids.shape[0], sampling.max_new_tokens
        stops = torch.tensor(self.eos_token_ids, device=input_ids.device)
        tokens = torch.full((n, total), self.pad_token_id, dtype=torch.long)  # [n, T]
        pieces: list[tuple[Tensor, int, Tensor]] = []  # (rows, first position, scores [a, k, V])
        alive = torch.arange(n, device=input_ids.device)  # rows still generating
        seq, mask, cache, done = input_ids, attn, None, 0
        # transformers >= 5.2x names the KV cache `cache` (and warns on `past_key_values`), older ones the other
        name = "cache" if "cache" in inspect.signature(hf_model(self.model).forward).parameters else "past_key_values"
        window = self.drop_finished_every
        while self._any_rank(done < total and len(alive) > 0, input_ids.device):
            if done >= total or len(alive) == 0:
                # sharded, and this rank is done while another is not: a throw-away window keeps the forward passes
                # (collectives under FSDP) in step
                self.model.generate(input_ids=input_ids[:1, -1:], attention_mask=attn[:1, -1:],
                                    **self._generate_kwargs(sampling, window))
                continue
            extra = {} if cache is None else {name: cache}
            out = self.model.generate(input_ids=seq, attention_mask=mask, **extra,
                                      **self._generate_kwargs(sampling, min(window, total - done)))
            new = out.sequences[:, seq.shape[1]:]  # [a, k]; k < the window only when every row has stopped
            k = new.shape[1]
            tokens[alive.cpu(), done : done + k] = new.cpu()
            if self.return_logprobs:
                pieces.append((alive.cpu(), done, torch.stack(out.scores, dim=1).float().cpu()))
            done += k
            keep = (~torch.isin(new, stops).any(dim=1)).nonzero().flatten()  # no stop yet
            cache = getattr(out, name)  # every token but the last sampled one
            if len(keep) < len(alive):
                cache.batch_select_indices(keep)
            seq = out.sequences[keep]
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], k)], dim=1)[keep]
            alive = alive[keep]
        scores = None
        if self.return_logprobs and pieces:
            scores = torch.zeros(n, done, pieces[0][2].shape[-1])  # [n, L, V]
            for rows, start, part in pieces:
                scores[rows, start : start + part.shape[1]] = part
        return tokens[:, :done], scores

    def any_rank(self, flag: bool) -> bool:
        """``flag`` on any rank: an all-reduce when the policy is sharded (see :meth:`RolloutEngine.any_rank`)."""
        return self._any_rank(flag, next(self.model.parameters()).device)

    def _any_rank(self, flag: bool, device: torch.device) -> bool:
        """``flag`` on any rank (a collective when the policy is sharded; just ``flag`` otherwise)."""
        return bool(self._max_over_ranks(int(flag), device))

    def _max_over_ranks(self, value: int, device: torch.device) -> int:
        """The largest ``value`` of all ranks (a collective when the policy is sharded; just ``value`` otherwise)."""
        if not (self.synced and torch.distributed.is_available() and torch.distributed.is_initialized()):
            return value
        out = torch.tensor([value], device=device)
        torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.MAX)
        return int(out.item())


def plan_chunks(lengths: list[int], max_new_tokens: int, max_batch_tokens: int,
                max_batch_size: int | None = None) -> list[list[int]]:
    """Row indices per ``generate`` call: rows sorted by prompt length (longest first; equal lengths keep their
    order, so a group's ``G`` rows stay together), then cut greedily so that every chunk's padded size
    ``len(chunk) * (longest prompt in it + max_new_tokens)`` is at most ``max_batch_tokens`` and it holds at most
    ``max_batch_size`` rows. A row that alone exceeds the budget gets a chunk of its own.

    Args:
        lengths: prompt length of every row ``[N]``.

    Returns:
        Chunks of row indices; every index in exactly one chunk.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    cap = max_batch_size or len(lengths)
    chunks: list[list[int]] = []
    start = 0
    while start < len(order):
        per_row = lengths[order[start]] + max_new_tokens  # the chunk's longest prompt is its first row
        size = max(1, min(cap, max_batch_tokens // per_row))
        chunks.append(order[start : start + size])
        start += size
    return chunks

