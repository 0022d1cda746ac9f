"""SequentialSamplingCallback: rounds of completions for the prompts whose group has no reward spread yet, up to a
cap; groups of different sizes trained with all their completions."""

from __future__ import annotations

import numpy as np
import pytest

from lit_rlft import DynamicSamplingCallback, ReplayCallback, SequentialSamplingCallback
from lit_rlft.core.advantages import keep_mask
from tests.callbacks.test_screening import _spy
from tests.step.test_async import _loop, _step


def test_groups_grow_until_both_outcomes_or_the_cap_and_every_completion_is_charged():
    step = _step(depth=0)  # coin-flip rewards
    calls = _spy(step)
    before = []
    cb = SequentialSamplingCallback(initial_generations=1, round_generations=2, max_generations=4)
    outs = _loop(step, [cb], steps=3, size=48, batch_size=8,
                 before_step=lambda s: before.append((len(calls), s.budget.completions)))
    saw_ragged = False
    for t, out in enumerate(outs):
        first, spent_before = before[t]
        step_calls = calls[first : before[t + 1][0] if t + 1 < len(before) else len(calls)]
        (planned, g1, _), *more = step_calls
        assert g1 == 1 and [g for _, g, _ in more] == [2, 1][: len(more)]  # 1, then 2, then the last 1 to the cap
        for (prev, _, _), (ids, _, _) in zip(step_calls, more):  # each round: the previous round's unresolved
            assert set(ids) <= set(prev)
        rollouts, record = out.rollouts, out.record
        trained = record.trained_batch()
        sizes = rollouts.group_sizes.tolist()
        saw_ragged |= len(set(sizes)) > 1
        assert keep_mask(trained.rewards.numpy(), trained.member_mask().numpy()).all()  # every trained group mixed
        assert sorted(record.prompt_ids.tolist()) == sorted(planned)  # each planned prompt once in the record
        dropped = record.select(~record.trained)
        assert (dropped.member_mask().sum(1) == 4).all()  # only groups at the cap are dropped
        assert not keep_mask(dropped.rewards.numpy(), dropped.member_mask().numpy()).any()
        for b, pid in enumerate(rollouts.prompt_ids.tolist()):  # a group's rows: its rounds' completions, in order
            texts = [c.completions[i * g + j] for ids, g, c in step_calls if pid in ids
                     for i in [ids.index(pid)] for j in range(g)]
            G = rollouts.group_size
            assert rollouts.completions[b * G : b * G + sizes[b]] == texts
            assert sizes[b] == len(texts) and all(x == "" for x in rollouts.completions[b * G + sizes[b]:(b + 1) * G])
        spent = out.metrics["budget/completions"] - spent_before
        assert spent == sum(len(ids) * g for ids, g, _ in step_calls) == int(record.member_mask().sum())
        assert max(sizes) <= 4
    assert saw_ragged


def test_keep_unresolved_trains_every_planned_prompt():
    outs = _loop(_step(depth=0), [SequentialSamplingCallback(2, 2, 4, keep_unresolved=True)], steps=2,
                 batch_size=8)
    for out in outs:
        assert out.record.trained.all() and out.rollouts.num_groups == 8


def test_replay_after_sequential_sampling_mixes_groups_of_different_sizes():
    outs = _loop(_step(depth=0), [SequentialSamplingCallback(1, 1, 4), ReplayCallback(delta=0.5, capacity=16)],
                 steps=4, size=48, batch_size=8)
    trained: dict[int, tuple[list[float], int]] = {}  # prompt id -> (rewards, size) when it was trained fresh
    replayed = 0
    for out in outs:
        r = out.rollouts
        sizes = r.group_sizes.tolist()
        for b, pid in enumerate(r.prompt_ids.tolist()):
            rewards = r.rewards[b, : sizes[b]].tolist()
            if bool(r.is_replay[b]):  # a replayed group comes back with its own size and rewards
                assert trained[pid] == (rewards, sizes[b]), pid
                replayed += 1
            else:
                trained[pid] = (rewards, sizes[b])
        assert len(r.completions) == r.num_groups * r.group_size and np.isfinite(out.metrics["loss"])
    assert replayed and any(o.rollouts.members is not None and bool(o.rollouts.is_replay.any()) for o in outs)


def test_sequential_sampling_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="max_generations"):
        SequentialSamplingCallback(initial_generations=4, max_generations=2)
    with pytest.raises(ValueError, match="must be the first rollout hook"):
        _loop(_step(depth=0), [DynamicSamplingCallback(max_rounds=2), SequentialSamplingCallback()], steps=1)


def test_one_generation_per_round_at_the_cap_of_one_is_uniform_with_drops():
    """max_generations == initial_generations: no extra rounds; the unresolved groups (all of them, with one
    completion) are dropped but one, which keeps the update going with no gradient."""
    with pytest.warns(UserWarning, match="no group of rank 0 has a reward spread"):
        outs = _loop(_step(depth=0), [SequentialSamplingCallback(1, 1, 1)], steps=1, batch_size=4)
    assert outs[0].rollouts.num_groups == 1 and np.isfinite(outs[0].metrics["loss"])
