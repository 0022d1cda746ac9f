"""Rollout sources backed by a :class:`~lit_rlft.rollout.worker.RolloutWorker` in this machine's processes: the
engine in the trainer's process (:class:`InProcessRollouts`) or a generation process beside it with its own copy of
the weights (:class:`ProcessRollouts`). The interface is :class:`lit_rlft.rollout.source.RolloutSource`; the source
of generation servers is :class:`lit_rlft.rollout.servers.ServerRollouts`."""

from lit_rlft.rollout.sources.in_process import InProcessRollouts
from lit_rlft.rollout.sources.process import GenerationError, ProcessRollouts

__all__ = ["GenerationError", "InProcessRollouts", "ProcessRollouts"]
