"""Generation on vLLM servers, on this machine or others: the trainer's side (:class:`ServerEngine`, the client;
:class:`ServerRollouts`, the rollout source; :class:`WeightSync`, the weight transport, over
:mod:`~lit_rlft.rollout.servers.weight_group`) and the servers' side (:class:`VLLMServer`, the launcher of
``lit-rlft serve``; :mod:`~lit_rlft.rollout.servers.vllm_extension`, the worker extension that receives the weights
inside vLLM). See ``docs/servers.md``."""

from lit_rlft.rollout.servers.client import ServerEngine, ServerError
from lit_rlft.rollout.servers.launcher import VLLMServer
from lit_rlft.rollout.servers.source import ServerRollouts
from lit_rlft.rollout.servers.weight_sync import WeightSync, WeightSyncError

__all__ = ["ServerEngine", "ServerError", "ServerRollouts", "VLLMServer", "WeightSync", "WeightSyncError"]
