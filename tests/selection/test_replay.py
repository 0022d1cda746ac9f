"""Tests of the rollout-replay buffer: admission, FIFO, newest-per-prompt, sampling, state round-trip, config."""

from __future__ import annotations

import copy
import io
from collections import Counter

import numpy as np
import pytest
import torch

from lit_rlft.selection.replay import ReplayBuffer, StoredGroup, validate_replay_config


def make_group(prompt_id: int, correct: list[bool] | None = None, step: int = 0, length: int = 3) -> StoredGroup:
    """A group with G = len(correct) completions of lengths length, length+1, ... (default G=2, one correct)."""
    correct = [True, False] if correct is None else correct
    g = len(correct)
    lengths = [length + i for i in range(g)]
    return StoredGroup(
        prompt_id=prompt_id,
        prompt_tokens=torch.arange(4, dtype=torch.long) + prompt_id,  # [P=4]
        completion_tokens=[torch.arange(n, dtype=torch.long) + 100 * step for n in lengths],  # G x [L_i]
        behaviour_logprobs=[-torch.rand(n, dtype=torch.float32) for n in lengths],  # G x [L_i]
        rewards=torch.tensor([1.0 if c else 0.1 for c in correct], dtype=torch.float32),  # [G]
        correct=torch.tensor(correct, dtype=torch.bool),  # [G]
        step=step,
    )


def assert_groups_equal(a: StoredGroup, b: StoredGroup) -> None:
    assert a.prompt_id == b.prompt_id and a.step == b.step
    torch.testing.assert_close(a.prompt_tokens, b.prompt_tokens, rtol=0, atol=0)
    torch.testing.assert_close(a.rewards, b.rewards, rtol=0, atol=0)
    torch.testing.assert_close(a.correct, b.correct, rtol=0, atol=0)
    assert len(a.completion_tokens) == len(b.completion_tokens) == len(a.behaviour_logprobs)
    for x, y in zip(a.completion_tokens, b.completion_tokens):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    for x, y in zip(a.behaviour_logprobs, b.behaviour_logprobs):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# StoredGroup
# ---------------------------------------------------------------------------------------------------------------
def test_success_rate_and_effective():
    assert make_group(0, [True, False, False, False]).success_rate == 0.25
    assert make_group(0, [True, False]).is_effective
    assert not make_group(0, [False, False]).is_effective
    assert not make_group(0, [True, True]).is_effective


# ---------------------------------------------------------------------------------------------------------------
# Admission, FIFO, newest-per-prompt
# ---------------------------------------------------------------------------------------------------------------
def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity=0)
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity=-3)


def test_only_effective_groups_are_admitted():
    buffer = ReplayBuffer(capacity=4)
    assert buffer.add(make_group(1, [False, False, False])) is False  # p = 0
    assert buffer.add(make_group(2, [True, True, True])) is False  # p = 1
    assert buffer.add(make_group(3, [True, False, False])) is True  # p = 1/3
    assert buffer.prompt_ids() == [3]
    assert 3 in buffer and 1 not in buffer and 2 not in buffer
    assert buffer.stats(0)["rejected"] == 2.0


def test_rejected_group_keeps_older_group_of_same_prompt():
    buffer = ReplayBuffer(capacity=4)
    buffer.add(make_group(7, step=1))
    assert not buffer.add(make_group(7, [True, True], step=5))
    assert buffer.get(7).step == 1


def test_fifo_order_and_eviction_at_capacity():
    # capacity 3: add 10, 11, 12 -> [10, 11, 12]; add 13 evicts 10 -> [11, 12, 13]; add 14 evicts 11.
    buffer = ReplayBuffer(capacity=3)
    for step, pid in enumerate([10, 11, 12]):
        buffer.add(make_group(pid, step=step))
    assert buffer.prompt_ids() == [10, 11, 12]
    buffer.add(make_group(13, step=3))
    assert buffer.prompt_ids() == [11, 12, 13]
    assert 10 not in buffer
    buffer.add(make_group(14, step=4))
    assert buffer.prompt_ids() == [12, 13, 14]
    assert len(buffer) == 3
    assert buffer.stats(4)["evicted"] == 2.0


