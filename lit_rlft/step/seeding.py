"""Per-step sampling seeds, so that a resumed run samples exactly what the uninterrupted run sampled.

At the start of every rollout step (``salt`` 0), before every reference set (``salt`` 1) and before validation batch
``i`` (step 0, ``salt`` ``2 + i``: the same at every step) torch's generator is re-seeded from
``(seed, step, salt, rank)``: ``HFEngine`` samples from it, and reward workers derive their seeds from
it. Engines with their own random state (vLLM) get one seed per call, a hash of ``(seed, step, salt, rank, call)``.
Rank 0's seeds do not depend on the number of ranks, so one-process runs keep theirs.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["StepSeeds", "seed_salt"]


def seed_salt(rank: int) -> int:
    """What a rank adds to a generation seed (0 on rank 0, so one-process runs keep their seeds)."""
    return int(rank) * 7_919


class StepSeeds:
    """The seeds of one run's sampling.

    Args:
        seed: the run's generation seed (``GenerationConfig.seed``); None never re-seeds and gives engines no seed.
    """

    def __init__(self, seed: int | None):
        self.seed = seed
        self._key = (0, 0)  # (salt of the last re-seed, engine calls since)

    def reseed(self, step: int, salt: int, rank: int) -> None:
        """Seed torch's generator from ``(seed, step, salt, rank)`` and restart the engine-call count."""
        self._key = (salt, 0)
        if self.seed is not None:
            torch.manual_seed(self.seed * 1_000_003 + step + salt * 1_000_000_007 + seed_salt(rank))

    def dispatch_seed(self, step: int, rank: int) -> int | None:
        """The seed of the asynchronous request for step ``step``'s batch (``salt`` 3; None without a seed): the
        generation process seeds torch and the engine with it, so a batch samples alike whenever it is dispatched."""
        if self.seed is None:
            return None
        return int(np.random.SeedSequence([self.seed, step, 3, rank, 0]).generate_state(1)[0] % 2**31)

    def engine_seed(self, step: int, rank: int) -> int | None:
        """The seed of the next engine call at rollout step ``step`` (None without a generation seed)."""
        if self.seed is None:
            return None
        salt, call = self._key
        self._key = (salt, call + 1)
        return int(np.random.SeedSequence([self.seed, step, salt, rank, call]).generate_state(1)[0] % 2**31)
