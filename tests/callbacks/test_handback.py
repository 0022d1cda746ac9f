"""UniformHandbackCallback on a selector, through the step context only (the fake context of test_context_only):
the batches it plans are compared with a plain uniform run's and the selector's own."""

from __future__ import annotations

import pytest

from lit_rlft.callbacks import DPSCallback, UniformHandbackCallback
from tests.callbacks.test_context_only import FakeContext, _drive


def _trained(outs) -> list[list[int]]:
    return [o.record.prompt_ids.tolist() for o in outs]


def test_a_full_hand_back_trains_exactly_what_uniform_sampling_trains(tmp_path):
    uniform = _trained(_drive(FakeContext(tmp_path), [], steps=6))
    ctx = FakeContext(tmp_path)
    outs = _drive(ctx, [DPSCallback(candidate_ratio=2), UniformHandbackCallback(0.0, 0.0)], steps=6)
    assert _trained(outs) == uniform
    assert ctx.logged["handback/share"] == 1.0


def test_before_the_start_the_selector_plans_alone_and_after_it_the_batch_is_handed_back(tmp_path):
    steps = 16  # pool 48, B = 4: one pass every 12 steps
    alone = _trained(_drive(FakeContext(tmp_path), [DPSCallback(candidate_ratio=2, seed=3)], steps=steps))
    ctx = FakeContext(tmp_path)
    handback = UniformHandbackCallback(start_passes=1.0, end_passes=1.0)
    outs = _drive(ctx, [DPSCallback(candidate_ratio=2, seed=3), handback], steps=steps)
    mine = _trained(outs)
    # steps 0..12: planned before 12 steps x 4 prompts = 1 pass were made (the batch of step 12 is planned after
    # step 11, at 48 / 48 = 1 pass: handed back)
    assert mine[:12] == alone[:12] and mine[12] != alone[12]
    shares = [h["handback/share"] for h in ctx.history if "handback/share" in h]
    assert shares[:11] == [0.0] * 11 and shares[11:] == [1.0] * (steps - 11)
    assert handback.passes == pytest.approx(steps * 4 / 48)
    assert ctx.logged["handback/passes"] == pytest.approx(steps * 4 / 48)


def test_it_must_come_after_the_selector(tmp_path):
    with pytest.raises(ValueError, match="must come after a selection callback"):
        _drive(FakeContext(tmp_path), [UniformHandbackCallback(), DPSCallback()], steps=1)
    with pytest.raises(ValueError, match="start <= end"):
        UniformHandbackCallback(start_passes=3, end_passes=1)


def test_its_state_resumes_the_same_hand_back(tmp_path):
    ctx = FakeContext(tmp_path)
    cb = UniformHandbackCallback(0.0, 10.0, seed=1)
    _drive(ctx, [DPSCallback(candidate_ratio=2), cb], steps=3)
    restored = UniformHandbackCallback(0.0, 10.0, seed=1)
    restored.load_state_dict(cb.state_dict())
    restored.pool_size = cb.pool_size
    assert restored.draws == cb.draws == 12 and restored.passes == cb.passes
    assert cb.rng.permutation(8).tolist() == restored.rng.permutation(8).tolist()  # the same prompts give way
