"""ShareController: hand-computed signals, and the share's direction on made-up reward streams where selection pays
and where it hurts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lit_rlft.selection.auto import ShareController, split_batch


def test_first_step_signal_by_hand():
    c = ShareController(num_prompts=10, initial_share=0.5, rate=0.5, horizon=2.0)
    # selected: rates 0.5, 0.25, 1.0 -> 2 informative of 3; control: 0.0, 0.5 -> 1 of 2
    s = c.observe(np.array([0, 1, 2]), np.array([0.5, 0.25, 1.0]), np.array([0.0, 0.5]))
    assert s.informative_selected == pytest.approx((2 + 1) / (3 + 2))
    assert s.informative_control == pytest.approx((1 + 1) / (2 + 2))
    assert s.coverage == 1.0  # no prompt drawn twice
    assert s.ratio == pytest.approx(0.6 / 0.5)
    assert s.share == pytest.approx(1 / (1 + math.exp(-0.5 * math.log(1.2))))


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


def _stream(c: ShareController, steps: int, p_sel: float, p_ctrl: float, focus: int, rng, batch: int = 32) -> list[float]:
    """Made-up reward streams: each selected group is informative with probability ``p_sel`` and drawn from the
    ``focus`` prompts the selector favours; control groups are informative with probability ``p_ctrl``."""
    shares = []
    for _ in range(steps):
        k = int(round(c.share * batch))
        ids = rng.choice(focus, size=k, replace=False)
        sel = np.where(rng.random(k) < p_sel, 0.5, 0.0)
        ctrl = np.where(rng.random(batch - k) < p_ctrl, 0.5, 1.0)
        shares.append(c.observe(ids, sel, ctrl).share)
    return shares


def test_the_share_rises_where_selection_pays():
    # the selector's groups are twice as often informative and spread over the whole pool
    c = ShareController(num_prompts=1000)
    shares = _stream(c, 150, p_sel=0.5, p_ctrl=0.25, focus=1000, rng=np.random.default_rng(1))
    assert shares[-1] == pytest.approx(0.75)  # 1 - min_control
    assert shares[20] > 0.6


def test_the_share_falls_where_selection_repeats_a_few_prompts():
    # as informative as before, but on 40 prompts of 1000 again and again: the policy fits them
    c = ShareController(num_prompts=1000)
    shares = _stream(c, 150, p_sel=0.5, p_ctrl=0.25, focus=40, rng=np.random.default_rng(1))
    assert shares[-1] == pytest.approx(0.125)  # min_selected
    assert c.last.coverage < 0.1


def test_the_share_falls_where_the_selectors_groups_teach_no_more_than_uniforms():
    c = ShareController(num_prompts=1000)
    shares = _stream(c, 150, p_sel=0.15, p_ctrl=0.3, focus=1000, rng=np.random.default_rng(2))
    assert shares[-1] < 0.2 and shares[30] < 0.5


def test_the_share_turns_when_the_regime_does():
    c = ShareController(num_prompts=1000)
    rng = np.random.default_rng(3)
    up = _stream(c, 60, p_sel=0.5, p_ctrl=0.25, focus=1000, rng=rng)
    down = _stream(c, 120, p_sel=0.28, p_ctrl=0.28, focus=100, rng=rng)
    assert up[-1] > 0.7 and down[-1] < 0.2


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
