"""Time and completions to TRL's accuracy on the Countdown study's pool: a study of the product with a TRL arm.

    .venv/bin/python -m benchmarks.time_to_trl --out runs/time_to_trl                      # the demo's pool
    .venv/bin/python -m benchmarks.time_to_trl --out runs/time_to_trl_skewed --skewed --pool-size 1000

This is ``lit-rlft study --baseline trl`` on the Countdown study's run config for one pool
(:meth:`benchmarks.study.config.StudyConfig.run_config`): TRL's ``GRPOTrainer`` (:mod:`lit_rlft.study.trl_arm`: the
same warm start, prompts token for token, rewards, B x G, sampling, optimizer and loss, float32), lit_rlft's uniform
run and the recipes (``--recipe``, default ``dps_c8``), per seed, one after another on one core each
(``--jobs 1``) or side by side, the arms' order rotated at each seed. Every arm is measured by the same evaluator at
the same completion marks; the clocks start at each trainer's first training step; every arm's time to TRL's final
accuracy (the mean over TRL's seeds) is its first crossing of it by one rule, TRL's own included (its seeds reach
their mean at or before their end, so TRL is no longer charged its whole budget).

Writes ``<out>/time_to_trl.json`` (the study's summary, ``"format": 2``), the study's own ``report.md`` and figures,
and prints the table. ``benchmarks/results/time_to_trl_*.json`` are such records (those made before the product,
format 1, with lit_rlft's clock started before ``fit``, TRL's at ``on_train_begin`` and TRL charged its whole training
time, were regenerated). The table is the study library's (:mod:`benchmarks.study.trl_tables`, which the pages render
the recorded ones with); ``result_table`` is importable from here too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.study.config import STRATEGIES, StudyConfig  # noqa: E402
from benchmarks.study.trl_tables import result_table  # noqa: E402

ACCURACY = "val/accuracy/learnable"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the study, the warm start and time_to_trl.json")
    p.add_argument("--pool-size", type=int, default=4000, help="the study's demo pool (about half a pass)")
    p.add_argument("--skewed", action="store_true", help="the study's skewed pool composition")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--recipe", nargs="+", default=["dps_c8"],
                   help="the lit_rlft strategies beside uniform (study strategies)")
    p.add_argument("--jobs", type=int, default=1, help="runs side by side (default 1: one core, runs in turn)")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="StudyConfig fields (JSON values)")
    return p.parse_args(argv)


def config(args: argparse.Namespace) -> StudyConfig:
    cfg = StudyConfig.skewed() if args.skewed else StudyConfig()
    for item in args.set:
        key, _, value = item.partition("=")
        if not hasattr(cfg, key):
            raise SystemExit(f"--set {item}: StudyConfig has no field {key!r}")
        setattr(cfg, key, json.loads(value))
    cfg.pool_sizes = [args.pool_size]
    cfg.jobs = args.jobs
    unknown = [name for name in args.recipe if name not in STRATEGIES or name == "uniform"]
    if unknown:
        raise SystemExit(f"--recipe {' '.join(unknown)}: not a study strategy beside uniform; choose from "
                         f"{', '.join(s for s in STRATEGIES if s != 'uniform')}")
    cfg.strategies = ["uniform", *args.recipe]
    cfg.seeds = list(args.seeds)
    return cfg


def main(argv: list[str] | None = None) -> int:
    from benchmarks.study.warm_start import resolve_warm_start
    from lit_rlft.records.jsonio import write_result
    from lit_rlft.study import run_study
    from lit_rlft.study.compose import write_config

    args = parse_args(argv)
    cfg = config(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    warm_start = resolve_warm_start(cfg, out, cfg.sft_threads)
    path = write_config(cfg.run_config(args.pool_size, warm_start), out / "run.yaml",
                        header="The Countdown study's run config (python -m benchmarks.time_to_trl).")
    settings = cfg.study_settings(args.pool_size, str(path), str(out / "study"))
    settings.strategies, settings.baseline = [*settings.strategies, "trl"], "trl"
    study = run_study(settings)
    result = {"format": 2,
              "command": "python -m benchmarks.time_to_trl " + " ".join(sys.argv[1:] if argv is None else argv),
              "config": cfg.to_dict(), "pool_size": args.pool_size, "seeds": args.seeds, "recipes": args.recipe,
              "warm_start": warm_start, "summary": study["summary"],
              "environment": study["environment"]}  # the study's, taken where its runs ran
    result["table_markdown"] = result_table(result)
    write_result(out / "time_to_trl.json", result)
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
