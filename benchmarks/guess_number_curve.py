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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "envs"
RESULTS = REPO / "benchmarks" / "results"
FIGURES = REPO / "docs" / "results"


def run(out: Path, threads: int, sft_steps: int | None, grpo_steps: int | None) -> dict:
    from lit_rlft.cli.demo import warm_start_then_grpo
    from lit_rlft.reporting import read_scalars

    cli, before, after, timings = warm_start_then_grpo(
        out, CONFIGS / "sft_guess_number_tiny.yaml", CONFIGS / "guess_number_tiny.yaml", "curve", threads, sft_steps,
        grpo_steps)
    scalars = read_scalars(out / "grpo" / "tb" / "curve")
    step = cli.model.grpo
    return {"before": before, "after": after, "steps": step.rollout_step, "budget": step.budget.state_dict(),
            "sft_s": timings["sft_s"], "grpo_s": timings["grpo_s"], "threads": threads,
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
