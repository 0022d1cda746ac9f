"""Lightning callbacks: thin adapters from Lightning hooks to the Lightning-free cores in ``lit_rlft.selection``.

Selection callbacks (``DPSCallback``, ``DOTSCallback``, ``HistoryResamplingCallback``) write the next step's
prompts into the datamodule's batch plan from ``on_train_batch_end``; rollout hooks (``DynamicSamplingCallback``,
``ScreeningCallback``, ``SequentialSamplingCallback``, ``AllocationCallback``, ``ReplayCallback``) reshape a step's rollout batch inside ``training_step``. They compose in one
Trainer.
"""

from lit_rlft.callbacks.allocation import AllocationCallback
from lit_rlft.callbacks.auto import AutoShareCallback
from lit_rlft.callbacks.base import RolloutHook
from lit_rlft.callbacks.budget import RolloutBudgetStop
from lit_rlft.callbacks.completions import CompletionLogger
from lit_rlft.callbacks.composition import BatchCompositionLogger
from lit_rlft.callbacks.difficulty import DifficultyPredictorConfig
from lit_rlft.callbacks.dots import DOTSCallback
from lit_rlft.callbacks.dps import DPSCallback
from lit_rlft.callbacks.dynamic import DynamicSamplingCallback
from lit_rlft.callbacks.greso import GRESOCallback
from lit_rlft.callbacks.handback import UniformHandbackCallback
from lit_rlft.callbacks.history import HistoryResamplingCallback
from lit_rlft.callbacks.mopps import MoPPSCallback
from lit_rlft.callbacks.recorder import SuccessRateRecorder
from lit_rlft.callbacks.replay import ReplayCallback
from lit_rlft.callbacks.screening import ScreeningCallback
from lit_rlft.callbacks.selection import SelectionCallback
from lit_rlft.callbacks.sequential import SequentialSamplingCallback

__all__ = [
    "AllocationCallback", "AutoShareCallback", "BatchCompositionLogger", "CompletionLogger", "DOTSCallback", "DPSCallback", "DifficultyPredictorConfig",
    "DynamicSamplingCallback", "GRESOCallback", "HistoryResamplingCallback", "MoPPSCallback", "ReplayCallback",
    "RolloutBudgetStop", "RolloutHook", "ScreeningCallback", "SelectionCallback", "SequentialSamplingCallback",
    "SuccessRateRecorder", "UniformHandbackCallback",
]
