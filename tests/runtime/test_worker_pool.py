"""The worker pool's own mechanics: results in job order across chunks, the timeout outcome, jobs finished but unsent
by a killed worker run again alike, and a dead worker's blame (real processes; the jobs are reward scorings)."""

from __future__ import annotations

import os
import re

import torch

from lit_rlft.rewards.score_job import score_job
from lit_rlft.runtime.worker_pool import ERROR, OK, TIMEOUT, Job, WorkerPool


def hostile_length(completions: list[str], **kwargs: object) -> list[float]:
    """len(c), except: "raise" raises, "hang" backtracks forever in C (holding the GIL), "die" kills its process,
    "nan" returns NaN."""
    (c,) = completions  # one completion at a time
    if c == "raise":
        raise ValueError("hostile")
    if c == "hang":
        re.match(r"(a+)+$", "a" * 64 + "b")  # exponential backtracking inside the C regex engine
    if c == "die":
        os._exit(3)
    if c == "nan":
        return [float("nan")]
    return [float(len(c))]


def test_pool_results_in_task_order_across_chunks() -> None:
    pool = WorkerPool([hostile_length], timeout_s=5.0, num_workers=2, call=score_job)
    texts = ["x" * (i % 7) for i in range(300)] + ["raise"]
    results = pool.run([Job(0, t, {}) for t in texts])
    assert [r.value for r in results[:-1]] == [float(len(t)) for t in texts[:-1]]
    assert results[-1].outcome == ERROR and "hostile" in results[-1].value
    assert {r.outcome for r in results[:-1]} == {OK}
    pool.close()


def test_pool_timeout_outcome() -> None:
    pool = WorkerPool([hostile_length], timeout_s=0.5, num_workers=1, call=score_job)
    results = pool.run([Job(0, "hang", {}), Job(0, "ab", {})])
    assert [r.outcome for r in results] == [TIMEOUT, OK] and results[1].value == 2.0
    pool.close()


def coin_or_hang(completions: list[str], **kwargs: object) -> list[float]:
    """A seeded coin, except "hang" hangs in C code."""
    hostile_length(completions)
    return [float(torch.rand(()))]


def test_tasks_finished_but_unsent_when_a_worker_is_killed_run_again_alike() -> None:
    """A worker answers a chunk at its end: the jobs it finished before a hang in the same chunk are lost with it
    and run again in its replacement, seeded alike, so every score equals a run without the hang."""
    texts = [f"t{i}" for i in range(12)]  # one worker, 12 jobs: chunks of 3
    seeds = list(range(100, 112))
    pool = WorkerPool([coin_or_hang], timeout_s=1.0, num_workers=1, call=score_job)
    clean = pool.run([Job(0, t, {}, s) for t, s in zip(texts, seeds)])
    hostile = list(texts)
    hostile[5] = "hang"  # the last job of the second chunk: its two first jobs finished, unsent
    results = pool.run([Job(0, t, {}, s) for t, s in zip(hostile, seeds)])
    assert [r.outcome for r in results] == [OK] * 5 + [TIMEOUT] + [OK] * 6
    assert [r.value for i, r in enumerate(results) if i != 5] == [r.value for i, r in enumerate(clean) if i != 5]
    assert pool.restarts == 1
    pool.close()


def test_a_worker_dying_after_finished_tasks_blames_only_the_task_it_was_running() -> None:
    pool = WorkerPool([hostile_length], timeout_s=5.0, num_workers=1, call=score_job)
    texts = ["a" * (i + 1) for i in range(12)]
    texts[4] = "die"  # second chunk of 3: one job finished before it, one after
    results = pool.run([Job(0, t, {}) for t in texts])
    assert results[4].outcome == ERROR and "died" in results[4].value
    assert [r.value for i, r in enumerate(results) if i != 4] == [float(len(t)) for i, t in enumerate(texts) if i != 4]
    pool.close()
