"""HFEngine: batched sampling with the trainer's own HF model (``model.generate`` with KV cache)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lit_rlft.core.types import left_pad, pad_to
from lit_rlft.models.sharding import hf_model
from lit_rlft.rollout.base import FinishReason, GenerationOutput, RolloutEngine, SamplingConfig, stop_token_ids


class HFEngine(RolloutEngine):
    """Sample with the policy itself (``model.generate`` with KV cache). Shares the model, so ``sync_weights`` has
    nothing to do. The default engine.

    Under FSDP the policy's parameters are sharded and every forward pass gathers them from all ranks, so the ranks
    must run the same number of decoding steps: a sharded policy generates with ``synced_gpus=True`` (a rank that
    has finished keeps stepping until all have).

    Args:
        max_batch_size: sequences per ``generate`` call, to bound memory (``None`` = all at once).
        return_logprobs: also return the sampling distribution's per-token log-probs. This keeps every step's
            processed scores (``[n, V]`` per token) until the end of ``generate``: fine for small models, far too
            much memory for a real vocabulary and long completions. GRPOModule does not need them (it computes
            pi_old with a forward pass), so the default is off and ``GenerationOutput.logprobs`` is ``None``.
    """

    def __init__(self, max_batch_size: int | None = None, return_logprobs: bool = False):
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"HFEngine: max_batch_size must be >= 1 or null, got {max_batch_size}")
        self.max_batch_size = max_batch_size
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

    @property
    def returns_logprobs(self) -> bool:
        return self.return_logprobs

    def sync_weights(self, model: nn.Module) -> None:
        self.model = model

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], num_generations: int, sampling: SamplingConfig,
                 seed: int | None = None) -> GenerationOutput:
        if self.model is None:
            raise RuntimeError("HFEngine.generate before setup(model, tokenizer)")
        rows = [p for p in prompts for _ in range(num_generations)]  # N prompts, grouped
        chunk = self.max_batch_size or len(rows)
        parts = [self._generate_chunk(rows[i : i + chunk], sampling) for i in range(0, len(rows), chunk)]
        length = max(p[0].shape[1] for p in parts)
        ids = torch.cat([pad_to(p[0], length, self.pad_token_id) for p in parts])
        mask = torch.cat([pad_to(p[1], length, 0) for p in parts])
        logprobs = torch.cat([pad_to(p[2], length, 0.0) for p in parts]) if self.return_logprobs else None
        reasons: list[FinishReason] = [r for p in parts for r in p[3]]
        return GenerationOutput(ids, mask, logprobs, reasons)

    def _generate_chunk(
        self, rows: list[list[int]], sampling: SamplingConfig
    ) -> tuple[Tensor, Tensor, Tensor | None, list[FinishReason]]:
        device = next(self.model.parameters()).device
        input_ids, attn = left_pad(rows, self.pad_token_id)  # [n, P] each
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attn.to(device),
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,  # 0 disables; never inherit a checkpoint's generation_config.json
                repetition_penalty=1.0,  # likewise: the policy's own distribution, as the loss assumes
                min_p=None,
                typical_p=1.0,
                no_repeat_ngram_size=0,
                max_new_tokens=sampling.max_new_tokens,
                eos_token_id=self.eos_token_ids,
                pad_token_id=self.pad_token_id,
                output_scores=self.return_logprobs,
                return_dict_in_generate=True,
                use_cache=True,
                synced_gpus=self.synced,
            )
        finally:
            self.model.train(was_training)
        completion = out.sequences[:, input_ids.shape[1]:].cpu()  # [n, L]
        is_eos = torch.isin(completion, torch.tensor(self.eos_token_ids))
        # Tokens after the first EOS are padding added by generate.
        after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
        mask = (~after_eos).long()
        completion = torch.where(mask.bool(), completion, torch.full_like(completion, self.pad_token_id))
        logprobs = None
        if self.return_logprobs:
            # Processed scores = the distribution actually sampled from (temperature, top-p applied).
            scores = torch.stack(out.scores, dim=1).float().cpu()  # [n, L, V]
            logprobs = torch.log_softmax(scores, dim=-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
            logprobs = torch.where(mask.bool(), logprobs, torch.zeros_like(logprobs))
        reasons: list[FinishReason] = ["stop" if e else "length" for e in is_eos.any(dim=1).tolist()]
        return completion, mask, logprobs, reasons
