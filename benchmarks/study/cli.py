"""``python -m benchmarks.study``: the command line of the study (see :mod:`benchmarks.study` for the design)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from benchmarks.study.config import STRATEGIES, StudyConfig


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` for ``--set``: VALUE is read as JSON (``16``, ``0.3``, ``[2,3]``, ``true``), else as text."""
    key, sep, value = text.partition("=")
    fields = {f.name for f in dataclasses.fields(StudyConfig)}
    if not sep or key.strip() not in fields:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with KEY a StudyConfig field ({', '.join(sorted(fields))}), "
                                         f"got {text!r}")
    try:
        parsed: object = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    return key.strip(), parsed


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.study",
        description="Train every data-selection strategy on the same Countdown pool, warm start, seeds and rollout "
                    "budget; write <out>/runs/*.json, study.json, results.md and plots. Re-running resumes.",
    )
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/bench, runs/bench_quick)")
    p.add_argument("--quick", action="store_true", help="the < 15 minute variant (StudyConfig.quick())")
    p.add_argument("--strategies", type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                   help=f"comma list from {','.join(STRATEGIES)}")
    p.add_argument("--seeds", type=_ints, help="comma list, e.g. 0,1,2")
    p.add_argument("--pool-sizes", type=_ints, help="comma list; the first is the main comparison, e.g. 4000,1000,16000")
    p.add_argument("--sweep-seeds", type=int, help="seeds run at the pool sizes after the first (default 1)")
    p.add_argument("--budget-completions", type=int, help="completions per run, all purposes")
    p.add_argument("--num-evals", type=int, help="evaluations after the start, at equally spaced completion marks")
    p.add_argument("--eval-size", type=int, help="held-out prompts")
    p.add_argument("--jobs", type=int, help="runs side by side (subprocesses, 1 thread each; 0 = in-process)")
    p.add_argument("--warm-start", help="HF checkpoint directory, or 'tiny' (fresh tiny policy); default: SFT once "
                                        "into <out>/sft/model as the demo does")
    p.add_argument("--five-numbers", action="store_true", help="add 5-number problems to the training pool")
    p.add_argument("--set", dest="settings", type=_setting, action="append", default=[], metavar="KEY=VALUE",
                   help="any other StudyConfig field, repeatable, e.g. --set num_generations=16 --set dots_alpha=0.3")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    return p


def config_from_args(a: argparse.Namespace) -> StudyConfig:
    overrides = {k: v for k, v in {
        "strategies": a.strategies, "seeds": a.seeds, "pool_sizes": a.pool_sizes, "sweep_seeds": a.sweep_seeds,
        "budget_completions": a.budget_completions, "num_evals": a.num_evals, "eval_size": a.eval_size,
        "jobs": a.jobs, "warm_start": a.warm_start, "five_numbers": a.five_numbers or None,
    }.items() if v is not None}
    overrides.update(dict(a.settings))
    return StudyConfig.quick(**overrides) if a.quick else StudyConfig(**overrides)


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    cfg = config_from_args(a)
    out = a.out or Path("runs/bench_quick" if a.quick else "runs/bench")
    from benchmarks.study.study import run_study

    t0 = time.perf_counter()
    run_study(cfg, out, progress=not a.no_progress)
    print((out / "results.md").read_text())
    print(f"benchmarks.study: wrote {out}/study.json, results.md and plots in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    main()
