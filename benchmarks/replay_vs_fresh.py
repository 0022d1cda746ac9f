"""Rollout replay vs plain GRPO at the same number of steps, side by side (one thread each).

    python benchmarks/replay_vs_fresh.py --warm-start runs/sft/model --steps 300

Runs ``configs/countdown_tiny.yaml`` with and without ``configs/strategies/replay.yaml`` (delta 0.5, capacity 256)
at the same time, one torch thread each, and reports the median step time, the generation share of a step and the
held-out accuracy at the end. Writes ``benchmarks/results/replay_vs_fresh.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from lit_rlft.records import read_scalars
from lit_rlft.records.jsonio import write_result

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {"grpo": [], "grpo + replay (delta 0.5)": ["--config", "configs/strategies/replay.yaml"]}


def _launch(name: str, extra: list[str], args: argparse.Namespace, out: Path) -> subprocess.Popen:
    run_dir = out / name.split()[0] if not extra else out / "replay"
    cmd = [sys.executable, "-m", "lit_rlft.cli", "fit", "--config", "configs/countdown_tiny.yaml", *extra,
           "--model.model", args.warm_start, "--trainer.max_steps", str(args.steps),
           "--trainer.val_check_interval", str(args.steps), "--trainer.enable_progress_bar", "false",
           "--trainer.default_root_dir", str(run_dir), "--trainer.logger.init_args.save_dir", str(run_dir),
           "--trainer.logger.init_args.version", "bench", "--seed_everything", str(args.seed)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    log = open(out / f"{run_dir.name}.log", "w")  # noqa: SIM115 (closed when the process ends)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def _summary(log_dir: Path) -> dict[str, float]:
    s = read_scalars(log_dir)
    step = np.array([v for _, v in s["time/step_s"]])
    gen = np.array([v for _, v in s["time/generation_s"]])
    out = {
        "steps": float(len(step)),
        "step_s_median": float(np.median(step[2:])),
        "generation_s_median": float(np.median(gen[2:])),
        "generation_share_median": float(np.median((gen / step)[2:])),
        "completions": float(s["budget/completions"][-1][1]),
    }
    out.update({k: v[-1][1] for k, v in s.items() if k.startswith("val/accuracy")})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warm-start", default="runs/sft/model", help="SFT checkpoint (lit-rlft sft / make demo)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO / "runs" / "replay_vs_fresh")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    procs = {name: _launch(name, extra, args, args.out) for name, extra in VARIANTS.items()}
    for name, proc in procs.items():
        if proc.wait() != 0:
            raise SystemExit(f"{name} failed: see {args.out}")
    results = {name: _summary(args.out / ("replay" if extra else "grpo") / "tb" / "bench")
               for name, extra in VARIANTS.items()}
    write_result(REPO / "benchmarks" / "results" / "replay_vs_fresh.json",
                 {"args": {k: str(v) for k, v in vars(args).items()}, "results": results})
    base, rep = results["grpo"], results["grpo + replay (delta 0.5)"]
    rows = ["| | step (s, median) | generation (s) | generation share | completions | held-out 3 / 4 numbers |",
            "|---|---|---|---|---|---|"]
    for name, r in results.items():
        rows.append(f"| {name} | {r['step_s_median']:.3f} | {r['generation_s_median']:.3f} | "
                    f"{r['generation_share_median']:.2f} | {r['completions']:.0f} | "
                    f"{r.get('val/accuracy/difficulty_3', float('nan')):.3f} / "
                    f"{r.get('val/accuracy/difficulty_4', float('nan')):.3f} |")
    rows.append(f"\nstep time ratio replay / plain: {rep['step_s_median'] / base['step_s_median']:.3f}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
