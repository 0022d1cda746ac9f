"""Rollout engines behind one interface, and the worker that generates and scores with one. vLLM is imported lazily
in ``rollout/vllm.py`` only."""

from lit_rlft.rollout.base import GenerationOutput, RolloutEngine, SamplingConfig
from lit_rlft.rollout.hf import HFEngine
from lit_rlft.rollout.judge import EngineJudge
from lit_rlft.rollout.worker import PromptSource, RolloutWorker

__all__ = ["EngineJudge", "GenerationOutput", "HFEngine", "PromptSource", "RolloutEngine", "RolloutWorker", "SamplingConfig"]
