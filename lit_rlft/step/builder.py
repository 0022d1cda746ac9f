"""Building a GRPO step from its settings, without Lightning: one :class:`GRPOConfig` (model, tiny, dtype, lora,
engine, rewards, generation, loss, optim) -> the policy, the frozen reference and the :class:`~lit_rlft.step.grpo.GRPOStep`.

    config = GRPOConfig(model="tiny", reward_funcs=["lit_rlft.rewards.countdown_reward"])
    step = build_step(config)                   # tokenizer, rollout source, reward runner; the policy attached
    step = build_step(config, models=False)     # the policy later: step.attach(*build_models(config, mesh))

``GRPOModule`` builds the step in ``__init__`` and the models in ``configure_model`` (under the Trainer's FSDP2
mesh); ``FabricLoop`` builds the models for Fabric to wrap, then attaches them; a plain loop calls
``build_step(config)``. Nothing here needs Lightning.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from lit_rlft.envs.formats import observation_format
from lit_rlft.models.loading import build_policy, load_tokenizer_for
from lit_rlft.rewards.runner import RewardRunner, resolve_reward
from lit_rlft.rewards.scorer import Scorer
from lit_rlft.rollout.engines.hf import HFEngine
from lit_rlft.rollout.episodes import EpisodeRunner
from lit_rlft.rollout.in_process import InProcessRollouts
from lit_rlft.rollout.process import ProcessRollouts
from lit_rlft.rollout.servers.source import ServerRollouts
from lit_rlft.rollout.source import RolloutSource
from lit_rlft.rollout.worker import RolloutWorker
from lit_rlft.step.config import GRPOConfig
from lit_rlft.step.grpo import GRPOStep

__all__ = ["build_models", "build_step", "episode_runner", "rollout_source"]


def build_step(config: GRPOConfig, models: bool = True, mesh: Any = None) -> GRPOStep:
    """The :class:`GRPOStep` of ``config``: its tokenizer, its rollout source (the engine and the reward runner in this
    process, or, with ``asynchronous.depth > 0``, a generation process beside it; worker processes start on first
    use), and, with ``models``, the policy and reference (:func:`build_models`, sharded over ``mesh``) attached, which
    sets the engine up. ``step.config`` keeps ``config``."""
    scorer = RewardRunner([resolve_reward(f) for f in config.reward_funcs], weights=config.reward_weights,
                           timeout_s=config.reward_timeout_s, num_workers=config.reward_workers)
    tokenizer = load_tokenizer_for(config.model)
    step = GRPOStep(rollout_source(config, scorer, tokenizer), tokenizer, generation=config.generation,
                    asynchronous=config.asynchronous, loss=config.loss, optim=config.optim,
                    scale_rewards=config.scale_rewards, tools=config.environment.tool_schemas() if config.environment is not None else ())
    step.config = config
    if models:
        step.attach(*build_models(config, mesh))
    return step


def rollout_source(config: GRPOConfig, scorer: Scorer, tokenizer: Any) -> RolloutSource:
    """Where the step's rollouts come from, by :attr:`GRPOConfig.rollout_kind`: generation servers (``servers``: the
    engine a :class:`~lit_rlft.rollout.servers.ServerEngine`, at any depth), the engine in this process (``in_process``) or a generation
    process with its own copy of the policy (``process``: ``asynchronous.depth > 0``)."""
    engine = config.engine if config.engine is not None else HFEngine()
    episodes = episode_runner(config, tokenizer)
    kind = config.rollout_kind
    if kind == "process":  # the worker is built in the generation process, from these settings
        a = config.asynchronous
        policy = functools.partial(generation_policy, config.model, config.dtype, config.tiny, config.lora)
        return ProcessRollouts(policy, engine, scorer, tokenizer, config.success_threshold, episodes,
                               threads=a.threads, device=a.device, timeout_s=a.timeout_s)
    worker = RolloutWorker(engine, scorer, tokenizer, config.success_threshold, config.generation.score_chunks,
                           episodes=episodes)
    return (ServerRollouts if kind == "servers" else InProcessRollouts)(worker, tokenizer)


def generation_policy(model: str, dtype: str, tiny: Any, lora: Any) -> nn.Module:
    """The policy a generation process samples with: built as the trainer's (model, dtype, size, LoRA), without a
    reference and unsharded (its weights are the trainer's, pushed to it)."""
    return build_policy(model, dtype, tiny, lora, reference=False)[0]


def episode_runner(config: GRPOConfig, tokenizer: Any) -> EpisodeRunner | None:
    """The multi-turn episode runner of ``config`` (its ``environment`` and ``episodes`` limits); None without an
    environment. A generation process gets a copy of it (with environment workers of its own)."""
    if config.environment is None:
        return None
    env, ep = config.environment, config.episodes
    return EpisodeRunner(env, tokenizer, observation_format(ep.observation_format, tokenizer, env.tool_schemas()),
                         max_turns=ep.max_turns, max_tokens=ep.max_tokens, timeout_s=ep.timeout_s,
                         num_workers=ep.num_workers)


def build_models(config: GRPOConfig, mesh: Any = None) -> tuple[nn.Module, nn.Module | None]:
    """``(policy, reference)``: the policy to train (LoRA-wrapped, checkpointed as configured) and, for a KL term
    (``loss.beta > 0``) in full fine-tuning, a frozen copy (with LoRA the reference is the base model with the
    adapters disabled: None). ``mesh``: a 1-D data-parallel mesh to shard both with FSDP2."""
    return build_policy(config.model, config.dtype, config.tiny, config.lora, reference=config.loss.beta > 0,
                        mesh=mesh, gradient_checkpointing=config.optim.gradient_checkpointing)
