"""How much the demo's held-out figures move with the evaluation's sampling seed and the thread count.

    python -m lit_rlft.cli.demo --out runs/demo                       # first: the demo (its models)
    python benchmarks/demo_spread.py --demo runs/demo --seeds 0 1 2 3 4 --out benchmarks/results/demo_spread.json

Each held-out evaluation samples 4 completions per problem at the training temperature; it is seeded from
``(generation.seed, batch, rank)``, so one (model, seed, thread count) gives one figure in any process.
This script evaluates the demo's warm start (``<demo>/sft/model``) and its GRPO result (``<demo>/grpo/model``) with
the demo's settings (``configs/countdown_tiny.yaml``) under several generation seeds, and seed 0 under one torch
thread as well as two, and prints the spread of every bucket's accuracy: the noise a single evaluation carries.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lit_rlft.cli import grpo_cli  # noqa: E402
from lit_rlft.cli.demo import add_learnable  # noqa: E402
from lit_rlft.records.jsonio import write_result  # noqa: E402

BUCKETS = ("val/accuracy/difficulty_2", "val/accuracy/difficulty_3", "val/accuracy/difficulty_4",
           "val/accuracy/learnable", "val/accuracy")


def evaluate(model: Path, seed: int, threads: int) -> dict[str, float]:
    """Held-out metrics of ``model`` under the demo's settings and generation seed ``seed``."""
    torch.set_num_threads(threads)
    cli = grpo_cli(["--config", str(REPO / "configs" / "countdown_tiny.yaml"), "--model.model", str(model),
                    "--model.generation.seed", str(seed), "--trainer.logger", "false",
                    "--trainer.enable_progress_bar", "false"], run=False)
    cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    return add_learnable(dict(cli.model.last_eval))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo", type=Path, default=Path("runs/demo"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    result: dict[str, dict] = {}
    for name in ("sft", "grpo"):
        model = a.demo / name / "model"
        runs = {f"seed={s},threads=2": evaluate(model, s, 2) for s in a.seeds}
        runs["seed=0,threads=1"] = evaluate(model, 0, 1)
        runs["seed=0,threads=2,again"] = evaluate(model, 0, 2)
        by_seed = [runs[f"seed={s},threads=2"] for s in a.seeds]
        spread = {k: {"mean": statistics.mean(r[k] for r in by_seed), "sd": statistics.stdev(r[k] for r in by_seed),
                      "min": min(r[k] for r in by_seed), "max": max(r[k] for r in by_seed)} for k in BUCKETS}
        result[name] = {"runs": runs, "spread_over_seeds": spread}
        print(f"\n{name}: {model}")
        print("| bucket | " + " | ".join(f"seed {s}" for s in a.seeds) + " | sd | seed 0, 1 thread | seed 0 again |")
        print("|---|" + "---|" * (len(a.seeds) + 3))
        for k in BUCKETS:
            cells = " | ".join(f"{r[k]:.3f}" for r in by_seed)
            print(f"| {k.removeprefix('val/')} | {cells} | {spread[k]['sd']:.3f} | {runs['seed=0,threads=1'][k]:.3f} "
                  f"| {runs['seed=0,threads=2,again'][k]:.3f} |")
    if a.out:
        write_result(a.out, result)


if __name__ == "__main__":
    main()
