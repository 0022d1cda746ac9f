"""RolloutWorker marks an exception raised while generating (not while scoring), type and message unchanged: the step
uses the mark to decide whether a failed rank of an FSDP2-sharded policy may join the failure gather."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_rlft.rollout.engines.base import GenerationOutput, RolloutEngine, SamplingConfig
from lit_rlft.rollout.source import RolloutRequest
from lit_rlft.rollout.worker import RolloutWorker


class _Source:
    def prompt_tokens(self, ids, split="train"):
        return [[1, 2] for _ in ids]

    def prompt_texts(self, ids, split="train"):
        return ["p" for _ in ids]

    def reward_columns(self, ids, split="train"):
        return {}


class _Tokenizer:
    pad_token_id = 0

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["c"] * len(ids)


class _Engine(RolloutEngine):
    def __init__(self, error=None):
        self.error = error

    def generate(self, prompts, num_generations, sampling, seed=None):
        if self.error is not None:
            raise self.error
        n = len(prompts) * num_generations
        return GenerationOutput(torch.ones(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long), None,
                                ["stop"] * n)


def _rollout(engine, rewards):
    worker = RolloutWorker(engine, rewards, _Tokenizer())
    return worker.rollout(RolloutRequest.render(_Source(), np.arange(2), 2, SamplingConfig(max_new_tokens=2)))


def test_an_engine_error_propagates_unchanged_and_marked_as_a_generation_failure():
    boom = RuntimeError("engine boom on rank 1")
    with pytest.raises(RuntimeError, match="engine boom on rank 1") as exc:
        _rollout(_Engine(boom), rewards=lambda texts, columns: pytest.fail("scored after a failed generation"))
    assert exc.value is boom and f"{type(exc.value).__name__}: {exc.value}" == "RuntimeError: engine boom on rank 1"
    assert RolloutWorker.failed_in_generation(exc.value)


def test_a_scoring_error_is_not_marked():
    def rewards(texts, columns):
        raise ValueError("reward function 'f' returned 0 scores")

    with pytest.raises(ValueError, match="returned 0 scores") as exc:
        _rollout(_Engine(), rewards)
    assert not RolloutWorker.failed_in_generation(exc.value)
    assert not RolloutWorker.failed_in_generation(RuntimeError("elsewhere"))
