"""Selection strategies' per-step cost at pool scale (DPS must handle 100k+ prompts in milliseconds).

    .venv/bin/python -m pytest benchmarks/bench_selection.py --benchmark-only -p no:cacheprovider
    .venv/bin/python -m benchmarks.bench_selection          # same measurement without pytest-benchmark

Goal: DPS ``select`` + ``observe`` over S = 100,000 prompts with B = 256 in <= 20 ms per step.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from lit_rlft.selection import DPSSelector, UniformSampler

S, B = 100_000, 256


class _DPSStep:
    """One training step of DPS: pick B prompts, observe their (random) outcomes."""

    def __init__(self, entropy_bonus: float = 0.0) -> None:
        self.dps = DPSSelector(S, decay=0.5, entropy_bonus=entropy_bonus)
        self.rng = np.random.default_rng(0)
        self.outcomes = np.random.default_rng(1)
        self.step = 0
        for _ in range(5):  # warm up: some prompts seen, so scores are not all tied
            self()

    def __call__(self) -> None:
        ids = self.dps.select(B, self.step, self.rng)
        rates = self.outcomes.choice([0.0, 0.5, 1.0], size=B)
        self.dps.observe(ids, rates, self.step)
        self.step += 1


def test_dps_step_100k(benchmark: pytest.FixtureFunction) -> None:
    benchmark.pedantic(_DPSStep(), rounds=50, iterations=1, warmup_rounds=2)


def test_dps_step_100k_entropy_bonus(benchmark: pytest.FixtureFunction) -> None:
    benchmark.pedantic(_DPSStep(entropy_bonus=0.1), rounds=30, iterations=1, warmup_rounds=2)


def test_uniform_select_100k(benchmark: pytest.FixtureFunction) -> None:
    sampler = UniformSampler(S)
    benchmark(sampler.select, B, 0)


if __name__ == "__main__":
    step = _DPSStep()
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(f"DPS select+observe, S={S}, B={B}: median {1e3 * np.median(times):.2f} ms, min {1e3 * min(times):.2f} ms")
