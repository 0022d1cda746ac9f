"""What the rollout sources whose rollouts a :class:`~lit_rlft.rollout.worker.RolloutWorker` of this process makes
share (:class:`WorkerRollouts`: the engine in process, ``in_process.py``; generation servers, ``servers/source.py``), and the one way every source stops the
workers it scores with (:func:`close_scoring`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn

from lit_rlft.models.sharding import is_sharded
from lit_rlft.rewards.scorer import Scorer
from lit_rlft.rollout.engines.base import RolloutEngine
from lit_rlft.rollout.episodes import EpisodeRunner
from lit_rlft.rollout.worker import RolloutWorker
from lit_rlft.runtime.distributed import LocalCollective, Ranks

__all__ = ["WorkerRollouts", "close_scoring"]


def close_scoring(scorer: Scorer, episodes: EpisodeRunner | None) -> None:
    """Stop the scorer's worker processes and the environment's (a later request starts them again)."""
    scorer.close()
    if episodes is not None:
        episodes.close()


class WorkerRollouts:
    """The base of a source that answers requests with a rollout worker in this process: the worker and its engine,
    the scorer (``scorer``, settable before the source starts), the engine set up once per attached policy, and the
    scoring workers stopped at :meth:`close`.

    Args:
        worker: the rollout worker (its engine, not yet set up, and its scorer; its episode runner for multi-turn
            rollouts).
        tokenizer: the policy's tokenizer (the engine's set-up).
    """

    def __init__(self, worker: RolloutWorker, tokenizer: Any):
        self.worker, self.tokenizer = worker, tokenizer
        self.ranks: Ranks = LocalCollective()
        self._policy: nn.Module | None = None

    def bind_ranks(self, ranks: Ranks) -> None:
        """The trainer's ranks (the step's collective)."""
        self.ranks = ranks

    @property
    def engine(self) -> RolloutEngine:
        """The worker's engine (set up on the trainer's policy once attached; also for measurements beside
        training)."""
        return self.worker.engine

    @property
    def scorer(self) -> Scorer:
        return self.worker.scorer

    @scorer.setter
    def scorer(self, scorer: Scorer) -> None:
        self.worker.scorer = scorer

    @contextlib.contextmanager
    def scored_by(self, scorer: Scorer) -> Iterator[None]:
        """Within the block the worker scores with ``scorer`` (this process scores every request); restored after."""
        saved = self.worker.scorer
        self.worker.scorer = scorer
        try:
            yield
        finally:
            self.worker.scorer = saved

    def _set_up(self, policy: nn.Module) -> bool:
        """Set the engine up on ``policy`` (sharded or not); False when it is the policy already attached."""
        if policy is self._policy:
            return False
        self._policy = policy
        self.engine.setup(policy, self.tokenizer, sharded=is_sharded(policy))
        return True

    @property
    def last_sync_bytes(self) -> int | None:
        return self.engine.last_sync_bytes

    def close(self) -> None:
        """Stop the scorer's and the environment's worker processes (a later request starts them again)."""
        close_scoring(self.scorer, self.worker.episodes)
