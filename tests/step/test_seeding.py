"""Per-step sampling seeds: the same in a resumed run, different per call, per step, per purpose and per rank."""

from __future__ import annotations

import torch

from lit_rlft.step.seeding import StepSeeds


def test_engine_seeds_differ_per_call_and_repeat_after_a_reseed():
    """Engines with their own random state (vLLM) get a seed per call from (seed, step, salt, rank, call): the
    calls of a step differ, and re-seeding the step (as a resumed run does) gives the same seeds again."""
    seeds = StepSeeds(3)
    seeds.reseed(step=0, salt=0, rank=0)
    first = [seeds.engine_seed(step=0, rank=0) for _ in range(3)]
    seeds.reseed(step=0, salt=0, rank=0)
    assert [seeds.engine_seed(step=0, rank=0) for _ in range(3)] == first and len(set(first)) == 3
    seeds.reseed(step=0, salt=1, rank=0)  # reference sets
    assert seeds.engine_seed(step=0, rank=0) not in first
    seeds.reseed(step=1, salt=0, rank=0)
    assert seeds.engine_seed(step=1, rank=0) != first[0]
    seeds.reseed(step=0, salt=0, rank=1)
    assert seeds.engine_seed(step=0, rank=1) != first[0]
    assert StepSeeds(None).engine_seed(step=0, rank=0) is None


def test_reseeding_sets_torch_from_step_salt_and_rank_and_rank_0_keeps_one_process_seeds():
    draws = {}
    for key in [(0, 0, 0), (0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]:
        StepSeeds(7).reseed(*key)
        draws.setdefault(key, []).append(torch.rand(1).item())
    assert draws[(0, 0, 0)][0] == draws[(0, 0, 0)][1]
    assert len({v[0] for v in draws.values()}) == 4
    StepSeeds(7).reseed(step=2, salt=0, rank=0)
    assert torch.initial_seed() == 7 * 1_000_003 + 2  # rank 0 adds nothing: a 1-process run's seed
    before = torch.initial_seed()
    StepSeeds(None).reseed(step=5, salt=0, rank=0)
    assert torch.initial_seed() == before  # no seed: never re-seeds
