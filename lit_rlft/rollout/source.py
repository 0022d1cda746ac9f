"""Where a rank's rollouts come from: one interface, :class:`RolloutSource`, that the step holds without knowing which
kind it is.

    source.attach(policy)              # the policy the source samples from (its engine set up, or copied later)
    source.submit(request)             # a planned training batch; returns at once
    reply = source.receive()           # the oldest batch submitted: its rollouts and outcomes (waits, bounded)
    reply = source.rollout(request)    # now, after what is in flight: refill rounds, reference sets, validation
    source.sync_weights(policy, version)       # requests submitted from now on sample from these weights
    source.close()                     # idempotent; a later request starts what it needs again

A source makes this rank's rollouts and nothing else: it holds no data, plans or budgets, and knows the ranks only
through :meth:`RolloutSource.bind_ranks` (what the servers' source needs to send the weights once for every rank). A request
carries this rank's prompts already rendered (token ids, texts, reward columns), the sampling and the seed; a reply
carries the scored :class:`~lit_rlft.core.types.Rollouts` (``birth_step``: the version of the weights that sampled
them), the scorer's failure counts and the episodes' sums. Sharding over ranks, gathering the outcomes, charging the
budget, and the ledger of batches in flight (the ids selection must not draw, the checkpoint's state) are the step's,
written once for every kind (:mod:`lit_rlft.step.sharded`).

Kinds (a new kind is a new file implementing the Protocol, never a branch in the step):

- :class:`~lit_rlft.rollout.in_process.InProcessRollouts`: the engine in the trainer's process, on the trainer's own
  policy (``model.asynchronous.depth = 0``).
- :class:`~lit_rlft.rollout.process.ProcessRollouts`: a generation process beside the trainer, with its own
  copy of the weights pushed through shared memory (``async_depth = k``).
- :class:`~lit_rlft.rollout.servers.source.ServerRollouts`: vLLM servers on this machine or others (``lit-rlft
  serve``), weights pushed over a ``torch.distributed`` group (``model.engine: ServerEngine``, any depth).

Notation: ``b`` prompts of this rank, ``G`` completions per prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from torch import nn

    from lit_rlft.core.types import Rollouts
    from lit_rlft.rewards.runner import RewardResult
    from lit_rlft.rewards.scorer import Scorer
    from lit_rlft.rollout.engines.base import SamplingConfig
    from lit_rlft.runtime.distributed import Ranks

__all__ = ["PromptReader", "RolloutReply", "RolloutRequest", "RolloutSource"]


class PromptReader(Protocol):
    """What prompts are rendered from (``PromptDataModule`` is one): pool ids to token ids, texts and the reward
    columns (the data set's other fields), per split."""

    def prompt_tokens(self, ids: np.ndarray, split: str = "train") -> list[list[int]]: ...

    def prompt_texts(self, ids: np.ndarray, split: str = "train") -> list[str]: ...

    def reward_columns(self, ids: np.ndarray, split: str = "train") -> dict[str, list[Any]]: ...


@dataclass
class RolloutRequest:
    """``b`` prompts of this rank to roll out, rendered by the trainer (a source holds no data).

    ``version`` is the trainer's weights version when the request is made (its rollout step): what a source that
    samples from the trainer's own policy samples from. ``seed`` seeds the engine's call (None: unseeded); a source
    in another process also seeds its torch generator with it."""

    prompt_ids: np.ndarray  # [b] pool ids
    prompt_tokens: list[list[int]]  # [b] token ids, unpadded
    prompt_texts: list[str]  # [b]
    columns: dict[str, list[Any]]  # reward columns, [b] each
    num_generations: int  # G
    sampling: SamplingConfig
    split: str = "train"
    seed: int | None = None
    version: int = 0
    purpose: str = "train"  # what the trainer asks it for (named in a failure): train, reference, eval, ...

    @classmethod
    def render(cls, data: PromptReader, prompt_ids: np.ndarray, num_generations: int, sampling: SamplingConfig,
               split: str = "train", seed: int | None = None, version: int = 0,
               purpose: str = "train") -> RolloutRequest:
        """The request for the pool ids ``prompt_ids`` ``[b]`` of ``split``, rendered from ``data``."""
        ids = np.asarray(prompt_ids, dtype=np.int64)
        return cls(ids, data.prompt_tokens(ids, split), data.prompt_texts(ids, split), data.reward_columns(ids, split),
                   num_generations, sampling, split, seed, version, purpose)


@dataclass
class RolloutReply:
    """What a source answers: this rank's scored rollouts and their outcomes."""

    rollouts: Rollouts  # [b] groups; birth_step = the version of the weights that sampled them
    scores: RewardResult  # the scorer's result: totals, per function, failures counted
    episodes: dict[str, float] = field(default_factory=dict)  # multi-turn episodes' sums (empty without)
    idle_s: float = 0.0  # the source's wait for work before this request (a generation process's; 0 in process)


@runtime_checkable
class RolloutSource(Protocol):
    """Makes this rank's rollouts (see the module docstring). Every call may raise; a source in another process or on
    another machine raises an error that names it (pid or address), how it ended and what the trainer asked of it.

    Requests are answered in order: :meth:`receive` returns the oldest batch :meth:`submit`-ted and not yet received,
    and :meth:`rollout` is answered after everything submitted before it. A request samples from the last weights
    pushed before it was made (in process: the policy itself)."""

    scorer: Scorer
    """The scorer of the completions it makes (setting it before the source starts replaces it)."""

    def scored_by(self, scorer: Scorer) -> AbstractContextManager[None]:
        """Within the block, score the completions of requests made in it with ``scorer`` instead of :attr:`scorer`
        (a measurement's reward of its own); restored afterwards. Raises ValueError naming the source where that
        cannot hold: it scores in another process, or on a thread of its own while the block runs (servers)."""
        ...

    def bind_ranks(self, ranks: Ranks) -> None:
        """The trainer's ranks (the step's collective), given by the sharded layer when the step is bound, before
        any request. A source that samples per rank ignores them; one shared by the ranks (generation servers) uses
        them: rank 0 alone sends the weights, and the ranks meet before and after a push."""
        ...

    def attach(self, policy: nn.Module) -> None:
        """Sample from ``policy`` (built, and sharded if it is): set the engine up on it, or copy its weights when the
        source starts. Called once per policy."""
        ...

    def submit(self, request: RolloutRequest) -> None:
        """Queue a planned training batch; returns at once."""
        ...

    def receive(self) -> RolloutReply:
        """The oldest submitted batch's reply, waiting for it (bounded)."""
        ...

    def rollout(self, request: RolloutRequest) -> RolloutReply:
        """Roll ``request`` out now (after what is queued) and wait for its reply (bounded)."""
        ...

    def sync_weights(self, policy: nn.Module, version: int, full: bool = False) -> None:
        """Requests made from now on sample from ``policy``'s weights, ``version`` (updates made): its trainable
        parameters, or with ``full`` every parameter and buffer (the weights changed other than by training: a
        checkpoint was loaded). Every rank calls it (an FSDP2 shard is gathered)."""
        ...

    @property
    def pending(self) -> int:
        """Batches submitted and not yet received."""
        ...

    @property
    def last_sync_bytes(self) -> int | None:
        """Bytes the last :meth:`push` sent to weights of the source's own (None: it samples from the policy)."""
        ...

    def metrics(self) -> dict[str, float]:
        """The source's own scalars, logged with the step's (servers: ``servers/alive``, ``servers/dropped``; empty
        for the others)."""
        ...

    def close(self) -> None:
        """Stop what the source started (processes, workers); drops what is in flight. Idempotent."""
        ...
