"""Per-prompt rollout allocation under a budget (Knapsack RL's idea, with the value "expected informative groups").

Notation: ``K`` prompts to allocate among, ``n`` completions of one prompt, ``f_i(n)`` the probability that prompt
``i``'s group of ``n`` completions has both outcomes (a reward spread: GRPO gets a gradient from it)::

    f(n) = 1 - E[p^n] - E[(1 - p)^n]          (f(0) = f(1) = 0)

under a strategy's belief about the prompt's success rate ``p``:

- a point prediction (DOTS): ``1 - p^n - (1 - p)^n``;
- a Beta posterior (MoPPS): ``E[p^n] = prod_{j < n} (alpha + j) / (alpha + beta + j)``;
- a belief over DPS's three states (unsolved, partial, solved after a group of ``G``): a mixture of the state's
  conditional laws of ``p`` under a uniform prior: ``Beta(1, G + 1)`` for unsolved, ``Beta(G + 1, 1)`` for solved, and
  for partial the uniform density conditioned on a spread, ``(1 - p^G - (1 - p)^G) / ((G - 1) / (G + 1))``, whose
  moments are ``E[p^n] = (1/(n+1) - 1/(n+G+1) - n! G! / (n+G+1)!) / ((G - 1) / (G + 1))``.

:func:`allocate` gives each prompt ``n_i`` in ``[n_min, n_max]`` (steps of ``granularity``) maximising
``sum_i f_i(n_i)``, the expected number of informative groups, subject to ``sum_i n_i <= budget``, and spends no
completion whose gain in expected informative groups is below ``min_gain``. ``f`` grows with ``n`` by ever smaller
steps for ``n >= 1`` (``f(n+1) - f(n) = E[p^n (1-p) + (1-p)^n p]``, decreasing in ``n``), so taking the largest
per-completion gains first is optimal: one sort of the ``K x (n_max - n_min) / granularity`` gains. What it does: prompts believed always solved or never solved get ``n_min``; completions go where a few more
most raise the chance of a spread (success rates near 0.1 or 0.9 get more than 0.5, which shows both outcomes
early).
"""

from __future__ import annotations

from math import lgamma

import numpy as np

__all__ = ["allocate", "beta_spread", "point_spread", "state_spread"]


def point_spread(p: np.ndarray, n_max: int) -> np.ndarray:
    """``[K, n_max + 1]`` ``f(n) = 1 - p^n - (1 - p)^n`` for ``n = 0 .. n_max`` (0 at ``n <= 1``) from ``[K]`` ``p``."""
    p = np.clip(np.asarray(p, dtype=np.float64).reshape(-1, 1), 0.0, 1.0)  # [K, 1]
    n = np.arange(n_max + 1)[None, :]  # [1, n_max + 1]
    f = 1.0 - p**n - (1.0 - p) ** n
    f[:, :2] = 0.0
    return np.clip(f, 0.0, 1.0)


def beta_spread(alpha: np.ndarray, beta: np.ndarray, n_max: int) -> np.ndarray:
    """``[K, n_max + 1]`` ``f(n) = 1 - E[p^n] - E[(1-p)^n]`` under ``p ~ Beta(alpha, beta)`` (``[K]`` each)."""
    a = np.asarray(alpha, dtype=np.float64).reshape(-1, 1)  # [K, 1]
    b = np.asarray(beta, dtype=np.float64).reshape(-1, 1)
    j = np.arange(n_max)[None, :]  # [1, n_max]
    ones = np.ones((a.shape[0], 1))
    moments_p = np.concatenate([ones, np.cumprod((a + j) / (a + b + j), axis=1)], axis=1)  # [K, n_max + 1] E[p^n]
    moments_q = np.concatenate([ones, np.cumprod((b + j) / (a + b + j), axis=1)], axis=1)  # E[(1 - p)^n]
    f = 1.0 - moments_p - moments_q
    f[:, :2] = 0.0
    return np.clip(f, 0.0, 1.0)


def state_spread(group_size: int, n_max: int) -> np.ndarray:
    """``[3, n_max + 1]`` ``f(n)`` given DPS's state (unsolved, partial, solved) after a group of ``group_size``,
    under a uniform prior on ``p`` (module docstring)."""
    G = int(group_size)
    if G < 2:
        raise ValueError(f"a group of {G} completion(s) cannot be partially solved: group_size must be >= 2")
    unsolved = beta_spread(np.array([1.0]), np.array([G + 1.0]), n_max)[0]
    solved = beta_spread(np.array([G + 1.0]), np.array([1.0]), n_max)[0]
    z = (G - 1) / (G + 1)  # P(spread in G | p ~ U(0, 1))
    n = np.arange(n_max + 1)
    cross = np.exp([lgamma(k + 1) + lgamma(G + 1) - lgamma(k + G + 2) for k in n])  # int p^n (1-p)^G dp
    moment = (1.0 / (n + 1) - 1.0 / (n + G + 1) - cross) / z  # E[p^n | partial] (= E[(1-p)^n | partial], symmetric)
    partial = 1.0 - 2.0 * moment
    partial[:2] = 0.0
    return np.stack([unsolved, np.clip(partial, 0.0, 1.0), solved])


def allocate(spread: np.ndarray, budget: int, min_generations: int, max_generations: int, granularity: int = 1,
             min_gain: float = 0.0) -> np.ndarray:
    """Completions per prompt maximising the expected informative groups within ``budget`` (module docstring).

    Args:
        spread: ``[K, n_max + 1]`` ``f_i(n)`` for ``n = 0 .. n_max`` (``n_max >= max_generations``).
        budget: completions to spend at most, all prompts together (``>= K * min_generations``).
        min_generations: ``n_min`` every prompt gets (>= 1).
        max_generations: ``n_max`` any prompt gets at most.
        granularity: completions are added in steps of this many (``n_i = n_min + granularity * j``).
        min_gain: a step is taken only if it raises the expected informative groups by at least this much per
            completion.

    Returns:
        ``[K]`` int64 completions per prompt.
    """
    f = np.asarray(spread, dtype=np.float64)
    K = f.shape[0]
    if min_generations < 1 or max_generations < min_generations or granularity < 1:
        raise ValueError(f"need 1 <= min_generations <= max_generations and granularity >= 1, got "
                         f"{min_generations}, {max_generations}, {granularity}")
    if f.ndim != 2 or f.shape[1] <= max_generations:
        raise ValueError(f"`spread` must be [K, n_max + 1] with n_max >= {max_generations}, got {f.shape}")
    if budget < K * min_generations:
        raise ValueError(f"a budget of {budget} completions cannot give {K} prompts {min_generations} each")
    n = np.full(K, min_generations, dtype=np.int64)
    steps = (max_generations - min_generations) // granularity
    room = (budget - K * min_generations) // granularity
    if K == 0 or steps == 0 or room == 0:
        return n
    marks = min_generations + granularity * np.arange(steps + 1)  # [J + 1] the allowed sizes
    gains = np.diff(f[:, marks], axis=1) / granularity  # [K, J] per completion, step j: marks[j] -> marks[j + 1]
    gains = np.minimum.accumulate(gains, axis=1)  # non-increasing along j (it is, up to rounding): prefixes win
    flat = gains.reshape(-1)
    take = min(int(room), flat.size, int((flat >= max(min_gain, 1e-12)).sum()))
    if take == 0:
        return n
    order = np.lexsort((np.tile(np.arange(steps), K), -flat))  # largest gain first, earlier steps first on ties
    chosen = order[:take]
    n += np.bincount(chosen // steps, minlength=K) * granularity
    return n
