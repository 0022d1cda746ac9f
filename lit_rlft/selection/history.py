"""History resampling (SRPO, the papers' "HR" baseline): stop serving prompts the policy already solves."""

from __future__ import annotations

import warnings
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
from lit_rlft.selection.uniform import EpochBatcher


class HistoryResampler:
    """Epochs over the *active* prompts; at each epoch's end drop those whose last group was all-correct.

    Drop rule, applied when a new epoch starts (so it sees every outcome observed until then): a prompt is active
    in the new epoch unless the last group observed for it had success rate ``p == 1``. Prompts never observed stay
    active, all-wrong (``p == 0``) and mixed groups stay active. The rule reads the *last* observation only, so a
    dropped prompt that is observed again (for example after a fallback) with ``p < 1`` becomes active again.

    Fallback: if fewer active prompts remain than the batch being served (in particular when every prompt is
    dropped), the new epoch covers the whole pool and a ``UserWarning`` says so; a batch never holds duplicates.

    Serving works as in :class:`~lit_rlft.selection.uniform.UniformSampler`: a permutation per epoch served in
    consecutive batches, a short remainder topped up from the next epoch (computed after the drop rule). The
    resampler owns its generator (``seed``) and ignores the ``rng`` argument of :meth:`select`.

    Args:
        num_prompts: pool size ``S``.
        seed: seed of the resampler's own generator.
    """

    version = 1

    def __init__(self, num_prompts: int, seed: int = 0) -> None:
        self.num_prompts = validate_num_prompts(num_prompts)
        self.seed = seed
        self._batcher = EpochBatcher(seed)
        self.last_rate = np.full(self.num_prompts, np.nan)  # [S] last observed success rate, NaN = never observed
        self.num_active = self.num_prompts  # prompts in the current epoch
        self.num_fallbacks = 0  # epochs that fell back to the whole pool

    @property
    def epoch(self) -> int:
        """Epochs started so far (a batch straddling a boundary counts the new one)."""
        return self._batcher.epoch

    def active_mask(self) -> np.ndarray:
        """``[S]`` bool: the prompts the drop rule would keep if an epoch started now."""
        return ~(self.last_rate == 1.0)  # NaN (never observed) compares False: kept

    def observe(self, prompt_ids: np.ndarray, success_rates: np.ndarray, step: int) -> None:
        """Record each observed prompt's latest success rate (``[B]`` ids, ``[B]`` rates)."""
        ids, rates = validate_observation(prompt_ids, success_rates, self.num_prompts)
        self.last_rate[ids] = rates

    def select(self, batch_size: int, step: int, rng: np.random.Generator | None = None,
               exclude: np.ndarray | None = None) -> np.ndarray:
        """Return the next ``[batch_size]`` int64 ids, skipping ``exclude``; ``step`` and ``rng`` are ignored."""
        batch_size = validate_batch_size(batch_size, self.num_prompts)

        def next_epoch() -> np.ndarray:
            active = np.flatnonzero(self.active_mask())
            if active.size < batch_size:
                warnings.warn(
                    f"history resampling: only {active.size} of {self.num_prompts} prompts are still unsolved, "
                    f"fewer than a batch of {batch_size}; this epoch covers the whole pool again",
                    UserWarning,
                    stacklevel=4,
                )
                self.num_fallbacks += 1
                active = np.arange(self.num_prompts, dtype=np.int64)
            self.num_active = int(active.size)
            return active

        return draw_excluding(lambda n: self._batcher.next_batch(n, next_epoch), batch_size, exclude,
                              self.num_prompts)

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "num_prompts": self.num_prompts,
            "last_rate": self.last_rate.copy(),
            "num_active": self.num_active,
            "num_fallbacks": self.num_fallbacks,
            **self._batcher.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_version(state, self.version, "HistoryResampler")
        check_num_prompts(state, self.num_prompts, "HistoryResampler")
        last_rate = np.asarray(state["last_rate"], dtype=np.float64)
        if last_rate.shape != (self.num_prompts,):
            raise ValueError(
                f"HistoryResampler checkpoint holds {last_rate.shape} rates, this run's pool {self.num_prompts}"
            )
        self._batcher.load_state_dict(state)
        self.last_rate = last_rate.copy()
        self.num_active = int(state.get("num_active", self._batcher.perm.size or self.num_prompts))
        self.num_fallbacks = int(state.get("num_fallbacks", 0))