def test_newest_group_per_prompt_moves_to_back_and_replaces():
    # [1, 2, 3] then re-add 1 (step 5) -> [2, 3, 1] with the new contents; then add 4 evicts 2, not 1.
    buffer = ReplayBuffer(capacity=3)
    for pid in (1, 2, 3):
        buffer.add(make_group(pid, step=0))
    new = make_group(1, [True, False, False, False], step=5)
    assert buffer.add(new)
    assert buffer.prompt_ids() == [2, 3, 1]
    assert len(buffer) == 3
    assert_groups_equal(buffer.get(1), new)
    assert buffer.get(1).success_rate == 0.25
    buffer.add(make_group(4, step=6))
    assert buffer.prompt_ids() == [3, 1, 4]
    np.testing.assert_array_equal(buffer.ages(6), [6, 1, 0])
    assert buffer.stats(6)["replaced"] == 1.0


def test_add_many_counts_admitted():
    buffer = ReplayBuffer(capacity=8)
    groups = [make_group(0), make_group(1, [False, False]), make_group(2), make_group(3, [True, True])]
    assert buffer.add_many(groups) == 2
    assert buffer.prompt_ids() == [0, 2]


def test_stats_and_ages():
    buffer = ReplayBuffer(capacity=4)
    empty = buffer.stats(3)
    assert empty["size"] == 0.0 and empty["age_mean"] == 0.0 and empty["fill"] == 0.0
    buffer.add(make_group(0, step=1))  # age 4 at step 5
    buffer.add(make_group(1, [True, False, False, False], step=3))  # age 2
    ages = buffer.ages(5)
    assert ages.dtype == np.int64
    np.testing.assert_array_equal(ages, [4, 2])
    stats = buffer.stats(5)
    assert stats["size"] == 2.0 and stats["capacity"] == 4.0 and stats["fill"] == 0.5
    assert stats["age_mean"] == 3.0 and stats["age_max"] == 4.0 and stats["age_min"] == 2.0
    assert stats["success_rate_mean"] == pytest.approx((0.5 + 0.25) / 2)
    assert stats["admitted"] == 2.0


def test_stored_tensors_are_detached_cpu():
    group = make_group(0)
    group.behaviour_logprobs = [t.requires_grad_() for t in group.behaviour_logprobs]
    buffer = ReplayBuffer(capacity=2)
    buffer.add(group)
    stored = buffer.get(0)
    assert all(not t.requires_grad and t.device.type == "cpu" for t in stored.behaviour_logprobs)


# ---------------------------------------------------------------------------------------------------------------
# Shape validation
# ---------------------------------------------------------------------------------------------------------------
def test_shape_validation_errors():
    buffer = ReplayBuffer(capacity=4)

    g = make_group(0, [True, False, False])
    g.completion_tokens = g.completion_tokens[:2]
    with pytest.raises(ValueError, match=r"completion_tokens.*G=3"):
        buffer.add(g)

    g = make_group(0, [True, False, False])
    g.behaviour_logprobs = g.behaviour_logprobs + [torch.zeros(2)]
    with pytest.raises(ValueError, match=r"behaviour_logprobs.*G=3"):
        buffer.add(g)

    g = make_group(0, [True, False])
    g.behaviour_logprobs[1] = torch.zeros(g.completion_tokens[1].shape[0] + 1)
    with pytest.raises(ValueError, match=r"behaviour_logprobs\[1\].*must match"):
        buffer.add(g)

    g = make_group(0, [True, False])
    g.correct = torch.tensor([True, False, True])
    with pytest.raises(ValueError, match="correct"):
        buffer.add(g)

    g = make_group(0, [True, False])
    g.correct = torch.tensor([1, 0])
    with pytest.raises(TypeError, match="bool"):
        buffer.add(g)

    g = make_group(0, [True, False])
    g.rewards = g.rewards.unsqueeze(0)  # [1, G]
    with pytest.raises(ValueError, match="rewards"):
        buffer.add(g)

    g = make_group(0, [True, False])
    g.completion_tokens[0] = g.completion_tokens[0].unsqueeze(0)  # [1, L]
    with pytest.raises(ValueError, match=r"completion_tokens\[0\]"):
        buffer.add(g)

    g = make_group(0, [True, False])
    g.prompt_tokens = g.prompt_tokens.unsqueeze(0)  # [1, P]
    with pytest.raises(ValueError, match="prompt_tokens"):
        buffer.add(g)

    assert len(buffer) == 0


