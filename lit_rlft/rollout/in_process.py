"""The in-process rollout source: the engine samples from the trainer's own policy, in the trainer's process.

    source = InProcessRollouts(RolloutWorker(HFEngine(), scorer, tokenizer), tokenizer)
    source.attach(policy)               # the engine set up on the policy (once per policy)
    source.submit(request)              # generated and scored now, with the current weights ...
    reply = source.receive()            # ... and handed back here
    source.sync_weights(policy, version)        # HF: nothing to do (it samples from the policy); vLLM: a weight sync

The synchronous step (``model.asynchronous.depth = 0``) submits its planned batch and receives it at once, so a
request is answered with the weights of the step it is made in. See :mod:`lit_rlft.rollout.source`.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from torch import nn

from lit_rlft.models.sharding import is_sharded
from lit_rlft.rollout.source import RolloutReply, RolloutRequest
from lit_rlft.rollout.worker import RolloutWorker
from lit_rlft.rollout.worker_rollouts import WorkerRollouts

__all__ = ["InProcessRollouts"]


class InProcessRollouts(WorkerRollouts):
    """A :class:`~lit_rlft.rollout.source.RolloutSource` that generates and scores in this process.

    Args:
        worker: the rollout worker (its engine, not yet set up, and its scorer; its episode runner for multi-turn
            rollouts).
        tokenizer: the policy's tokenizer (the engine's set-up).
    """

    def __init__(self, worker: RolloutWorker, tokenizer: Any):
        super().__init__(worker, tokenizer)
        self._replies: deque[RolloutReply] = deque()

    def attach(self, policy: nn.Module) -> None:
        """Set the engine up on ``policy``; a sharded (FSDP2) policy's reward models are sharded over its mesh."""
        if self._set_up(policy) and is_sharded(policy):
            self.scorer.shard(next(p for p in policy.parameters() if hasattr(p, "device_mesh")).device_mesh)

    def submit(self, request: RolloutRequest) -> None:
        """Generate and score ``request`` now (the current weights); :meth:`receive` hands it back."""
        self._replies.append(self.worker.rollout(request))

    def receive(self) -> RolloutReply:
        if not self._replies:
            raise RuntimeError("InProcessRollouts.receive: nothing was submitted")
        return self._replies.popleft()

    def rollout(self, request: RolloutRequest) -> RolloutReply:
        return self.worker.rollout(request)

    def sync_weights(self, policy: nn.Module, version: int, full: bool = False) -> None:
        """Make the engine sample from ``policy``'s current weights (no-op for an engine that shares the policy)."""
        self.engine.sync_weights(policy)

    @property
    def pending(self) -> int:
        return len(self._replies)

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        """Drop the replies not received; stop the scorer's and the environment's worker processes (a later request
        starts them again)."""
        self._replies.clear()
        super().close()
