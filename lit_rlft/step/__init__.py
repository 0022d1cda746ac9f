"""One GRPO step without Lightning: :class:`GRPOStep` (rollout, scoring, gathering, advantages, update), the
:class:`StepContext` callbacks work against, the updater and its backends, and what ranks share.

A plain PyTorch loop drives it directly; ``GRPOModule`` (Trainer) and ``FabricLoop`` (Fabric) are thin adapters.
"""

from lit_rlft.core.distributed import Collective, LocalCollective, RankFailure, TorchCollective, get_collective
from lit_rlft.step.budget import RolloutBudget
from lit_rlft.step.config import GenerationConfig, OptimConfig
from lit_rlft.step.context import PromptData, RolloutHook, StepContext, StepOutput
from lit_rlft.step.grpo import GRPOStep
from lit_rlft.step.update import PolicyUpdater, TorchBackend, UpdateBackend

__all__ = ["Collective", "GRPOStep", "GenerationConfig", "LocalCollective", "OptimConfig", "PolicyUpdater",
           "PromptData", "RankFailure", "RolloutBudget", "RolloutHook", "StepContext", "StepOutput", "TorchBackend",
           "TorchCollective", "UpdateBackend", "get_collective"]
