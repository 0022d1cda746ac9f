"""HFEngine: grouping, EOS handling and finish reasons, chunking, opt-in behaviour log-probs, config checks."""

from __future__ import annotations

import pytest
import torch

from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2
from lit_rlft.rollout import HFEngine, RolloutEngine, SamplingConfig
from tests.conftest import TINY_SMALL


@pytest.fixture(scope="module")
def engine_parts():
    tok = char_tokenizer()
    return tiny_qwen2(tok, TinyConfig(**TINY_SMALL)), tok


def test_engine_satisfies_the_protocol(engine_parts):
    model, tok = engine_parts
    assert isinstance(HFEngine.bound(model, tok), RolloutEngine)


def test_eos_ends_a_completion_and_everything_after_is_padding(engine_parts):
    model, tok = engine_parts
    # An untrained policy at a high temperature samples EOS (about 1 in 100 tokens) at random positions:
    # over 64 completions of up to 40 tokens both finish reasons occur.
    engine = HFEngine.bound(model, tok)
    torch.manual_seed(0)
    out = engine.generate([tok("1 2>3=")["input_ids"]], 64, SamplingConfig(max_new_tokens=40, temperature=5.0))
    assert {"stop", "length"} == set(out.finish_reasons)
    for row, mask, reason in zip(out.completion_ids, out.completion_mask, out.finish_reasons):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()  # real tokens first, then padding
        assert (row[n:] == tok.pad_token_id).all()
        eos_at = (row[:n] == tok.eos_token_id).nonzero().flatten().tolist()
        if reason == "stop":
            assert eos_at == [n - 1]  # EOS is the last real token, and part of the completion
        else:
            assert eos_at == [] and n == 40


def test_groups_are_contiguous_and_chunking_changes_nothing_but_memory(engine_parts):
    model, tok = engine_parts
    prompts = [tok("1 2>3=")["input_ids"], tok("12 7 3>81=")["input_ids"]]
    sampling = SamplingConfig(max_new_tokens=5)
    torch.manual_seed(0)
    whole = HFEngine.bound(model, tok).generate(prompts, 3, sampling)
    chunked = HFEngine.bound(model, tok, max_batch_size=2).generate(prompts, 3, sampling)
    assert whole.completion_ids.shape[0] == chunked.completion_ids.shape[0] == 6
    assert len(whole.finish_reasons) == 6 and whole.logprobs is None  # log-probs are opt-in


def test_logprobs_when_asked_are_those_of_the_tempered_distribution(engine_parts):
    model, tok = engine_parts
    engine = HFEngine.bound(model, tok, return_logprobs=True)
    out = engine.generate([tok("1 2>3=")["input_ids"]], 2, SamplingConfig(max_new_tokens=4, temperature=0.5))
    assert out.logprobs.shape == out.completion_ids.shape
    assert (out.logprobs[out.completion_mask.bool()] <= 0).all()


@pytest.mark.parametrize("kwargs, option", [({"temperature": 0.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
                                            ({"max_new_tokens": 0}, "max_new_tokens"), ({"top_k": -1}, "top_k")])
def test_sampling_config_names_the_option(kwargs, option):
    with pytest.raises(ValueError, match=option):
        SamplingConfig(**kwargs)


def test_every_stop_id_of_the_generation_config_ends_a_completion(engine_parts):
    """Chat models stop on several ids (e.g. <|im_end|> and <|endoftext|>): the engine takes the whole list."""
    import copy

    model, tok = engine_parts
    model = copy.deepcopy(model)
    digit = tok.convert_tokens_to_ids("7")
    model.generation_config.eos_token_id = [tok.eos_token_id, digit]
    engine = HFEngine.bound(model, tok)
    assert engine.eos_token_ids == [tok.eos_token_id, digit]
    torch.manual_seed(0)
    out = engine.generate([tok("1 2>3=")["input_ids"]], 64, SamplingConfig(max_new_tokens=40, temperature=5.0))
    ended_on_digit = 0
    for row, mask, reason in zip(out.completion_ids, out.completion_mask, out.finish_reasons):
        n = int(mask.sum())
        stops = [i for i, t in enumerate(row[:n].tolist()) if t in (tok.eos_token_id, digit)]
        assert stops == ([n - 1] if reason == "stop" else [])
        ended_on_digit += reason == "stop" and int(row[n - 1]) == digit
    assert ended_on_digit > 0
