"""A judge model generating through a lit_rlft engine, for :class:`~lit_rlft.rewards.JudgeReward` (here, above the
rewards, because it needs the engines).

    judge = JudgeReward(EngineJudge("runs/judge_model"))
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lit_rlft.rewards.batched import Failure

__all__ = ["EngineJudge"]


class EngineJudge:
    """A judge model generating through a lit_rlft engine in this process (HF by default; vLLM where installed).

    Args:
        model: a causal LM checkpoint directory, a hub name where reachable, or a built ``nn.Module``.
        tokenizer: its tokenizer (default: the one saved with ``model``); its chat template is used when it has one.
        engine: a :class:`~lit_rlft.rollout.engines.base.RolloutEngine` (default ``HFEngine()``), set up with the judge model.
        max_new_tokens: the judgement's length bound.
        temperature: sampling temperature (engines sample; a small value is nearly greedy).
        system_prompt: an optional system message (chat template only).
        device: where the judge runs (default: this rank's GPU, else the CPU).
        seed: each call's sampling is seeded from it and the call count, so a rerun judges alike.
    """

    uses_global_rng = True  # the HF engine samples from torch's global generator (seeded around each call)

    def __init__(self, model: str | nn.Module, tokenizer: Any = None, *, engine: Any = None, max_new_tokens: int = 64,
                 temperature: float = 0.01, system_prompt: str | None = None, device: str | None = None,
                 seed: int = 0) -> None:
        from lit_rlft.rollout.engines.base import SamplingConfig

        if isinstance(model, str):
            from lit_rlft.models.loading import load_model, load_tokenizer_for

            tokenizer = tokenizer if tokenizer is not None else load_tokenizer_for(model)
            model = load_model(model)
        elif tokenizer is None:
            raise ValueError("EngineJudge: a built model needs its tokenizer (tokenizer=...)")
        if isinstance(tokenizer, str):
            from lit_rlft.models.loading import load_tokenizer_for

            tokenizer = load_tokenizer_for(tokenizer)
        from lit_rlft.rewards.model import default_device

        self.device = torch.device(device) if device is not None else default_device()
        self.model = model.eval().requires_grad_(False).to(self.device)
        self.tokenizer = tokenizer
        if engine is None:
            from lit_rlft.rollout.engines.hf import HFEngine

            engine = HFEngine()
        self.engine = engine
        self.engine.setup(self.model, tokenizer)
        self.sampling = SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens)
        self.system_prompt = system_prompt
        self.seed = int(seed)
        self.calls = 0

    def encode(self, requests: list[str]) -> list[list[int]]:
        if getattr(self.tokenizer, "chat_template", None) is None:
            return [list(ids) for ids in self.tokenizer(requests)["input_ids"]]
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [list(self.tokenizer.apply_chat_template(system + [{"role": "user", "content": r}], tokenize=True,
                                                        add_generation_prompt=True, return_dict=False))
                for r in requests]

    def complete(self, requests: list[str]) -> list[str | Failure]:
        seed = hash((self.seed, self.calls)) % 2**31
        self.calls += 1
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            out = self.engine.generate(self.encode(requests), 1, self.sampling, seed=seed)
        return list(self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True))

    def __repr__(self) -> str:
        return f"EngineJudge({type(self.model).__name__}, engine={type(self.engine).__name__})"
