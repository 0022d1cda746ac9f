"""HFEngine: batched sampling with the trainer's own HF model (``model.generate`` with KV cache)."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from lit_rlft.core.types import left_pad, pad_to
from lit_rlft.models.sharding import hf_model
from lit_rlft.rollout.engines.base import FinishReason, GenerationOutput, RolloutEngine, SamplingConfig, stop_token_ids
from lit_rlft.rollout.engines.kv_cache import ReservedCache
from lit_rlft.runtime.distributed import split_to


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
        return_logprobs: also return the sampling distribution's per-token log-probs (temperature, top-k and top-p
            applied: the distribution each token was drawn from). They are gathered at every decode step, so the
            memory is one ``[n, V]`` distribution at a time and ``[n, L]`` log-probs, never ``generate``'s
            ``[n, L, V]`` scores. GRPOModule does not need them unless it runs asynchronously or corrects the
            engine's mismatch (it computes pi_old with a forward pass), so the default is off and
            ``GenerationOutput.logprobs`` is ``None``.
        shared_prefill: prefill each group's prompt once and share its KV cache among the group's ``G`` samples
            (on by default). The rows of a ``generate`` call that hold the same prompt (a group, or the part of it
            the call holds) are prefilled as one row, all but the prompt's last token, and the cache is copied to
            the ``G`` rows before decoding; ``generate`` then starts from the last prompt token. Same seed, the same
            tokens as with it off; log-probs equal within float rounding (the last prompt position is computed over
            the cache instead of inside the whole prompt's pass). Saves ``(G - 1) / G`` of the prefill; the decode
            steps, which dominate short prompts, cost the same. vLLM does this by itself (its prefix cache).
            Not with ``static_cache`` (``generate`` builds that cache itself).
        static_cache: decode into a preallocated KV cache (transformers' ``cache_implementation="static"``)
            instead of one that grows by a copy every step (on this CPU, ``DynamicCache``'s concatenation is about
            40% of a tiny policy's decoding time), and compile the decode step with ``torch.compile`` (transformers'
            ``CompileConfig``, on every device): the first call of every new shape (rows, prompt width) compiles
            (about 30 s for the tiny policy on 2 cores), later ones reuse it. Off by default; see
            ``benchmarks/hf_generation.py`` for when it pays. Not with ``drop_finished_every``.
    """

    def __init__(self, max_batch_size: int | None = None, return_logprobs: bool = False,
                 max_batch_tokens: int | None = None, drop_finished_every: int | None = None,
                 shared_prefill: bool = True, static_cache: bool = False):
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
        if static_cache and drop_finished_every is not None:
            raise ValueError("HFEngine: static_cache and drop_finished_every do not combine (rows leave a dynamic "
                             "cache between windows); choose one")
        self.static_cache = static_cache
        self.shared_prefill = shared_prefill and not static_cache
        self.model: nn.Module | None = None
        self.pad_token_id = 0
        self.eos_token_ids: list[int] = []
        self.synced = False
        self._forward_params: set[str] = set()

    @classmethod
    def bound(cls, model: nn.Module, tokenizer: Any, **kwargs: Any) -> HFEngine:
        """An engine already set up with ``model`` and ``tokenizer`` (for loops outside ``GRPOModule``)."""
        engine = cls(**kwargs)
        engine.setup(model, tokenizer)
        return engine

    def setup(self, model: nn.Module, tokenizer: Any, sharded: bool = False) -> None:
        """Bind the policy, the pad id and the stop ids (any of them ends a completion and is part of its loss)."""
        self.model = model
        self._forward_params = set(inspect.signature(hf_model(model).forward).parameters)  # read once, not per call
        self.pad_token_id = tokenizer.pad_token_id
        self.eos_token_ids = stop_token_ids(hf_model(model), tokenizer)
        self.synced = sharded

    def sync_weights(self, model: nn.Module) -> None:
        if model is not self.model:
            self._forward_params = set(inspect.signature(hf_model(model).forward).parameters)
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
        if self.shared_prefill and input_ids.shape[1] < 2:  # one prompt token: a padding column leaves a prefix
            input_ids, attn = pad_left(input_ids, self.pad_token_id), pad_left(attn, 0)
        input_ids, attn = input_ids.to(device), attn.to(device)
        was_training = self.model.training
        self.model.eval()
        try:
            cache = self._new_cache(sampling.max_new_tokens)
            if self.shared_prefill:
                cache = self._prefill(input_ids, attn, cache)
            if self.drop_finished_every is None:
                completion, logprobs, _ = self._sample(input_ids, attn, cache, sampling, sampling.max_new_tokens)
                completion = completion.cpu()  # [n, L]
                logprobs = logprobs.cpu() if logprobs is not None else None  # [n, L]
            else:
                completion, logprobs = self._generate_dropping_finished(input_ids, attn, cache, sampling)
        finally:
            self.model.train(was_training)
        is_eos = torch.isin(completion, torch.tensor(self.eos_token_ids))
        # Tokens after the first EOS are padding added by generate.
        after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
        mask = (~after_eos).long()
        completion = torch.where(mask.bool(), completion, torch.full_like(completion, self.pad_token_id))
        if logprobs is not None:
            logprobs = torch.where(mask.bool(), logprobs, torch.zeros_like(logprobs))
        reasons: list[FinishReason] = ["stop" if e else "length" for e in is_eos.any(dim=1).tolist()]
        return completion, mask, logprobs, reasons

    def _new_cache(self, max_new_tokens: int) -> Any:
        """An empty KV cache with room for the prompt and ``max_new_tokens`` (:class:`ReservedCache`: each decode
        step writes in place instead of copying the cache), or None with ``static_cache`` (``generate`` builds it)."""
        if self.static_cache:
            return None
        return ReservedCache(hf_model(self.model).config, reserve=max_new_tokens + 1)

    def _prefill(self, input_ids: Tensor, attn: Tensor, cache: Any) -> Any:
        """``cache`` filled with every row's prompt but its last token, each distinct prompt computed once.

        Args:
            input_ids, attn: ``[n, P]`` left-padded prompts and their mask (``P >= 2``), on the model's device.
            cache: an empty cache.

        Returns:
            A cache of ``n`` rows and ``P - 1`` positions, for ``generate`` to continue from.
        """
        distinct, row_of = torch.unique_consecutive(torch.cat([input_ids, attn], dim=1), dim=0, return_inverse=True)
        ids, mask = distinct[:, : input_ids.shape[1] - 1], distinct[:, input_ids.shape[1] :][:, :-1]  # [u, P - 1]
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)  # as generate numbers left-padded rows
        keep = {"logits_to_keep": 1} if "logits_to_keep" in self._forward_params else {}  # its logits are unused
        self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                   **{self._cache_name: cache}, **keep)
        cache.batch_select_indices(row_of)  # [u] -> [n] rows: each group's prompt copied to its G samples
        return cache

    def _sample(self, input_ids: Tensor, attn: Tensor, cache: Any, sampling: SamplingConfig,
                max_new_tokens: int) -> tuple[Tensor, Tensor | None, Any]:
        """One ``generate`` call from ``input_ids`` (continuing ``cache`` when given, which holds all of them but
        the last).

        Returns:
            ``(new tokens [n, k], their log-probs [n, k] or None, the cache)``; ``k < max_new_tokens`` only when
            every row has stopped.
        """
        recorder = SampledLogprobs(input_ids.shape[1], max_new_tokens) if self.return_logprobs else None
        extra = {} if cache is None else {self._cache_name: cache}
        out = self.model.generate(input_ids=input_ids, attention_mask=attn, **extra,
                                  **self._generate_kwargs(sampling, max_new_tokens, recorder))
        new = out.sequences[:, input_ids.shape[1] :]
        logprobs = recorder.finish(out.sequences) if recorder is not None else None
        return new, logprobs, getattr(out, self._cache_name)

    @property
    def _cache_name(self) -> str:
        """``generate``'s name for the KV cache: ``cache`` in transformers >= 5.2x, ``past_key_values`` before."""
        return "cache" if "cache" in self._forward_params else "past_key_values"

    def _generate_kwargs(self, sampling: SamplingConfig, max_new_tokens: int,
                         recorder: SampledLogprobs | None = None) -> dict[str, Any]:
        """``model.generate``'s settings: plain sampling from the policy, whatever its generation config says.

        Temperature, top-k and top-p are passed as ``generate``'s own warpers, in ``generate``'s order, with the
        log-prob recorder after them, so that the recorder sees the distribution that is sampled from.
        """
        warpers = LogitsProcessorList()
        if sampling.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k:
            warpers.append(TopKLogitsWarper(top_k=sampling.top_k, min_tokens_to_keep=1))
        if sampling.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
        if recorder is not None:
            warpers.append(recorder)
        static = {}
        if self.static_cache:
            from transformers.generation.configuration_utils import CompileConfig

            compile_config = CompileConfig(fullgraph=False, dynamic=False, mode="default")
            compile_config._compile_all_devices = True  # transformers compiles on accelerators only unless told
            static = dict(cache_implementation="static", compile_config=compile_config)
        return dict(
            **static,
            do_sample=True,
            temperature=1.0,  # the warpers above; never inherit a checkpoint's generation_config.json
            top_p=1.0,
            top_k=0,
            logits_processor=warpers,
            repetition_penalty=1.0,  # likewise: the policy's own distribution, as the loss assumes
            min_p=None,
            typical_p=1.0,
            no_repeat_ngram_size=0,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            use_cache=True,
            synced_gpus=self.synced,
        )

    def _generate_dropping_finished(self, input_ids: Tensor, attn: Tensor, cache: Any,
                                    sampling: SamplingConfig) -> tuple[Tensor, Tensor | None]:
        """``generate`` in windows of ``drop_finished_every`` new tokens, each continuing from the KV cache of the
        last; between windows the rows that have stopped leave the batch and the cache.

        Args:
            input_ids, attn: ``[n, P]`` left-padded prompts and their mask, on the model's device.
            cache: the prompts' shared prefill (all but their last token), or None.

        Returns:
            ``(completion [n, L], logprobs [n, L] or None)`` on the CPU: generated ids (anything after a row's stop
            is pad) and, with ``return_logprobs``, their log-probs (zeros after a row's stop).
        """
        n, total = input_ids.shape[0], sampling.max_new_tokens
        stops = torch.tensor(self.eos_token_ids, device=input_ids.device)
        tokens = torch.full((n, total), self.pad_token_id, dtype=torch.long)  # [n, T]
        logprobs = torch.zeros((n, total), dtype=torch.float32) if self.return_logprobs else None  # [n, T]
        alive = torch.arange(n, device=input_ids.device)  # rows still generating
        seq, mask, done = input_ids, attn, 0
        window = self.drop_finished_every
        while self._any_rank(done < total and len(alive) > 0, input_ids.device):
            if done >= total or len(alive) == 0:
                # sharded, and this rank is done while another is not: a throw-away window keeps the forward passes
                # (collectives under FSDP) in step
                self.model.generate(input_ids=input_ids[:1, -1:], attention_mask=attn[:1, -1:],
                                    **self._generate_kwargs(sampling, window))
                continue
            new, new_logprobs, cache = self._sample(seq, mask, cache, sampling, min(window, total - done))
            k = new.shape[1]  # k < the window only when every row has stopped
            tokens[alive.cpu(), done : done + k] = new.cpu()
            if logprobs is not None:
                logprobs[alive.cpu(), done : done + k] = new_logprobs.cpu()
            done += k
            keep = (~torch.isin(new, stops).any(dim=1)).nonzero().flatten()  # no stop yet
            # the cache holds every token but the last sampled one
            if len(keep) < len(alive):
                cache.batch_select_indices(keep)
            seq = torch.cat([seq, new], dim=1)[keep]
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], k)], dim=1)[keep]
            alive = alive[keep]
        return tokens[:, :done], (logprobs[:, :done] if logprobs is not None else None)

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



