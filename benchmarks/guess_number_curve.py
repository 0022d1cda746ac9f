"""The multi-turn example's learning curve on CPU: the guessing game (configs/envs/) with the tiny policy.

    .venv/bin/python -m benchmarks.guess_number_curve                    # warm start, then GRPO; about 20 minutes
    .venv/bin/python -m benchmarks.guess_number_curve --grpo-steps 2 --sft-steps 3 --out /tmp/guess   # a smoke run

Steps (the warm start is skipped when ``<out>/sft/model`` exists):
1. the warm start (``configs/envs/sft_guess_number_tiny.yaml``): the format and the rules, a random guess among the
   numbers still possible;
2. held-out games won within 4 turns by the warm start (``val/accuracy``), GRPO with the environment
   (``configs/envs/guess_number_tiny.yaml``), held-out games won again;
3. ``benchmarks/results/guess_number_curve.json`` and ``docs/results/guess_number_curve.png``: games won, turns per
   episode and the training reward against completions (written only for a full run, not with the smoke options).

A random consistent guesser wins about half the games of 1..16 in 4 turns; bisection wins 15 of 16 (the target
that needs a fifth guess is the one it loses).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "envs"
RESULTS = REPO / "benchmarks" / "results"
FIGURES = REPO / "docs" / "results"


def run(out: Path, threads: int, sft_steps: int | None, grpo_steps: int | None) -> dict:
    from lit_rlft.cli import grpo_cli, sft_cli
    from lit_rlft.reporting import read_scalars

    torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sft_model = out / "sft" / "model"
    if not (sft_model / "config.json").exists():
        args = ["--config", str(CONFIGS / "sft_guess_number_tiny.yaml"), "--model.output_dir", str(sft_model),
                "--trainer.default_root_dir", str(out / "sft"), "--trainer.logger.init_args.save_dir", str(out / "sft")]
        if sft_steps:
            args += ["--trainer.max_steps", str(sft_steps)]
        sft_cli(args)
    sft_s = time.perf_counter() - t0
    grpo_dir = out / "grpo"
    args = ["--config", str(CONFIGS / "guess_number_tiny.yaml"), "--model.model", str(sft_model),
            "--trainer.default_root_dir", str(grpo_dir), "--trainer.logger.init_args.save_dir", str(grpo_dir),
            "--trainer.logger.init_args.version", "curve"]
    if grpo_steps:
        args += ["--trainer.max_steps", str(grpo_steps)]
    cli = grpo_cli(args, run=False)
    t1 = time.perf_counter()
    cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    before = dict(cli.model.last_eval)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    grpo_s = time.perf_counter() - t1
    cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    after = dict(cli.model.last_eval)
    scalars = read_scalars(grpo_dir / "tb" / "curve")
    step = cli.model.grpo
    return {"before": before, "after": after, "steps": step.rollout_step, "budget": step.budget.state_dict(),
            "sft_s": sft_s, "grpo_s": grpo_s, "threads": threads,
            "curves": {k: scalars.get(k, []) for k in ("val/accuracy", "reward", "episodes/turns_mean",
                                                       "episodes/ended_by_env", "budget/completions")}}


def plot(result: dict, path: Path) -> Path:
    from lit_rlft.reporting import _pyplot

    plt = _pyplot()
    curves = result["curves"]
    completions = dict(curves["budget/completions"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    val = [(0, result["before"].get("val/accuracy"))] + [(completions.get(s, s), v) for s, v in curves["val/accuracy"]]
    axes[0].plot([c for c, _ in val], [v for _, v in val], marker="o", label="held-out games won (4 turns)")
    reward = curves["reward"]
    axes[0].plot([completions.get(s, s) for s, _ in reward], [v for _, v in reward], alpha=0.4,
                 label="training reward")
    axes[0].set_xlabel("completions (episodes)")
    axes[0].set_ylim(0, 1)
    axes[0].legend()
    turns = curves["episodes/turns_mean"]
    axes[1].plot([completions.get(s, s) for s, _ in turns], [v for _, v in turns], label="turns per episode")
    axes[1].set_xlabel("completions (episodes)")
    axes[1].legend()
    fig.suptitle("Guessing game (1..16, 4 turns), tiny policy, GRPO on CPU")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/guess_curve"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sft-steps", type=int, default=None, help="override the warm start's max_steps (smoke runs)")
    p.add_argument("--grpo-steps", type=int, default=None, help="override GRPO's max_steps (smoke runs)")
    a = p.parse_args()
    result = run(a.out, a.threads, a.sft_steps, a.grpo_steps)
    before, after = result["before"].get("val/accuracy"), result["after"].get("val/accuracy")
    print(f"held-out games won: {before:.3f} (warm start) -> {after:.3f} after {result['steps']} GRPO steps, "
          f"{result['budget']['completions']} episodes, {result['grpo_s']:.0f} s")
    if a.sft_steps is None and a.grpo_steps is None:
        (RESULTS / "guess_number_curve.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {RESULTS / 'guess_number_curve.json'} and {plot(result, FIGURES / 'guess_number_curve.png')}")
    else:
        print(f"smoke run: nothing written to the repository; the plot: {plot(result, a.out / 'curve.png')}")


if __name__ == "__main__":
    main()
