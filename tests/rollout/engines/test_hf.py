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


# -- token-budget chunks (max_batch_tokens) ---------------------------------------------------------------------------
from lit_rlft.rollout.engines.hf import plan_chunks  # noqa: E402
from lit_rlft.runtime.distributed import split_to  # noqa: E402

PROMPTS = ["1 2>3=", "12 7 3>81=", "4 5>9=", "13 11 2 9>99=", "3>3=", "10 5 6>21="]


def test_token_chunks_respect_the_budget_and_cover_every_row_once_longest_first():
    lengths = [3, 9, 9, 1, 5, 5, 5, 12, 2, 2]
    for budget, cap in [(40, None), (60, 3), (1, None), (10_000, 4), (10_000, None)]:
        chunks = plan_chunks(lengths, 8, budget, cap)
        assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
        flat = [lengths[i] for c in chunks for i in c]
        assert flat == sorted(lengths, reverse=True)  # longest first
        for c in chunks:
            assert len(c) == 1 or len(c) * (max(lengths[i] for i in c) + 8) <= budget
            assert cap is None or len(c) <= cap
    # equal lengths keep their order, so a group's rows stay together and in order
    assert plan_chunks([4, 4, 4, 7, 7, 7], 2, 1000) == [[3, 4, 5, 0, 1, 2]]
    assert plan_chunks([4] * 6, 2, 12) == [[0, 1], [2, 3], [4, 5]]


def test_split_to_reaches_the_count_within_the_budget():
    chunks = plan_chunks([5, 5, 5, 5, 3, 3], 3, 32)  # 4 x 8 = 32, then 2 x 6
    assert chunks == [[0, 1, 2, 3], [4, 5]]
    assert split_to(chunks, 2) == chunks
    more = split_to(chunks, 4)
    assert len(more) == 4 and sorted(i for c in more for i in c) == list(range(6))
    assert all(len(c) <= 2 for c in more)
    assert split_to([[0]], 3) == [[0], [], []]


def _rows(tok, prompts: list[str]) -> list[list[int]]:
    return [tok(p)["input_ids"] for p in prompts]


@pytest.fixture(scope="module")
def peaked(engine_parts):
    """The tiny policy with large random weights: its greedy completions depend on the prompt (an untrained one
    repeats one token whatever the prompt)."""
    import copy

    model, tok = engine_parts
    model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model, tok


def test_token_chunks_give_the_greedy_completions_of_the_whole_batch_in_the_original_order(peaked):
    """top_k=1 (greedy): chunked-by-tokens generation equals one call over the whole batch and per-prompt calls,
    completion ids, masks, finish reasons and log-probs, row for row in the caller's order."""
    model, tok = peaked
    prompts = _rows(tok, PROMPTS)
    sampling = SamplingConfig(max_new_tokens=12, top_k=1)
    whole = HFEngine.bound(model, tok, return_logprobs=True).generate(prompts, 2, sampling)
    engine = HFEngine.bound(model, tok, return_logprobs=True, max_batch_tokens=3 * (16 + 12))
    chunks = plan_chunks([len(p) for p in prompts for _ in range(2)], 12, engine.max_batch_tokens)
    assert len(chunks) >= 3  # really chunked
    chunked = engine.generate(prompts, 2, sampling)
    assert torch.equal(whole.completion_ids, chunked.completion_ids)
    assert torch.equal(whole.completion_mask, chunked.completion_mask)
    assert whole.finish_reasons == chunked.finish_reasons
    torch.testing.assert_close(whole.logprobs, chunked.logprobs, rtol=0, atol=1e-5)
    alone = [HFEngine.bound(model, tok).generate([p], 1, sampling) for p in prompts]
    for i, one in enumerate(alone):  # rows 2i, 2i+1 belong to prompt i
        n = one.completion_ids.shape[1]
        for row in (2 * i, 2 * i + 1):
            assert torch.equal(chunked.completion_ids[row, :n], one.completion_ids[0])
            assert chunked.finish_reasons[row] == one.finish_reasons[0]
    assert len({tuple(r.tolist()) for r in chunked.completion_ids[::2]}) > 1  # the prompts do differ


