"""AutoShareCallback on a selector, through the step context only (the fake context of test_context_only): the
split of each planned batch, the slices it observes, the completions it charges, and its order in the list."""

from __future__ import annotations

import numpy as np
import pytest

from lit_rlft.callbacks import AutoShareCallback, DPSCallback, MoPPSCallback
from lit_rlft.callbacks.base import StepCallback
from tests.callbacks.test_context_only import FakeContext, G, _drive


def test_each_batch_is_the_selectors_share_and_a_uniform_control_slice(tmp_path):
    ctx = FakeContext(tmp_path)
    auto = AutoShareCallback(initial_share=0.5, min_selected=0.25, rate=1.0)
    splits: dict[int, tuple[list[int], list[int], float]] = {}  # step -> (kept, control, share when split)
    split = auto._split

    def spy(ctx_, step):
        share = auto.controller.share
        split(ctx_, step)
        kept, control = auto.planned[step]
        splits[step] = (kept.tolist(), control.tolist(), share)

    auto._split = spy
    observed: list[tuple[list[int], int]] = []
    observe = None

    def watch(ctx_):
        nonlocal observe
        observe = auto.controller.observe

        def spy_observe(ids, sel, ctrl, transfer):
            observed.append((sorted(ids.tolist()), len(ctrl)))
            return observe(ids, sel, ctrl, transfer)

        auto.controller.observe = spy_observe

    outs = _drive(ctx, [MoPPSCallback(candidate_ratio=2), auto, _After(watch)], steps=6)
    shares = [h["auto/share"] for h in ctx.history if "auto/share" in h]
    assert len(shares) == 6 and len(set(shares)) > 1  # the coin-flip rewards move it
    for t, out in enumerate(outs):  # step t trains the batch split for it: kept + control, the split's share kept
        kept, control, share = splits[t]
        assert out.record.prompt_ids.tolist() == kept + control
        assert len(kept) == round(share * 4) and not set(kept) & set(control)
    for t in range(1, 6):  # the slices the controller saw are the ones planned (step 0 was split before the spy)
        assert observed[t - 1] == (sorted(splits[t][0]), len(splits[t][1]))
    assert 6 in splits and ctx.data.plan.scheduled.tolist() == splits[6][0] + splits[6][1]


class _After(StepCallback):
    """Runs ``hook(ctx)`` once, at the end of the first step (after the callbacks before it)."""

    def __init__(self, hook):
        self.hook, self.done = hook, False

    def after_step(self, ctx, output):
        if not self.done:
            self.hook(ctx)
            self.done = True


def test_it_charges_its_probes_to_the_budget_and_counts_the_control_slices(tmp_path):
    alone = FakeContext(tmp_path)
    _drive(alone, [DPSCallback(candidate_ratio=2)], steps=6)
    ctx = FakeContext(tmp_path)
    auto = AutoShareCallback(probe_budget=0.2, probe_generations=2)
    _drive(ctx, [DPSCallback(candidate_ratio=2), auto], steps=6)
    # pool 48: 3 held-back prompts (1/16), 2 completions each: a probe costs 6 completions; each step trains
    # B G = 16. Probed before step 0 (6 spent), then after a step that leaves them under 0.2 of the trained ones:
    # after step 2 (6 < 6.4: 12 spent), step 4 (12 < 12.8: 18) and step 6 (18 < 19.2: 24), not after 1, 3, 5
    assert auto.held.size == 3 and len(auto.transfer.probes) == 4
    assert [p[0] for p in auto.transfer.probes] == [0, 2, 4, 6]
    assert ctx.budget.by_purpose["auto"] == 4 * 3 * 2 == auto.probe_completions
    assert auto.trained_completions == 6 * 4 * G
    assert ctx.budget.completions == alone.budget.completions + 4 * 3 * 2
    assert len([h for h in ctx.history if "auto/held_back_success" in h]) == 3
    # initial share 1/2 of B = 4: 2 control groups of G completions at the first step
    controls = [h for h in ctx.history if "auto/control_completions" in h]
    assert controls[0]["auto/control_completions"] == 2 * G
    assert auto.control_completions == ctx.logged["auto/control_completions"]
    assert 0 < auto.control_completions < ctx.budget.by_purpose["train"]


def test_the_held_back_prompts_are_never_trained(tmp_path):
    ctx = FakeContext(tmp_path)
    auto = AutoShareCallback(holdout=3, seed=5)
    mopps = MoPPSCallback(candidate_ratio=2)
    outs = _drive(ctx, [mopps, auto], steps=30)  # 120 groups over a pool of 48: every other prompt is trained
    trained = {i for o in outs[1:] for i in o.record.prompt_ids.tolist()}
    held = set(auto.held.tolist())
    assert not trained & held
    assert len(trained) >= 40  # the rest of the pool was trained on
    # the selector proposed held-back prompts (it never observed them): they were replaced, not trained
    assert all(len(o.record.prompt_ids) == 4 for o in outs)


def test_it_must_come_after_the_selector(tmp_path):
    with pytest.raises(ValueError, match="must come after a selection callback"):
        _drive(FakeContext(tmp_path), [AutoShareCallback(), DPSCallback()], steps=1)
    with pytest.raises(ValueError, match="must come after a selection callback"):
        _drive(FakeContext(tmp_path), [AutoShareCallback()], steps=1)
    with pytest.raises(ValueError, match="initial_share"):
        AutoShareCallback(initial_share=0.95)
    with pytest.raises(ValueError, match="holdout"):
        AutoShareCallback(holdout=0)
    with pytest.raises(ValueError, match="probe_budget"):
        AutoShareCallback(probe_budget=0.0)
    with pytest.raises(ValueError, match="probe_generations"):
        AutoShareCallback(probe_generations=1)


def test_its_state_resumes_the_same_split(tmp_path):
    ctx = FakeContext(tmp_path)
    cb = AutoShareCallback(rate=1.0, seed=1)
    _drive(ctx, [DPSCallback(candidate_ratio=2), cb], steps=3)
    restored = AutoShareCallback(rate=1.0, seed=1)
    restored.load_state_dict(cb.state_dict())
    restored.setup_step(ctx)
    assert restored.controller.share == cb.controller.share
    assert restored.control_completions == cb.control_completions
    assert restored.held.tolist() == cb.held.tolist() and restored.transfer.probes == cb.transfer.probes
    assert {k: [a.tolist() for a in v] for k, v in restored.planned.items()} == \
        {k: [a.tolist() for a in v] for k, v in cb.planned.items()}
    np.testing.assert_array_equal(restored.controller.counts, cb.controller.counts)
    assert cb.rng.permutation(8).tolist() == restored.rng.permutation(8).tolist()
