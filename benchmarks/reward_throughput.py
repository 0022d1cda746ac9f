"""Scoring throughput of a 512-completion MATH batch (the GPU recipe's B x G): one whole-batch call, as the runner
did before per-completion isolation, against the isolated runner (worker processes) and its inline mode.

    .venv/bin/python benchmarks/reward_throughput.py --rounds 5
    # a cheap rule reward, where the workers' round trips are what costs: 16 Countdown prompts x 8 (the tiny step)
    .venv/bin/python benchmarks/reward_throughput.py --task countdown --rounds 20 \
        --out benchmarks/results/reward_throughput_countdown.json

The batch is 64 MATH-500 problems x 8 completions: for each problem 4 copies of its own worked solution (correct)
and 4 of the next problem's (wrong), so math-verify parses and compares every one. The three ways alternate in
each round (whole batch, processes, inline, ...), so that load from other work hits them alike; the first round
warms caches (math-verify's imports, the gold-answer cache, the worker processes) and is not counted. Reports the
median seconds per batch and the ratio to the whole-batch call. Writes ``benchmarks/results/reward_throughput.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _batch(data_dir: Path, problems: int, per_problem: int) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in (data_dir / "math500" / "test.jsonl").open(encoding="utf-8") if line.strip()]
    rows = rows[: problems + 1]
    completions, answers = [], []
    for i in range(problems):
        for k in range(per_problem):
            source = rows[i] if k < per_problem // 2 else rows[i + 1]
            completions.append(source["solution"])
            answers.append(rows[i]["answer"])
    return completions, answers


def _countdown_batch(prompts: int, per_problem: int) -> tuple[list[str], dict[str, list]]:
    """Countdown prompts x ``per_problem`` completions: the generating expression (correct), a wrong expression and
    character noise of the untrained policy's kind, in turns."""
    import random

    from lit_rlft.data import CountdownTask

    rng = random.Random(0)
    records = [r.data for r in CountdownTask(size=prompts, seed=0).records()]
    completions, nums, target = [], [], []
    for record in records:
        for k in range(per_problem):
            kind = k % 3
            if kind == 0:
                text = f"<answer>{record['solution']}</answer>"
            elif kind == 1:
                text = f"<answer>{'+'.join(str(n) for n in record['nums'])}*2</answer>"
            else:
                text = "".join(rng.choice("0123456789+-*/()<>= answer") for _ in range(28))
            completions.append(text)
            nums.append(record["nums"])
            target.append(record["target"])
    return completions, {"nums": nums, "target": target}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="math", choices=["math", "countdown"],
                   help="math: 64 MATH-500 problems x 8 (math-verify); countdown: 16 prompts x 8 (a cheap rule)")
    p.add_argument("--data-dir", default=os.environ.get("LIT_RLFT_DATA_DIR", str(REPO.parent / "shared" / "data")))
    p.add_argument("--problems", type=int, default=64)
    p.add_argument("--per-problem", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=None, help="reward processes (default: the runner's default)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "reward_throughput.json"))
    a = p.parse_args(argv)

    from lit_rlft.rewards import RewardRunner, countdown_reward, math_reward

    if a.task == "math":
        reward = math_reward
        completions, answers = _batch(Path(a.data_dir), a.problems, a.per_problem)
        columns: dict[str, list] = {"answer": answers}
    else:
        reward = countdown_reward
        completions, columns = _countdown_batch(16 if a.problems == 64 else a.problems, a.per_problem)
    isolated = RewardRunner([reward], timeout_s=10.0, num_workers=a.workers)
    inline = RewardRunner([reward], timeout_s=None)
    ways = {
        "whole_batch_call": lambda: reward(completions, **columns),
        "isolated_processes": lambda: isolated(completions, columns).total.tolist(),
        "isolated_inline": lambda: inline(completions, columns).total.tolist(),
    }
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    reference = None
    for round_ in range(a.rounds + 1):
        for name, way in ways.items():
            start = time.perf_counter()
            scores = [float(s or 0.0) for s in way()]
            elapsed = time.perf_counter() - start
            if reference is None:
                reference = scores
            if scores != reference:
                raise SystemExit(f"{name} scored differently from the whole-batch call")
            if round_ > 0:
                seconds[name].append(elapsed)
        print(f"round {round_}: " + ", ".join(f"{n} {s[-1] * 1e3:.1f} ms" for n, s in seconds.items() if s)
              if round_ else "round 0 (warm-up)", flush=True)
    isolated.close()
    base = statistics.median(seconds["whole_batch_call"])
    result = {
        "command": "python benchmarks/reward_throughput.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "task": a.task,
        "batch": len(completions),
        "correct_share": sum(reference) / len(reference),
        "workers": isolated.pool.num_workers,
        "median_s": {n: statistics.median(s) for n, s in seconds.items()},
        "ratio_to_whole_batch": {n: statistics.median(s) / base for n, s in seconds.items()},
        "rounds_s": seconds,
    }
    print(json.dumps({k: result[k] for k in ("batch", "workers", "median_s", "ratio_to_whole_batch")}, indent=1))
    from lit_rlft.records.jsonio import write_result

    write_result(a.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
