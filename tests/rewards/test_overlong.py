"""DAPO's soft overlong punishment. L_max = 100, L_cache = 20: the ramp runs over lengths 81..100.
    length  80: 80 <= 100 - 20                    -> 0
    length  81: (80 - 81) / 20                    -> -0.05
    length  90: (80 - 90) / 20                    -> -0.5
    length 100: (80 - 100) / 20                   -> -1.0
    length 101: > L_max                           -> -1.0
"""

import pickle

import pytest

from lit_rlft.rewards import SoftOverlongPunishment, resolve_reward, soft_overlong_punishment

LENGTHS = [0, 80, 81, 90, 100, 101]
EXPECTED = [0.0, 0.0, -0.05, -0.5, -1.0, -1.0]


def test_soft_overlong_punishment_by_hand():
    reward = SoftOverlongPunishment(max_completion_length=100, soft_punish_cache=20)
    assert reward(["x"] * 6, completion_length=LENGTHS, answer=[None] * 6) == pytest.approx(EXPECTED)
    # no ramp: only lengths above the limit are punished
    assert soft_overlong_punishment(["x"] * 3, [99, 100, 101], max_completion_length=100,
                                    soft_punish_cache=0) == [0.0, 0.0, -1.0]


def test_equals_trl():
    pytest.importorskip("trl", reason="TRL is not installed: compared with trl.rewards.get_soft_overlong_punishment")
    from trl.rewards import get_soft_overlong_punishment

    for cache in (0, 1, 20, 100):
        trl_reward = get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=cache)
        ours = SoftOverlongPunishment(100, cache)
        lengths = list(range(0, 130, 3))
        assert ours([""] * len(lengths), completion_length=lengths) == trl_reward([[0] * n for n in lengths])


def test_from_yaml_and_picklable_for_the_reward_workers():
    reward = resolve_reward({"class_path": "lit_rlft.rewards.SoftOverlongPunishment",
                             "init_args": {"max_completion_length": 100, "soft_punish_cache": 20}})
    assert reward.name == "soft_overlong_punishment"
    again = pickle.loads(pickle.dumps(reward))
    assert again(["x"], completion_length=[90]) == [-0.5]


def test_errors_name_the_missing_column_and_bad_options():
    reward = SoftOverlongPunishment(100, 20)
    with pytest.raises(ValueError, match="completion_length"):
        reward(["x", "y"])
    with pytest.raises(ValueError, match="2 completions"):
        reward(["x", "y"], completion_length=[3])
    with pytest.raises(ValueError, match="soft_punish_cache"):
        SoftOverlongPunishment(100, 101)
    with pytest.raises(ValueError, match="max_completion_length"):
        SoftOverlongPunishment(0, 0)
