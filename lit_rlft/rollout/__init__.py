"""Where rollouts are made, one room a concern:

- ``source.py``: the interface a step holds (:class:`RolloutSource`, with :class:`RolloutRequest` and
  :class:`RolloutReply`); ``worker.py``: the :class:`RolloutWorker` that generates and scores with an engine;
  ``episodes.py``: multi-turn episodes; ``judge.py``: an engine as an LLM judge.
- ``engines/``: the engines (:class:`HFEngine`, :class:`VLLMEngine`) behind :class:`RolloutEngine`.
- the three rollout sources, one place each: ``in_process.py`` (:class:`InProcessRollouts`, the engine in the
  trainer's process, on ``worker_rollouts.py``'s base), ``process/`` (:class:`ProcessRollouts`, a generation process
  beside the trainer: the wire, the child, the handle and the source), ``servers/`` (below).
- ``servers/``: vLLM servers (:class:`ServerEngine`, :class:`ServerRollouts`, :class:`WeightSync`,
  :class:`VLLMServer`, the vLLM worker extension).

vLLM is imported on first use only (``engines/vllm.py``; on the servers' side, inside their processes)."""

from lit_rlft.rollout.engines import GenerationOutput, HFEngine, RolloutEngine, SamplingConfig, VLLMEngine
from lit_rlft.rollout.in_process import InProcessRollouts
from lit_rlft.rollout.judge import EngineJudge
from lit_rlft.rollout.process import GenerationError, ProcessRollouts
from lit_rlft.rollout.servers import ServerEngine, ServerError, ServerRollouts, VLLMServer, WeightSync, WeightSyncError
from lit_rlft.rollout.source import PromptReader, RolloutReply, RolloutRequest, RolloutSource
from lit_rlft.rollout.worker import RolloutWorker

__all__ = ["EngineJudge", "GenerationError", "GenerationOutput", "HFEngine", "InProcessRollouts", "ProcessRollouts",
           "PromptReader", "RolloutEngine", "RolloutReply", "RolloutRequest", "RolloutSource", "RolloutWorker",
           "SamplingConfig", "ServerEngine", "ServerError", "ServerRollouts", "VLLMEngine", "VLLMServer", "WeightSync",
           "WeightSyncError"]
