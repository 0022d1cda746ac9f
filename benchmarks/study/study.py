"""The study end to end: warm start, pool degeneracy, every run, derived figures, ``study.json``, ``results.md``
and the three plots under ``<out>``."""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.study.config import RunSpec, StudyConfig
from benchmarks.study.degeneracy import measure_degeneracy
from benchmarks.study.derived import summarise_pool
from benchmarks.study.jsonio import read_json, write_json
from benchmarks.study.plots import plot_curves, plot_effective_ratio
from benchmarks.study.report import results_markdown
from benchmarks.study.run_one import is_finished, run_json_path
from benchmarks.study.runner import execute_runs
from benchmarks.study.strategies import strategy_settings
from benchmarks.study.warm_start import resolve_warm_start

#: How the derived figures are computed (written into ``study.json``).
METHODS: dict[str, str] = {
    "targets": "accuracy: uniform's final held-out accuracy on 3+4 numbers; train_reward: uniform's final "
               "training-pool reward; both the mean over uniform's seeds at the same pool size",
    "crossing": "first crossing of the curve, linear interpolation between evaluation points; never crossed = not "
                "reached (censored)",
    "to_baseline_final": "completions to reach a baseline's final held-out accuracy on 3+4 numbers (the mean over "
                         "the baseline's seeds; baselines dynamic_sampling and uniform), found as 'crossing', divided "
                         "by the completions of the same seed's baseline run (its last evaluation); geometric mean "
                         "over seeds, Student-t 95% interval on log-ratios; low/high: the evaluations around the "
                         "crossing, over the same denominator",
    "at_marks": "held-out accuracy on 3+4 numbers minus uniform's, paired by seed, each curve linearly interpolated "
                "at the evaluation marks; Student-t 95% interval across seeds",
    "intervals": "ratios: geometric mean of per-seed ratios paired by seed, Student-t 95% interval on log-ratios; "
                 "means: Student-t 95% interval across seeds; none with one seed",
    "plots": "mean across seeds, band = +-1 standard deviation across seeds",
    "callbacks": "each run records its strategy's callbacks with every constructor argument (defaults included, "
                 "file locations left out), resolved with inspect.signature from the arguments the study passes",
}


def pool_degeneracy(cfg: StudyConfig, out: Path, warm_start: str) -> dict[str, Any]:
    """Degeneracy of each pool under the warm start (cached in ``<out>/degeneracy-pool<N>.json``)."""
    result = {}
    for size in cfg.pool_sizes:
        path = out / f"degeneracy-pool{size}.json"
        key = {"warm_start": warm_start, "fingerprint": cfg.run_fingerprint(), "sample": cfg.degeneracy_sample,
               "G": cfg.degeneracy_generations}
        cached = read_json(path)
        if cached and cached.get("key") == key:
            result[str(size)] = cached["result"]
        else:
            try:
                result[str(size)] = measure_degeneracy(cfg, size, warm_start, threads=cfg.threads)
                write_json(path, {"key": key, "result": result[str(size)]})
            except Exception as exc:  # reported, never fatal
                result[str(size)] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
                continue
        # the target is not part of the measurement (nor of its cache key): judged against today's
        d = result[str(size)]
        d["target"] = cfg.degenerate_target
        d["meets_target"] = d["overall"]["degenerate"] >= cfg.degenerate_target
    return result


def retire_stale_runs(cfg: StudyConfig, out: Path) -> list[str]:
    """Move aside (to ``<out>/runs/stale/``) every finished run whose recorded callback settings differ from what
    the study passes now (or that has none recorded), so that it runs again; returns their names.

    A run is reused when it says ``ok``, matches ``cfg.run_fingerprint()`` (the settings every run shares) and ran
    with the callbacks :func:`~benchmarks.study.strategies.strategy_settings` gives now, defaults included: changing
    one strategy's setting, or a default of its callback, re-runs that strategy and nothing else."""
    stale = []
    fingerprint = cfg.run_fingerprint()
    for spec in cfg.runs():
        path = run_json_path(out, spec)
        if is_finished(path, fingerprint) and not is_finished(path, fingerprint, _settings(cfg, spec)):
            target = path.parent / "stale" / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            path.replace(target)
            stale.append(spec.name)
    if stale:
        print(f"benchmarks.study: {len(stale)} finished run(s) ran with other callback settings than the study passes "
              f"now and run again (old results in {out / 'runs' / 'stale'}): {', '.join(stale)}")
    return stale


def _settings(cfg: StudyConfig, spec: RunSpec) -> list[dict[str, Any]]:
    return strategy_settings(spec.strategy, cfg, spec.seed)


def run_study(cfg: StudyConfig, out: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the study and write its outputs; returns the ``study.json`` content."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    warm_start = resolve_warm_start(cfg, out, threads=cfg.sft_threads)
    timings: dict[str, Any] = {"warm_start_s": time.perf_counter() - t0}
    degeneracy = pool_degeneracy(cfg, out, warm_start)
    timings["degeneracy_s"] = time.perf_counter() - t0 - timings["warm_start_s"]
    for size, d in degeneracy.items():
        if not d.get("meets_target", True):
            print(f"benchmarks.study: pool {size} is only {d['overall']['degenerate']:.0%} degenerate at the start "
                  f"(< {d['target']:.0%}): change its composition (--five-numbers, --bucket-weights)")
    t_runs = time.perf_counter()
    retire_stale_runs(cfg, out)
    executed = execute_runs(cfg, warm_start, out, progress=progress)
    timings.update(runs_s=time.perf_counter() - t_runs, runs_executed=executed["executed"],
                   runs_reused=executed["reused"])
    runs = executed["records"]
    pools = {str(size): summarise_pool([r for r in runs if r.get("pool_size") == size], cfg.strategies_at(size),
                                       cfg.confidence, cfg.eval_marks()) for size in cfg.pool_sizes}
    timings["study_s"] = time.perf_counter() - t0
    timings["runs_total_s"] = sum(r.get("total_s") or 0.0 for r in runs)
    study = {"config": cfg.to_dict(), "warm_start": warm_start, "degeneracy": degeneracy, "pools": pools,
             "runs": runs, "timings": timings, "methods": METHODS}
    write_json(out / "study.json", study)
    for i, size in enumerate(cfg.pool_sizes):
        pool_runs = [r for r in runs if r.get("pool_size") == size and r.get("status") == "ok" and r.get("curve")]
        seeds = cfg.seeds if i == 0 else cfg.seeds[: cfg.sweep_seeds]
        if i > 0 and len(seeds) < 2:
            continue  # a one-seed sweep pool is summarised in the sweep table only
        suffix = "" if i == 0 else f"_pool{size}"
        title = f"Countdown, pool {size}, budget {cfg.budget_completions:,} completions, seeds {seeds}"
        strategies = cfg.strategies_at(size)
        targets = pools[str(size)]["targets"]
        plot_curves(pool_runs, strategies, targets, "completions", out / f"accuracy_vs_rollouts{suffix}.png", title)
        plot_curves(pool_runs, strategies, targets, "wall_s", out / f"accuracy_vs_time{suffix}.png", title)
        plot_effective_ratio(pool_runs, strategies, out / f"effective_ratio{suffix}.png", title)
    (out / "results.md").write_text(results_markdown(cfg, study), encoding="utf-8")
    return study
