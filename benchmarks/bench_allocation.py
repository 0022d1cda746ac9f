"""Per-prompt allocators' own per-step cost (everything but generating): the decision over a batch drawn from a pool of
100,000 prompts, and the batch surgery (joining each prompt's completions into groups of different sizes).

    .venv/bin/python -m pytest benchmarks/bench_allocation.py --benchmark-only -p no:cacheprovider
    .venv/bin/python -m benchmarks.bench_allocation     # the table and benchmarks/results/allocation_overhead.json

Goal (issue 25): at most 1% of a CPU step at 100,000 prompts. The step it is compared with is measured in the same
run: a tiny-policy GRPO step of the demo's shape (B=32, G=8, 16 tokens) on this machine.

What each allocator does per step besides generating:

- ``AllocationCallback`` + DPS / MoPPS / DOTS: the strategy's spread probabilities for the B prompts
  (``spread_probabilities``: a ``[B, 3] @ [3, n_max + 1]`` product, Beta moments, or DOTS' predictions), then
  :func:`~lit_rlft.selection.allocation.allocate` (a sort of ``B x (n_max - n_min) / granularity`` gains);
- ``SequentialSamplingCallback``: per round, each group's size and spread (``OutcomeRecord.join`` of the rounds);
- both: ``Rollouts.join`` of the rounds' completions into groups of different sizes;
- ``ScreeningCallback``: each round's spread filter, the records' concatenation and the kept groups' completion
  (``extend_groups``).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_rlft.callbacks.extend import sizes_and_spread
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.records.jsonio import write_result
from lit_rlft.selection import DPSSelector
from lit_rlft.selection.allocation import allocate, point_spread
from lit_rlft.selection.mopps import MoPPSSelector

S, G, N_MIN, N_MAX, STEP = 100_000, 8, 2, 16, 2


def _warm(selector, batch: int) -> None:
    rng, outcomes = np.random.default_rng(0), np.random.default_rng(1)
    for t in range(5):
        ids = rng.choice(S, size=batch, replace=False)
        selector.observe(ids, outcomes.choice([0.0, 0.5, 1.0], size=batch), t)


def allocation_decision(kind: str, batch: int):
    """``() -> None``: one step's allocation for ``batch`` prompts of a pool of ``S`` (the strategy's predictions and
    the greedy allocation)."""
    ids = np.random.default_rng(2).choice(S, size=batch, replace=False)
    if kind == "dps":
        selector = DPSSelector(S, decay=0.5)
        _warm(selector, batch)
        predict = lambda: selector.spread_probabilities(ids, N_MAX, G)  # noqa: E731
    elif kind == "mopps":
        selector = MoPPSSelector(S, G, decay=0.5)
        _warm(selector, batch)
        predict = lambda: selector.spread_probabilities(ids, N_MAX, G)  # noqa: E731
    else:  # DOTS: its predictions (benchmarked in bench_dots.py) turned into spread probabilities
        p = np.random.default_rng(3).random(batch)
        predict = lambda: point_spread(p, N_MAX)  # noqa: E731

    def step() -> None:
        allocate(predict(), batch * G, N_MIN, N_MAX, STEP, 0.01)

    return step


def _rollouts(ids: np.ndarray, width: int, length: int = 16, prompt: int = 16) -> Rollouts:
    n = len(ids) * width
    gen = torch.Generator().manual_seed(0)
    rewards = (torch.rand(len(ids), width, generator=gen) > 0.5).float()
    return Rollouts(
        prompt_ids=torch.as_tensor(ids), prompt_tokens=torch.randint(3, 60, (n, prompt), generator=gen),
        prompt_mask=torch.ones(n, prompt, dtype=torch.long),
        completion_tokens=torch.randint(3, 60, (n, length), generator=gen),
        completion_mask=torch.ones(n, length, dtype=torch.long), rewards=rewards, correct=rewards > 0,
        birth_step=torch.zeros(len(ids), dtype=torch.long), is_replay=torch.zeros(len(ids), dtype=torch.bool),
        truncated=torch.zeros(n, dtype=torch.bool), completions=["x"] * n, prompts=["p"] * len(ids),
    )


def sequential_rounds(batch: int):
    """``() -> None``: sequential sampling's bookkeeping for one step of ``batch`` prompts: 2 completions each, then
    three rounds of 2 for a shrinking half (sizes and spread per round, the rounds' records and rollouts joined)."""
    ids = np.arange(batch)
    parts = [_rollouts(ids, 2)] + [_rollouts(ids[: batch >> k], 2) for k in (1, 2, 3)]
    records = [OutcomeRecord.from_rollouts(p) for p in parts]

    def step() -> None:
        for k in range(1, len(records) + 1):
            sizes_and_spread(OutcomeRecord.join(records[:k]))
        Rollouts.join(parts)

    return step


def screening_surgery(batch: int):
    """``() -> None``: screening's bookkeeping for one step of ``batch`` prompts: 4 rounds of ``batch`` candidates
    with 2 completions each filtered by spread, the kept ones' records joined, and the kept groups completed with 6
    more (``extend_groups``)."""
    from lit_rlft.core.advantages import keep_mask

    rounds = [_rollouts(np.arange(k * batch, (k + 1) * batch), 2) for k in range(4)]
    records = [OutcomeRecord.from_rollouts(r) for r in rounds]

    def step() -> None:
        kept = [r.select_groups(torch.from_numpy(np.flatnonzero(keep_mask(rec.rewards.numpy()))))
                for r, rec in zip(rounds, records)]
        OutcomeRecord.concat(records)
        screened = Rollouts.concat(kept)
        more = _rollouts(screened.prompt_ids.numpy(), 6)
        screened.extend_groups(more)

    return step


def tiny_step_seconds(repeats: int = 5) -> float:
    """Median wall time of a tiny-policy GRPO step of the demo's shape (B=32, G=8, 16 tokens) on this machine."""
    from lit_rlft import CountdownTask, GenerationConfig, GRPOConfig, OptimConfig, PromptDataModule, build_step
    from lit_rlft.step import TorchBackend
    from lit_rlft.step.optim import configure_adamw

    torch.manual_seed(0)
    config = GRPOConfig(model="tiny", reward_funcs=["lit_rlft.rewards.countdown_reward"],
                        generation=GenerationConfig(num_generations=G, max_completion_length=16),
                        optim=OptimConfig(learning_rate=1e-4))
    step = build_step(config)
    data = PromptDataModule(train=CountdownTask(size=2000, split="train"), answer_field=None, batch_size=32)
    data.setup("fit")
    step.bind(data)
    opt = configure_adamw(step.policy, step.optim, total_steps=100)
    backend = TorchBackend(step.policy, opt["optimizer"], opt["lr_scheduler"]["scheduler"])
    step.start()
    times = []
    try:
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            step.run(backend)
            times.append(time.perf_counter() - t0)
    finally:
        step.close()
    return float(np.median(times[1:]))


def _median_s(fn, rounds: int = 30) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@pytest.mark.parametrize("kind", ["dps", "mopps", "dots"])
def test_allocation_decision_100k(benchmark, kind):
    benchmark.pedantic(allocation_decision(kind, 256), rounds=30, iterations=1, warmup_rounds=2)


def test_sequential_rounds_b256(benchmark):
    benchmark.pedantic(sequential_rounds(256), rounds=10, iterations=1, warmup_rounds=1)


def test_screening_surgery_b256(benchmark):
    benchmark.pedantic(screening_surgery(256), rounds=10, iterations=1, warmup_rounds=1)


if __name__ == "__main__":
    torch.set_num_threads(2)
    step_s = tiny_step_seconds()
    rows = []
    for batch in (32, 256):
        for kind in ("dps", "mopps", "dots"):
            rows.append((f"allocation ({kind}), pool {S:,}, B={batch}", _median_s(allocation_decision(kind, batch))))
        rows.append((f"sequential sampling's rounds, B={batch}", _median_s(sequential_rounds(batch), rounds=10)))
        rows.append((f"screening's rounds and completion, B={batch}", _median_s(screening_surgery(batch), rounds=10)))
        rows.append((f"Rollouts.join of the rounds (allocation's surgery), B={batch}",
                     _median_s(lambda b=batch: Rollouts.join([_rollouts(np.arange(b), 2),
                                                              _rollouts(np.arange(b // 2), 6)]), rounds=10)))
    print(f"tiny GRPO step (B=32, G=8, 16 tokens): median {step_s:.3f} s")
    print("| operation | median | share of the tiny step |\n|---|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {1e3 * seconds:.2f} ms | {100 * seconds / step_s:.2f}% |")
    out = write_result(Path(__file__).parent / "results" / "allocation_overhead.json",
                       {"command": "python -m benchmarks.bench_allocation", "tiny_step_s": step_s,
                        "rows": [{"operation": n, "median_s": s, "share_of_tiny_step": s / step_s} for n, s in rows]})
    print(f"wrote {out}")
