"""The tiny offline policy: character tokenizer, saved checkpoints load back with identical tokenisation."""

from __future__ import annotations

import torch

from lit_rlft.models.loading import load_policy
from lit_rlft.models.tiny import TinyConfig, char_tokenizer, save_tiny_policy, tiny_qwen2


def test_char_tokenizer_is_one_token_per_character_and_round_trips():
    tok = char_tokenizer()
    text = "12 7 3>81=(12-3)*7"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1


def test_saved_checkpoint_loads_with_the_same_tokenisation_and_weights(tmp_path):
    save_tiny_policy(tmp_path / "m", TinyConfig(hidden_size=64, num_attention_heads=1, num_key_value_heads=1,
                                                num_hidden_layers=1, intermediate_size=64))
    model, tok = load_policy(str(tmp_path / "m"))
    ref = char_tokenizer()
    text = "12 7 3>81="
    assert tok(text)["input_ids"] == ref(text)["input_ids"]  # spaces kept (AutoTokenizer would drop them)
    assert tok.padding_side == "left" and tok.pad_token == "<pad>"
    fresh = tiny_qwen2(ref, TinyConfig(hidden_size=64, num_attention_heads=1, num_key_value_heads=1,
                                       num_hidden_layers=1, intermediate_size=64))
    for (n, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), n


def test_default_size_is_the_scouted_one_with_head_dim_64():
    model = tiny_qwen2(char_tokenizer())
    assert model.config.head_dim == 64
    assert 1.0e6 < sum(p.numel() for p in model.parameters()) < 1.1e6
