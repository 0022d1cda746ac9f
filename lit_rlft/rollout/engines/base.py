"""The rollout engine protocol: token ids in; completions, behaviour log-probs and finish reasons out.

Engines are deliberately small so that an HF engine (sharing the trainer's model) and a vLLM engine (its own
copy of the weights, synced after each optimizer step) are interchangeable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor, nn

from lit_rlft.core.finite import check_finite

FinishReason = Literal["stop", "length"]


@dataclass
class SamplingConfig:
    """How completions are sampled (TRL / vLLM names)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256

    def __post_init__(self) -> None:
        check_finite(self, "sampling")
        check_sampling(self.temperature, self.top_p, self.top_k, self.max_new_tokens)


def check_sampling(temperature: float, top_p: float, top_k: int, max_new_tokens: int, prefix: str = "sampling.",
                   names: Mapping[str, str] | None = None) -> None:
    """The one check of sampling values (``SamplingConfig`` and ``GenerationConfig`` call it); the error names the
    option as the user gave it: ``prefix + name``, or ``names[name]`` (e.g. ``max_new_tokens`` is
    ``model.generation.max_completion_length``)."""
    name = {k: prefix + k for k in ("temperature", "top_p", "top_k", "max_new_tokens")} | dict(names or {})
    if temperature <= 0:
        raise ValueError(f"{name['temperature']} must be > 0 (sampling: greedy decoding is not a policy), got "
                         f"{temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"{name['top_p']} must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"{name['top_k']} must be >= 0 (0 = off), got {top_k}")
    if max_new_tokens < 1:
        raise ValueError(f"{name['max_new_tokens']} must be >= 1, got {max_new_tokens}")


@dataclass
class GenerationOutput:
    """``N = len(prompts) * num_generations`` completions, grouped per prompt (rows ``b*G .. b*G+G-1``)."""

    completion_ids: Tensor  # [N, L] long, right-padded with pad_id
    completion_mask: Tensor  # [N, L] long, 1 on generated tokens (EOS included)
    logprobs: Tensor | None  # [N, L] float32, log-probs of the distribution actually sampled from (if asked)
    finish_reasons: list[FinishReason]  # [N]
    policy_mask: Tensor | None = None  # [N, L] long, 1 on the policy's tokens (multi-turn episodes; None: the mask)
    versions: list[int] | None = None  # [N] the weights version that sampled each row (engines that report it)

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum())


class RolloutEngine:
    """What the rollout worker needs from a generator. Subclass it and choose it in YAML::

        model:
          engine:
            class_path: lit_rlft.rollout.HFEngine
            init_args: {max_batch_size: 256}

    An engine is built without a model (the YAML holds only its settings); :meth:`setup` hands it the policy and
    tokenizer once ``GRPOModule.configure_model`` has built (and possibly sharded) them.
    """

    last_sync_bytes: int | None = None
    """What the last :meth:`sync_weights` pushed, in bytes, for engines that hold weights of their own (vLLM);
    ``None`` for engines that share the policy (logged as ``perf/weight_sync_mib`` when set)."""

    synced: bool = False
    """Whether every :meth:`generate` call is a collective across ranks (a sharded policy generating in place: the HF
    engine under FSDP); callers that make a data-dependent number of calls agree through :meth:`any_rank`."""

    def any_rank(self, flag: bool) -> bool:
        """``flag`` on any rank: a collective when :attr:`synced` (every rank must call it), just ``flag``
        otherwise."""
        return flag

    def setup(self, model: nn.Module, tokenizer: Any, sharded: bool = False) -> None:
        """Bind the policy. ``sharded``: the policy is sharded across ranks (FSDP), so every rank must run the same
        number of forward passes while generating."""
        raise NotImplementedError

    def generate(self, prompts: list[list[int]], num_generations: int, sampling: SamplingConfig,
                 seed: int | None = None) -> GenerationOutput:
        """Sample ``num_generations`` completions for each tokenised prompt (no padding in ``prompts``).

        ``seed``: the call's seed, derived by the module from ``(generation_seed, step, rank, call)``; an engine with
        its own random state (vLLM) seeds its requests from it, so a resumed run samples what the uninterrupted run
        sampled. ``None``: unseeded. (``HFEngine`` draws from torch's generator, which the module re-seeds.)
        """
        raise NotImplementedError

    def sync_weights(self, model: nn.Module) -> None:
        """Make the engine sample from ``model``'s current weights (no-op for engines that share the model).

        Called after the last optimizer step of every rollout step (and when training or validation starts), on
        every rank: under FSDP the full weights are gathered, which is a collective."""


def stop_token_ids(model: nn.Module | None, tokenizer: Any) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the model's generation config's ``eos_token_id``
    (an id or a list: chat models often stop on several, e.g. ``<|im_end|>`` and ``<|endoftext|>``)."""
    ids: list[int] = []
    for source in (getattr(tokenizer, "eos_token_id", None),
                   getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation config names an EOS token")
    return ids
