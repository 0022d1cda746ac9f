"""History resampling: the drop rule worked out by hand, fallback, resume."""

from __future__ import annotations

import numpy as np
import pytest

from lit_rlft.selection import HistoryResampler, SelectionStrategy


def test_drop_rule_by_hand() -> None:
    # Pool of 6, batches of 3: epoch 1 is two batches. Outcomes: prompt 0 solved (p = 1), 1 unsolved, 2 mixed,
    # 3 solved, 4 mixed then solved in a later observation, 5 never observed.
    # Epoch 2 keeps 1 (all wrong), 2 (mixed), 5 (never observed); drops 0, 3, 4 (last group all correct).
    hr = HistoryResampler(num_prompts=6, seed=0)
    epoch1 = np.concatenate([hr.select(3, 0), hr.select(3, 1)])
    assert sorted(epoch1.tolist()) == list(range(6)) and hr.num_active == 6
    hr.observe(np.array([0, 1, 2, 3, 4]), np.array([1.0, 0.0, 0.5, 1.0, 0.25]), step=1)
    hr.observe(np.array([4]), np.array([1.0]), step=2)
    assert hr.active_mask().tolist() == [False, True, True, False, False, True]
    epoch2 = hr.select(3, 2)
    assert sorted(epoch2.tolist()) == [1, 2, 5] and hr.num_active == 3 and hr.epoch == 2
    # a dropped prompt observed again below 1 comes back at the next epoch's start
    hr.observe(np.array([1, 2, 5, 0]), np.array([1.0, 0.5, 0.0, 0.5]), step=3)
    assert sorted(hr.select(3, 3).tolist()) == [0, 2, 5]


def test_top_up_uses_the_next_epoch_after_dropping() -> None:
    # Pool of 5, batches of 2: batch 3 takes the last id of epoch 1 and one id of epoch 2.
    hr = HistoryResampler(num_prompts=5, seed=1)
    b1, b2 = hr.select(2, 0), hr.select(2, 1)
    leftover = hr._batcher.perm[4]
    solved = np.concatenate([b1, b2])
    hr.observe(solved, np.ones(4), step=1)  # 4 prompts solved, only `leftover` stays active
    with pytest.warns(UserWarning, match="whole pool"):  # 1 active < batch of 2: fall back to all prompts
        b3 = hr.select(2, 2)
    assert b3[0] == leftover and len(set(b3.tolist())) == 2 and hr.num_fallbacks == 1 and hr.num_active == 5

    hr = HistoryResampler(num_prompts=5, seed=1)
    b1, b2 = hr.select(2, 0), hr.select(2, 1)
    leftover = hr._batcher.perm[4]
    hr.observe(b1, np.ones(2), step=1)  # 2 solved: epoch 2 holds the 3 others
    b3 = hr.select(2, 2)
    assert b3[0] == leftover and b3[1] in b2.tolist() + [leftover] and b3[1] != leftover
    assert hr.num_active == 3
    b4 = hr.select(2, 3)  # the rest of epoch 2 (2 ids)
    assert sorted(np.concatenate([b3[1:], b4]).tolist()) == sorted(np.setdiff1d(np.arange(5), b1).tolist())


def test_everything_solved_falls_back_to_all_prompts() -> None:
    hr = HistoryResampler(num_prompts=4, seed=0)
    ids = hr.select(4, 0)
    hr.observe(ids, np.ones(4), step=0)
    with pytest.warns(UserWarning, match="whole pool"):
        again = hr.select(4, 1)
    assert sorted(again.tolist()) == [0, 1, 2, 3] and hr.num_fallbacks == 1


def test_resume_continues_exactly() -> None:
    def outcomes(t: int, ids: np.ndarray) -> np.ndarray:
        return np.random.default_rng([7, t]).choice([0.0, 0.5, 1.0], size=ids.size, p=[0.3, 0.5, 0.2])

    full = HistoryResampler(20, seed=2)
    expected = []
    for t in range(15):
        ids = full.select(6, t)
        full.observe(ids, outcomes(t, ids), t)
        expected.append(ids.tolist())

    first, got = HistoryResampler(20, seed=2), []
    for t in range(7):
        ids = first.select(6, t)
        first.observe(ids, outcomes(t, ids), t)
        got.append(ids.tolist())
    resumed = HistoryResampler(20, seed=0)
    resumed.load_state_dict(first.state_dict())
    for t in range(7, 15):
        ids = resumed.select(6, t)
        resumed.observe(ids, outcomes(t, ids), t)
        got.append(ids.tolist())
    assert got == expected
    assert resumed.num_active == full.num_active < 20
    with pytest.raises(ValueError, match="pool of 20"):
        HistoryResampler(21).load_state_dict(first.state_dict())
    assert isinstance(resumed, SelectionStrategy)