# ---------------------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------------------
def filled_buffer(n: int, capacity: int | None = None, seed: int = 0) -> ReplayBuffer:
    buffer = ReplayBuffer(capacity=capacity or n, seed=seed)
    for pid in range(n):
        buffer.add(make_group(pid, step=pid))
    return buffer


def test_sample_without_replacement_and_uniform():
    # 10 groups, 3 drawn per call, 3000 calls: each id expected 900 times (std ~25); allow +-100.
    buffer = filled_buffer(10)
    counts: Counter[int] = Counter()
    for _ in range(3000):
        drawn = [g.prompt_id for g in buffer.sample(3)]
        assert len(drawn) == 3 and len(set(drawn)) == 3
        counts.update(drawn)
    assert set(counts) == set(range(10))
    assert all(abs(c - 900) < 100 for c in counts.values()), counts


def test_sample_excludes_prompt_ids():
    buffer = filled_buffer(6)
    for exclude in ({0, 2, 4}, np.array([0, 2, 4]), torch.tensor([0, 2, 4]), [0, 2, 4, 99]):
        for _ in range(20):
            drawn = {g.prompt_id for g in buffer.sample(2, exclude_prompt_ids=exclude)}
            assert len(drawn) == 2 and drawn <= {1, 3, 5}
    # Asking for more than is available returns every non-excluded group.
    drawn = {g.prompt_id for g in buffer.sample(10, exclude_prompt_ids={0, 2, 4})}
    assert drawn == {1, 3, 5}


def test_sample_more_than_available_returns_all():
    buffer = filled_buffer(4, capacity=10)
    drawn = buffer.sample(7)
    assert sorted(g.prompt_id for g in drawn) == [0, 1, 2, 3]
    assert buffer.sample(0) == []
    assert ReplayBuffer(capacity=3).sample(5) == []
    assert buffer.sample(3, exclude_prompt_ids=range(4)) == []
    with pytest.raises(ValueError, match="k"):
        buffer.sample(-1)


def test_sample_deterministic_by_seed():
    draws = [[[g.prompt_id for g in filled_buffer(20, seed=s).sample(5)] for _ in range(2)] for s in (3, 3, 4)]
    assert draws[0] == draws[1]
    assert draws[0] != draws[2]
    a, b = filled_buffer(20, seed=3), filled_buffer(20, seed=3)
    assert [[g.prompt_id for g in a.sample(5)] for _ in range(5)] == [
        [g.prompt_id for g in b.sample(5)] for _ in range(5)
    ]


# ---------------------------------------------------------------------------------------------------------------
# State round-trip
# ---------------------------------------------------------------------------------------------------------------
def run_steps(buffer: ReplayBuffer, steps: range) -> list[list[int]]:
    """A little training loop: add fresh groups for 3 prompts of a 12-prompt pool, replay 2 others."""
    out = []
    for step in steps:
        fresh = [(7 * step + j) % 12 for j in range(3)]
        correct = [[True, False], [False, False], [True, False, False]]
        buffer.add_many(make_group(pid, correct[j], step=step) for j, pid in enumerate(fresh))
        out.append([g.prompt_id for g in buffer.sample(2, exclude_prompt_ids=set(fresh))])
        out.append(buffer.prompt_ids())
    return out


