"""The strategy study's runs at async depth 1 against depth 0: held-out accuracy at equal completions, and the
wall-clock to each evaluation.

    python -m benchmarks.study --out runs/async_study_depth0 --strategies uniform,dps_c8 --seeds 0,1,2 \
        --pool-sizes 4000 --jobs 1 --warm-start runs/demo/sft/model --set async_depth=0 --set threads=2
    python -m benchmarks.study --out runs/async_study_depth1 --strategies uniform,dps_c8 --seeds 0,1,2 \
        --pool-sizes 4000 --jobs 1 --warm-start runs/demo/sft/model --set async_depth=1 --set threads=1
    python benchmarks/async_study.py runs/async_study_depth0 runs/async_study_depth1 --out <json>

Equal cores: depth 0 trains and generates on 2 torch threads, depth 1 gives the trainer 1 and its generation process
1; runs one at a time. Prints, per strategy: the final learnable accuracy per seed at each depth, the paired
difference (depth 1 - depth 0) with its spread, and the median wall-clock (training, evaluations excluded) to each
evaluation mark.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

KEY = "val/accuracy/learnable"


def load(folder: Path) -> dict[tuple[str, int], dict[str, Any]]:
    runs = {}
    for path in sorted((folder / "runs").glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("status") == "ok":
            runs[(data["strategy"], int(data["seed"]))] = data
    return runs


def train_wall(curve: list[dict[str, Any]]) -> list[float]:
    """Wall seconds to each evaluation, the evaluations' own time taken out."""
    spent, out = 0.0, []
    for point in curve:
        out.append(point["wall_s"] - spent)
        spent += point.get("eval_s", 0.0)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("depth0", type=Path)
    p.add_argument("depth1", type=Path)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    d0, d1 = load(a.depth0), load(a.depth1)
    report: dict[str, Any] = {}
    for strategy in sorted({s for s, _ in d0} & {s for s, _ in d1}):
        seeds = sorted({k for s, k in d0 if s == strategy} & {k for s, k in d1 if s == strategy})
        final0 = [d0[(strategy, k)]["curve"][-1][KEY] for k in seeds]
        final1 = [d1[(strategy, k)]["curve"][-1][KEY] for k in seeds]
        diffs = [b - x for x, b in zip(final0, final1)]
        spread0 = max(final0) - min(final0)
        walls0 = [train_wall(d0[(strategy, k)]["curve"]) for k in seeds]
        walls1 = [train_wall(d1[(strategy, k)]["curve"]) for k in seeds]
        marks = [p_["completions"] for p_ in d0[(strategy, seeds[0])]["curve"]]
        wall0 = [statistics.median(w[i] for w in walls0) for i in range(len(marks))]
        wall1 = [statistics.median(w[i] for w in walls1) for i in range(min(len(w) for w in walls1))]
        report[strategy] = {"seeds": seeds, "final_depth0": final0, "final_depth1": final1, "paired_diff": diffs,
                            "seed_range_depth0": spread0, "marks": marks, "train_wall_s_depth0": wall0,
                            "train_wall_s_depth1": wall1}
        print(f"\n{strategy}: final {KEY} per seed {seeds}")
        print(f"  depth 0: {', '.join(f'{x:.3f}' for x in final0)} (range {spread0:.3f})")
        print(f"  depth 1: {', '.join(f'{x:.3f}' for x in final1)}; paired differences "
              f"{', '.join(f'{x:+.3f}' for x in diffs)} (mean {statistics.mean(diffs):+.3f})")
        print("  completions: " + ", ".join(str(m) for m in marks))
        print("  train wall s, depth 0: " + ", ".join(f"{x:.0f}" for x in wall0))
        print("  train wall s, depth 1: " + ", ".join(f"{x:.0f}" for x in wall1))
    if a.out:
        from lit_rlft.records.jsonio import write_result

        write_result(a.out, report)


if __name__ == "__main__":
    main()
