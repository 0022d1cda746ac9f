"""MoPPS: the Beta update by hand, Thompson selection toward the target, candidates, exact resume."""

from __future__ import annotations

import numpy as np
import pytest

from lit_rlft.selection.base import SelectionStrategy
from lit_rlft.selection.mopps import MoPPSSelector


def test_posterior_update_by_hand():
    # G = 4; prompt 2 solved 3 of 4 (s = 3), prompt 5 solved 0 of 4; prior (1, 1)
    m = MoPPSSelector(8, num_generations=4, candidate_ratio=None)
    m.observe(np.array([2, 5]), np.array([0.75, 0.0]), step=0)
    assert (m.alpha[2], m.beta[2]) == (4.0, 2.0) and (m.alpha[5], m.beta[5]) == (1.0, 5.0)
    assert m.alpha[0] == 1.0 and m.beta[0] == 1.0  # not rolled out: unchanged
    # decay 0.5 toward the prior (1, 1): alpha = 0.5 * 4 + 0.5 * 1 + 2 = 4.5, beta = 0.5 * 2 + 0.5 + 2 = 3.5
    d = MoPPSSelector(8, num_generations=4, decay=0.5, candidate_ratio=None)
    d.observe(np.array([2]), np.array([0.75]), 0)
    assert (d.alpha[2], d.beta[2]) == (2.5 + 1.5, 1.5 + 0.5)  # first update: 0.5*1 + 0.5*1 + 3, 0.5 + 0.5 + 1
    d.observe(np.array([2]), np.array([0.5]), 1)
    assert (d.alpha[2], d.beta[2]) == (4.5, 3.5)
    np.testing.assert_allclose(d.posterior_mean(np.array([2])), [4.5 / 8])


def test_selection_prefers_prompts_near_the_target():
    # 3 prompts seen often at 50%, 3 always solved, 3 never: the posterior noise is small, the 50% ones win
    m = MoPPSSelector(9, num_generations=8, candidate_ratio=None)
    for step in range(10):
        m.observe(np.arange(9), np.array([0.5] * 3 + [1.0] * 3 + [0.0] * 3), step)
    picks = [sorted(m.select(3, 10 + i, np.random.default_rng(i)).tolist()) for i in range(20)]
    assert all(p == [0, 1, 2] for p in picks)
    assert m.last_gamma.shape == (9,) and m.last_candidates.tolist() == list(range(9))


def test_candidates_are_a_shuffled_epoch_and_the_batch_comes_from_them():
    m = MoPPSSelector(20, num_generations=4, candidate_ratio=2)
    rng = np.random.default_rng(0)
    seen = []
    for step in range(2):  # 2 steps x 2 x B=5 = 20 candidates: one epoch, no repeats
        ids = m.select(5, step, rng)
        assert set(ids) <= set(m.last_candidates) and m.last_candidates.size == 10
        seen += m.last_candidates.tolist()
    assert sorted(seen) == list(range(20))


def test_resume_is_exact():
    def run(m, rng, steps):
        out = []
        for t in steps:
            ids = m.select(4, t, rng)
            m.observe(ids, np.random.default_rng(t).integers(0, 5, size=4) / 4, t)
            out.append(ids.tolist())
        return out

    full, rng = MoPPSSelector(50, 4, candidate_ratio=3, seed=1), np.random.default_rng(7)
    expected = run(full, rng, range(6))
    first, rng1 = MoPPSSelector(50, 4, candidate_ratio=3, seed=1), np.random.default_rng(7)
    run(first, rng1, range(3))
    state, rng_state = first.state_dict(), rng1.bit_generator.state
    resumed, rng2 = MoPPSSelector(50, 4, candidate_ratio=3, seed=1), np.random.default_rng()
    resumed.load_state_dict(state)
    rng2.bit_generator.state = rng_state
    assert run(resumed, rng2, range(3, 6)) == expected[3:]


@pytest.mark.parametrize("kwargs, option", [({"decay": 0.0}, "decay"), ({"target": 1.5}, "target"),
                                            ({"prior": (0.0, 1.0)}, "prior"), ({"candidate_ratio": 0}, "candidate")])
def test_bad_options_name_the_option(kwargs, option):
    with pytest.raises(ValueError, match=option):
        MoPPSSelector(10, 4, **kwargs)


def test_is_a_selection_strategy():
    assert isinstance(MoPPSSelector(10, 4), SelectionStrategy)
