"""A peft LoRA policy's adapters exported as vLLM serves them: the checks of what vLLM can serve as a plain LoRA
adapter, the adapter's tensors under peft's saved names (FSDP2 shards gathered), its ``adapter_config.json``, and the
frozen base without the adapters. Used by the colocated :class:`~lit_rlft.rollout.engines.vllm.VLLMEngine` and by the
generation servers' client (``lora_sync: adapter``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lit_rlft.models.export import save_hf_checkpoint, whole

__all__ = ["VLLM_LORA_RANKS", "adapter_config_dict", "adapter_shapes", "adapter_weights", "check_adapter_sync",
           "lora_config", "save_base_checkpoint", "vllm_lora_rank"]

#: The LoRA ranks vLLM 0.32 accepts as ``max_lora_rank`` (``vllm.config.lora.MaxLoRARanks``).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_config(policy: nn.Module) -> Any:
    """The peft config of ``policy``'s active adapter (``None``: not a peft model)."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return None
    if not isinstance(policy, PeftModel):
        return None
    configs = policy.peft_config
    active = list(policy.active_adapters)
    if len(active) != 1:
        raise ValueError(f"VLLMEngine(lora_sync='adapter'): {len(active)} active adapters {active}; vLLM serves "
                         f"one per request. Use lora_sync: merged")
    return configs[active[0]]


def check_adapter_sync(policy: nn.Module, config: Any) -> None:
    """Refuse, with the reason, what vLLM cannot serve as a plain LoRA adapter (or what adapters alone would miss).

    Raises:
        ValueError: naming the feature and ``lora_sync: merged`` as the way out.
    """
    why = []
    peft_type = getattr(config, "peft_type", "LORA")
    if str(getattr(peft_type, "value", peft_type)) != "LORA":
        why.append(f"peft type {peft_type} (vLLM serves plain LoRA)")
    if getattr(config, "use_dora", False):
        why.append("DoRA")
    if getattr(config, "lora_bias", False):
        why.append("LoRA bias")
    if getattr(config, "modules_to_save", None):
        why.append(f"modules_to_save {config.modules_to_save}")
    init = getattr(config, "init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in ("gaussian", "eva", "orthogonal", "mica", "lora_ga"):
        why.append(f"init_lora_weights={init!r} (it changes the base weights)")
    ranks = [int(config.r), *[int(r) for r in (getattr(config, "rank_pattern", None) or {}).values()]]
    if max(ranks) > VLLM_LORA_RANKS[-1]:
        why.append(f"rank {max(ranks)} > {VLLM_LORA_RANKS[-1]}")
    trained = [n for n, p in policy.named_parameters() if p.requires_grad and ".lora_" not in n]
    if trained:
        why.append(f"{len(trained)} trainable weights outside the adapters (e.g. {trained[0]}): the base changes")
    if why:
        raise ValueError("VLLMEngine(lora_sync='adapter') cannot send this policy as an adapter: " + "; ".join(why)
                         + ". Use lora_sync: merged (full weights with the adapters merged)")


def vllm_lora_rank(config: Any) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds the adapter's largest rank."""
    largest = max([int(config.r), *[int(r) for r in (getattr(config, "rank_pattern", None) or {}).values()]])
    return next(r for r in VLLM_LORA_RANKS if r >= largest)


def adapter_config_dict(config: Any) -> dict[str, Any]:
    """``adapter_config.json`` as peft writes it (sets as sorted lists)."""
    out = config.to_dict()
    return {k: sorted(v) if isinstance(v, set) else v for k, v in out.items()}


def _adapter_state(policy: nn.Module) -> dict[str, Any]:
    """peft's saved names and tensors of the active adapter (FSDP2 shards as DTensors, nothing gathered); never the
    base embeddings (``save_embedding_layers="auto"`` would look the base model up on the hub)."""
    from peft import get_peft_model_state_dict

    name = policy.active_adapters[0]
    return get_peft_model_state_dict(policy, adapter_name=name, save_embedding_layers=False)


def adapter_shapes(policy: nn.Module) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of the adapter tensors (peft's saved names), without gathering anything."""
    return {k: tuple(v.shape) for k, v in _adapter_state(policy).items()}


def adapter_weights(policy: nn.Module, dtype: torch.dtype) -> dict[str, Tensor]:
    """The active adapter's tensors under peft's saved names (``base_model.model.<module>.lora_A.weight``
    ``[r, in]``, ``...lora_B.weight`` ``[out, r]``), whole (FSDP2 shards gathered: every rank must call it at the same
    time), on the CPU in ``dtype``."""
    return {k: whole(v).detach().to("cpu", dtype).contiguous() for k, v in _adapter_state(policy).items()}


def save_base_checkpoint(policy: nn.Module, path: str) -> None:
    """Write the HF model inside ``policy`` *without* its adapters (the frozen base vLLM applies them to) and its
    config: ``base_layer`` dropped from the names, LoRA tensors left out, FSDP2 shards gathered, tied weights under
    both names."""
    save_hf_checkpoint(policy, path, merge_lora=False)
