"""Lightning callbacks: thin adapters from Lightning hooks to the Lightning-free cores in ``lit_rlft.selection``."""

from lit_rlft.callbacks.base import RolloutHook
from lit_rlft.callbacks.completions import CompletionLogger

__all__ = ["CompletionLogger", "RolloutHook"]
