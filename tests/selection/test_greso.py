"""GRESO: streaks and kinds, keep probabilities by hand, the adaptive p_easy / p_hard, filling, exact resume."""

from __future__ import annotations

import numpy as np
import pytest

from lit_rlft.selection.base import SelectionStrategy
from lit_rlft.selection.greso import EASY, HARD, GRESOSelector


def test_streaks_kinds_and_keep_probability_by_hand():
    g = GRESOSelector(6, initial_p=0.5, min_keep=0.01)
    g.observe(np.array([0, 1, 2]), np.array([1.0, 0.0, 0.5]), 0)  # easy, hard, informative
    g.observe(np.array([0, 1]), np.array([1.0, 0.0]), 1)
    assert g.streak[:4].tolist() == [2, 2, 0, 0] and g.kind[:3].tolist() == [EASY, HARD, 0]
    # p_easy / p_hard moved twice: step 0 had 1/3 easy (> target 0.25/3) and 1/3 hard (> 0.25*2/3): both down;
    # step 1 had 1/2 and 1/2: both down again -> 0.48
    assert g.p_easy == pytest.approx(0.48) and g.p_hard == pytest.approx(0.48)
    # keep probability: max(0.48 ** 2, 0.01) for the streaks of 2; 1 for prompts without a streak
    np.testing.assert_allclose(g.keep_probability(np.arange(4)), [0.48**2, 0.48**2, 1.0, 1.0])
    g.observe(np.array([0]), np.array([0.5]), 2)  # informative again: the streak resets
    assert g.streak[0] == 0 and g.kind[0] == 0
    g.streak[5], g.kind[5] = 50, HARD
    assert g.keep_probability(np.array([5]))[0] == 0.01  # never below min_keep


def test_p_rises_when_the_batch_has_few_zero_variance_groups():
    g = GRESOSelector(10, initial_p=0.5, step_size=0.01)
    g.observe(np.arange(10), np.full(10, 0.5), 0)  # no zero-variance group at all
    assert (g.p_easy, g.p_hard) == (pytest.approx(0.51), pytest.approx(0.51))


def test_selection_skips_zero_variance_prompts_and_fills_the_batch():
    g = GRESOSelector(40, initial_p=0.0, min_keep=0.0)  # a streak means always skipped
    g.observe(np.arange(20), np.ones(20), 0)  # prompts 0-19 all correct: skipped from now on
    ids = g.select(10, 1, np.random.default_rng(0))
    assert len(set(ids)) == 10 and all(i >= 20 for i in ids)
    assert g.last_skipped == g.last_skipped_easy > 0 and g.last_skipped_hard == 0
    # only 20 prompts can be taken: a batch of 30 is filled with skipped ones
    ids = g.select(30, 2, np.random.default_rng(1))
    assert len(set(ids)) == 30


def test_resume_is_exact():
    def run(g, rng, steps):
        out = []
        for t in steps:
            ids = g.select(5, t, rng)
            g.observe(ids, np.random.default_rng(t).integers(0, 3, size=5) / 2, t)
            out.append(ids.tolist())
        return out

    full, rng = GRESOSelector(30, seed=2), np.random.default_rng(3)
    expected = run(full, rng, range(8))
    first, rng1 = GRESOSelector(30, seed=2), np.random.default_rng(3)
    run(first, rng1, range(4))
    resumed, rng2 = GRESOSelector(30, seed=2), np.random.default_rng()
    resumed.load_state_dict(first.state_dict())
    rng2.bit_generator.state = rng1.bit_generator.state
    assert run(resumed, rng2, range(4, 8)) == expected[4:]


@pytest.mark.parametrize("kwargs, option", [({"target_zero_variance": 2.0}, "target_zero_variance"),
                                            ({"step_size": 0.0}, "step_size"), ({"min_keep": -1}, "min_keep")])
def test_bad_options_name_the_option(kwargs, option):
    with pytest.raises(ValueError, match=option):
        GRESOSelector(10, **kwargs)


def test_is_a_selection_strategy():
    assert isinstance(GRESOSelector(10), SelectionStrategy)
