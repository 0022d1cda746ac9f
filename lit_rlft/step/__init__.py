"""One GRPO step without Lightning: :class:`GRPOStep` (rollout, scoring, gathering, advantages, update), built from a
:class:`GRPOConfig` by :func:`build_step`; the :class:`StepContext` callbacks work against; its rollouts over the
ranks (:class:`ShardedRollouts`, from a rollout source of any kind); the updater and its backends; what ranks share
(re-exported from ``lit_rlft.runtime.distributed``); and the one driver loop, :func:`train`.

A plain PyTorch loop and ``FabricLoop`` (Fabric) run :func:`train`; ``GRPOModule`` (Trainer) is a thin adapter.
"""

from lit_rlft.runtime.distributed import Collective, LocalCollective, RankFailure, TorchCollective, get_collective
from lit_rlft.step.budget import RolloutBudget
from lit_rlft.step.builder import build_models, build_step
from lit_rlft.step.config import AsyncConfig, EpisodeConfig, GenerationConfig, GRPOConfig, OptimConfig
from lit_rlft.step.context import PromptData, RolloutHook, StepContext, StepOutput, StopCondition
from lit_rlft.step.grpo import GRPOStep
from lit_rlft.step.loop import train
from lit_rlft.step.sharded import ShardedRollouts
from lit_rlft.step.update import PolicyUpdater, TorchBackend, UpdateBackend, UpdateOutput

__all__ = ["AsyncConfig", "Collective", "EpisodeConfig", "GRPOConfig", "GRPOStep", "GenerationConfig", "LocalCollective", "OptimConfig",
           "PolicyUpdater", "PromptData", "RankFailure", "RolloutBudget", "RolloutHook", "ShardedRollouts",
           "StepContext", "StepOutput", "StopCondition", "TorchBackend", "TorchCollective", "UpdateBackend",
           "UpdateOutput", "build_models", "build_step", "get_collective", "train"]
