"""Rollout engines behind one interface, the worker that generates and scores with one, and the rollout sources a
step holds (one interface, :class:`RolloutSource`: in process, a generation process, or vLLM servers). vLLM is imported lazily in
``rollout/vllm.py`` only."""

from lit_rlft.rollout.base import GenerationOutput, RolloutEngine, SamplingConfig
from lit_rlft.rollout.generation_process import GenerationError, ProcessRollouts
from lit_rlft.rollout.hf import HFEngine
from lit_rlft.rollout.in_process import InProcessRollouts
from lit_rlft.rollout.judge import EngineJudge
from lit_rlft.rollout.server_rollouts import ServerRollouts
from lit_rlft.rollout.servers import ServerEngine, ServerError
from lit_rlft.rollout.source import PromptSource, RolloutReply, RolloutRequest, RolloutSource
from lit_rlft.rollout.vllm_server import VLLMServer
from lit_rlft.rollout.weight_sync import WeightSync, WeightSyncError
from lit_rlft.rollout.worker import RolloutWorker

__all__ = ["EngineJudge", "GenerationError", "GenerationOutput", "HFEngine", "InProcessRollouts", "ProcessRollouts",
           "PromptSource", "RolloutEngine", "RolloutReply", "RolloutRequest", "RolloutSource", "RolloutWorker",
           "SamplingConfig", "ServerEngine", "ServerError", "ServerRollouts", "VLLMServer", "WeightSync",
           "WeightSyncError"]
