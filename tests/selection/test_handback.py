"""The hand-back schedule and the batch it makes, against values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from lit_rlft.selection.handback import hand_back, handback_share


@pytest.mark.parametrize("passes, share", [(0.0, 0.0), (1.99, 0.0), (2.0, 0.0), (2.5, 0.25), (3.0, 0.5), (4.0, 1.0),
                                           (9.0, 1.0)])
def test_the_share_ramps_linearly_from_start_to_end(passes, share):
    assert handback_share(passes, 2.0, 4.0) == pytest.approx(share)


def test_equal_start_and_end_is_a_step_and_bad_bounds_are_refused():
    assert handback_share(2.9, 3.0, 3.0) == 0.0 and handback_share(3.0, 3.0, 3.0) == 1.0
    with pytest.raises(ValueError, match="start <= end"):
        handback_share(1.0, 4.0, 2.0)
    with pytest.raises(ValueError, match="0 <= start"):
        handback_share(1.0, -1.0, 2.0)


class Order:
    """A uniform order 100, 101, ... that skips what it is told is used (as BatchPlan.draw_unused does)."""

    def __init__(self) -> None:
        self.next = 100
        self.asked: list[tuple[int, set[int]]] = []

    def __call__(self, n: int, used: set[int]) -> np.ndarray:
        self.asked.append((n, used))
        out = np.arange(self.next, self.next + n)
        self.next += n
        return out


def test_a_quarter_of_eight_is_two_ids_replaced_by_the_next_uniform_draws():
    selected = np.arange(8)
    order = Order()
    out = hand_back(selected, 0.25, np.random.default_rng(0), order)
    dropped = sorted(set(selected) - set(out.tolist()))
    assert len(dropped) == 2 and out[-2:].tolist() == [100, 101]
    kept = [i for i in selected if i not in dropped]
    assert out[:6].tolist() == kept  # the kept selections keep their order
    assert order.asked == [(2, set(kept))]  # the uniform order skips the kept ones


def test_share_zero_keeps_the_batch_and_share_one_replaces_it_all():
    selected = np.array([5, 3, 9, 1])
    assert hand_back(selected, 0.0, np.random.default_rng(0), Order()).tolist() == [5, 3, 9, 1]
    assert hand_back(selected, 1.0, np.random.default_rng(0), Order()).tolist() == [100, 101, 102, 103]


def test_a_short_uniform_order_is_filled_with_the_selectors_own_ids():
    out = hand_back(np.array([1, 2, 3, 4]), 1.0, np.random.default_rng(0), lambda n, used: np.array([7]))
    assert len(out) == 4 and len(set(out.tolist())) == 4 and 7 in out.tolist()
