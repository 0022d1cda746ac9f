"""Tests of mean-pooled prompt embeddings and their disk cache, on a tiny local Qwen2 (no hub access)."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2Model

from lit_rlft.models import embeddings as emb_mod
from lit_rlft.models.embeddings import cached_embeddings, mean_pooled_embeddings

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 +-*/=?."
TEXTS = ["what is 2+3?", "a", "hello world", "12*12=?", "zz"]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """Char-level WordLevel tokenizer: [PAD]=0, [UNK]=1, then one id per character of CHARS (46 ids < 64)."""
    vocab = {"[PAD]": 0, "[UNK]": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


def tiny_config() -> Qwen2Config:
    return Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        intermediate_size=128,
    )


@pytest.fixture(scope="module")
def tiny_lm() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(tiny_config()).eval()


def reference_embedding(model, tokenizer, text: str) -> torch.Tensor:
    """One text alone, no padding: mean of hidden_states[-1] over its tokens -> [D]."""
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]  # [1, L, D]
    return hidden[0].mean(0)


def test_char_tokenizer_is_char_level():
    tok = char_tokenizer()
    assert tok("ab 1")["input_ids"] == [2, 3, 38, 29]


def test_mean_pooling_matches_unpadded_per_text(tiny_lm):
    tok = char_tokenizer()
    tiny_lm.train()  # restored afterwards
    out = mean_pooled_embeddings(tiny_lm, tok, TEXTS, batch_size=2, progress=False)
    assert tiny_lm.training
    assert out.shape == (len(TEXTS), 64) and out.dtype == torch.float32
    tiny_lm.eval()
    for i, text in enumerate(TEXTS):
        torch.testing.assert_close(out[i], reference_embedding(tiny_lm, tok, text), atol=1e-5, rtol=1e-5)


def test_base_model_and_causal_lm_agree(tiny_lm):
    tok = char_tokenizer()
    base = Qwen2Model(tiny_config())
    base.load_state_dict(tiny_lm.model.state_dict())
    a = mean_pooled_embeddings(tiny_lm, tok, TEXTS, progress=False)
    b = mean_pooled_embeddings(base, tok, TEXTS, progress=False)
    torch.testing.assert_close(a, b)


def test_truncation_and_progress(tiny_lm):
    tok = char_tokenizer()
    long = ["abcdefgh", "abcdxxxx"]  # same first 4 chars: identical after truncation to 4 tokens
    out = mean_pooled_embeddings(tiny_lm, tok, long, max_length=4, progress=True)
    torch.testing.assert_close(out[0], out[1])
    assert mean_pooled_embeddings(tiny_lm, tok, [], progress=False).shape == (0, 64)


@pytest.fixture
def saved_model_dir(tmp_path, tiny_lm):
    path = tmp_path / "tiny-qwen2"
    tiny_lm.save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


def test_cache_from_path_hits_without_loading(tmp_path, saved_model_dir, monkeypatch, tiny_lm):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    calls = []
    real = emb_mod.load_model_and_tokenizer

    def counting(path, device="cpu"):
        calls.append(path)
        return real(path, device)

    monkeypatch.setattr(emb_mod, "load_model_and_tokenizer", counting)
    cache = tmp_path / "cache"
    # AutoTokenizer would load the saved char tokenizer as a Qwen2Tokenizer (its class follows config.json's
    # model_type) and rebuild its pre-tokenizer, dropping spaces: pass the tokenizer itself
    path, tok = str(saved_model_dir), char_tokenizer()
    first = cached_embeddings(TEXTS, path, cache, tokenizer=tok, progress=False)
    assert len(calls) == 1 and len(list(cache.glob("emb-*.pt"))) == 1
    assert not list(cache.glob("*.tmp"))
    second = cached_embeddings(TEXTS, path, cache, tokenizer=tok, progress=False)
    assert len(calls) == 1  # hit: the model was not loaded again
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    # AutoModel loads the base of the causal-LM checkpoint: same embeddings as the in-memory model
    torch.testing.assert_close(first, mean_pooled_embeddings(tiny_lm, tok, TEXTS, progress=False))

    # misses: other texts, other order, other max_length, other key_extra, the path's own tokenizer
    cached_embeddings(TEXTS[:3], path, cache, tokenizer=tok, progress=False)
    cached_embeddings(TEXTS[::-1], path, cache, tokenizer=tok, progress=False)
    cached_embeddings(TEXTS, path, cache, tokenizer=tok, max_length=3, progress=False)
    cached_embeddings(TEXTS, path, cache, tokenizer=tok, key_extra="rev2", progress=False)
    own = cached_embeddings(TEXTS, path, cache, progress=False)
    assert len(calls) == 6 and len(list(cache.glob("emb-*.pt"))) == 6
    assert own.shape == first.shape
    cached_embeddings(TEXTS, path, cache, progress=False)
    assert len(calls) == 6  # hit


def test_cache_rewrites_a_file_of_the_wrong_length(tmp_path, tiny_lm):
    tok, cache = char_tokenizer(), tmp_path / "cache"
    cached_embeddings(TEXTS, tiny_lm, cache, tokenizer=tok, progress=False)
    (file,) = cache.glob("emb-*.pt")
    torch.save({"embeddings": torch.zeros(2, 64)}, file)  # a stale / foreign file under the right name
    out = cached_embeddings(TEXTS, tiny_lm, cache, tokenizer=tok, progress=False)
    assert out.shape == (len(TEXTS), 64) and out.abs().sum() > 0
    file.write_bytes(b"not a checkpoint")
    torch.testing.assert_close(cached_embeddings(TEXTS, tiny_lm, cache, tokenizer=tok, progress=False), out)
    assert cached_embeddings(TEXTS, tiny_lm, cache, tokenizer=tok, progress=False).shape == out.shape


def test_cache_from_model_object(tmp_path):
    tok, cache = char_tokenizer(), tmp_path / "cache"
    torch.manual_seed(0)
    model = Qwen2Model(tiny_config())
    a = cached_embeddings(TEXTS, model, cache, tokenizer=tok, progress=False)
    assert len(list(cache.glob("emb-*.pt"))) == 1
    torch.testing.assert_close(cached_embeddings(TEXTS, model, cache, tokenizer=tok, progress=False), a)
    assert len(list(cache.glob("emb-*.pt"))) == 1  # hit
    with torch.no_grad():
        model.embed_tokens.weight.mul_(2.0)  # other weights -> other key
    b = cached_embeddings(TEXTS, model, cache, tokenizer=tok, progress=False)
    assert len(list(cache.glob("emb-*.pt"))) == 2 and not torch.allclose(a, b)
    with pytest.raises(ValueError, match="tokenizer"):
        cached_embeddings(TEXTS, model, cache)
