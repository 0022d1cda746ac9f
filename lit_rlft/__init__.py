"""lit_rlft: data-efficient reinforcement fine-tuning of LLMs on PyTorch Lightning.

GRPO with rollout replay as one Lightning-free step (``lit_rlft.step``, built from a ``GRPOConfig``) driven by a
LightningModule, a Fabric loop or a plain PyTorch loop;
online data selection (DOTS, DPS, MoPPS, GRESO, dynamic sampling, history resampling) and replay as composable
Lightning callbacks; multi-turn episodes with tools and environments (``lit_rlft.envs``)::

    from lit_rlft import DPSCallback, GRPOModule, PromptDataModule, ReplayCallback
"""

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

__version__ = "0.3.0"

__all__ = [
    "AllocationCallback", "ArithmeticTask", "BatchCompositionLogger", "BatchPlan", "CompletionLogger", "CountdownTask", "DOTSCallback",
    "DPSCallback", "DifficultyPredictorConfig", "DynamicSamplingCallback", "EnvStep", "Environment", "EpisodeConfig",
    "FabricLoop", "GuessNumberEnv", "GuessNumberTask", "ToolEnvironment", "GRESOCallback", "GRPOLoss",
    "GRPOConfig", "GRPOModule", "GRPOStep", "GenerationConfig", "HFEngine", "HistoryResamplingCallback", "MoPPSCallback", "LoRAConfig", "OptimConfig", "OutcomeRecord", "PolicyUpdater", "PromptDataModule",
    "ReplayCallback", "RewardRunner", "RolloutBudgetStop", "RolloutEngine", "RolloutHook", "RolloutWorker",
    "Rollouts", "SamplingConfig", "ScreeningCallback", "SelectionCallback", "SequentialSamplingCallback", "StepContext", "StepOutput", "StopCondition", "SuccessRateRecorder", "TinyConfig", "TorchBackend", "UniformHandbackCallback",
    "__version__", "build_models", "build_step", "fsdp2_parallelize",
]
