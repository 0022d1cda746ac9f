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

#: The one list of public names: ``_EXPORTS``' keys (the eager imports below, for static analysers, are checked
#: against it by tests/test_lazy_exports.py).
__all__ = ["__version__", *sorted(_EXPORTS)]


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


if TYPE_CHECKING:  # what static analysers and IDEs see: the eager imports (``X as X``: re-exported)
    from lit_rlft.callbacks import (
        AllocationCallback as AllocationCallback,
        BatchCompositionLogger as BatchCompositionLogger,
        CompletionLogger as CompletionLogger,
        DifficultyPredictorConfig as DifficultyPredictorConfig,
        DOTSCallback as DOTSCallback,
        DPSCallback as DPSCallback,
        DynamicSamplingCallback as DynamicSamplingCallback,
        GRESOCallback as GRESOCallback,
        HistoryResamplingCallback as HistoryResamplingCallback,
        MoPPSCallback as MoPPSCallback,
        ReplayCallback as ReplayCallback,
        RolloutBudgetStop as RolloutBudgetStop,
        RolloutHook as RolloutHook,
        ScreeningCallback as ScreeningCallback,
        SelectionCallback as SelectionCallback,
        SequentialSamplingCallback as SequentialSamplingCallback,
        SuccessRateRecorder as SuccessRateRecorder,
        UniformHandbackCallback as UniformHandbackCallback,
    )
    from lit_rlft.core.losses import (
        GRPOLoss as GRPOLoss,
    )
    from lit_rlft.core.types import (
        OutcomeRecord as OutcomeRecord,
        Rollouts as Rollouts,
    )
    from lit_rlft.data import (
        ArithmeticTask as ArithmeticTask,
        BatchPlan as BatchPlan,
        CountdownTask as CountdownTask,
        PromptDataModule as PromptDataModule,
    )
    from lit_rlft.envs import (
        Environment as Environment,
        EnvStep as EnvStep,
        GuessNumberEnv as GuessNumberEnv,
        GuessNumberTask as GuessNumberTask,
        ToolEnvironment as ToolEnvironment,
    )
    from lit_rlft.lightning.fabric import (
        FabricLoop as FabricLoop,
        fsdp2_parallelize as fsdp2_parallelize,
    )
    from lit_rlft.lightning.module import (
        GRPOModule as GRPOModule,
    )
    from lit_rlft.models import (
        LoRAConfig as LoRAConfig,
        TinyConfig as TinyConfig,
    )
    from lit_rlft.rewards.runner import (
        RewardRunner as RewardRunner,
    )
    from lit_rlft.rollout import (
        HFEngine as HFEngine,
        RolloutEngine as RolloutEngine,
        RolloutWorker as RolloutWorker,
        SamplingConfig as SamplingConfig,
    )
    from lit_rlft.step import (
        AsyncConfig as AsyncConfig,
        EpisodeConfig as EpisodeConfig,
        GenerationConfig as GenerationConfig,
        GRPOConfig as GRPOConfig,
        GRPOStep as GRPOStep,
        OptimConfig as OptimConfig,
        StepContext as StepContext,
        StepOutput as StepOutput,
        StopCondition as StopCondition,
        build_models as build_models,
        build_step as build_step,
    )
    from lit_rlft.step.update import (
        PolicyUpdater as PolicyUpdater,
        TorchBackend as TorchBackend,
    )
