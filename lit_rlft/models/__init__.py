"""Policies: HF loading, LoRA, FSDP2 sharding and the tiny offline model."""

from lit_rlft.models.loading import LoRAConfig, apply_lora, build_policy, load_model, load_policy, load_tokenizer_for
from lit_rlft.models.tiny import TinyConfig, char_tokenizer, save_tiny_policy, tiny_qwen2

__all__ = ["LoRAConfig", "TinyConfig", "apply_lora", "build_policy", "char_tokenizer", "load_model", "load_policy",
           "load_tokenizer_for", "save_tiny_policy", "tiny_qwen2"]
