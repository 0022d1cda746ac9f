"""Rollout engines behind one protocol. vLLM is imported lazily in ``rollout/vllm.py`` only."""

from lit_rlft.rollout.base import GenerationOutput, RolloutEngine, SamplingConfig
from lit_rlft.rollout.hf import HFEngine

__all__ = ["GenerationOutput", "HFEngine", "RolloutEngine", "SamplingConfig"]
