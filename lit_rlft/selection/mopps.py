"""MoPPS, model predictive prompt selection (Qu et al. 2025; verl ``recipe/mopps``): a Beta posterior per prompt on
its success rate, Thompson sampling toward a target rate. Pure numpy.

Each prompt ``q`` of the pool (``S`` prompts) carries ``Beta(alpha_q, beta_q)`` over its success rate, starting at the
prior ``(alpha_0, beta_0)``. After a step, every prompt just rolled out with ``s`` correct completions of ``k``::

    alpha_q <- lambda * alpha_q + (1 - lambda) * alpha_0 + s
    beta_q  <- lambda * beta_q  + (1 - lambda) * beta_0  + (k - s)

(the other prompts keep their posterior; ``lambda = 1``, the reference code's config default and MATH setting, never
forgets; its Countdown scripts use 0.5). Selection:
draw a candidate set (``candidate_ratio * B`` prompts of a shuffled epoch of the pool, or the whole pool), sample
``gamma_q ~ Beta(alpha_q, beta_q)`` for every candidate (a Thompson sample: the posterior's own noise is the
exploration) and take the ``B`` candidates with the highest ``-(gamma_q - target)^2`` (target 0.5: prompts predicted
to be solved about half the time, where a group most likely has reward spread).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lit_rlft.selection.allocation import beta_spread
from lit_rlft.selection.base import (
    allowed_ids,
    check_num_prompts,
    check_version,
    draw_excluding,
    excluding,
    top_k_random_ties,
    validate_batch_size,
    validate_candidate_ratio,
    validate_num_prompts,
    validate_observation,
)
from lit_rlft.selection.uniform import CandidateStream


class MoPPSSelector:
    """Thompson sampling of Beta posteriors on prompt success rates (module docstring: the update).

    Args:
        num_prompts: pool size ``S``.
        num_generations: ``k``, completions per group (success rate ``p`` -> ``s = round(p * k)`` successes).
        prior: ``(alpha_0, beta_0)`` (1, 1: uniform).
        decay: ``lambda`` in (0, 1] (1: no forgetting, the reference code's default; 0.5 in its Countdown scripts).
        target: the success rate aimed at.
        candidate_ratio: candidates per step = ``candidate_ratio * B`` (the reference code's ``ts_ratio``: 16 for
            MATH, 8 for Countdown);
            ``None``: the whole pool.
        seed: seed of the candidate stream.

    Attributes (``S`` = ``num_prompts``):
        alpha, beta: ``[S]`` float64 posterior parameters.
        last_gamma: ``[C]`` the Thompson samples of the last selection's candidates, ``last_candidates`` ``[C]``.
    """

    version = 1

    def __init__(self, num_prompts: int, num_generations: int, prior: tuple[float, float] = (1.0, 1.0),
                 decay: float = 1.0, target: float = 0.5, candidate_ratio: int | None = 16, seed: int = 0) -> None:
        self.num_prompts = validate_num_prompts(num_prompts)
        if int(num_generations) != num_generations or num_generations < 1:
            raise ValueError(f"`num_generations` must be an integer >= 1, got {num_generations!r}")
        a0, b0 = (float(x) for x in prior)
        if not (np.isfinite(a0) and np.isfinite(b0) and a0 > 0 and b0 > 0):
            raise ValueError(f"`prior` (alpha_0, beta_0) must be positive, got {prior!r}")
        if not np.isfinite(decay) or not 0.0 < decay <= 1.0:
            raise ValueError(f"`decay` (lambda) must lie in (0, 1], got {decay!r}")
        if not 0.0 <= target <= 1.0:
            raise ValueError(f"`target` must lie in [0, 1], got {target!r}")
        self.num_generations = int(num_generations)
        self.alpha_0, self.beta_0 = a0, b0
        self.decay, self.target = float(decay), float(target)
        self.candidate_ratio = validate_candidate_ratio(candidate_ratio)
        self.candidates = CandidateStream(self.num_prompts, seed=seed)
        self.alpha = np.full(self.num_prompts, a0)  # [S]
        self.beta = np.full(self.num_prompts, b0)  # [S]
        self.num_observed = np.zeros(self.num_prompts, dtype=np.int64)  # [S] groups observed per prompt
        self.last_candidates: np.ndarray | None = None
        self.last_gamma: np.ndarray | None = None

    observes_group_sizes = True
    """:meth:`observe` takes each group's size (groups of different sizes: per-prompt allocation, screening)."""

    def observe(self, prompt_ids: np.ndarray, success_rates: np.ndarray, step: int,
                group_sizes: np.ndarray | None = None) -> None:
        """Update the posteriors of the prompts just rolled out (``[B]`` ids, ``[B]`` success rates; ``[B]``
        completions per group, default ``num_generations`` each)."""
        ids, rates = validate_observation(prompt_ids, success_rates, self.num_prompts)
        k = self.num_generations if group_sizes is None else np.asarray(group_sizes, dtype=np.float64).reshape(-1)
        s = np.rint(rates * k)  # [B] successes
        lam = self.decay
        self.alpha[ids] = lam * self.alpha[ids] + (1.0 - lam) * self.alpha_0 + s
        self.beta[ids] = lam * self.beta[ids] + (1.0 - lam) * self.beta_0 + (k - s)
        self.num_observed[ids] += 1

    def spread_probabilities(self, prompt_ids: np.ndarray, n_max: int, group_size: int) -> np.ndarray:
        """``[n, n_max + 1]`` probability that a group of ``0 .. n_max`` completions of each prompt has both outcomes,
        under its posterior (:func:`~lit_rlft.selection.allocation.beta_spread`; ``group_size`` unused)."""
        ids = np.asarray(prompt_ids, dtype=np.int64)
        return beta_spread(self.alpha[ids], self.beta[ids], n_max)

    def posterior_mean(self, prompt_ids: np.ndarray | None = None) -> np.ndarray:
        """``[n]`` (or ``[S]``) posterior mean success rates ``alpha / (alpha + beta)``."""
        a, b = (self.alpha, self.beta) if prompt_ids is None else (self.alpha[prompt_ids], self.beta[prompt_ids])
        return a / (a + b)

    def select(self, batch_size: int, step: int, rng: np.random.Generator,
               exclude: np.ndarray | None = None) -> np.ndarray:
        """``[batch_size]`` candidates (none in ``exclude``) whose Thompson sample is closest to ``target`` (ties at
        random)."""
        B = validate_batch_size(batch_size, self.num_prompts)
        if self.candidate_ratio is None or self.candidate_ratio * B >= self.num_prompts:
            cand = np.arange(self.num_prompts, dtype=np.int64) if not excluding(exclude) else \
                allowed_ids(self.num_prompts, exclude, B)
        else:
            cand = draw_excluding(self.candidates.draw, self.candidate_ratio * B, exclude, self.num_prompts)
        gamma = rng.beta(self.alpha[cand], self.beta[cand])  # [C] Thompson samples
        self.last_candidates, self.last_gamma = cand, gamma
        return cand[top_k_random_ties(-((gamma - self.target) ** 2), B, rng)]

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "num_prompts": self.num_prompts,
            "alpha": self.alpha.copy(),
            "beta": self.beta.copy(),
            "num_observed": self.num_observed.copy(),
            "candidates": self.candidates.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_version(state, self.version, "MoPPSSelector")
        check_num_prompts(state, self.num_prompts, "MoPPSSelector")
        for key in ("alpha", "beta"):
            value = np.asarray(state[key], dtype=np.float64)
            if value.shape != (self.num_prompts,):
                raise ValueError(f"MoPPSSelector checkpoint's {key!r} has shape {value.shape}, expected "
                                 f"({self.num_prompts},)")
            setattr(self, key, value.copy())
        self.num_observed = np.asarray(state.get("num_observed", np.zeros(self.num_prompts)), dtype=np.int64).copy()
        if "candidates" in state:
            self.candidates.load_state_dict(state["candidates"])
