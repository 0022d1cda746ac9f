"""RolloutWorker with ``score_chunks``: each chunk of whole groups is scored while the next one generates, and the
joined rollouts hold each completion with its own score, failures summed."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2
from lit_rlft.rewards import BatchedReward, Failure, RewardRunner
from lit_rlft.rollout.engines.base import SamplingConfig
from lit_rlft.rollout.engines.hf import HFEngine
from lit_rlft.rollout.source import RolloutRequest
from lit_rlft.rollout.worker import RolloutWorker
from lit_rlft.step.config import GenerationConfig

SMALL = TinyConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                   intermediate_size=128, head_dim=64)
PROMPTS = ["1 2>3=", "4 5>9=", "2 2>4=", "3 1>2=", "6 2>3=", "9 1>8="]


class Source:
    def __init__(self, tok):
        self.tok = tok

    def prompt_tokens(self, ids, split="train"):
        return [self.tok(PROMPTS[i])["input_ids"] for i in ids]

    def prompt_texts(self, ids, split="train"):
        return [PROMPTS[i] for i in ids]

    def reward_columns(self, ids, split="train"):
        return {"prompts": [PROMPTS[i] for i in ids], "answer": [int(i) for i in ids]}


class Clocked(BatchedReward):
    """Scores each completion by its length and the prompt's id; records when it scored and which rows it saw; the
    first completion of prompt 5 fails."""

    name = "clocked"

    def __init__(self, delay: float) -> None:
        self.delay, self.spans, self.seen = delay, [], []

    def score(self, completions, columns):
        start = time.perf_counter()
        time.sleep(self.delay)
        self.spans.append((start, time.perf_counter()))
        self.seen.append(list(columns["answer"]))
        tok = char_tokenizer()
        assert [tok.decode(ids, skip_special_tokens=True) for ids in columns["completion_ids"]] == completions
        answers = list(columns["answer"])
        first_of_5 = answers.index(5) if 5 in answers else -1
        return [Failure("error", "prompt 5") if k == first_of_5 else 100 * a + len(c)
                for k, (a, c) in enumerate(zip(answers, completions))]


class TimedEngine(HFEngine):
    def __init__(self):
        super().__init__()
        self.spans = []

    def generate(self, prompts, num_generations, sampling, seed=None):
        start = time.perf_counter()
        out = super().generate(prompts, num_generations, sampling, seed=seed)
        self.spans.append((start, time.perf_counter()))
        return out


def rollout(chunks: int, delay: float = 0.0):
    tok = char_tokenizer()
    engine = TimedEngine()
    engine.setup(tiny_qwen2(tok, SMALL), tok)
    reward = Clocked(delay)
    worker = RolloutWorker(engine, RewardRunner([reward], timeout_s=None, report=False), tok, score_chunks=chunks)
    torch.manual_seed(0)
    reply = worker.rollout(RolloutRequest.render(Source(tok), np.arange(6), 3, SamplingConfig(max_new_tokens=6), seed=1))
    return reply.rollouts, reply.scores, engine, reward


def test_chunks_are_scored_while_the_next_generates_and_joined_in_order():
    roll, scored, engine, reward = rollout(chunks=3, delay=0.05)
    assert len(engine.spans) == 3 and reward.seen == [[0, 0, 0, 1, 1, 1], [2, 2, 2, 3, 3, 3], [4, 4, 4, 5, 5, 5]]
    overlaps = sum(1 for s0, s1 in reward.spans for g0, g1 in engine.spans if s0 < g1 and g0 < s1)
    assert overlaps >= 1, (reward.spans, engine.spans)  # a chunk was scored while another generated
    assert threading.current_thread() is threading.main_thread()
    # every completion holds its own score, in prompt order
    ids = roll.prompt_ids.tolist()
    assert ids == list(range(6)) and roll.rewards.shape == (6, 3)
    texts = roll.completions
    for b in range(6):
        for g in range(3):
            expected = 0.0 if (b == 5 and g == 0) else 100 * b + len(texts[b * 3 + g])
            assert roll.rewards[b, g].item() == pytest.approx(expected)
    assert scored.num_errors == 1 and scored.failures == {"clocked": {"num_errors": 1}}
    mask = roll.completion_mask.bool()
    assert all(roll.completion_tokens[i][~mask[i]].eq(0).all() for i in range(18))  # joined with right padding


def test_one_chunk_is_todays_path_and_bad_settings_are_named():
    roll, scored, engine, reward = rollout(chunks=1)
    assert len(engine.spans) == 1 and len(reward.seen) == 1
    with pytest.raises(ValueError, match="score_chunks must be >= 1"):
        GenerationConfig(score_chunks=0)
    tok = char_tokenizer()
    engine = HFEngine()
    engine.setup(tiny_qwen2(tok, SMALL), tok, sharded=True)
    worker = RolloutWorker(engine, RewardRunner([Clocked(0)], timeout_s=None), tok, score_chunks=2)
    with pytest.raises(ValueError, match="unsharded"):
        worker.rollout(RolloutRequest.render(Source(tok), np.arange(2), 2, SamplingConfig(max_new_tokens=2)))
