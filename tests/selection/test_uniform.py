"""Uniform sampling: epochs without replacement, no duplicates across epoch boundaries, exact resume."""

from __future__ import annotations

import numpy as np
import pytest

from lit_rlft.selection import EpochBatcher, SelectionStrategy, UniformSampler


def test_each_epoch_covers_the_pool_once() -> None:
    sampler = UniformSampler(num_prompts=12, seed=0)
    batches = [sampler.select(4, step=t) for t in range(6)]  # 2 epochs of 3 batches
    assert all(b.dtype == np.int64 and b.shape == (4,) for b in batches)
    for epoch in (batches[:3], batches[3:]):
        assert sorted(np.concatenate(epoch).tolist()) == list(range(12))
    assert sampler.epoch == 2
    assert np.concatenate(batches[:3]).tolist() != np.concatenate(batches[3:]).tolist()  # a new permutation


def test_batches_straddling_epochs_hold_no_duplicates() -> None:
    # 10 prompts, batches of 4: batch 3 takes the 2 left over from epoch 1 and 2 from epoch 2.
    sampler = UniformSampler(num_prompts=10, seed=3)
    served = [sampler.select(4, step=t) for t in range(10)]  # 40 ids = 4 full epochs
    assert all(len(set(b.tolist())) == 4 for b in served)
    flat = np.concatenate(served)
    for e in range(4):  # every epoch, counted in serving order, is a permutation of the pool
        assert sorted(flat[10 * e : 10 * (e + 1)].tolist()) == list(range(10))


def test_top_up_skips_ids_already_in_the_batch() -> None:
    # An epoch of [0, 1, 2] whose last id 2 is left: the next permutation may start with 2, it must be skipped
    # for this batch and served later in that epoch.
    batcher = EpochBatcher(seed=0)
    batcher.perm, batcher.cursor = np.array([0, 1, 2]), 2
    for seed in range(20):
        batcher.rng = np.random.default_rng(seed)
        batcher.perm, batcher.cursor = np.array([0, 1, 2]), 2
        batch = batcher.next_batch(2, lambda: np.arange(3))
        assert batch[0] == 2 and batch[1] != 2
        assert sorted(batcher.perm.tolist()) == [0, 1, 2] and batcher.perm[0] == batch[1] and batcher.cursor == 1


def test_resume_continues_exactly() -> None:
    full = UniformSampler(num_prompts=11, seed=5)
    expected = [full.select(3, t).tolist() for t in range(12)]
    first = UniformSampler(num_prompts=11, seed=5)
    got = [first.select(3, t).tolist() for t in range(5)]
    resumed = UniformSampler(num_prompts=11, seed=999)  # the checkpoint's generator state wins
    resumed.load_state_dict(first.state_dict())
    got += [resumed.select(3, t).tolist() for t in range(5, 12)]
    assert got == expected


def test_validation_and_ignored_arguments() -> None:
    sampler = UniformSampler(num_prompts=5)
    with pytest.raises(ValueError, match="batch_size"):
        sampler.select(6, 0)
    with pytest.raises(ValueError, match="num_prompts"):
        UniformSampler(num_prompts=0)
    a = UniformSampler(5, seed=1).select(2, 0, np.random.default_rng(1))
    b = UniformSampler(5, seed=1).select(2, 0, np.random.default_rng(2))
    assert a.tolist() == b.tolist()  # the caller's rng is ignored
    sampler.observe(np.array([0, 1]), np.array([0.0, 1.0]), step=0)  # a no-op
    with pytest.raises(ValueError, match="pool of 5"):
        UniformSampler(6).load_state_dict(sampler.state_dict())
    assert isinstance(sampler, SelectionStrategy)
