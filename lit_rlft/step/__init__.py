"""One GRPO step without Lightning: :class:`GRPOStep` (rollout, scoring, gathering, advantages, update), built from a
:class:`GRPOConfig` by :func:`build_step`; the :class:`StepContext` callbacks work against; the updater and its
backends; what ranks share (re-exported from ``lit_rlft.core.distributed``).

A plain PyTorch loop drives it directly; ``GRPOModule`` (Trainer) and ``FabricLoop`` (Fabric) are thin adapters.
"""

from lit_rlft.core.distributed import Collective, LocalCollective, RankFailure, TorchCollective, get_collective
from lit_rlft.step.budget import RolloutBudget
from lit_rlft.step.builder import GRPOConfig, build_models, build_step
from lit_rlft.step.config import EpisodeConfig, GenerationConfig, OptimConfig
from lit_rlft.step.context import PromptData, RolloutHook, StepContext, StepOutput, StopCondition
from lit_rlft.step.grpo import GRPOStep
from lit_rlft.step.update import PolicyUpdater, TorchBackend, UpdateBackend

__all__ = ["Collective", "EpisodeConfig", "GRPOConfig", "GRPOStep", "GenerationConfig", "LocalCollective", "OptimConfig",
           "PolicyUpdater", "PromptData", "RankFailure", "RolloutBudget", "RolloutHook", "StepContext", "StepOutput",
           "StopCondition", "TorchBackend", "TorchCollective", "UpdateBackend", "build_models", "build_step",
           "get_collective"]