def test_state_round_trip_continues_exactly():
    torch.manual_seed(0)
    reference = ReplayBuffer(capacity=5, seed=11)
    run_steps(reference, range(6))

    torch.manual_seed(0)
    interrupted = ReplayBuffer(capacity=5, seed=11)
    run_steps(interrupted, range(6))
    blob = io.BytesIO()
    torch.save(interrupted.state_dict(), blob)
    blob.seek(0)
    resumed = ReplayBuffer(capacity=5, seed=999)  # the seed is overridden by the saved generator state
    resumed.load_state_dict(torch.load(blob, weights_only=True))

    assert resumed.prompt_ids() == reference.prompt_ids()
    for pid in reference.prompt_ids():
        assert_groups_equal(resumed.get(pid), reference.get(pid))
    assert resumed.stats(6) == reference.stats(6)

    torch.manual_seed(1)
    expected = run_steps(reference, range(6, 14))
    torch.manual_seed(1)
    assert run_steps(resumed, range(6, 14)) == expected


def test_state_dict_does_not_alias_live_state():
    buffer = filled_buffer(3, capacity=4, seed=2)
    state = copy.deepcopy(buffer.state_dict())
    buffer.sample(2)
    buffer.add(make_group(9))
    restored = ReplayBuffer(capacity=4)
    restored.load_state_dict(state)
    assert restored.prompt_ids() == [0, 1, 2]
    fresh = filled_buffer(3, capacity=4, seed=2)
    assert [g.prompt_id for g in restored.sample(2)] == [g.prompt_id for g in fresh.sample(2)]


def test_load_with_smaller_capacity_drops_oldest_with_warning():
    state = filled_buffer(5, seed=1).state_dict()
    smaller = ReplayBuffer(capacity=3)
    with pytest.warns(UserWarning, match="capacity"):
        smaller.load_state_dict(state)
    assert smaller.prompt_ids() == [2, 3, 4]
    assert smaller.capacity == 3

    larger = ReplayBuffer(capacity=8)
    with pytest.warns(UserWarning, match="capacity"):
        larger.load_state_dict(state)
    assert larger.prompt_ids() == [0, 1, 2, 3, 4]


def test_load_rejects_newer_version():
    state = filled_buffer(2).state_dict()
    state["version"] = 99
    with pytest.raises(ValueError, match="version"):
        ReplayBuffer(capacity=2).load_state_dict(state)


# ---------------------------------------------------------------------------------------------------------------
# validate_replay_config
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("delta", "capacity", "batch_size", "expected"),
    [
        (0.5, 256, 64, (32, 32)),
        (1.0, 1, 8, (8, 0)),
        (0.3, 7, 10, (3, 7)),  # 0.3 * 10 is 3.0000000000000004 in floats: still 3 fresh
        (0.5, 2, 5, (3, 2)),  # ceil(2.5) = 3 fresh, 2 replayed
        (0.01, 3, 4, (1, 3)),  # at least one fresh prompt
        (0.5, 1, 1, (1, 0)),
    ],
)
def test_validate_replay_config(delta, capacity, batch_size, expected):
    assert validate_replay_config(delta, capacity, batch_size) == expected


@pytest.mark.parametrize("delta", [0.0, -0.5, 1.5, float("nan")])
def test_validate_replay_config_bad_delta(delta):
    with pytest.raises(ValueError, match="delta"):
        validate_replay_config(delta, 256, 64)


def test_validate_replay_config_capacity_too_small():
    with pytest.raises(ValueError, match=r"`capacity`=10 .* at least 32"):
        validate_replay_config(0.5, 10, 64)
    with pytest.raises(ValueError, match="capacity"):
        validate_replay_config(1.0, 0, 8)
    with pytest.raises(ValueError, match="batch_size"):
        validate_replay_config(0.5, 8, 0)
