"""A tiny offline policy: a character-level tokenizer and a small Qwen2, built locally (no hub download).

head_dim is 64 so that the same model runs in vLLM (which needs head_dim >= 64). The default size
(hidden 128, 4 layers, 2 heads of 64, MLP 512, tied embeddings, about 1.06M parameters) is the one
the CPU scouting runs used (see docs/design.md and the README's results).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
#: Printable ASCII plus newline: enough for arithmetic, Countdown and simple templates.
CHARACTERS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]


def char_tokenizer(characters: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer (one token per character), with ``<pad>``, ``<eos>`` and ``<unk>``."""
    chars = characters or CHARACTERS
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK)
    fast.padding_side = "left"
    return fast


@dataclass
class TinyConfig:
    """Size of the tiny Qwen2 policy."""

    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 256
    head_dim: int = 64
    seed: int = 0


def tiny_qwen2(tokenizer: PreTrainedTokenizerFast, config: TinyConfig | None = None) -> Qwen2ForCausalLM:
    """A freshly initialised small Qwen2 causal LM sized for ``tokenizer`` (seeded, deterministic)."""
    cfg = config or TinyConfig()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Qwen2ForCausalLM(_qwen2_config(tokenizer, cfg))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def tiny_reward_model(tokenizer: PreTrainedTokenizerFast, config: TinyConfig | None = None,
                      num_labels: int = 1) -> Qwen2ForSequenceClassification:
    """A freshly initialised small Qwen2 sequence classifier (a reward model: ``num_labels=1``), seeded; its
    ``pad_token_id`` is the tokenizer's, as a batched forward needs."""
    cfg = config or TinyConfig()
    qcfg = _qwen2_config(tokenizer, cfg)
    qcfg.num_labels = num_labels
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return Qwen2ForSequenceClassification(qcfg)


def _qwen2_config(tokenizer: PreTrainedTokenizerFast, cfg: TinyConfig) -> Qwen2Config:
    if cfg.hidden_size != cfg.num_attention_heads * cfg.head_dim:
        raise ValueError(
            f"TinyConfig: hidden_size ({cfg.hidden_size}) must equal num_attention_heads * head_dim "
            f"({cfg.num_attention_heads} * {cfg.head_dim})"
        )
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        head_dim=cfg.head_dim,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_sliding_window=False,
    )


def save_tiny_policy(out_dir: str | Path, config: TinyConfig | None = None) -> Path:
    """Build the tiny policy and tokenizer and save both as an HF checkpoint directory."""
    out = Path(out_dir)
    tok = char_tokenizer()
    model = tiny_qwen2(tok, config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
