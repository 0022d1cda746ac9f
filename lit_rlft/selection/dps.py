"""DPS, dynamics-predictive sampling: an HMM over each prompt's solved state, vectorised over the whole pool.

Every prompt ``q`` of the pool (``S`` prompts) carries a hidden state ``z`` in {0 unsolved, 1 partial, 2 solved}
(the paper's 1 / 2 / 3; see :mod:`lit_rlft.selection.base`), a Dirichlet posterior ``alpha[q]`` ``[3, 3]`` over its
own column-stochastic transition matrix ``Phi[j, i] = P(z' = j | z = i)``, a belief ``mu_post[q]`` ``[3]`` about its
state after the last step and a prediction ``mu_prior[q]`` ``[3]`` for the next one. Each step the ``B`` prompts with
the highest predicted probability of being *partially* solved are rolled out: those are the groups that give GRPO a
gradient, found without rolling out the rest (DAPO's dynamic sampling finds them by rolling out and discarding).

One step (:meth:`DPSSelector.observe`), for all ``S`` prompts at once, with ``lambda = decay`` and
``Phi_bar(alpha) = alpha / alpha.sum(axis=0)`` (each column divided by its sum)::

    sampled, observed y:  xi[j, i] ∝ e_y[j] * mu_post_prev[i] * Phi_bar(alpha_prev)[j, i],  sum(xi) = 1
                          mu_post = e_y
                          alpha   = lambda * alpha_prev + (1 - lambda) * alpha_0 + xi
    not sampled:          mu_post = mu_prior
                          alpha   = lambda * alpha_prev + (1 - lambda) * alpha_0
    every prompt:         mu_prior = normalise(Phi_bar(alpha) @ mu_post)

``xi`` uses ``Phi_bar(alpha_prev)``, the estimate *before* this step's update: the one that produced the prediction
the observation is compared with (``xi`` is then the exact posterior of the transition ``(z_prev = i, z = j)`` under
that estimate). The paper's reference numbers do not distinguish it from the decayed ``alpha``: in them ``xi`` only
ever sees a uniform ``alpha_prev`` or a one-hot ``mu_post_prev``.

Named priors ``alpha_0`` (Dirichlet counts, rows ``j`` = next state, columns ``i`` = current state, order
unsolved / partial / solved)::

    "uniform"    [[1, 1, 1],     "progress"   [[1, 1, 1],     "stability"  [[2, 1, 1],     "local"  [[2, 2, 1],
                  [1, 1, 1],                   [2, 1, 1],                   [1, 2, 1],               [2, 2, 2],
                  [1, 1, 1]]                   [1, 2, 2]]                   [1, 1, 2]]               [1, 2, 2]]

"progress": one extra count on moving up (unsolved -> partial, partial -> solved) and on solved staying solved;
"stability": one extra count on staying; "local": one extra count on staying or moving to a neighbouring state
(so only the jumps unsolved <-> solved keep a single count). ``alpha_0`` is also where forgetting pulls ``alpha``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from lit_rlft.selection.allocation import state_spread
from lit_rlft.selection.base import (
    NUM_STATES,
    PARTIAL,
    allowed_ids,
    check_num_prompts,
    check_version,
    draw_excluding,
    excluding,
    state_of,
    top_k_random_ties,
    validate_batch_size,
    validate_candidate_ratio,
    validate_num_prompts,
    validate_observation,
)
from lit_rlft.selection.uniform import CandidateStream

PRIORS: dict[str, np.ndarray] = {
    "uniform": np.ones((3, 3)),
    "progress": np.array([[1.0, 1.0, 1.0], [2.0, 1.0, 1.0], [1.0, 2.0, 2.0]]),
    "stability": np.array([[2.0, 1.0, 1.0], [1.0, 2.0, 1.0], [1.0, 1.0, 2.0]]),
    "local": np.array([[2.0, 2.0, 1.0], [2.0, 2.0, 2.0], [1.0, 2.0, 2.0]]),
}
"""Named Dirichlet priors ``alpha_0`` ``[3, 3]``, ``[j, i]`` = counts of the transition ``i -> j``."""


def prior_matrix(prior: str | np.ndarray) -> np.ndarray:
    """Resolve a prior name (see :data:`PRIORS`) or a user ``[3, 3]`` array of positive counts to a copy."""
    if isinstance(prior, str):
        if prior not in PRIORS:
            raise ValueError(f"unknown `prior` {prior!r}; valid names: {', '.join(PRIORS)} (or a 3x3 array)")
        return PRIORS[prior].copy()
    alpha_0 = np.array(prior, dtype=np.float64)
    if alpha_0.shape != (NUM_STATES, NUM_STATES) or not np.all(np.isfinite(alpha_0)) or np.any(alpha_0 <= 0):
        raise ValueError(f"`prior` must be a 3x3 array of positive finite counts, got {alpha_0.tolist()!r}")
    return alpha_0


def cold_start_belief(p: np.ndarray, group_size: int) -> np.ndarray:
    """Belief over the state of a group of ``G`` completions, each correct with probability ``p``.

    ``P(unsolved) = (1 - p)^G``, ``P(solved) = p^G``, the rest partial. With ``p = 1 - d_hat`` from DOTS's difficulty
    predictor this seeds DPS's beliefs for prompts it has never seen ("DPS with a DOTS cold start").

    Args:
        p: ``[n]`` predicted success probabilities in [0, 1].
        group_size: ``G``, completions per prompt.

    Returns:
        ``[n, 3]`` float64 beliefs (unsolved, partial, solved), rows summing to 1.
    """
    p = np.asarray(p, dtype=np.float64)
    if p.size and (not np.all(np.isfinite(p)) or p.min() < 0.0 or p.max() > 1.0):
        raise ValueError("success probabilities `p` must lie in [0, 1]")
    if int(group_size) != group_size or group_size < 1:
        raise ValueError(f"`group_size` must be an integer >= 1, got {group_size!r}")
    unsolved = (1.0 - p) ** group_size
    solved = p**group_size
    partial = np.clip(1.0 - unsolved - solved, 0.0, 1.0)
    return np.stack([unsolved, partial, solved], axis=-1)


class DPSSelector:
    """Dynamics-predictive sampling over a pool of ``S`` prompts (module docstring: the update).

    Args:
        num_prompts: pool size ``S``.
        decay: ``lambda`` in (0, 1]: how much of the transition counts survives a step (1 = never forget). The
            paper used 0.7 on MATH, 0.5 on Countdown and Geometry3k.
        prior: ``alpha_0``: "uniform" (all ones, the paper's default), "progress", "stability", "local" (module
            docstring), or a ``[3, 3]`` array of positive counts.
        entropy_bonus: ``w`` in ``score = mu_prior[partial] + w * entropy(mu_prior)`` (natural log); 0 = the paper.
            A positive ``w`` favours prompts whose state is uncertain (exploration).
        candidate_ratio: as the reference code's loader: each step a candidate set of ``min(candidate_ratio * B,
            S)`` prompts is drawn (a shuffled epoch of the pool, without replacement through the epoch) and the top-B
            of those are selected; ``None`` ranks the whole pool. The paper's scripts: 8 on Countdown, 32 on MATH.
            Beliefs of every prompt are propagated each step either way.
        seed: seed of the candidate stream.

    Attributes (``S`` = ``num_prompts``):
        alpha: ``[S, 3, 3]`` float64 Dirichlet counts, ``alpha[q, j, i]`` for the transition ``i -> j``.
        mu_post: ``[S, 3]`` belief about each prompt's state after the last step.
        mu_prior: ``[S, 3]`` prediction for the next step (what :meth:`select` ranks by).
        seen: ``[S]`` bool, observed at least once.
        last_state: ``[S]`` int8 last observed state, -1 if never observed.

    Example::

        dps = DPSSelector(num_prompts=len(pool), decay=0.5)
        tracker = PredictionTracker()
        ids = dps.select(batch_size=256, step=0, rng=rng)
        rates = roll_out_and_score(ids)  # [256] fraction of correct completions
        tracker.update(dps.predict_states(ids), state_of(rates))  # before observe
        dps.observe(ids, rates, step=0)
    """

    version = 1

    def __init__(
        self,
        num_prompts: int,
        decay: float = 0.5,
        prior: str | np.ndarray = "uniform",
        entropy_bonus: float = 0.0,
        candidate_ratio: int | None = None,
        seed: int = 0,
    ) -> None:
        self.num_prompts = validate_num_prompts(num_prompts)
        if not np.isfinite(decay) or not 0.0 < decay <= 1.0:
            raise ValueError(f"`decay` (lambda) must lie in (0, 1], got {decay!r}")
        if not np.isfinite(entropy_bonus):
            raise ValueError(f"`entropy_bonus` must be finite, got {entropy_bonus!r}")
        self.decay = float(decay)
        self.entropy_bonus = float(entropy_bonus)
        self.alpha_0 = prior_matrix(prior)  # [3, 3]
        self.prior = prior if isinstance(prior, str) else "custom"
        S = self.num_prompts
        self.alpha = np.broadcast_to(self.alpha_0, (S, 3, 3)).copy()  # [S, 3, 3]
        self.mu_post = np.full((S, 3), 1.0 / 3.0)  # [S, 3]
        self.mu_prior = np.full((S, 3), 1.0 / 3.0)  # [S, 3]
        self.seen = np.zeros(S, dtype=bool)  # [S]
        self.last_state = np.full(S, -1, dtype=np.int8)  # [S]
        self.last_step: int | None = None
        self.num_updates = 0
        self.candidate_ratio = validate_candidate_ratio(candidate_ratio)
        self.candidates = CandidateStream(S, seed=seed)
        self.last_candidates: np.ndarray | None = None  # the candidate set of the last selection (None: whole pool)

    # ----------------------------------------------------------------------------------------------- update
    def observe(self, prompt_ids: np.ndarray, success_rates: np.ndarray, step: int) -> None:
        """Advance every prompt's belief by one step; the prompts in ``prompt_ids`` were sampled.

        Call exactly once per training step, with strictly increasing ``step`` (e.g. ``trainer.global_step``):
        each call is one HMM transition whatever the gap between steps. Prompts not in ``prompt_ids`` count as not
        sampled.

        Args:
            prompt_ids: ``[B]`` int64 unique ids of the prompts rolled out this step.
            success_rates: ``[B]`` fraction of each prompt's ``G`` completions that were correct.
            step: the training step these outcomes belong to.
        """
        ids, rates = validate_observation(prompt_ids, success_rates, self.num_prompts)
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(
                f"DPS observed step {step} after step {self.last_step}: observe() is called once per training step "
                "with a strictly increasing step"
            )
        y = state_of(rates).astype(np.intp)  # [B]
        rows = np.arange(ids.size)

        # 1. soft transition counts of the sampled prompts, under Phi_bar(alpha_prev) (the pre-update estimate):
        #    xi[y, i] ∝ mu_post_prev[i] * alpha_prev[y, i] / sum_j alpha_prev[j, i]; every other row of xi is 0
        alpha_prev = self.alpha[ids]  # [B, 3, 3] (a copy)
        xi_row = self.mu_post[ids] * alpha_prev[rows, y, :] / alpha_prev.sum(axis=1)  # [B, 3]
        xi_row /= xi_row.sum(axis=1, keepdims=True)

        # 2. beliefs after this step: the prediction if not sampled, the observed state if sampled
        np.copyto(self.mu_post, self.mu_prior)  # [S, 3]
        self.mu_post[ids] = 0.0
        self.mu_post[ids, y] = 1.0

        # 3. forget towards alpha_0 (every prompt), then count this step's transitions (sampled prompts)
        if self.decay < 1.0:
            self.alpha *= self.decay  # [S, 3, 3], in place
            self.alpha += (1.0 - self.decay) * self.alpha_0  # broadcast [3, 3]
        self.alpha[ids, y, :] += xi_row  # ids are unique: plain fancy-index add is exact

        # 4. predict: mu_prior = Phi_bar(alpha) @ mu_post, without materialising Phi_bar:
        #    sum_i alpha[j, i] / colsum[i] * mu_post[i] = alpha @ (mu_post / colsum)
        weights = np.einsum("sji->si", self.alpha)  # [S, 3] column sums
        np.divide(self.mu_post, weights, out=weights)  # [S, 3] mu_post / column sums, in place
        np.einsum("sji,si->sj", self.alpha, weights, out=self.mu_prior)  # [S, 3]
        # sums to 1 up to rounding; renormalise so rounding cannot accumulate over thousands of steps
        # (an explicit 3-term sum: numpy's reduction over a length-3 inner axis is ~15x slower)
        total = self.mu_prior[:, 0] + self.mu_prior[:, 1] + self.mu_prior[:, 2]  # [S]
        self.mu_prior /= total[:, None]

        self.seen[ids] = True
        self.last_state[ids] = y
        self.last_step = int(step)
        self.num_updates += 1

    def init_belief(self, prompt_ids: np.ndarray, probs: np.ndarray, only_unseen: bool = True) -> int:
        """Set ``mu_prior`` and ``mu_post`` of prompts to given beliefs (e.g. :func:`cold_start_belief`).

        Args:
            prompt_ids: ``[n]`` int64 ids.
            probs: ``[n, 3]`` beliefs (unsolved, partial, solved), non-negative, rows summing to 1.
            only_unseen: leave prompts that were already observed alone (their beliefs come from real outcomes).

        Returns:
            How many prompts were set.
        """
        ids = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
        probs = np.asarray(probs, dtype=np.float64)
        if probs.shape != (ids.size, NUM_STATES):
            raise ValueError(f"`probs` must have shape [{ids.size}, 3], got {probs.shape}")
        if ids.size == 0:
            return 0
        validate_observation(ids, np.zeros(ids.size), self.num_prompts)
        sums = probs.sum(axis=1, keepdims=True)
        if np.any(probs < 0) or not np.all(np.isfinite(probs)) or np.any(np.abs(sums - 1.0) > 1e-6):
            raise ValueError("`probs` rows must be non-negative and sum to 1")
        if only_unseen:
            keep = ~self.seen[ids]
            ids, probs, sums = ids[keep], probs[keep], sums[keep]
        self.mu_prior[ids] = probs / sums
        self.mu_post[ids] = probs / sums
        return int(ids.size)

    # ----------------------------------------------------------------------------------------------- select
    def scores(self) -> np.ndarray:
        """``[S]`` ranking scores: ``mu_prior[:, partial] + entropy_bonus * entropy(mu_prior)``."""
        score = self.mu_prior[:, PARTIAL].copy()
        if self.entropy_bonus != 0.0:
            m = self.mu_prior
            plogp = m * np.log(np.where(m > 0.0, m, 1.0))  # [S, 3], 0 log 0 = 0
            score -= self.entropy_bonus * (plogp[:, 0] + plogp[:, 1] + plogp[:, 2])  # + w * entropy
        return score

    def select(self, batch_size: int, step: int, rng: np.random.Generator,
               exclude: np.ndarray | None = None) -> np.ndarray:
        """The ``batch_size`` candidates with the highest score, ties broken at random with ``rng``.

        Candidates: the whole pool, or with ``candidate_ratio`` the next ``candidate_ratio * B`` prompts of the
        candidate stream (the whole pool when that is at least ``S``), less ``exclude`` (in flight). O(S) (one
        ``np.partition``).

        Returns:
            ``[batch_size]`` int64 ids: those above the tie in descending score order, then the drawn ties.
        """
        B = validate_batch_size(batch_size, self.num_prompts)
        score = self.scores()  # [S]
        if self.candidate_ratio is None or self.candidate_ratio * B >= self.num_prompts:
            self.last_candidates = None
            if not excluding(exclude):
                return top_k_random_ties(score, B, rng)
            allowed = allowed_ids(self.num_prompts, exclude, B)  # [S - |exclude|]
            return allowed[top_k_random_ties(score[allowed], B, rng)]
        cand = draw_excluding(self.candidates.draw, self.candidate_ratio * B, exclude, self.num_prompts)  # [C]
        self.last_candidates = cand
        return cand[top_k_random_ties(score[cand], B, rng)]

    # ------------------------------------------------------------------------------------------ diagnostics
    def predict_states(self, prompt_ids: np.ndarray) -> np.ndarray:
        """``[n]`` int8 most probable next state (argmax of ``mu_prior``; exact ties go to the lower state, so a
        never-seen prompt, at 1/3 each, is predicted unsolved)."""
        return np.argmax(self.mu_prior[np.asarray(prompt_ids, dtype=np.int64)], axis=1).astype(np.int8)

    def spread_probabilities(self, prompt_ids: np.ndarray, n_max: int, group_size: int) -> np.ndarray:
        """``[n, n_max + 1]`` probability that a group of ``0 .. n_max`` completions of each prompt has both outcomes:
        the predicted state belief ``mu_prior`` mixing each state's law of the success rate after a group of
        ``group_size`` (:func:`~lit_rlft.selection.allocation.state_spread`)."""
        return self.mu_prior[np.asarray(prompt_ids, dtype=np.int64)] @ state_spread(group_size, n_max)

    def prob_partial(self, prompt_ids: np.ndarray) -> np.ndarray:
        """``[n]`` predicted probability that each prompt's next group is partially solved."""
        return self.mu_prior[np.asarray(prompt_ids, dtype=np.int64), PARTIAL].copy()

    # ---------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "num_prompts": self.num_prompts,
            "decay": self.decay,
            "alpha_0": self.alpha_0.copy(),
            "alpha": self.alpha.copy(),
            "mu_post": self.mu_post.copy(),
            "mu_prior": self.mu_prior.copy(),
            "seen": self.seen.copy(),
            "last_state": self.last_state.copy(),
            "last_step": self.last_step,
            "num_updates": self.num_updates,
            "candidates": self.candidates.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore arrays written by :meth:`state_dict`; ``decay`` and the prior stay as constructed (a warning
        says so if the checkpoint's differ). ``seen``, ``last_state``, ``last_step``, ``num_updates`` are optional.
        """
        check_version(state, self.version, "DPSSelector")
        check_num_prompts(state, self.num_prompts, "DPSSelector")
        S = self.num_prompts
        arrays = {
            "alpha": (np.float64, (S, 3, 3)),
            "mu_post": (np.float64, (S, 3)),
            "mu_prior": (np.float64, (S, 3)),
            "seen": (bool, (S,)),
            "last_state": (np.int8, (S,)),
        }
        loaded = {}
        for key, (dtype, shape) in arrays.items():
            if key not in state:
                if key in ("seen", "last_state"):
                    continue
                raise KeyError(f"DPSSelector state lacks {key!r}")
            value = np.asarray(state[key], dtype=dtype)
            if value.shape != shape:
                raise ValueError(
                    f"DPSSelector checkpoint's {key!r} has shape {value.shape}, expected {shape}: the checkpoint "
                    f"was written for another pool (this run's pool holds {S} prompts)"
                )
            loaded[key] = value.copy()
        if float(state.get("decay", self.decay)) != self.decay:
            warnings.warn(
                f"DPS checkpoint used decay={state['decay']}, continuing with decay={self.decay}",
                UserWarning,
                stacklevel=2,
            )
        if "alpha_0" in state and not np.array_equal(np.asarray(state["alpha_0"]), self.alpha_0):
            warnings.warn(
                "DPS checkpoint used another prior alpha_0; continuing with this run's", UserWarning, stacklevel=2
            )
        self.alpha = loaded["alpha"]
        self.mu_post = loaded["mu_post"]
        self.mu_prior = loaded["mu_prior"]
        self.seen = loaded.get("seen", np.zeros(S, dtype=bool))
        self.last_state = loaded.get("last_state", np.full(S, -1, dtype=np.int8))
        last_step = state.get("last_step")
        self.last_step = None if last_step is None else int(last_step)
        self.num_updates = int(state.get("num_updates", 0))
        if "candidates" in state:
            self.candidates.load_state_dict(state["candidates"])


class PredictionTracker:
    """Predicted vs observed states of the sampled prompts, accumulated until :meth:`reset`.

    Feed it each step *before* the selector sees the outcomes::

        tracker.update(selector.predict_states(ids), state_of(rates))
        selector.observe(ids, rates, step)

    ``confusion[o, p]`` counts prompts observed in state ``o`` (rows) and predicted in state ``p`` (columns),
    sklearn's orientation. Precision, recall and F1 are those of the partial state (the one DPS selects for);
    a metric whose denominator is 0 reports 0.0 (sklearn's ``zero_division=0``).
    """

    def __init__(self) -> None:
        self.confusion = np.zeros((NUM_STATES, NUM_STATES), dtype=np.int64)  # [3, 3] rows observed, cols predicted

    def update(self, predicted: np.ndarray, observed: np.ndarray) -> None:
        """Add ``[n]`` predicted and ``[n]`` observed 0-based states."""
        predicted = np.asarray(predicted, dtype=np.intp).reshape(-1)
        observed = np.asarray(observed, dtype=np.intp).reshape(-1)
        if predicted.shape != observed.shape:
            raise ValueError(f"got {predicted.size} predictions for {observed.size} observations")
        np.add.at(self.confusion, (observed, predicted), 1)

    def reset(self) -> None:
        self.confusion[...] = 0

    @property
    def total(self) -> int:
        return int(self.confusion.sum())

    @property
    def accuracy(self) -> float:
        return _ratio(np.trace(self.confusion), self.total)

    @property
    def precision(self) -> float:
        """Of the prompts predicted partial, the fraction observed partial."""
        return _ratio(self.confusion[PARTIAL, PARTIAL], self.confusion[:, PARTIAL].sum())

    @property
    def recall(self) -> float:
        """Of the prompts observed partial, the fraction predicted partial."""
        return _ratio(self.confusion[PARTIAL, PARTIAL], self.confusion[PARTIAL, :].sum())

    @property
    def f1(self) -> float:
        return _ratio(2.0 * self.precision * self.recall, self.precision + self.recall)

    def metrics(self) -> dict[str, float]:
        """Scalars for a logger: ``accuracy``, ``partial_precision``, ``partial_recall``, ``partial_f1``."""
        return {
            "accuracy": self.accuracy,
            "partial_precision": self.precision,
            "partial_recall": self.recall,
            "partial_f1": self.f1,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "confusion": self.confusion.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        confusion = np.asarray(state.get("confusion", np.zeros((3, 3))), dtype=np.int64)
        if confusion.shape != (NUM_STATES, NUM_STATES):
            raise ValueError(f"confusion matrix must be 3x3, got {confusion.shape}")
        self.confusion = confusion.copy()


def _ratio(numerator: float, denominator: float) -> float:
    return float(numerator) / float(denominator) if denominator else 0.0
