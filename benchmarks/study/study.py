"""The Countdown study end to end: warm start, pool degeneracy, then each pool size as a study of the product
(:func:`lit_rlft.study.run_study` on the pool's run config), the Countdown figures, ``study.json``, ``results.md`` and
the plots under ``<out>``.

Layout: ``<out>/pool<N>/`` is the product's study of pool ``N`` (its ``run.yaml``, ``arms/``, ``runs/``, its own
``report.md``); ``<out>/study.json`` and ``results.md`` put the pools together with the Countdown tables (degeneracy,
the training-pool reward, the sweep across pools, the DPS paper's metric).
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.study.config import COMPARISONS, FINAL_BASELINES, TARGETS, RunSpec, StudyConfig
from benchmarks.study.degeneracy import measure_degeneracy
from benchmarks.study.tables import results_markdown
from benchmarks.study.warm_start import resolve_warm_start
from lit_rlft.records.jsonio import read_json, write_json, write_result
from lit_rlft.study import run_study
from lit_rlft.study.compose import write_config
from lit_rlft.study.summary import summarise

#: Each pool's curves: held-out accuracy on 3+4 numbers and the training-pool reward.
PANELS = (("val/accuracy/learnable", "held-out accuracy, 3+4 numbers (T=1)", "accuracy"),
          ("train_pool_reward", "training-pool reward (fixed subset, T=1, G=4)", "train_reward"))

#: How the derived figures are computed (written into ``study.json``).
METHODS: dict[str, str] = {
    "targets": "accuracy: uniform's final held-out accuracy on 3+4 numbers; train_reward: uniform's final "
               "training-pool reward; both the mean over uniform's seeds at the same pool size",
    "crossing": "first crossing of the curve, linear interpolation between evaluation points, the same rule for "
                "every strategy (uniform's own seeds included); never crossed = not reached (censored)",
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


def summarise_pool(runs: list[dict[str, Any]], strategies: list[str], confidence: float,
                   marks: list[int] | None = None) -> dict[str, Any]:
    """All derived figures of one pool size (the product's :func:`~lit_rlft.study.summary.summarise` with the
    Countdown targets, comparisons and the DPS paper's baselines)."""
    return summarise(runs, strategies, confidence, marks, TARGETS, baseline="uniform", comparisons=COMPARISONS,
                     final_baselines=FINAL_BASELINES)


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


def pool_runs(cfg: StudyConfig, size: int, warm_start: str, out: Path, progress: bool) -> dict[str, Any]:
    """Pool ``size`` as a study of the product under ``<out>/pool<N>``; its run records, each with ``pool_size``
    and the Countdown study's run name (``<strategy>-pool<N>-seed<S>``)."""
    folder = out / f"pool{size}"
    config = write_config(cfg.run_config(size, warm_start), folder / "run.yaml",
                          header=f"The Countdown study's run config for pool {size} (python -m benchmarks.study).")
    study = run_study(cfg.study_settings(size, str(config), str(folder)), progress=progress)
    runs = []
    for r in study["runs"]:
        runs.append({**r, "run": RunSpec(r["strategy"], size, r["seed"]).name, "pool_size": size,
                     "warm_start": warm_start})
    return {"runs": runs, "timings": study["timings"]}


def run_countdown_study(cfg: StudyConfig, out: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the study and write its outputs; returns the ``study.json`` content."""
    from lit_rlft.study.plots import plot_curves, plot_effective_ratio

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
    runs: list[dict[str, Any]] = []
    executed = reused = 0
    for size in cfg.pool_sizes:
        pool = pool_runs(cfg, size, warm_start, out, progress)
        runs += pool["runs"]
        executed += pool["timings"]["runs_executed"]
        reused += pool["timings"]["runs_reused"]
    timings.update(runs_s=time.perf_counter() - t_runs, runs_executed=executed, runs_reused=reused)
    pools = {str(size): summarise_pool([r for r in runs if r.get("pool_size") == size], cfg.strategies_at(size),
                                       cfg.confidence, cfg.eval_marks()) for size in cfg.pool_sizes}
    timings["study_s"] = time.perf_counter() - t0
    timings["runs_total_s"] = sum(r.get("total_s") or 0.0 for r in runs)
    study = {"config": cfg.to_dict(), "warm_start": warm_start, "degeneracy": degeneracy, "pools": pools,
             "runs": runs, "timings": timings, "methods": METHODS}
    write_result(out / "study.json", study)
    for i, size in enumerate(cfg.pool_sizes):
        pool_ok = [r for r in runs if r.get("pool_size") == size and r.get("status") == "ok" and r.get("curve")]
        seeds = cfg.seeds if i == 0 else cfg.seeds[: cfg.sweep_seeds]
        if i > 0 and len(seeds) < 2:
            continue  # a one-seed sweep pool is summarised in the sweep table only
        suffix = "" if i == 0 else f"_pool{size}"
        title = f"Countdown, pool {size}, budget {cfg.budget_completions:,} completions, seeds {seeds}"
        strategies = cfg.strategies_at(size)
        targets = pools[str(size)]["targets"]
        plot_curves(pool_ok, strategies, targets, "completions", out / f"accuracy_vs_rollouts{suffix}.png", title,
                    PANELS)
        plot_curves(pool_ok, strategies, targets, "wall_s", out / f"accuracy_vs_time{suffix}.png", title, PANELS)
        plot_effective_ratio(pool_ok, strategies, out / f"effective_ratio{suffix}.png", title)
    (out / "results.md").write_text(results_markdown(cfg, study), encoding="utf-8")
    return study
