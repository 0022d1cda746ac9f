"""ShareController: hand-computed signals, and the share's direction on made-up reward streams where selection pays
and where it hurts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lit_rlft.selection.auto import ShareController, Transfer, probe_variance, split_batch


def test_first_step_signal_by_hand():
    c = ShareController(num_prompts=10, initial_share=0.5, rate=0.5, horizon=2.0)
    # selected: rates 0.5, 0.25, 1.0 -> 2 informative of 3; control: 0.0, 0.5 -> 1 of 2
    s = c.observe(np.array([0, 1, 2]), np.array([0.5, 0.25, 1.0]), np.array([0.0, 0.5]), transfer=0.75)
    assert s.informative_selected == pytest.approx((2 + 1) / (3 + 2))
    assert s.informative_control == pytest.approx((1 + 1) / (2 + 2))
    assert s.coverage == 1.0  # no prompt drawn twice
    assert s.transfer == 0.75
    assert s.ratio == pytest.approx(0.75 * 0.6 / 0.5)
    # the informative ratio's standard error: (1 - .6) / (.6 * 5) + (1 - .5) / (.5 * 4), one of it to the selector
    se = math.sqrt(0.4 / 3.0 + 0.5 / 2.0)
    assert c.ratio_error() == pytest.approx(se)
    assert s.share == pytest.approx(1 / (1 + math.exp(-0.5 * (math.log(0.9) + se))))
    exact = ShareController(num_prompts=10, initial_share=0.5, rate=0.5, horizon=2.0, z=0.0)
    e = exact.observe(np.array([0, 1, 2]), np.array([0.5, 0.25, 1.0]), np.array([0.0, 0.5]), transfer=0.75)
    assert e.share == pytest.approx(1 / (1 + math.exp(-0.5 * math.log(0.9))))
    # a step later: counts discounted by 1 - 1/horizon = 0.5 before the new ones are added
    s = c.observe(np.array([3]), np.array([0.5]), np.array([0.0]))
    assert s.informative_selected == pytest.approx((2 * 0.5 + 1 + 1) / (3 * 0.5 + 1 + 2))
    assert s.informative_control == pytest.approx((1 * 0.5 + 0 + 1) / (2 * 0.5 + 1 + 2))


def test_coverage_is_the_pool_share_of_the_selectors_draws():
    # decay 1 - 1/horizon = 0.5; step 1 draws {0, 1}, step 2 draws {0, 1}: counts 0.5 + 1 each
    c = ShareController(num_prompts=8, horizon=2.0)
    c.observe(np.array([0, 1]), np.array([0.5, 0.5]), np.array([0.5]))
    c.observe(np.array([0, 1]), np.array([0.5, 0.5]), np.array([0.5]))
    w, w2, cc = 0.5 * 2 + 2, 0.25 * 2 + 2, 2 * 1.5 ** 2
    q = (cc - w2) / (w ** 2 - w2)
    assert c.coverage() == pytest.approx(1 / (8 * q))
    # two prompts: q is 1/2 once the pairs within a step are counted as (0, 1), across steps as repeats
    assert c.coverage() < 0.5


def test_uniform_draws_have_coverage_near_one():
    rng = np.random.default_rng(0)
    c = ShareController(num_prompts=200, horizon=32.0)
    for _ in range(200):
        ids = rng.choice(200, size=24, replace=False)
        c.observe(ids, np.full(24, 0.5), np.full(8, 0.5))
    assert c.coverage() > 0.9


def _stream(c: ShareController, steps: int, p_sel: float, p_ctrl: float, focus: int, rng, batch: int = 32,
            transfer: float = 1.0) -> list[float]:
    """Made-up reward streams: each selected group is informative with probability ``p_sel`` and drawn from the
    ``focus`` prompts the selector favours; control groups are informative with probability ``p_ctrl``; the
    learning transfers as ``transfer`` says."""
    shares = []
    for _ in range(steps):
        k = int(round(c.share * batch))
        ids = rng.choice(focus, size=k, replace=False)
        sel = np.where(rng.random(k) < p_sel, 0.5, 0.0)
        ctrl = np.where(rng.random(batch - k) < p_ctrl, 0.5, 1.0)
        shares.append(c.observe(ids, sel, ctrl, transfer).share)
    return shares


def test_the_share_rises_where_selection_pays():
    # the selector's groups are twice as often informative and spread over the whole pool
    c = ShareController(num_prompts=1000)
    shares = _stream(c, 150, p_sel=0.5, p_ctrl=0.25, focus=1000, rng=np.random.default_rng(1))
    assert shares[-1] == pytest.approx(0.875)  # 1 - min_control
    assert shares[20] > 0.6


def test_the_share_falls_where_what_the_policy_learns_does_not_transfer():
    # as informative as before, but the policy fits the prompts it trains on: a third of its gain holds on
    # held-back prompts (the selector's twice as informative groups are worth 2/3 of uniform's)
    c = ShareController(num_prompts=1000)
    shares = _stream(c, 150, p_sel=0.5, p_ctrl=0.25, focus=40, rng=np.random.default_rng(1), transfer=1 / 3)
    assert shares[-1] == pytest.approx(0.125)  # min_selected
    assert shares[40] < 0.3
    assert c.last.coverage < 0.1  # the diagnostic sees the 40 prompts


def test_the_share_falls_where_the_selectors_groups_teach_no_more_than_uniforms():
    c = ShareController(num_prompts=1000)
    shares = _stream(c, 150, p_sel=0.15, p_ctrl=0.3, focus=1000, rng=np.random.default_rng(2))
    assert shares[-1] < 0.2 and shares[30] < 0.5


def test_the_share_turns_when_the_regime_does():
    c = ShareController(num_prompts=1000)
    rng = np.random.default_rng(3)
    up = _stream(c, 60, p_sel=0.5, p_ctrl=0.25, focus=1000, rng=rng)
    down = _stream(c, 120, p_sel=0.5, p_ctrl=0.25, focus=100, rng=rng, transfer=0.3)
    assert up[-1] > 0.7 and down[-1] < 0.2


def test_transfer_is_the_slope_ratio_of_held_back_over_trained_success():
    t = Transfer(min_points=3)
    for step, held in [(0, 0.10), (10, 0.12), (20, 0.14)]:
        t.add_probe(step, held)
    t.add_pool(0, 0.20, 8)
    t.add_pool(1, 0.21, 8)
    assert t.value == 1.0  # two pool points: not yet measured
    t.add_pool(2, 0.22, 8)
    # pool slope 0.01 per step, held-back slope 0.002 per step
    assert t.value == pytest.approx(0.2)
    t.add_pool(3, 0.26, 24)  # weighted by groups: slope of (0,.2,8),(1,.21,8),(2,.22,8),(3,.26,24)
    x, y, w = np.array([0, 1, 2, 3.]), np.array([0.2, 0.21, 0.22, 0.26]), np.array([8, 8, 8, 24.])
    xm, ym = np.average(x, weights=w), np.average(y, weights=w)
    slope = np.sum(w * (x - xm) * (y - ym)) / np.sum(w * (x - xm) ** 2)
    assert slope > 0 and t.value == pytest.approx(min(1.0, 0.002 / slope))
    t.add_pool(4, 0.5, 8)  # the pool rises fast, the held-back prompts do not follow
    assert 0.0 < t.value < 0.2
    t.add_probe(30, 0.0)  # held-back success falling: no transfer
    assert t.value == 0.0
    u = Transfer()
    u.load_state_dict(t.state_dict())
    assert u.value == t.value


def test_a_noisy_held_back_slope_is_given_one_standard_error_of_doubt():
    # probes at steps 0, 10, 20 with variances .0004, .0001, .0004: dx = -10, 0, 10, Sxx = 200,
    # slope (0.14 - 0.10) / 20 = .002, se = sqrt(100 * .0004 + 100 * .0004) / 200 = sqrt(.08) / 200
    t = Transfer(min_points=3, z=1.0)
    for step, held, var in [(0, 0.10, 4e-4), (10, 0.12, 1e-4), (20, 0.14, 4e-4)]:
        t.add_probe(step, held, var)
    for step in range(3):
        t.add_pool(step, 0.20 + 0.01 * step, 8)  # pool slope .01
    b, se = t.held_slope()
    assert b == pytest.approx(0.002) and se == pytest.approx(np.sqrt(0.08) / 200)
    assert t.value == pytest.approx((0.002 + np.sqrt(0.08) / 200) / 0.01)
    assert Transfer(min_points=3, z=0.0).value == 1.0  # not measured yet
    exact = Transfer(min_points=3, z=0.0)
    exact.load_state_dict(t.state_dict())
    assert exact.value == pytest.approx(0.2)  # the point estimate
    doubtful = Transfer(min_points=3, z=6.0)
    doubtful.load_state_dict(t.state_dict())
    assert doubtful.value == 1.0  # six standard errors cover a held-back slope as steep as the pool's


def test_probe_variance_is_the_binomial_variance_of_the_mean():
    # rates .5 and .25 from 4 completions each: (.25 + .1875) / 3 / 4
    assert probe_variance(np.array([0.5, 0.25]), 4) == pytest.approx((0.25 + 0.1875) / 3 / 4)
    assert probe_variance(np.array([0.0, 1.0]), 4) == 0.0
    assert probe_variance(np.array([0.5]), 1) == 0.0


def test_no_transfer_is_measured_while_the_pool_does_not_improve():
    t = Transfer(min_points=2)
    for step in range(5):
        t.add_probe(step, 0.1 + 0.01 * step)
        t.add_pool(step, 0.3, 8)
    assert t.value == 1.0


def test_state_round_trip_continues_identically():
    rng = np.random.default_rng(4)
    a = ShareController(num_prompts=50)
    _stream(a, 10, 0.5, 0.3, 30, rng)
    b = ShareController(num_prompts=50)
    b.load_state_dict(a.state_dict())
    ra, rb = np.random.default_rng(5), np.random.default_rng(5)
    assert _stream(a, 10, 0.5, 0.3, 30, ra) == _stream(b, 10, 0.5, 0.3, 30, rb)
    with pytest.raises(ValueError, match="pool of 50 prompts"):
        ShareController(num_prompts=60).load_state_dict(a.state_dict())


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="min_selected \\+ min_control"):
        ShareController(10, min_selected=0.5, min_control=0.5)
    with pytest.raises(ValueError, match="initial_share"):
        ShareController(10, initial_share=0.9)
    with pytest.raises(ValueError, match="rate"):
        ShareController(10, rate=0.0)
    with pytest.raises(ValueError, match="horizon"):
        ShareController(10, horizon=0.5)
    with pytest.raises(ValueError, match="prompt ids"):
        ShareController(10).observe(np.array([10]), np.array([0.5]), np.array([0.5]))
    with pytest.raises(ValueError, match="transfer"):
        ShareController(10).observe(np.array([1]), np.array([0.5]), np.array([0.5]), transfer=1.5)


def test_split_batch_keeps_the_share_and_draws_the_rest_uniformly():
    rng = np.random.default_rng(0)
    order = iter(range(100, 200))

    def draw(n, used):
        return np.array([next(order) for _ in range(n)])

    kept, control = split_batch(np.arange(8), 0.75, rng, draw)
    assert kept.size == 6 and set(kept) <= set(range(8)) and list(kept) == sorted(kept)
    assert control.tolist() == [100, 101]
    # a pool too small for the draws: the selector's ids fill the rest, as kept
    kept, control = split_batch(np.arange(8), 0.5, rng, lambda n, used: np.array([50]))
    assert kept.size == 7 and control.tolist() == [50]