def pad_left(x: Tensor, value: int) -> Tensor:
    """``x`` ``[n, P]`` with one more column of ``value`` on the left: ``[n, P + 1]``."""
    return torch.cat([x.new_full((x.shape[0], 1), value), x], dim=1)


class SampledLogprobs(LogitsProcessor):
    """The log-prob of every sampled token under the distribution it was drawn from, gathered one decode step
    later (when ``generate`` hands this processor the sequences with that token appended), so that only one step's
    ``[n, V]`` distribution is held at a time. Put it after the warpers: it returns the scores unchanged.

    Args:
        start: the length of the sequences ``generate`` starts from (the prompt, or the prompt and earlier windows).
        max_new_tokens: the most tokens ``generate`` appends (the log-probs go into one buffer of that width: many
            small tensors kept between the large per-step ones would fragment the heap).
    """

    def __init__(self, start: int, max_new_tokens: int):
        self.start = start
        self.buffer: Tensor | None = None  # [n, max_new_tokens]
        self.width = max_new_tokens
        self.done = 0  # log-probs gathered so far
        self.pending: Tensor | None = None  # [n, V]: the last step's log-softmax, awaiting its sampled token

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._gather(input_ids)
        self.pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _gather(self, sequences: Tensor) -> None:
        if self.pending is None or sequences.shape[1] <= self.start + self.done:
            return
        if self.buffer is None:
            self.buffer = self.pending.new_zeros((sequences.shape[0], self.width))
        torch.gather(self.pending, -1, sequences[:, -1:], out=self.buffer[:, self.done : self.done + 1])
        self.done += 1

    def finish(self, sequences: Tensor) -> Tensor:
        """The log-probs ``[n, k]`` of the ``k`` tokens ``generate`` appended to the ``start`` it began from."""
        self._gather(sequences)
        self.pending = None
        k = sequences.shape[1] - self.start
        if self.buffer is None:
            return sequences.new_zeros((sequences.shape[0], k), dtype=torch.float32)
        return self.buffer[:, :k]
