"""The rollout source of generation servers: :class:`ServerRollouts`, a
:class:`~lit_rlft.rollout.source.RolloutSource` whose engine is a :class:`~lit_rlft.rollout.servers.client.ServerEngine`.

    source = ServerRollouts(RolloutWorker(ServerEngine(urls=[...]), scorer, tokenizer), tokenizer)
    source.attach(policy)            # nothing is sent yet: the first request pushes the full weights first
    source.submit(request)           # returns at once: a thread of this process asks the servers, then scores
    reply = source.receive()         # the oldest batch, waiting for it
    source.sync_weights(policy, version)     # after the batches submitted before it are answered: the servers' weights

Requests are answered in order by one thread (generation on the servers, scoring here, multi-turn episodes turn by
turn), so with ``model.asynchronous.depth = k`` the servers generate the next batches while the trainer trains.
A push first waits until every request submitted before it is answered (the rule of every source: a request samples
from the last weights pushed before it was submitted), then, on several trainer ranks, for every rank (a barrier),
sends the weights and lets every rank go on. So at depth 1 the servers generate batch ``t + 1`` while step ``t`` trains;
at depth ``k >= 2`` selection lags ``k`` steps but generation still overlaps one step of training (the trainer waits for
the batches in flight at each push): rows are always sampled by one version, the one the servers report.

Every trainer rank asks the servers for its own slice (requests are independent; a rank's rows are its own), and rank
0 alone sends the weights (the servers need them once); the barriers keep a rank from asking before the push is done.
"""

from __future__ import annotations

import contextlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from torch import nn

from lit_rlft.rewards.scorer import Scorer
from lit_rlft.rollout.servers.client import ServerEngine
from lit_rlft.rollout.source import RolloutReply, RolloutRequest
from lit_rlft.rollout.worker import RolloutWorker
from lit_rlft.rollout.worker_rollouts import WorkerRollouts
from lit_rlft.runtime.distributed import Ranks

__all__ = ["ServerRollouts"]


class ServerRollouts(WorkerRollouts):
    """Rollouts from vLLM servers (see the module docstring).

    Args:
        worker: the rollout worker, its engine a :class:`ServerEngine` (and its scorer, its episode runner).
        tokenizer: the policy's tokenizer.
    """

    def __init__(self, worker: RolloutWorker, tokenizer: Any):
        if not isinstance(worker.engine, ServerEngine):
            raise TypeError(f"ServerRollouts needs a worker whose engine is a ServerEngine, got "
                            f"{type(worker.engine).__name__}")
        super().__init__(worker, tokenizer)
        self._pushed = False  # the servers hold this run's weights (no: the next request pushes them all first)
        self._thread: ThreadPoolExecutor | None = None
        self._batches: deque[Future] = deque()  # submitted training batches, oldest first
        self._other: Future | None = None  # the last request made now (rollout)

    @property
    def engine(self) -> ServerEngine:
        return self.worker.engine

    def bind_ranks(self, ranks: Ranks) -> None:
        """The trainer's ranks: the servers' client sends the weights from rank 0 and spreads each rank's prompts
        over the servers from a different one."""
        super().bind_ranks(ranks)
        self.engine.ranks = ranks

    def scored_by(self, scorer: Scorer) -> contextlib.AbstractContextManager[None]:
        """Refused: training batches run on the servers' thread while a measurement runs (with depth > 0 at every
        mark but the first), so a scorer swapped here would score some of them; refusing up front fails a study at
        its first evaluation rather than mid-run."""
        raise ValueError("ServerRollouts scores training batches on its own thread while a measurement runs: a "
                         "measurement with a reward of its own (reward_funcs) needs the rollouts in the trainer's "
                         "process (model.asynchronous.depth 0, no generation servers)")

    def attach(self, policy: nn.Module) -> None:
        """Use ``policy``: its pad and stop ids; its weights go to the servers before the first request."""
        if self._set_up(policy):
            self._pushed = False

    def _run(self, request: RolloutRequest) -> RolloutReply:
        self.engine.doing = f"{'validation' if request.split == 'val' else request.purpose} rollouts of " \
                            f"{len(request.prompt_ids)} prompts requested at step {request.version}"
        return self.worker.rollout(request)

    def _queue(self, request: RolloutRequest) -> Future:
        if not self._pushed:  # the first request (after a set-up or a close): the servers get the full weights
            self.sync_weights(self._policy, request.version, full=True)
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lit_rlft-server-rollouts")
        return self._thread.submit(self._run, request)

    def submit(self, request: RolloutRequest) -> None:
        self._batches.append(self._queue(request))

    def receive(self) -> RolloutReply:
        if not self._batches:
            raise RuntimeError("ServerRollouts.receive: nothing was submitted")
        return self._batches.popleft().result()

    def rollout(self, request: RolloutRequest) -> RolloutReply:
        self._other = self._queue(request)
        return self._other.result()

    def sync_weights(self, policy: nn.Module, version: int, full: bool = False) -> None:
        """After every request submitted before it is answered (on every rank), ``policy``'s weights to the servers
        (rank 0 sends; see :meth:`ServerEngine.sync_weights`)."""
        if self._policy is None:
            raise RuntimeError("ServerRollouts: no policy (attach it first)")
        wait([f for f in (*self._batches, self._other) if f is not None])
        self.ranks.barrier()
        self.engine.sync_weights(policy, version, full=full or not self._pushed)
        self._pushed = True
        self.ranks.barrier()

    @property
    def pending(self) -> int:
        return len(self._batches)

    def metrics(self) -> dict[str, float]:
        return self.engine.metrics()

    def close(self) -> None:
        """Stop the request thread (what is in flight is dropped: the step's ledger keeps its ids), leave the
        weight-sync group, stop the scorer's and the environment's workers. The servers keep running; the next
        request pushes the full weights again."""
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None
        self._batches.clear()
        self._other = None
        self._pushed = False
        self.engine.close()
        super().close()
