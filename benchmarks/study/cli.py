"""``python -m benchmarks.study``: the command line of the study (see :mod:`benchmarks.study` for the design)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from benchmarks.study.config import SKEWED_POOL, StudyConfig
from benchmarks.study.tables import degeneracy_lines
from lit_rlft.records.jsonio import write_result
from lit_rlft.study.cli import key_value
from lit_rlft.study.overrides import parse_override
from lit_rlft.study.strategies import ArmError


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` for ``--set``: KEY a StudyConfig field, VALUE read as JSON, else as text; or a change to the
    strategies' callbacks (``[ARM:]Callback.argument=VALUE``, ``lit-rlft study``'s ``--set``), kept as
    ``("overrides", text)``."""
    if "." in text.partition("=")[0]:
        try:
            parse_override(text)
        except ArmError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return "overrides", text
    return key_value(text, _FIELDS, "a StudyConfig field")


#: Output folders when ``--out`` is not given.
DEFAULT_OUT, QUICK_OUT = Path("runs/bench"), Path("runs/bench_quick")


def _fmt_default(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def default_text(field: str) -> str | None:
    """``default X`` (and ``--quick: Y`` where the quick study differs) for ``StudyConfig`` field ``field``, read
    from ``StudyConfig()`` and ``StudyConfig.quick()``; None when the default is None or False (said in words)."""
    full, quick = getattr(StudyConfig(), field), getattr(StudyConfig.quick(), field)
    if full is None or full is False:
        return None
    text = f"default {_fmt_default(full)}"
    return text + (f"; --quick: {_fmt_default(quick)}" if quick != full else "")


def parser() -> argparse.ArgumentParser:
    """The study's argument parser. Options whose ``dest`` is a ``StudyConfig`` field override it, and their help
    ends with the field's default, read from the config (never typed here)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.study",
        description="Train every data-selection strategy on the same Countdown pool, warm start, seeds and rollout "
                    "budget; write <out>/runs/*.json, study.json, results.md and plots. Re-running resumes.",
    )
    p.add_argument("--out", type=Path, default=None, help=f"output folder (default {DEFAULT_OUT}; --quick: {QUICK_OUT}; "
                                                                 "--skewed: the same with _skewed)")
    p.add_argument("--quick", action="store_true", help="the < 15 minute variant (StudyConfig.quick())")
    p.add_argument("--strategies", type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                   help="comma list of strategies")
    p.add_argument("--seeds", type=_ints, help="comma list, e.g. 0,1,2")
    p.add_argument("--pool-sizes", type=_ints, help="comma list; the first is the main comparison, e.g. 4000,1000,16000")
    p.add_argument("--sweep-seeds", type=int, help="seeds run at the pool sizes after the first")
    p.add_argument("--budget-completions", type=int, help="completions per run, all purposes")
    p.add_argument("--num-evals", type=int, help="evaluations after the start, at equally spaced completion marks")
    p.add_argument("--eval-size", type=int, help="held-out prompts")
    p.add_argument("--jobs", type=int, help="runs side by side (subprocesses, 1 thread each; 0 = in-process)")
    p.add_argument("--warm-start", help="HF checkpoint directory, or 'tiny' (fresh tiny policy); without it: SFT "
                                        "once into <out>/sft/model as the demo does")
    p.add_argument("--five-numbers", action="store_true", default=None,
                   help="add 5-number problems to the training pool")
    p.add_argument("--bucket-weights", type=lambda t: [float(x) for x in t.split(",") if x.strip()],
                   help="the pool's composition: a weight per number count of the pool (2,3,4 or, with "
                        "--five-numbers, 2,3,4,5), e.g. 0.3,0.1,0.3,0.3")
    p.add_argument("--skewed", action="store_true",
                   help="the pool that wastes most rollouts (StudyConfig.skewed(): 5-number problems, weights "
                        "0.3,0.1,0.3,0.3, target >= 70%% degenerate groups at the warm start)")
    p.add_argument("--set", dest="settings", type=_setting, action="append", default=[], metavar="KEY=VALUE",
                   help="any other StudyConfig field, or a strategy's callback argument as lit-rlft study's --set takes "
                        "it, repeatable, e.g. --set num_generations=16 --set DOTSCallback.alpha=0.3")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    p.add_argument("--degeneracy-only", action="store_true",
                   help="only measure each pool's degenerate groups under the warm start (<out>/degeneracy.json), "
                        "no training runs")
    for action in p._actions:
        text = default_text(action.dest) if action.dest in _FIELDS else None
        if text:
            action.help = f"{action.help} ({text})"
    return p


_FIELDS = frozenset(f.name for f in dataclasses.fields(StudyConfig))


def config_from_args(a: argparse.Namespace) -> StudyConfig:
    """The study's config: ``StudyConfig`` (or ``.quick()``) with every given field option and ``--set`` applied."""
    overrides = {k: v for k, v in vars(a).items() if k in _FIELDS and v is not None}
    changes = [v for k, v in a.settings if k == "overrides"]
    overrides.update({k: v for k, v in a.settings if k != "overrides"})
    if changes:
        overrides["overrides"] = [*overrides.get("overrides", []), *changes]
    if a.skewed:  # the skewed pool's settings, under anything given explicitly
        overrides = {**SKEWED_POOL, **overrides}
    return StudyConfig.quick(**overrides) if a.quick else StudyConfig(**overrides)


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    cfg = config_from_args(a)
    out = a.out or Path(f"{QUICK_OUT if a.quick else DEFAULT_OUT}{'_skewed' if a.skewed else ''}")
    from benchmarks.study.study import pool_degeneracy, resolve_warm_start, run_countdown_study

    t0 = time.perf_counter()
    if a.degeneracy_only:
        out.mkdir(parents=True, exist_ok=True)
        warm_start = resolve_warm_start(cfg, out, threads=cfg.sft_threads)
        result = {"config": cfg.to_dict(), "warm_start": warm_start, "pools": pool_degeneracy(cfg, out, warm_start)}
        write_result(out / "degeneracy.json", result)
        print("\n".join(degeneracy_lines(result["pools"])))
        print(f"benchmarks.study: wrote {out}/degeneracy.json in {time.perf_counter() - t0:.0f} s")
        return 0
    run_countdown_study(cfg, out, progress=not a.no_progress)
    print((out / "results.md").read_text())
    print(f"benchmarks.study: wrote {out}/study.json, results.md and plots in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    main()