def test_token_chunks_are_reproducible_with_a_fixed_seed_and_keep_the_output_contract(engine_parts):
    model, tok = engine_parts
    prompts = _rows(tok, PROMPTS)
    engine = HFEngine.bound(model, tok, max_batch_tokens=100, max_batch_size=3)
    sampling = SamplingConfig(max_new_tokens=20, temperature=3.0)
    torch.manual_seed(7)
    a = engine.generate(prompts, 4, sampling)
    torch.manual_seed(7)
    b = engine.generate(prompts, 4, sampling)
    assert torch.equal(a.completion_ids, b.completion_ids) and a.finish_reasons == b.finish_reasons
    assert a.completion_ids.shape[0] == len(a.finish_reasons) == 24 and a.logprobs is None
    for row, mask, reason in zip(a.completion_ids, a.completion_mask, a.finish_reasons):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any() and (row[n:] == tok.pad_token_id).all()
        assert (reason == "stop") == (int(row[n - 1]) == tok.eos_token_id)
        assert reason == "stop" or n == 20
    assert a.completion_ids.shape[1] == int(a.completion_mask.sum(1).max())  # no all-padding columns


#: What HFEngine(max_batch_size=5) sampled here at commit 65b160e (before token-budget chunks and dropping finished
#: rows), with torch.manual_seed(3): the same script gives the same ids on that commit and this one.
BEFORE = [[32, 65, 80, 11, 49, 66], [92, 9, 96, 12, 64, 63], [48, 55, 17, 21, 62, 80], [1, 0, 0, 0, 0, 0],
          [78, 80, 71, 54, 40, 80], [86, 11, 40, 43, 64, 73], [61, 92, 19, 22, 63, 63], [33, 9, 86, 71, 51, 88],
          [95, 31, 91, 67, 25, 40], [69, 3, 76, 97, 80, 53], [76, 9, 59, 41, 10, 81], [5, 95, 43, 42, 22, 88]]


def test_with_the_options_off_the_engine_samples_what_it_sampled_before(engine_parts):
    model, tok = engine_parts
    prompts = _rows(tok, PROMPTS)
    torch.manual_seed(3)
    out = HFEngine.bound(model, tok, max_batch_size=5).generate(prompts, 2, SamplingConfig(max_new_tokens=6))
    assert out.completion_ids.tolist() == BEFORE


def test_max_batch_tokens_is_checked():
    with pytest.raises(ValueError, match="max_batch_tokens"):
        HFEngine(max_batch_tokens=0)


# -- dropping rows that have stopped (drop_finished_every) --------------------------------------------------------------
@pytest.fixture(scope="module")
def stopping(peaked):
    """The peaked policy made to stop: EOS scores a little above the token it greedily repeats most, so greedy
    completions stop at prompt-dependent lengths (some run to the limit)."""
    import collections
    import copy

    model, tok = peaked
    model = copy.deepcopy(model)
    out = HFEngine.bound(model, tok).generate(_rows(tok, PROMPTS), 1, SamplingConfig(max_new_tokens=30, top_k=1))
    counts = collections.Counter(out.completion_ids.flatten().tolist())
    common = counts.most_common(2)[1][0]
    with torch.no_grad():
        weight = model.get_output_embeddings().weight
        weight[tok.eos_token_id] = weight[common] * 1.02
    return model, tok


def test_dropping_stopped_rows_gives_the_greedy_completions_of_one_call(stopping):
    model, tok = stopping
    prompts = _rows(tok, PROMPTS)
    sampling = SamplingConfig(max_new_tokens=24, top_k=1)
    whole = HFEngine.bound(model, tok, return_logprobs=True).generate(prompts, 2, sampling)
    lengths = whole.completion_mask.sum(1)
    assert "stop" in whole.finish_reasons and len(set(lengths.tolist())) >= 3  # rows stop at different lengths
    for window in (1, 5, 24, 100):
        for tokens in (None, 60):
            engine = HFEngine.bound(model, tok, return_logprobs=True, drop_finished_every=window,
                                    max_batch_tokens=tokens)
            out = engine.generate(prompts, 2, sampling)
            assert torch.equal(out.completion_ids, whole.completion_ids), (window, tokens)
            assert torch.equal(out.completion_mask, whole.completion_mask)
            assert out.finish_reasons == whole.finish_reasons
            torch.testing.assert_close(out.logprobs, whole.logprobs, rtol=0, atol=1e-5)


