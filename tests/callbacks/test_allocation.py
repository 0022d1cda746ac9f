"""AllocationCallback: each planned prompt gets the completions the allocation gives it, every one charged, and only
groups with a reward spread are trained on."""

from __future__ import annotations

import numpy as np
import pytest

from lit_rlft import AllocationCallback, DPSCallback, MoPPSCallback, ReplayCallback
from lit_rlft.core.advantages import keep_mask
from tests.callbacks.test_screening import _spy
from tests.step.test_async import _loop, _step


@pytest.mark.parametrize("selection", [DPSCallback, MoPPSCallback])
def test_each_prompt_gets_its_allocation_every_completion_is_charged_and_trained_groups_are_mixed(selection):
    step = _step(depth=0)  # coin-flip rewards
    calls = _spy(step)
    cb = AllocationCallback(min_generations=2, max_generations=8, budget_ratio=1.25, granularity=2, min_gain=0.0)
    allocations = []
    allocation = cb.allocation

    def spied(ctx, ids):
        n, spread = allocation(ctx, ids)
        allocations.append((list(ids), n))
        return n, spread

    cb.allocation = spied
    before = []
    outs = _loop(step, [cb, selection()], steps=4, size=8, batch_size=8,  # the same 8 prompts, told apart
                 before_step=lambda s: before.append((len(calls), s.budget.completions)))
    assert len(allocations) == 4
    saw_uneven = False
    for t, out in enumerate(outs):
        ids, n = allocations[t]
        saw_uneven |= len(set(n.tolist())) > 1
        assert n.sum() <= 1.25 * 8 * 4 and n.min() >= 2 and n.max() <= 8  # within the budget and the bounds
        record = out.record
        sizes = dict(zip(record.prompt_ids.tolist(), record.member_mask().sum(1).tolist()))
        assert [sizes[i] for i in ids] == n.tolist()  # every prompt's group holds its allocation
        spent = out.metrics["budget/completions"] - before[t][1]
        assert spent == n.sum()  # every completion charged, once
        first, *more = calls[before[t][0] : before[t + 1][0] if t + 1 < len(before) else len(calls)]
        assert first[0] == ids and first[1] == 2 and sorted(g for _, g, _ in more) == sorted(
            {int(c) - 2 for c in n if c > 2})  # one call per distinct number of extra completions
        trained = record.trained_batch()
        assert keep_mask(trained.rewards.numpy(), trained.member_mask().numpy()).all()
        assert out.rollouts.group_sizes.tolist() == [sizes[i] for i in out.rollouts.prompt_ids.tolist()]
    assert saw_uneven, "every prompt got the same allocation: the test would not see a per-prompt mix-up"


def test_allocation_needs_a_predicting_selection_callback_and_composes_with_replay():
    with pytest.raises(ValueError, match="needs a selection callback whose strategy predicts success"):
        _loop(_step(depth=0), [AllocationCallback()], steps=1)
    outs = _loop(_step(depth=0), [AllocationCallback(1, 6, granularity=1, min_gain=0.0), DPSCallback(),
                                  ReplayCallback(delta=0.5, capacity=16)], steps=4, batch_size=8)
    assert any(bool(o.rollouts.is_replay.any()) for o in outs)
    assert all(np.isfinite(o.metrics["loss"]) for o in outs)
