"""ScreeningCallback: a few completions per candidate first, the rest only for prompts whose outcomes are mixed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_rlft import DynamicSamplingCallback, ReplayCallback, ScreeningCallback
from lit_rlft.core.advantages import keep_mask
from lit_rlft.core.types import OutcomeRecord, Rollouts
from tests.step.test_async import _loop, _step


def _spy(step):
    """Record every rollout call of ``step`` (its planned batch and every call a hook makes): (ids, completions per
    prompt, this rank's rollouts)."""
    calls = []
    rollout, next_batch = step.rollout, step.rollouts.next_batch

    def spied(prompt_ids, *args, **kwargs):
        local, record = rollout(prompt_ids, *args, **kwargs)
        calls.append((np.asarray(prompt_ids).tolist(), local.group_size, local))
        return local, record

    def spied_batch(*args, **kwargs):  # one rank: the planned batch's ids are its rollouts' ids
        local, record = next_batch(*args, **kwargs)
        calls.append((local.prompt_ids.tolist(), local.group_size, local))
        return local, record

    step.rollout, step.rollouts.next_batch = spied, spied_batch
    return calls


def test_kept_groups_join_their_screening_completions_to_the_rest_and_every_trained_group_is_mixed():
    step = _step(depth=0)  # coin-flip rewards: about 1 prompt in 2 shows both outcomes among 2 completions
    calls = _spy(step)
    before = []
    outs = _loop(step, [ScreeningCallback(initial_generations=2, max_rounds=3)], steps=3, size=48,
                 before_step=lambda s: before.append((len(calls), s.budget.completions)))
    for t, out in enumerate(outs):
        first, spent_before = before[t]
        step_calls = calls[first : before[t + 1][0] if t + 1 < len(before) else len(calls)]
        *screening, (kept_ids, rest, continuation) = step_calls
        assert [g for _, g, _ in screening] == [2] * len(screening) and rest == 2  # g0 each, then G - g0
        rollouts = out.rollouts
        assert rollouts.group_size == 4 and rollouts.prompt_ids.tolist() == kept_ids
        assert keep_mask(out.record.trained_batch().rewards.numpy()).all()  # filled: every trained group is mixed
        for b, pid in enumerate(kept_ids):  # rows of group b: its 2 screening completions, then the 2 others
            (ids, _, screened), = [c for c in screening if pid in c[0]]
            s = ids.index(pid)
            assert keep_mask(screened.rewards[s : s + 1].numpy()).all()  # kept: its screening round was mixed
            assert rollouts.completions[4 * b : 4 * b + 2] == screened.completions[2 * s : 2 * s + 2]
            assert rollouts.completions[4 * b + 2 : 4 * b + 4] == continuation.completions[2 * b : 2 * b + 2]
            assert torch.equal(rollouts.rewards[b], torch.cat([screened.rewards[s], continuation.rewards[b]]))
            assert torch.equal(rollouts.completion_tokens[4 * b], torch.nn.functional.pad(
                screened.completion_tokens[2 * s], (0, rollouts.completion_tokens.shape[1]
                                                    - screened.completion_tokens.shape[1]), value=rollouts.pad_id))
        # the record: kept prompts once, full width and trained; screened-out ones once, 2 wide, not trained
        record = out.record
        screened_ids = [i for ids, _, _ in screening for i in ids]
        assert sorted(record.prompt_ids.tolist()) == sorted(screened_ids)
        out_rows = record.select(~record.trained)
        assert out_rows.rewards.shape[1] == 2
        surplus = out_rows.prompt_ids[torch.as_tensor(keep_mask(out_rows.rewards.numpy()))].tolist()
        assert set(surplus) <= set(screening[-1][0])  # a mixed group left out is the last round's surplus only
        # the budget charged every completion: 2 per screened candidate, 2 more per kept prompt
        spent = (out.metrics["budget/completions"] - spent_before)
        assert spent == 2 * len(screened_ids) + 2 * len(kept_ids)


def test_screening_refuses_what_it_cannot_do(tmp_path):
    with pytest.raises(ValueError, match="initial_generations must be >= 2"):
        ScreeningCallback(initial_generations=1)
    with pytest.raises(ValueError, match="num_generations is 4"):
        _loop(_step(depth=0), [ScreeningCallback(initial_generations=4)], steps=1)
    with pytest.raises(ValueError, match="must be the first rollout hook"):
        _loop(_step(depth=0), [DynamicSamplingCallback(max_rounds=2), ScreeningCallback()], steps=1)
    with pytest.raises(ValueError, match="both set how many completions"):
        _loop(_step(depth=0), [ScreeningCallback(), ScreeningCallback()], steps=1)


def test_replay_after_screening_mixes_full_groups():
    outs = _loop(_step(depth=0), [ScreeningCallback(initial_generations=2), ReplayCallback(delta=0.5, capacity=8)],
                 steps=4, size=48)
    assert all(o.rollouts.group_size == 4 for o in outs)
    assert any(bool(o.rollouts.is_replay.any()) for o in outs)  # replay had full groups to store and mix in


# -- the containers ----------------------------------------------------------------------------------------------
def _rollouts(ids: list[int], g: int, start: int, length: int) -> Rollouts:
    b, n = len(ids), len(ids) * g
    tokens = torch.arange(start, start + n)[:, None].repeat(1, length)  # row i holds the value start + i
    return Rollouts(
        prompt_ids=torch.tensor(ids), prompt_tokens=torch.full((n, 3), 7), prompt_mask=torch.ones(n, 3, dtype=torch.long),
        completion_tokens=tokens, completion_mask=torch.ones(n, length, dtype=torch.long),
        rewards=torch.arange(start, start + n, dtype=torch.float32).view(b, g), correct=torch.zeros(b, g, dtype=bool),
        birth_step=torch.zeros(b, dtype=torch.long), is_replay=torch.zeros(b, dtype=torch.bool),
        truncated=torch.zeros(n, dtype=torch.bool), engine_logprobs=-tokens.float(),
        reward_per_func={"f": torch.arange(start, start + n, dtype=torch.float32).view(b, g)},
        completions=[str(start + i) for i in range(n)], prompts=[f"p{i}" for i in ids], generation_s=1.0,
    )


def test_extend_groups_puts_each_prompts_new_rows_after_its_own():
    a, more = _rollouts([5, 9], g=2, start=0, length=3), _rollouts([5, 9], g=3, start=100, length=5)
    joined = a.extend_groups(more)
    assert joined.group_size == 5 and joined.completion_tokens.shape == (10, 5)
    assert joined.completions == ["0", "1", "100", "101", "102", "2", "3", "103", "104", "105"]
    assert joined.rewards.tolist() == [[0, 1, 100, 101, 102], [2, 3, 103, 104, 105]]
    assert joined.completion_tokens[:, 0].tolist() == [0, 1, 100, 101, 102, 2, 3, 103, 104, 105]
    assert joined.completion_mask[0].tolist() == [1, 1, 1, 0, 0]  # a's rows padded to the longer completions
    assert torch.equal(joined.engine_logprobs[:, 0], -joined.completion_tokens[:, 0].float())
    assert joined.reward_per_func["f"].tolist() == joined.rewards.tolist() and joined.generation_s == 2.0
    with pytest.raises(ValueError, match="same prompts in the same order"):
        a.extend_groups(_rollouts([9, 5], g=3, start=100, length=5))


def test_records_of_different_group_sizes_count_members_only():
    wide = OutcomeRecord.from_rollouts(_rollouts([1], g=4, start=0, length=2))
    wide.correct[:] = torch.tensor([[True, False, False, False]])
    narrow = OutcomeRecord.from_rollouts(_rollouts([2, 3], g=2, start=10, length=2), trained=False)
    narrow.correct[:] = torch.tensor([[True, True], [False, True]])
    both = OutcomeRecord.concat([wide, narrow])
    assert both.members.tolist() == [[True] * 4, [True, True, False, False], [True, True, False, False]]
    assert both.success_rates.tolist() == [0.25, 1.0, 0.5]  # over each group's own completions
    assert both.select([1, 2]).members is None and both.select([1, 2]).rewards.shape == (2, 2)  # narrowed
    assert both.trained_batch().members is None and torch.equal(both.trained_batch().rewards, wide.rewards)
    assert torch.isnan(both.reward_per_func["f"][1, 2:]).all()
    joined = narrow.extend_groups(OutcomeRecord.from_rollouts(_rollouts([2, 3], g=1, start=50, length=2)))
    assert joined.rewards.tolist() == [[10, 11, 50], [12, 13, 51]]