def test_dropping_stopped_rows_is_reproducible_and_keeps_the_output_contract(engine_parts):
    model, tok = engine_parts
    prompts = _rows(tok, PROMPTS)
    engine = HFEngine.bound(model, tok, drop_finished_every=4, return_logprobs=True)
    sampling = SamplingConfig(max_new_tokens=30, temperature=5.0)  # EOS at random positions
    torch.manual_seed(11)
    a = engine.generate(prompts, 8, sampling)
    torch.manual_seed(11)
    b = engine.generate(prompts, 8, sampling)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)
    assert {"stop", "length"} == set(a.finish_reasons)
    for row, mask, lp, reason in zip(a.completion_ids, a.completion_mask, a.logprobs, a.finish_reasons):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any() and (row[n:] == tok.pad_token_id).all()
        assert (lp[:n] <= 0).all() and (lp[n:] == 0).all()
        assert (reason == "stop") == (int(row[n - 1]) == tok.eos_token_id) and (reason == "stop" or n == 30)
    with pytest.raises(ValueError, match="drop_finished_every"):
        HFEngine(drop_finished_every=0)


def _sharded_rank(rank: int, port: int, out_dir: str) -> None:
    """One of two gloo ranks generating with ``sharded=True`` (synced_gpus) and token chunks, from prompts of other
    lengths than the other rank's, so that the two plans have different numbers of chunks; then dropping stopped rows,
    rank 0 with few short completions, rank 1 with many long ones, so that their numbers of windows differ."""
    import torch.distributed as dist

    from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        tok = char_tokenizer()
        torch.manual_seed(0)
        model = tiny_qwen2(tok, TinyConfig(**TINY_SMALL))
        engine = HFEngine(max_batch_tokens=2 * (14 + 6))
        engine.setup(model, tok, sharded=True)
        prompts = _rows(tok, PROMPTS[:2] if rank == 0 else PROMPTS)
        torch.manual_seed(rank)
        out = engine.generate(prompts, 2, SamplingConfig(max_new_tokens=6))
        dropping = HFEngine(drop_finished_every=3, max_batch_tokens=60)
        dropping.setup(model, tok, sharded=True)
        # rank 0: EOS is likely at temperature 5 (stops within a window or two); rank 1: 40 tokens at temperature 1
        sampling = SamplingConfig(max_new_tokens=4 if rank == 0 else 40, temperature=5.0 if rank == 0 else 1.0)
        dropped = dropping.generate(prompts, 2, sampling)
        torch.save({"rows": out.completion_ids.shape[0], "reasons": out.finish_reasons,
                    "chunks": len(plan_chunks([len(p) for p in prompts for _ in range(2)], 6, 40)),
                    "dropped_rows": dropped.completion_ids.shape[0], "dropped_width": dropped.completion_ids.shape[1]},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_sharded_ranks_agree_on_the_number_of_generate_calls(tmp_path):
    """Under FSDP every generate call is a collective: two ranks whose own plans (token chunks, windows of dropped
    rows) differ in length still finish."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_sharded_rank, args=(port, str(tmp_path)), nprocs=2, start_method="spawn", join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert (r0["rows"], r1["rows"]) == (4, 12) and len(r1["reasons"]) == 12
    assert r0["chunks"] < r1["chunks"]  # the plans did differ; the smaller one was split (or padded) to match
    assert (r0["dropped_rows"], r1["dropped_rows"]) == (4, 12)
    assert r0["dropped_width"] <= 4 < r1["dropped_width"]  # rank 0 stopped windows before rank 1


# -- log-probs per decode step, and the shared prefill ----------------------------------------------------------------
def _rescored(model, prompt: list[int], completion: list[int], sampling: SamplingConfig) -> torch.Tensor:
    """The log-probs of ``completion`` after ``prompt`` under the tempered, top-k and top-p filtered distribution,
    from one forward pass of the policy (transformers' own warpers applied to its logits)."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # [L, V]
    out = []
    for t, token in enumerate(completion):
        scores = logits[t : t + 1]
        for warper in (TemperatureLogitsWarper(sampling.temperature), TopKLogitsWarper(sampling.top_k),
                       TopPLogitsWarper(sampling.top_p)):
            scores = warper(ids[:, : len(prompt) + t], scores)
        out.append(torch.log_softmax(scores, dim=-1)[0, token])
    return torch.stack(out)


@pytest.mark.parametrize("options", [{}, {"drop_finished_every": 3}, {"shared_prefill": False}])
def test_logprobs_are_those_of_the_distribution_each_token_was_drawn_from(peaked, options):
    """Gathered one decode step at a time (never [n, L, V]), they equal a rescoring forward pass under the same
    temperature, top-k and top-p, token for token."""
    model, tok = peaked
    sampling = SamplingConfig(max_new_tokens=10, temperature=0.7, top_k=20, top_p=0.9)
    prompts = _rows(tok, PROMPTS[:3])
    torch.manual_seed(5)
    out = HFEngine.bound(model, tok, return_logprobs=True, **options).generate(prompts, 3, sampling)
    for row in range(out.completion_ids.shape[0]):
        n = int(out.completion_mask[row].sum())
        expected = _rescored(model, prompts[row // 3], out.completion_ids[row, :n].tolist(), sampling)
        # the peaked policy's logits are large (tens); the rescoring pass is unpadded and without a cache
        torch.testing.assert_close(out.logprobs[row, :n], expected, rtol=1e-4, atol=1e-4)
        assert (out.logprobs[row, n:] == 0).all()


@pytest.mark.parametrize("options", [{}, {"max_batch_size": 5}, {"max_batch_tokens": 60}, {"drop_finished_every": 4}])
def test_the_shared_prefill_samples_the_same_tokens_and_logprobs(engine_parts, options):
    """Same seed, prefilled once per group or once per row: the same completions, finish reasons and log-probs
    (within 1e-5: the prompt's last position is computed over the shared cache instead of inside the prompt's
    pass). ``max_batch_size=5`` cuts groups of 4 across calls; one-token prompts get a padding column."""
    model, tok = engine_parts
    prompts = _rows(tok, PROMPTS) + [[tok.convert_tokens_to_ids("7")]]
    sampling = SamplingConfig(max_new_tokens=16, temperature=3.0)  # EOS at random positions
    outs = []
    for shared in (False, True):
        torch.manual_seed(13)
        engine = HFEngine.bound(model, tok, return_logprobs=True, shared_prefill=shared, **options)
        outs.append(engine.generate(prompts, 4, sampling))
    per_row, shared = outs
    assert torch.equal(per_row.completion_ids, shared.completion_ids)
    assert per_row.finish_reasons == shared.finish_reasons
    torch.testing.assert_close(per_row.logprobs, shared.logprobs, rtol=0, atol=1e-5)


def test_the_shared_prefill_computes_each_prompt_once(engine_parts):
    """The prefill forward sees each group's prompt once (all but its last token), then generate goes on from it."""
    model, tok = engine_parts
    prompts = _rows(tok, PROMPTS[:2])
    seen = []
    hook = model.model.register_forward_pre_hook(lambda _m, args, kw: seen.append(tuple(kw["input_ids"].shape)),
                                                 with_kwargs=True)
    try:
        HFEngine.bound(model, tok).generate(prompts, 8, SamplingConfig(max_new_tokens=3))
    finally:
        hook.remove()
    width = max(len(p) for p in prompts)
    assert seen[0] == (2, width - 1)  # the prefill: 2 prompts, not 16 rows
    assert seen[1] == (16, 1)  # then the last prompt token of every row, over the shared cache


_MEMORY_SCRIPT = """
import resource, sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from lit_rlft.models.tiny import char_tokenizer
from lit_rlft.rollout import HFEngine, SamplingConfig
torch.set_num_threads(1)
vocab, rows, length = 32768, 64, 1024
config = Qwen2Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
                     num_key_value_heads=1, head_dim=32, intermediate_size=64, max_position_embeddings=2048)
torch.manual_seed(0)
model = Qwen2ForCausalLM(config).eval()
tok = char_tokenizer()
engine = HFEngine.bound(model, tok, return_logprobs=True)
engine.eos_token_ids = [vocab - 1]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = engine.generate([[5, 6, 7, 8]], rows, SamplingConfig(max_new_tokens=length))
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(tuple(out.logprobs.shape), int(out.completion_mask.sum()), grown * 1024)
"""


def test_logprobs_of_a_long_generation_over_a_large_vocabulary_cost_no_vocabulary_sized_memory():
    """64 x 1,024 tokens over a 32,768-token vocabulary: generate's stacked scores would be 64 x 1,024 x 32,768
    float32 = 8.6 GB; gathered per step, the peak grows by the KV cache (16 MiB here) and a few [64, V] steps
    (about 110 MiB measured; 1.6 GiB when each step's log-probs were a tensor of their own, from heap fragmentation)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    shape, tokens, grown = out.stdout.split(")")[0] + ")", *out.stdout.split(")")[1].split()
    assert shape == "(64, 1024)" and int(tokens) > 60 * 1024  # (almost) every row ran to the end
    assert int(grown) < 512 * 2**20, f"peak memory grew by {int(grown) / 2**20:.0f} MiB"
