"""Rollout engines: one interface (:class:`RolloutEngine`: ``setup``, ``generate``, ``sync_weights``) and its
implementations in the trainer's process, HF ``generate`` (:class:`HFEngine`) and colocated vLLM
(:class:`VLLMEngine`, vLLM imported on first use). The engine on generation servers is
:class:`lit_rlft.rollout.servers.ServerEngine`."""

from lit_rlft.rollout.engines.base import GenerationOutput, RolloutEngine, SamplingConfig
from lit_rlft.rollout.engines.hf import HFEngine
from lit_rlft.rollout.engines.vllm import VLLMEngine

__all__ = ["GenerationOutput", "HFEngine", "RolloutEngine", "SamplingConfig", "VLLMEngine"]
