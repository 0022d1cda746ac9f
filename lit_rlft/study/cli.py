"""``lit-rlft study``: which strategy pays on my model and data, at my budget?

    lit-rlft study --config my_run.yaml --strategies uniform,dps,mopps,greso --seeds 0,1,2 \
        --completions 40000 --eval-every 5000 --jobs 2 --out runs/study

Re-running the same command resumes: finished runs are reused, the others run. ``--report-only`` rebuilds the report
from the finished runs without running anything.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lit_rlft.study.overrides import SYNTAX, parse_override
from lit_rlft.study.settings import LOOPS, TRL_ARM, StudySettings
from lit_rlft.study.strategies import STRATEGIES, ArmError
from lit_rlft.study.study import StudyError

PROG = "lit-rlft study"


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def key_value(text: str, names: set[str] | frozenset[str], what: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with KEY one of ``names`` (``what`` they are, for the error); VALUE read as JSON (``16``, ``0.3``,
    ``[2,3]``, ``true``), else as text."""
    key, sep, value = text.partition("=")
    if not sep or key.strip() not in names:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with KEY {what} ({', '.join(sorted(names))}), got {text!r}")
    try:
        parsed: Any = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    return key.strip(), parsed


def _setting(text: str) -> str:
    """``[ARM:]Callback.argument[.field]=VALUE`` for ``--set`` (checked against the arms when the study starts)."""
    try:
        parse_override(text)
    except ArmError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _group(text: str) -> tuple[str, list[Any]]:
    """``NAME=V1,V2`` for ``--group``: difficulty values pooled into ``val/accuracy/NAME``."""
    name, sep, values = text.partition("=")
    if not sep or not name.strip() or not values.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=V1,V2 (difficulty values), got {text!r}")
    out: list[Any] = []
    for v in values.split(","):
        v = v.strip()
        out.append(int(v) if v.lstrip("-").isdigit() else v)
    return name.strip(), out


def _arm_seeds(text: str) -> tuple[str, int]:
    """``ARM=N`` for ``--arm-seeds``."""
    arm, sep, n = text.partition("=")
    if not sep or not arm.strip() or not n.strip().isdigit() or int(n) < 1:
        raise argparse.ArgumentTypeError(f"expected ARM=N with N >= 1 (the first N seeds), got {text!r}")
    return arm.strip(), int(n)


def parser() -> argparse.ArgumentParser:
    d = StudySettings(configs=[])
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run several arms (selection strategies) of one lit-rlft fit config at an equal budget of "
                    "completions, evaluate them all on the config's held-out data at the same marks, and report "
                    "which pays: <out>/report.md, study.json, figures and each run's TensorBoard. Re-running resumes.",
        epilog=f"shipped strategies: {', '.join(STRATEGIES)}; '{TRL_ARM}' is TRL's GRPOTrainer on the same config.")
    p.add_argument("--config", action="append", required=True, metavar="FILE",
                   help="the run config (a lit-rlft fit YAML with data.val); repeat to merge files in order")
    p.add_argument("--strategies", type=_names, default=d.strategies,
                   help=f"comma list of arms: shipped strategies or YAML overlay files of callbacks (default "
                        f"{','.join(d.strategies)})")
    p.add_argument("--seeds", type=_ints, default=d.seeds, help="comma list (default 0,1,2)")
    p.add_argument("--completions", type=int, default=d.completions,
                   help=f"the budget of every run, completions of every purpose (default {d.completions})")
    p.add_argument("--eval-every", type=int, default=None,
                   help="completions between evaluations (default: a quarter of the budget)")
    p.add_argument("--jobs", type=int, default=d.jobs, help=f"runs side by side, at most the cores (default {d.jobs}; "
                                                            "0: one after another in this process)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / jobs)")
    p.add_argument("--out", default=d.out, help=f"the study's folder (default {d.out})")
    p.add_argument("--baseline", default=d.baseline,
                   help=f"the arm the others are compared with (default {d.baseline}; '{TRL_ARM}': TRL's trainer)")
    p.add_argument("--eval-seed", type=int, default=d.eval_seed, help="the evaluation's sampling seed (default 0)")
    p.add_argument("--train-subset", type=int, default=d.train_subset,
                   help="also track the reward of a fixed training-pool subset of this many prompts (default 0: no)")
    p.add_argument("--train-generations", type=int, default=d.train_generations,
                   help=f"samples per training-subset prompt (default {d.train_generations})")
    p.add_argument("--group", type=_group, action="append", default=[], metavar="NAME=D1,D2",
                   help="pool held-out difficulty values into val/accuracy/NAME, e.g. learnable=3,4")
    p.add_argument("--eval-reward", action="append", default=[], metavar="DOTTED.PATH",
                   help="score the evaluation with this reward instead of the config's (repeatable), e.g. the rule "
                        "while the config trains on a reward model")
    p.add_argument("--metric", default=d.metric, help=f"the held-out curve the report is about (default {d.metric})")
    p.add_argument("--arm-seeds", type=_arm_seeds, action="append", default=[], metavar="ARM=N",
                   help="run ARM on the first N seeds only (repeatable), e.g. more seeds for the arms that differ "
                        "little and fewer for the rest")
    p.add_argument("--set", dest="settings", type=_setting, action="append", default=[], metavar="[ARM:]CLS.ARG=VALUE",
                   help=f"change one argument of the arms' callbacks, repeatable: {SYNTAX} (without ARM: every arm "
                        "with that callback; see configs/study/*.yaml)")
    p.add_argument("--loop", choices=LOOPS, default=d.loop,
                   help=f"what drives each lit_rlft run: the Trainer (lit-rlft fit) or FabricLoop (default {d.loop})")
    p.add_argument("--run-timeout", type=float, default=None, help="seconds after which a run is killed (default none)")
    p.add_argument("--probe-prompts", type=int, default=d.probe_prompts,
                   help=f"training and held-out prompts the probe samples before the runs (default {d.probe_prompts})")
    p.add_argument("--no-probe", action="store_true", help="no probe before the runs")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from the finished runs only")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def settings_from_args(a: argparse.Namespace) -> StudySettings:
    return StudySettings(
        configs=a.config, strategies=a.strategies, seeds=a.seeds, completions=a.completions, eval_every=a.eval_every,
        out=a.out, jobs=a.jobs, threads=a.threads, baseline=a.baseline, eval_seed=a.eval_seed,
        train_subset=a.train_subset, train_generations=a.train_generations, groups=dict(a.group),
        eval_reward=a.eval_reward, arm_seeds=dict(a.arm_seeds), metric=a.metric,
        overrides=a.settings, run_timeout_s=a.run_timeout, loop=a.loop,
        probe=not a.no_probe,
        probe_prompts=a.probe_prompts)


def main(argv: list[str] | None = None) -> int:
    from lit_rlft.cli.lightning_cli import fail

    a = parser().parse_args(argv)
    settings = settings_from_args(a)
    try:
        if a.report_only:
            from lit_rlft.study.study import rebuild_report

            study = rebuild_report(settings)
        else:
            from lit_rlft.study.study import run_study

            study = run_study(settings, progress=not a.no_progress)
    except StudyError as e:
        fail(PROG, str(e))
    report = Path(settings.out) / "report.md"
    print(report.read_text(encoding="utf-8"))
    failed = [r["run"] for r in study["runs"] if r.get("status") != "ok"]
    print(f"{PROG}: wrote {report}, study.json and the figures in {study['timings']['study_s']:.0f} s"
          + (f"; {len(failed)} run(s) failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
