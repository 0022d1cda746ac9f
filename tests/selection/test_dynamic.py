"""Dynamic sampling bookkeeping: which groups are kept, rounds, truncation, totals."""

from __future__ import annotations

import numpy as np
import pytest

from lit_rlft.selection import DynamicFilter, FilterRound, keep_mask


def test_keep_mask_is_non_zero_std() -> None:
    rewards = np.array(
        [
            [1.0, 1.0, 1.0, 1.0],  # all correct: std 0
            [0.0, 0.0, 0.0, 0.0],  # all wrong: std 0
            [0.0, 1.0, 0.0, 0.0],  # mixed
            [0.1, 0.1, 0.1, 0.1],  # shaped, all equal (float std of these is not exactly 0): dropped
            [0.1, 0.1, 1.0, 0.1],  # shaped, spread: kept
        ]
    )
    assert keep_mask(rewards).tolist() == [False, False, True, False, True]
    assert DynamicFilter.keep_mask(rewards).tolist() == [False, False, True, False, True]
    with pytest.raises(ValueError, match=r"\[b, G\]"):
        keep_mask(np.ones(4))


def test_rounds_until_filled_then_truncate() -> None:
    # batch 4; round 1 keeps 2 of 4 (groups 1, 3); round 2 keeps 3 of 4 (groups 4, 5, 7) -> 5 kept, done;
    # truncation to 4 keeps [1, 3, 4, 5] and counts 1 surplus; discarded: 2 + 1 = 3; rolled out 8.
    flt = DynamicFilter(max_rounds=10)
    acc = flt.start(batch_size=4)
    r1 = np.array([[0, 0], [0, 1], [1, 1], [1, 0]], dtype=float)
    r2 = np.array([[1, 0], [0, 1], [0, 0], [1, 0]], dtype=float)
    assert acc.add(r1).tolist() == [False, True, False, True]
    assert not acc.done and acc.num_kept == 2 and acc.remaining == 2 and acc.rounds == 1
    acc.add(r2)
    assert acc.done and acc.num_kept == 5 and acc.num_discarded == 3 and acc.remaining == 0
    with pytest.raises(RuntimeError, match="no more rounds"):
        acc.add(r2)
    result = acc.finish()
    assert result.kept == [1, 3, 4, 5]
    assert (result.num_kept, result.num_discarded, result.num_surplus, result.num_rolled_out) == (4, 3, 1, 8)
    assert result.rounds == 2 and result.filled
    with pytest.raises(RuntimeError, match="already"):
        acc.finish()
    assert flt.state_dict()["total_rolled_out"] == 8 and flt.total_kept == 4


def test_round_limit_and_custom_labels() -> None:
    # max_rounds 2, batch 3, each round keeps one group: stops after 2 rounds with 2 kept, not filled.
    acc = FilterRound(batch_size=3, max_rounds=2)
    acc.add(np.array([[0.0, 1.0], [1.0, 1.0]]), groups=["a", "b"])
    acc.add(np.array([[0.0, 0.0], [0.0, 1.0]]), groups=[("r2", 0), ("r2", 1)])
    assert acc.done and acc.rounds == 2
    result = acc.finish()
    assert result.kept == ["a", ("r2", 1)] and not result.filled and result.num_discarded == 2
    with pytest.raises(ValueError, match="labels"):
        FilterRound(batch_size=3, max_rounds=2).add(np.zeros((2, 2)), groups=[0])


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_max_rounds_validation(bad: float) -> None:
    with pytest.raises(ValueError, match="max_rounds"):
        DynamicFilter(max_rounds=bad)


def test_totals_round_trip() -> None:
    flt = DynamicFilter(max_rounds=1)
    acc = flt.start(batch_size=2)
    acc.add(np.array([[0.0, 0.0], [1.0, 0.0]]))
    acc.finish()
    restored = DynamicFilter(max_rounds=1)
    restored.load_state_dict(flt.state_dict())
    assert restored.state_dict() == flt.state_dict()
    assert (restored.total_steps, restored.total_unfilled, restored.total_discarded) == (1, 1, 1)
    restored.load_state_dict({"version": 1})  # older checkpoints lacking counters: zeros
    assert restored.total_steps == 0
