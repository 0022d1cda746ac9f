"""Uniform sampling (the papers' "US" baseline): plain GRPO's random batches without replacement per epoch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lit_rlft.selection.base import (
    check_num_prompts,
    check_version,
    draw_excluding,
    validate_batch_size,
    validate_num_prompts,
    validate_observation,
)


class EpochBatcher:
    """Serve an epoch's permutation in consecutive batches, topping up across the epoch boundary.

    When the rest of an epoch is shorter than a batch, the batch takes the rest and is topped up with the first
    ids of the next epoch's permutation that are not already in the batch. The next epoch's permutation is then
    reordered so that those top-up ids come first (the others keep their order) and its cursor starts after them:
    every epoch still serves each of its members exactly once, and no batch holds an id twice.

    Args:
        seed: seed of the batcher's own ``numpy.random.Generator``.
    """

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.perm = np.empty(0, dtype=np.int64)  # [n] ids of the current epoch, in serving order
        self.cursor = 0  # how many of `perm` were served
        self.epoch = 0  # epochs started so far (0 before the first batch)

    def next_batch(self, batch_size: int, next_members: Callable[[], np.ndarray]) -> np.ndarray:
        """Return the next ``[batch_size]`` int64 ids.

        Args:
            batch_size: ids to return.
            next_members: called only when a new epoch starts; returns the ``[n]`` ids of that epoch. It must
                return at least ``batch_size`` ids.
        """
        rest = self.perm[self.cursor : self.cursor + batch_size]
        self.cursor += rest.size
        need = batch_size - rest.size
        if need == 0:
            return rest.copy()
        members = np.asarray(next_members(), dtype=np.int64)
        perm = self.rng.permutation(members)
        fresh = np.flatnonzero(~np.isin(perm, rest))[:need]
        if fresh.size < need:
            raise RuntimeError(f"an epoch of {members.size} prompts cannot top up a batch of {batch_size}")
        top = perm[fresh]
        later = np.ones(perm.size, dtype=bool)
        later[fresh] = False
        self.perm = np.concatenate([top, perm[later]])
        self.cursor = need
        self.epoch += 1
        return np.concatenate([rest, top])

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng_state": self.rng.bit_generator.state,
            "perm": self.perm.copy(),
            "cursor": self.cursor,
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rng_state" in state:
            self.rng.bit_generator.state = state["rng_state"]
        self.perm = np.asarray(state.get("perm", np.empty(0)), dtype=np.int64).copy()
        self.cursor = int(state.get("cursor", 0))
        self.epoch = int(state.get("epoch", 0))
        if not 0 <= self.cursor <= self.perm.size:
            raise ValueError(f"cursor {self.cursor} lies outside an epoch of {self.perm.size} prompts")


class UniformSampler:
    """Random batches without replacement per epoch over a pool of ``S`` prompts.

    Each epoch is a fresh permutation of ``0 .. S-1`` served in consecutive batches; a batch that straddles an
    epoch boundary is topped up from the next epoch without duplicates (see :class:`EpochBatcher`).

    The sampler owns its random generator (seeded by ``seed``, saved in ``state_dict``) and ignores the ``rng``
    argument of :meth:`select`: the batches then depend on the seed only, not on how many draws the caller's
    generator served elsewhere, and a resumed run continues exactly. ``observe`` is a no-op.

    Args:
        num_prompts: pool size ``S``.
        seed: seed of the sampler's own generator.

    Example::

        sampler = UniformSampler(num_prompts=1000, seed=0)
        ids = sampler.select(batch_size=64, step=0, rng=np.random.default_rng())  # [64] int64
    """

    version = 1

    def __init__(self, num_prompts: int, seed: int = 0) -> None:
        self.num_prompts = validate_num_prompts(num_prompts)
        self.seed = seed
        self._batcher = EpochBatcher(seed)

    @property
    def epoch(self) -> int:
        """Epochs started so far (a batch straddling a boundary counts the new one)."""
        return self._batcher.epoch

    def observe(self, prompt_ids: np.ndarray, success_rates: np.ndarray, step: int) -> None:
        """Validate the outcomes and ignore them: uniform sampling does not look at results."""
        validate_observation(prompt_ids, success_rates, self.num_prompts)

    def select(self, batch_size: int, step: int, rng: np.random.Generator | None = None,
               exclude: np.ndarray | None = None) -> np.ndarray:
        """Return the next ``[batch_size]`` int64 ids, skipping ``exclude``; ``step`` and ``rng`` are ignored (see
        the class docstring)."""
        batch_size = validate_batch_size(batch_size, self.num_prompts)
        members = lambda: np.arange(self.num_prompts, dtype=np.int64)  # noqa: E731
        return draw_excluding(lambda n: self._batcher.next_batch(n, members), batch_size, exclude, self.num_prompts)

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version, "num_prompts": self.num_prompts, **self._batcher.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_version(state, self.version, "UniformSampler")
        check_num_prompts(state, self.num_prompts, "UniformSampler")
        self._batcher.load_state_dict(state)
        if self._batcher.perm.size not in (0, self.num_prompts):
            raise ValueError(
                f"UniformSampler checkpoint holds an epoch of {self._batcher.perm.size} prompts, but this run's "
                f"pool holds {self.num_prompts}"
            )


class CandidateStream:
    """Candidate sets as the DPS / MoPPS reference loaders draw them: consecutive slices of a shuffled epoch of the
    pool, without replacement through an epoch (a set straddling an epoch boundary is topped up from the next one,
    without duplicates). Its generator is seeded by ``seed`` and is part of :meth:`state_dict`.

    Args:
        num_prompts: pool size ``S``.
        seed: seed of the stream's own generator.
    """

    def __init__(self, num_prompts: int, seed: int = 0) -> None:
        self.num_prompts = validate_num_prompts(num_prompts)
        self._batcher = EpochBatcher(seed)

    def draw(self, k: int) -> np.ndarray:
        """The next ``[min(k, S)]`` distinct ids."""
        k = min(int(k), self.num_prompts)
        return self._batcher.next_batch(k, lambda: np.arange(self.num_prompts, dtype=np.int64))

    @property
    def epoch(self) -> int:
        return self._batcher.epoch

    def state_dict(self) -> dict[str, Any]:
        return self._batcher.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._batcher.load_state_dict(state)
