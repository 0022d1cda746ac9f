"""The step's settings: where the rollouts come from is decided in one place (``GRPOConfig.rollout_kind``), the
asynchronous pipeline is its own group (``model.asynchronous``), and 0.3's ``generation.async_*`` keys in a dict (a
checkpoint's hyper-parameters) move there with a warning naming the new place."""

from __future__ import annotations

import dataclasses

import pytest

from lit_rlft.rollout import HFEngine, ServerEngine
from lit_rlft.step.config import AsyncConfig, GenerationConfig, GRPOConfig

REWARD = ["lit_rlft.rewards.countdown_reward"]


@pytest.mark.parametrize(("engine", "depth", "kind"), [
    (None, 0, "in_process"), (HFEngine(), 0, "in_process"), (None, 2, "process"), (HFEngine(), 1, "process"),
    ("servers", 0, "servers"), ("servers", 1, "servers")])
def test_the_rollout_kind_is_decided_by_the_engine_and_the_depth(engine, depth, kind):
    engine = ServerEngine(["127.0.0.1:1"]) if engine == "servers" else engine
    config = GRPOConfig(reward_funcs=REWARD, engine=engine, asynchronous=AsyncConfig(depth=depth))
    assert config.rollout_kind == kind


def test_the_builder_makes_the_source_of_the_kind():
    from lit_rlft.models.tiny import char_tokenizer
    from lit_rlft.rollout import InProcessRollouts, ProcessRollouts, ServerRollouts
    from lit_rlft.step.builder import rollout_source

    made = {}
    for kind, config in {"in_process": GRPOConfig(reward_funcs=REWARD),
                         "process": GRPOConfig(reward_funcs=REWARD, asynchronous={"depth": 1, "threads": 1}),
                         "servers": GRPOConfig(reward_funcs=REWARD, engine=ServerEngine(["127.0.0.1:1"]))}.items():
        assert config.rollout_kind == kind
        made[kind] = type(rollout_source(config, lambda c, cols: [0.0] * len(c), char_tokenizer()))
    assert made == {"in_process": InProcessRollouts, "process": ProcessRollouts, "servers": ServerRollouts}


def test_sampling_and_the_pipeline_are_apart():
    sampling = {f.name for f in dataclasses.fields(GenerationConfig)}
    assert not {name for name in sampling if name.startswith("async")}, sampling
    assert {f.name for f in dataclasses.fields(AsyncConfig)} == {"depth", "timeout_s", "threads", "device"}
    with pytest.raises(ValueError, match=r"model.asynchronous.depth must be >= 0"):
        AsyncConfig(depth=-1)
    with pytest.raises(ValueError, match=r"model.asynchronous.timeout_s must be > 0 and threads >= 1"):
        AsyncConfig(threads=0)
    assert GRPOConfig(reward_funcs=REWARD).plain()["asynchronous"] == dataclasses.asdict(AsyncConfig())


def test_0_3_async_keys_in_a_generation_dict_move_with_a_warning():
    """A checkpoint of lit_rlft 0.3 holds ``generation: {..., async_depth, async_threads, ...}``: it still loads,
    its values now in ``asynchronous``, and the warning names each new place."""
    old = {"num_generations": 4, "async_depth": 2, "async_timeout_s": 30.0, "async_threads": 1, "async_device": None}
    with pytest.warns(FutureWarning, match=r"model.generation.async_depth moved to model.asynchronous.depth"):
        config = GRPOConfig(reward_funcs=REWARD, generation=old)
    assert config.generation == GenerationConfig(num_generations=4)
    assert config.asynchronous == AsyncConfig(depth=2, timeout_s=30.0, threads=1)
    assert config.rollout_kind == "process"
    with pytest.warns(FutureWarning):  # a value given in the new group too wins over the old key
        config = GRPOConfig(reward_funcs=REWARD, generation={"async_depth": 2}, asynchronous={"depth": 3})
    assert config.asynchronous.depth == 3
