"""The rollout source of asynchronous runs: :class:`ProcessRollouts`, whose rollouts a
:class:`~lit_rlft.rollout.process.handle.GenerationProcess` makes (see :mod:`lit_rlft.rollout.process`)."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any

from torch import nn

from lit_rlft.rewards.scorer import Scorer, as_scorer
from lit_rlft.rollout.engines.base import RolloutEngine
from lit_rlft.rollout.episodes import EpisodeRunner
from lit_rlft.rollout.process.handle import GenerationError, GenerationProcess, default_threads
from lit_rlft.rollout.process.wire import ProcessSpec
from lit_rlft.rollout.source import RolloutReply, RolloutRequest
from lit_rlft.rollout.worker_rollouts import close_scoring
from lit_rlft.runtime.distributed import Ranks

__all__ = ["ProcessRollouts"]


class ProcessRollouts:
    """A :class:`~lit_rlft.rollout.source.RolloutSource` whose rollouts are made in a :class:`GenerationProcess`.

    Args:
        policy: builds the process's copy of the policy (a picklable function without arguments: the same model,
            dtype, size and LoRA as the trainer's; no reference, no optimizer).
        engine: the rollout engine's settings (not set up; an HF engine returns its sampling log-probs).
        scorer: the scorer (pickled to the process; it scores there).
        tokenizer: the policy's tokenizer.
        success_threshold: a completion is correct when its total reward is at least this.
        episodes: multi-turn episodes (pickled: the process runs its own environment workers); None: single turn.
        threads: the process's torch threads (None: :func:`default_threads`).
        device: where its policy runs (None: ``"cpu"``; ``"cuda:1"``: a GPU of its own).
        timeout_s: longest a call waits for the process (``model.asynchronous.timeout_s``).
    """

    def __init__(self, policy: Callable[[], nn.Module], engine: RolloutEngine, scorer: Scorer, tokenizer: Any,
                 success_threshold: float = 1.0, episodes: EpisodeRunner | None = None, *, threads: int | None = None,
                 device: str | None = None, timeout_s: float = 600.0):
        self.policy_factory, self.engine, self.tokenizer = policy, engine, tokenizer
        self.scorer = scorer
        self.success_threshold, self.episodes = success_threshold, episodes
        self.threads, self.device, self.timeout_s = threads or default_threads(), device or "cpu", timeout_s
        self.process: GenerationProcess | None = None
        self._policy: nn.Module | None = None
        self._tickets: deque[tuple[int, str]] = deque()  # (ticket, what receiving it is) of the batches submitted

    @property
    def scorer(self) -> Scorer:
        return self._scorer

    @scorer.setter
    def scorer(self, scorer: Scorer) -> None:
        self._scorer = as_scorer(scorer)

    def scored_by(self, scorer: Scorer) -> contextlib.AbstractContextManager[None]:
        """Refused: this source scores in its generation process, with the scorer it was started with."""
        raise ValueError(f"ProcessRollouts scores in its generation process (pid {self.pid}): a measurement with a "
                         "reward of its own (reward_funcs) needs the rollouts scored in the trainer's process "
                         "(model.asynchronous.depth 0, no generation servers)")

    def bind_ranks(self, ranks: Ranks) -> None:
        """Nothing to do: each rank has a generation process of its own."""

    def attach(self, policy: nn.Module) -> None:
        """Copy ``policy``'s weights into the process when it starts (at the first push or request)."""
        self._policy = policy

    @property
    def pid(self) -> int | None:
        """The generation process's pid (None while none runs)."""
        return self.process.pid if self.process is not None else None

    def _started(self, version: int, doing: str) -> GenerationProcess:
        """The process, started with the trainer's current weights (``version``) if there is none. One that died is
        an error (:class:`GenerationError`), never silently replaced: the requests it held would never be answered."""
        if self.process is not None:
            if not self.process.alive:
                raise self.process.died(doing)
            return self.process
        if self._policy is None:
            raise RuntimeError("ProcessRollouts: no policy to copy (attach it first)")
        spec = ProcessSpec(self.policy_factory, self.engine, self.scorer, self.tokenizer, self.success_threshold,
                     self.episodes, self.threads, self.device)
        self.process = GenerationProcess(spec, timeout_s=self.timeout_s)
        self.process.sync_weights(self._policy, version, full=True)
        return self.process

    def submit(self, request: RolloutRequest) -> None:
        doing = f"submitting the {_what(request)}"
        ticket = self._started(request.version, doing).submit(request, doing)
        self._tickets.append((ticket, f"receiving the {_what(request)}"))

    def receive(self) -> RolloutReply:
        if not self._tickets:
            raise RuntimeError("ProcessRollouts.receive: nothing was submitted")
        ticket, doing = self._tickets.popleft()
        if self.process is None:
            raise GenerationError(f"the generation process was closed while the trainer was {doing}")
        return self.process.result(ticket, doing)

    def rollout(self, request: RolloutRequest) -> RolloutReply:
        process = self._started(request.version, f"submitting the {_what(request)}")
        doing = f"waiting for the {_what(request)}"
        return process.result(process.submit(request, doing), doing)

    def sync_weights(self, policy: nn.Module, version: int, full: bool = False) -> None:
        """Weights ``version`` to the process; one that is not running starts with the current weights."""
        self._policy = policy
        if self.process is None:
            self._started(version, f"starting it with weights version {version}")
        else:
            self.process.sync_weights(policy, version, full=full)

    @property
    def pending(self) -> int:
        return len(self._tickets)

    @property
    def last_sync_bytes(self) -> int | None:
        return None

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        """Stop the process (and this side's scorer and environment workers, should anything have started them);
        batches in flight are dropped (the step's ledger keeps their ids)."""
        if self.process is not None:
            self.process.close()
        self.process = None
        self._tickets.clear()
        close_scoring(self.scorer, self.episodes)


def _what(request: RolloutRequest) -> str:
    """A request in words, for failures: ``train rollouts of 4 prompts requested at step 3``."""
    kind = "validation" if request.split == "val" else request.purpose
    return f"{kind} rollouts of {len(request.prompt_ids)} prompts requested at step {request.version}"
