"""Per-prompt allocation: the spread probabilities against their formulas (and a numerical integral), the greedy
allocation against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lit_rlft.selection.allocation import allocate, beta_spread, point_spread, state_spread
from lit_rlft.selection.dps import DPSSelector
from lit_rlft.selection.mopps import MoPPSSelector


def test_point_and_beta_spread_are_their_formulas():
    f = point_spread(np.array([0.0, 0.5, 0.9]), 3)
    assert np.allclose(f, [[0, 0, 0, 0], [0, 0, 0.5, 0.75], [0, 0, 1 - 0.81 - 0.01, 1 - 0.729 - 0.001]])
    uniform = beta_spread(np.array([1.0]), np.array([1.0]), 6)[0]  # p ~ U(0, 1): E[p^n] = 1 / (n + 1)
    assert np.allclose(uniform[2:], [1 - 2 / (n + 1) for n in range(2, 7)])
    a, b = 2.0, 5.0  # E[p^2] = a (a + 1) / ((a + b)(a + b + 1)) = 6 / 56; E[(1-p)^2] = 30 / 56
    assert np.isclose(beta_spread(np.array([a]), np.array([b]), 2)[0, 2], 1 - 6 / 56 - 30 / 56)
    sharp = beta_spread(np.array([0.3e6]), np.array([0.7e6]), 8)  # a posterior this sure is the point prediction
    assert np.allclose(sharp, point_spread(np.array([0.3]), 8), atol=1e-5)


def test_state_spread_integrates_the_conditional_laws_of_the_success_rate():
    G, n_max = 8, 10
    p = (np.arange(200_000) + 0.5) / 200_000  # midpoint rule on [0, 1]
    spread_n = 1 - p[None, :] ** np.arange(n_max + 1)[:, None] - (1 - p[None, :]) ** np.arange(n_max + 1)[:, None]
    spread_n[:2] = 0
    for state, weight in enumerate([(1 - p) ** G, 1 - p**G - (1 - p) ** G, p**G]):  # likelihood of the state
        expected = (spread_n * weight).sum(1) / weight.sum()
        assert np.allclose(state_spread(G, n_max)[state], expected, atol=1e-6), state


def _best_by_brute_force(f, budget, lo, hi, step, min_gain):
    best, best_value = None, -1.0
    choices = range(lo, hi + 1, step)
    for n in itertools.product(choices, repeat=f.shape[0]):
        if sum(n) > budget:
            continue
        value = sum(f[i, k] for i, k in enumerate(n)) - min_gain * sum(n)  # what each completion must earn
        if value > best_value + 1e-12:
            best, best_value = n, value
    return np.array(best), best_value


@pytest.mark.parametrize("budget", [8, 14, 20, 40])
def test_greedy_allocation_is_the_brute_force_optimum(budget):
    rng = np.random.default_rng(0)
    p = np.array([0.0, 0.03, 0.2, 0.5, 0.97])
    f = beta_spread(p * 20 + 0.1 + rng.random(5), (1 - p) * 20 + 0.1, 12)
    for min_gain in (0.0, 0.02):
        n = allocate(f, budget, 1, 9, granularity=2, min_gain=min_gain)
        _, best = _best_by_brute_force(f, budget, 1, 9, 2, min_gain)
        value = f[np.arange(5), n].sum() - min_gain * n.sum()
        assert n.sum() <= budget and np.isclose(value, best), (n, value, best)


def test_allocation_gives_the_sure_prompts_the_minimum_and_the_rest_to_the_uncertain_ones():
    f = point_spread(np.array([0.0, 1.0, 0.1, 0.5]), 16)
    n = allocate(f, 4 * 8, 2, 16, granularity=2, min_gain=0.01)
    assert n.tolist()[:2] == [2, 2] and n[2] > n[3] >= 4 and n.sum() <= 32
    assert allocate(f, 4 * 8, 2, 16, 2, min_gain=1.0).tolist() == [2, 2, 2, 2]  # nothing is worth a completion
    with pytest.raises(ValueError, match="cannot give 4 prompts 2 each"):
        allocate(f, 7, 2, 16)


def test_strategies_predict_spread_from_their_state():
    mopps = MoPPSSelector(4, 8)
    mopps.observe(np.array([0, 1]), np.array([0.0, 0.5]), step=0)  # Beta(1, 9) and Beta(5, 5)
    f = mopps.spread_probabilities(np.array([0, 1, 2]), 4, 8)
    assert np.allclose(f, beta_spread(np.array([1.0, 5.0, 1.0]), np.array([9.0, 5.0, 1.0]), 4))
    mopps.observe(np.array([3]), np.array([0.5]), step=1, group_sizes=np.array([2]))  # 1 of 2: Beta(2, 2)
    assert np.allclose(mopps.alpha[3], 2.0) and np.allclose(mopps.beta[3], 2.0)
    dps = DPSSelector(3)
    dps.observe(np.array([0]), np.array([0.0]), step=0)
    f = dps.spread_probabilities(np.array([0, 1]), 6, 8)
    assert np.allclose(f, dps.mu_prior[[0, 1]] @ state_spread(8, 6))
    assert f[0, 6] < f[1, 6]  # predicted unsolved: a spread is less likely than for a prompt never seen
