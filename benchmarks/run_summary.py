"""Summarise one training run from its TensorBoard events: a PNG of rewards per step and the timing medians.

    python benchmarks/run_summary.py runs/gsm8k_smollm2_lora/tb --out docs/smollm2_gsm8k.png \\
        --tags reward rewards/gsm8k_reward/mean rewards/gsm8k_format_reward/mean

Prints the median step time, generation time and generation share (first step left out: it includes start-up
costs), and the first and last values of every plotted tag, as markdown.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log_dir")
    p.add_argument("--out", required=True)
    p.add_argument("--tags", nargs="+", default=["reward"])
    p.add_argument("--title", default="")
    a = p.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lit_rlft.records import read_scalars

    scalars = read_scalars(a.log_dir)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for tag in a.tags:
        if tag in scalars:
            steps, values = zip(*scalars[tag])
            axes[0].plot(steps, values, marker=".", label=tag)
    axes[0].set_xlabel("rollout step")
    axes[0].set_title(a.title or "training batches")
    axes[0].legend(fontsize=8)
    for tag in ("time/step_s", "time/generation_s", "time/weight_sync_s"):
        if tag in scalars:
            steps, values = zip(*scalars[tag])
            axes[1].plot(steps, values, marker=".", label=tag)
    axes[1].set_xlabel("rollout step")
    axes[1].set_ylabel("seconds")
    axes[1].set_title("time per step")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")

    def steady(tag: str) -> list[float]:
        return [v for _, v in scalars.get(tag, [])][1:]

    step, gen = steady("time/step_s"), steady("time/generation_s")
    print(f"| steps | median step (s) | median generation (s) | median generation share |\n|---|---|---|---|\n"
          f"| {len(scalars.get('time/step_s', []))} | {statistics.median(step):.1f} | {statistics.median(gen):.1f} | "
          f"{statistics.median(g / s for g, s in zip(gen, step)):.2f} |")
    for tag in a.tags + sorted(t for t in scalars if t.startswith("val/")):
        if tag in scalars:
            values = [v for _, v in scalars[tag]]
            print(f"{tag}: first {values[0]:.3f}, last {values[-1]:.3f}, mean {statistics.mean(values):.3f}, "
                  f"{len(values)} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
