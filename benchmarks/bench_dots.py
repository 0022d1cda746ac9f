"""DOTS prediction speed: difficulty of 10,000 pool prompts from a reference set of K = 256, cached embeddings.

Goal: one full-pool prediction <= 1 s on CPU (it runs once per queue fill, i.e. every ``mu`` steps).

    python benchmarks/bench_dots.py                                              # medians, plain timer
    python -m pytest benchmarks/bench_dots.py --benchmark-enable -q              # the same through pytest-benchmark

``cold``: the pool's query projections are recomputed (what happens after every online adapter fit);
``warm``: projections cached (the predictor unchanged since the last prediction); ``select``: cold prediction plus
the Gumbel-top-k draw of ``B * mu`` ids; ``observe``: one online fit (20 Adam steps) from a buffer of 4,096 labels.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
import torch

from lit_rlft.selection.dots import DOTSSelector

S, K, B = 10_000, 256, 64
DIMS = (384, 896)  # MiniLM width; Qwen2.5-0.5B width


def make_selector(dim: int) -> DOTSSelector:
    g = torch.Generator().manual_seed(0)
    sel = DOTSSelector(torch.randn(S, dim, generator=g), reference_size=K, seed=0)
    rng = np.random.default_rng(0)
    ref = sel.reference_ids(rng)
    sel.set_reference(ref, rng.random(K))
    return sel


def cold(sel: DOTSSelector) -> torch.Tensor:
    sel.invalidate_cache()
    return sel.predict()


def select(sel: DOTSSelector, rng: np.random.Generator) -> np.ndarray:
    sel.invalidate_cache()
    sel._refill = True  # force a queue fill, as after a fresh reference set
    return sel.select(B, 0, rng)


def observe_fit(sel: DOTSSelector, rng: np.random.Generator) -> None:
    ids = rng.choice(S, size=B, replace=False)
    sel.observe(ids, rng.random(B), 0)


@pytest.mark.parametrize("dim", DIMS)
def test_predict_cold(benchmark, dim):
    sel = make_selector(dim)
    out = benchmark(cold, sel)
    assert out.shape == (S,)


@pytest.mark.parametrize("dim", DIMS)
def test_predict_warm(benchmark, dim):
    sel = make_selector(dim)
    sel.predict()
    benchmark(sel.predict)


@pytest.mark.parametrize("dim", DIMS)
def test_select(benchmark, dim):
    sel = make_selector(dim)
    rng = np.random.default_rng(0)
    assert benchmark(select, sel, rng).shape == (B,)


def _median(fn, repeats: int) -> float:
    fn()  # warm-up (first-call allocations, lazy imports)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; S={S}, K={K}, B={B}, hidden 256, P 128")
    for dim in DIMS:
        sel = make_selector(dim)
        rng = np.random.default_rng(0)
        # a buffer of 4,096 labels for the online-fit timing
        ids = rng.choice(S, size=4096, replace=False)
        sel._remember(ids, rng.random(4096))
        rows = {
            "predict cold": _median(lambda sel=sel: cold(sel), 7),
            "predict warm": _median(sel.predict, 7),
            "select (cold predict + draw)": _median(lambda sel=sel, rng=rng: select(sel, rng), 7),
            "observe (20 Adam steps)": _median(lambda sel=sel, rng=rng: observe_fit(sel, rng), 5),
        }
        for name, t in rows.items():
            print(f"D={dim:4d}  {name:30s} median {t * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
