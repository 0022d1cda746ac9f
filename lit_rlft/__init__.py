"""lit_rlft: data-efficient reinforcement fine-tuning of LLMs on PyTorch Lightning.

GRPO with rollout replay as one Lightning-free step (``lit_rlft.step``, built from a ``GRPOConfig``) driven by a
LightningModule, a Fabric loop or a plain PyTorch loop;
online data selection (DOTS, DPS, MoPPS, GRESO, dynamic sampling, history resampling) and replay as composable
Lightning callbacks; multi-turn episodes with tools and environments (``lit_rlft.envs``)::

    from lit_rlft import DPSCallback, GRPOModule, PromptDataModule, ReplayCallback

Every name below is imported on first use (PEP 562), so ``import lit_rlft`` imports neither Lightning nor torch's
heavier parts: a rollout worker, reward worker or server process that imports ``lit_rlft`` does not pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.3.0"

#: Each public name and the module it lives in.
_EXPORTS: dict[str, str] = {
    "AllocationCallback": "lit_rlft.callbacks",
    "BatchCompositionLogger": "lit_rlft.callbacks",
    "CompletionLogger": "lit_rlft.callbacks",
    "DifficultyPredictorConfig": "lit_rlft.callbacks",
    "DOTSCallback": "lit_rlft.callbacks",
    "DPSCallback": "lit_rlft.callbacks",
    "DynamicSamplingCallback": "lit_rlft.callbacks",
    "GRESOCallback": "lit_rlft.callbacks",
    "HistoryResamplingCallback": "lit_rlft.callbacks",
    "MoPPSCallback": "lit_rlft.callbacks",
    "ReplayCallback": "lit_rlft.callbacks",
    "RolloutBudgetStop": "lit_rlft.callbacks",
    "RolloutHook": "lit_rlft.callbacks",
    "ScreeningCallback": "lit_rlft.callbacks",
    "SelectionCallback": "lit_rlft.callbacks",
    "SequentialSamplingCallback": "lit_rlft.callbacks",
    "SuccessRateRecorder": "lit_rlft.callbacks",
    "UniformHandbackCallback": "lit_rlft.callbacks",
    "GRPOLoss": "lit_rlft.core.losses",
    "OutcomeRecord": "lit_rlft.core.types",
    "Rollouts": "lit_rlft.core.types",
    "ArithmeticTask": "lit_rlft.data",
    "BatchPlan": "lit_rlft.data",
    "CountdownTask": "lit_rlft.data",
    "PromptDataModule": "lit_rlft.data",
    "Environment": "lit_rlft.envs",
    "EnvStep": "lit_rlft.envs",
    "GuessNumberEnv": "lit_rlft.envs",
    "GuessNumberTask": "lit_rlft.envs",
    "ToolEnvironment": "lit_rlft.envs",
    "FabricLoop": "lit_rlft.lightning.fabric",
    "fsdp2_parallelize": "lit_rlft.lightning.fabric",
    "GRPOModule": "lit_rlft.lightning.module",
    "LoRAConfig": "lit_rlft.models",
    "TinyConfig": "lit_rlft.models",
    "RewardRunner": "lit_rlft.rewards.runner",
    "HFEngine": "lit_rlft.rollout",
    "RolloutEngine": "lit_rlft.rollout",
    "RolloutWorker": "lit_rlft.rollout",
    "SamplingConfig": "lit_rlft.rollout",
    "AsyncConfig": "lit_rlft.step",
    "EpisodeConfig": "lit_rlft.step",
    "GenerationConfig": "lit_rlft.step",
    "GRPOConfig": "lit_rlft.step",
    "GRPOStep": "lit_rlft.step",
    "OptimConfig": "lit_rlft.step",
    "StepContext": "lit_rlft.step",
    "StepOutput": "lit_rlft.step",
    "StopCondition": "lit_rlft.step",
    "build_models": "lit_rlft.step",
    "build_step": "lit_rlft.step",
    "PolicyUpdater": "lit_rlft.step.update",
    "TorchBackend": "lit_rlft.step.update",
}

__all__ = [
    "AllocationCallback", "ArithmeticTask", "AsyncConfig", "BatchCompositionLogger", "BatchPlan", "CompletionLogger", "CountdownTask", "DOTSCallback",
    "DPSCallback", "DifficultyPredictorConfig", "DynamicSamplingCallback", "EnvStep", "Environment", "EpisodeConfig",
    "FabricLoop", "GuessNumberEnv", "GuessNumberTask", "ToolEnvironment", "GRESOCallback", "GRPOLoss",
    "GRPOConfig", "GRPOModule", "GRPOStep", "GenerationConfig", "HFEngine", "HistoryResamplingCallback", "MoPPSCallback", "LoRAConfig", "OptimConfig", "OutcomeRecord", "PolicyUpdater", "PromptDataModule",
    "ReplayCallback", "RewardRunner", "RolloutBudgetStop", "RolloutEngine", "RolloutHook", "RolloutWorker",
    "Rollouts", "SamplingConfig", "ScreeningCallback", "SelectionCallback", "SequentialSamplingCallback", "StepContext", "StepOutput", "StopCondition", "SuccessRateRecorder", "TinyConfig", "TorchBackend", "UniformHandbackCallback",
    "__version__", "build_models", "build_step", "fsdp2_parallelize",
]


def __getattr__(name: str) -> Any:
    """Import ``name``'s module on first use and cache the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lit_rlft' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what static analysers and IDEs see: the eager imports
    from lit_rlft.callbacks import (
        AllocationCallback,
        BatchCompositionLogger,
        CompletionLogger,
        DifficultyPredictorConfig,
        DOTSCallback,
        DPSCallback,
        DynamicSamplingCallback,
        GRESOCallback,
        HistoryResamplingCallback,
        MoPPSCallback,
        ReplayCallback,
        RolloutBudgetStop,
        RolloutHook,
        ScreeningCallback,
        SelectionCallback,
        SequentialSamplingCallback,
        SuccessRateRecorder,
        UniformHandbackCallback,
    )
    from lit_rlft.core.losses import GRPOLoss
    from lit_rlft.core.types import OutcomeRecord, Rollouts
    from lit_rlft.data import ArithmeticTask, BatchPlan, CountdownTask, PromptDataModule
    from lit_rlft.envs import Environment, EnvStep, GuessNumberEnv, GuessNumberTask, ToolEnvironment
    from lit_rlft.lightning.fabric import FabricLoop, fsdp2_parallelize
    from lit_rlft.lightning.module import GRPOModule
    from lit_rlft.models import LoRAConfig, TinyConfig
    from lit_rlft.rewards.runner import RewardRunner
    from lit_rlft.rollout import HFEngine, RolloutEngine, RolloutWorker, SamplingConfig
    from lit_rlft.step import (
        AsyncConfig,
        EpisodeConfig,
        GenerationConfig,
        GRPOConfig,
        GRPOStep,
        OptimConfig,
        StepContext,
        StepOutput,
        StopCondition,
        build_models,
        build_step,
    )
    from lit_rlft.step.update import PolicyUpdater, TorchBackend
