"""GRESO, pre-rollout filtering of prompts that keep giving no gradient (Zheng et al. 2025, "Act Only When It Pays").
Pure numpy.

A group has zero reward variance when all its completions were correct (*easy*) or all wrong (*hard*). GRESO keeps,
per prompt, how many of its latest groups in a row had zero variance (``k``, the streak) and of which kind the last
one was. Before rolling out, a candidate with ``k >= 1`` is skipped with probability ``1 - max(p ** k, min_keep)``,
``p`` being ``p_easy`` or ``p_hard`` by the kind of its last group (a prompt always keeps at least a ``min_keep``
chance: it may have become learnable); a candidate with ``k = 0`` (new, or informative last time) is always taken.
Candidates come in the order of a shuffled epoch of the pool, and more are drawn until the batch is full.

``p_easy`` and ``p_hard`` adapt every step by ``step_size`` toward a target share of zero-variance groups in the
batch (``target_zero_variance``, 0.25), of which hard prompts get the larger part (``hard_fraction``, 2/3): when the
batch held more easy (hard) zero-variance groups than their target share, ``p_easy`` (``p_hard``) goes down, so more
such prompts are skipped; otherwise it goes up.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lit_rlft.selection.base import (
    check_num_prompts,
    check_version,
    excluding,
    validate_batch_size,
    validate_num_prompts,
    validate_observation,
)
from lit_rlft.selection.uniform import CandidateStream

EASY, HARD = 1, 2  # kind of a prompt's last zero-variance group (0: none / informative)


class GRESOSelector:
    """Probabilistic skipping of prompts whose recent groups had no reward variance (module docstring).

    Args:
        num_prompts: pool size ``S``.
        target_zero_variance: zero-variance share of a batch that ``p_easy`` / ``p_hard`` steer toward.
        hard_fraction: the part of that share given to hard (all-wrong) prompts; easy ones get the rest.
        initial_p: starting ``p_easy`` and ``p_hard``.
        step_size: how far ``p_easy`` / ``p_hard`` move per step.
        min_keep: every candidate is kept with at least this probability.
        seed: seed of the candidate stream.

    Attributes (``S`` = ``num_prompts``):
        streak: ``[S]`` int, latest groups in a row with zero reward variance.
        kind: ``[S]`` int8, ``EASY`` / ``HARD`` for the last zero-variance group, 0 otherwise.
        p_easy, p_hard: the current base keep probabilities.
        last_skipped / last_skipped_easy / last_skipped_hard: candidates skipped by the last selection.
    """

    version = 1

    def __init__(self, num_prompts: int, target_zero_variance: float = 0.25, hard_fraction: float = 2 / 3,
                 initial_p: float = 0.5, step_size: float = 0.01, min_keep: float = 0.01, seed: int = 0) -> None:
        self.num_prompts = validate_num_prompts(num_prompts)
        for name, value in (("target_zero_variance", target_zero_variance), ("hard_fraction", hard_fraction),
                            ("initial_p", initial_p), ("min_keep", min_keep)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"`{name}` must lie in [0, 1], got {value!r}")
        if not 0.0 < step_size <= 1.0:
            raise ValueError(f"`step_size` must lie in (0, 1], got {step_size!r}")
        self.target_zero_variance, self.hard_fraction = float(target_zero_variance), float(hard_fraction)
        self.step_size, self.min_keep = float(step_size), float(min_keep)
        self.p_easy = self.p_hard = float(initial_p)
        self.candidates = CandidateStream(self.num_prompts, seed=seed)
        self.streak = np.zeros(self.num_prompts, dtype=np.int64)  # [S]
        self.kind = np.zeros(self.num_prompts, dtype=np.int8)  # [S]
        self.last_skipped = self.last_skipped_easy = self.last_skipped_hard = 0
        self.last_zero_variance = (0.0, 0.0)  # easy, hard share of the last observed batch

    @property
    def targets(self) -> tuple[float, float]:
        """The target zero-variance shares of a batch: ``(easy, hard)``."""
        return (self.target_zero_variance * (1.0 - self.hard_fraction), self.target_zero_variance * self.hard_fraction)

    def keep_probability(self, prompt_ids: np.ndarray) -> np.ndarray:
        """``[n]``: 1 for a prompt with no zero-variance streak, else ``max(p ** k, min_keep)``."""
        ids = np.asarray(prompt_ids, dtype=np.int64)
        k = self.streak[ids]
        p = np.where(self.kind[ids] == EASY, self.p_easy, self.p_hard)
        return np.where(k == 0, 1.0, np.maximum(p ** k, self.min_keep))

    def observe(self, prompt_ids: np.ndarray, success_rates: np.ndarray, step: int) -> None:
        """Update the streaks of the prompts rolled out (``[B]``) and move ``p_easy`` / ``p_hard``."""
        ids, rates = validate_observation(prompt_ids, success_rates, self.num_prompts)
        easy, hard = rates >= 1.0, rates <= 0.0  # [B]
        zero = easy | hard
        self.streak[ids] = np.where(zero, self.streak[ids] + 1, 0)
        self.kind[ids] = np.where(easy, EASY, np.where(hard, HARD, 0)).astype(np.int8)
        if ids.size:
            easy_share, hard_share = float(easy.mean()), float(hard.mean())
            target_easy, target_hard = self.targets
            self.p_easy = _step_toward(self.p_easy, easy_share > target_easy, self.step_size)
            self.p_hard = _step_toward(self.p_hard, hard_share > target_hard, self.step_size)
            self.last_zero_variance = (easy_share, hard_share)

    def select(self, batch_size: int, step: int, rng: np.random.Generator,
               exclude: np.ndarray | None = None) -> np.ndarray:
        """``[batch_size]`` ids: candidates in stream order (``exclude``, in flight, passed over), each kept with
        :meth:`keep_probability`; more are drawn until the batch is full. After a whole pool's worth of candidates,
        skipped ones fill what is missing."""
        B = validate_batch_size(batch_size, self.num_prompts)
        chosen: list[int] = []
        taken: set[int] = excluding(exclude)
        skipped: list[int] = []
        drawn = 0
        while len(chosen) < B and drawn < self.num_prompts:
            cand = [int(i) for i in self.candidates.draw(B - len(chosen)) if int(i) not in taken]
            drawn += len(cand) or 1
            cand_ids = np.asarray(cand, dtype=np.int64)
            keep = rng.random(len(cand)) < self.keep_probability(cand_ids)  # [c]
            for i, k in zip(cand, keep):
                taken.add(i)
                (chosen if k else skipped).append(i)
        skipped_kinds = self.kind[np.asarray(skipped, dtype=np.int64)] if skipped else np.zeros(0, dtype=np.int8)
        self.last_skipped = len(skipped)
        self.last_skipped_easy = int((skipped_kinds == EASY).sum())
        self.last_skipped_hard = int((skipped_kinds == HARD).sum())
        if len(chosen) < B:  # the pool ran out of prompts to take: fill with the skipped ones, in draw order
            chosen += skipped[: B - len(chosen)]
        return np.asarray(chosen[:B], dtype=np.int64)

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "num_prompts": self.num_prompts,
            "streak": self.streak.copy(),
            "kind": self.kind.copy(),
            "p_easy": self.p_easy,
            "p_hard": self.p_hard,
            "candidates": self.candidates.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_version(state, self.version, "GRESOSelector")
        check_num_prompts(state, self.num_prompts, "GRESOSelector")
        streak = np.asarray(state["streak"], dtype=np.int64)
        kind = np.asarray(state["kind"], dtype=np.int8)
        if streak.shape != (self.num_prompts,) or kind.shape != (self.num_prompts,):
            raise ValueError(f"GRESOSelector checkpoint holds {streak.shape} streaks, this run's pool "
                             f"{self.num_prompts}")
        self.streak, self.kind = streak.copy(), kind.copy()
        self.p_easy, self.p_hard = float(state["p_easy"]), float(state["p_hard"])
        if "candidates" in state:
            self.candidates.load_state_dict(state["candidates"])


def _step_toward(p: float, too_many: bool, step: float) -> float:
    """``p`` lowered by ``step`` when the batch held too many such groups, raised otherwise, within [0, 1]."""
    return float(min(1.0, max(0.0, p - step if too_many else p + step)))
