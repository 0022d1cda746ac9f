"""Derived figures of the study: targets, per-run costs to reach them, and per-strategy summaries across seeds.

Targets (per pool size, from the uniform runs of that pool):
- ``accuracy``: uniform GRPO's final held-out accuracy on the learnable bucket (``val/accuracy/learnable``),
  averaged over uniform's seeds;
- ``train_reward``: uniform's final ``train_pool_reward`` (fixed 256-prompt training subset, T=1, G=4), averaged
  over uniform's seeds.
A run's cost to reach a target is the first crossing of its curve (linear interpolation between evaluation
points) in cumulative completions, rollout steps and training wall time; a run that never reaches it is censored
("not reached"). Ratios are paired by seed and summarised by :func:`benchmarks.study.stats.ratio_summary`.

The DPS paper's own metric, :func:`to_baseline_final`: the completions a strategy needs to reach a *baseline's*
final held-out accuracy (3+4 numbers; the mean over the baseline's seeds), as a share of the completions the
baseline itself spent (same seed), for the baselines in :data:`FINAL_BASELINES`. :func:`paired_at_marks`: the
paired difference to uniform at every evaluation mark.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from benchmarks.study.stats import crossing, crossing_bracket, mean_interval, ratio_summary

TARGETS = {"accuracy": "val/accuracy/learnable", "train_reward": "train_pool_reward"}
MEASURES = ("completions", "step", "wall_s")
#: Extra paired comparisons besides "vs uniform": (strategy, baseline).
COMPARISONS = (("dps", "dynamic_sampling"), ("dps_c8", "dynamic_sampling"), ("dps_c8", "dps"),
               # what the allocation and the content priors add to the strategy they are built on
               ("allocation_dps", "dps_c8"), ("allocation_mopps", "mopps"), ("allocation_dots", "dots"),
               ("allocation_dps_cold", "dps_cold_start"), ("dps_cold_start", "dps"), ("dps_content_prior", "dps_c8"))
#: Baselines of the "completions to reach a baseline's final accuracy" table (the DPS paper's own metric).
FINAL_BASELINES = ("dynamic_sampling", "uniform")


#: Budget purposes whose completions join the groups they were generated for: the planned batch (``train``) and the
#: extra completions of sequential sampling and of the allocation (the groups those drop at the end included).
TRAINING_PURPOSES = ("train", "sequential", "allocation")


def _series_values(run: dict[str, Any], tag: str) -> np.ndarray:
    return np.asarray([v for _, v in run.get("series", {}).get(tag, []) if v is not None], dtype=float)


def _finite_mean(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else None


def compute_targets(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Targets from the ``uniform`` runs given (one pool size)."""
    uniform = [r for r in runs if r["strategy"] == "uniform" and r.get("status") == "ok" and r.get("curve")]
    out: dict[str, float | None] = {}
    for kind, key in TARGETS.items():
        finals = [r["curve"][-1].get(key) for r in uniform]
        finals = [f for f in finals if f is not None]
        out[kind] = float(np.mean(finals)) if finals else None
    return out


def run_metrics(run: dict[str, Any], targets: dict[str, float | None]) -> dict[str, Any]:
    """Per-run figures: start and final curve values, costs to reach each target, series means."""
    curve = run["curve"]
    out: dict[str, Any] = {"final": dict(curve[-1]), "start": dict(curve[0]), "reached": {}}
    for kind, key in TARGETS.items():
        target = targets.get(kind)
        ys = [p.get(key) for p in curve]
        if target is not None and ys[0] is not None and ys[0] >= target:  # met before training: costs nothing
            out["reached"][kind] = dict.fromkeys(MEASURES, 0.0)
        else:
            out["reached"][kind] = {m: (None if target is None else crossing([p[m] for p in curve], ys, target))
                                    for m in MEASURES}
    out["mean_effective_ratio"] = _finite_mean(_series_values(run, "effective_ratio"))
    name = run.get("selection_name")
    out["fresh_effective_ratio"] = _finite_mean(_series_values(run, f"{name}/effective_ratio")) if name else None
    out["dots_pearson"] = _finite_mean(_series_values(run, "dots/pearson"))
    out["cold_start_pearson"] = _finite_mean(_series_values(run, "dps/cold_start_pearson"))
    # out of sample, on each new uniform reference set (the batch Pearson above is range-restricted by selection)
    out["dots_reference_pearson"] = _finite_mean(
        _series_values(run, "dots/reference_pearson") if name != "dps"
        else _series_values(run, "dps/cold_start_reference_pearson"))
    out["dps_accuracy"] = _finite_mean(_series_values(run, "dps/accuracy"))
    out["overhead_share"] = None
    if name:
        overhead = _series_values(run, f"{name}/overhead_s").sum()
        total = (_series_values(run, "time/step_s").sum() + overhead
                 + _series_values(run, f"{name}/reference_generation_s").sum())
        out["overhead_share"] = float(overhead / total) if total > 0 else None
    out["composition"] = batch_composition(run)
    distinct = _series_values(run, "composition/distinct_prompts")
    out["distinct_prompts"] = float(distinct[-1]) if distinct.size else None
    out["repeat_share"] = _finite_mean(_series_values(run, "composition/repeat_share"))
    budget = run.get("budget", {})
    by = budget.get("by_purpose", {})
    out["completions"] = budget.get("completions")
    trained = sum(by.get(p, 0) for p in TRAINING_PURPOSES)
    out["non_train_share"] = (1 - trained / budget["completions"]) if budget.get("completions") else None
    return out


def batch_composition(run: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Mean over steps of the trained batch's ``share`` and ``effective_share`` per bucket, from the
    ``composition/<column>_<value>/...`` series of :class:`~lit_rlft.callbacks.BatchCompositionLogger`:
    ``{"share": {"difficulty_2": ..., ...}, "effective_share": {...}}`` (empty for runs made without it)."""
    out: dict[str, dict[str, float]] = {"share": {}, "effective_share": {}}
    for tag in run.get("series", {}):
        parts = tag.split("/")
        if len(parts) == 3 and parts[0] == "composition" and parts[2] in out:
            mean = _finite_mean(_series_values(run, tag))
            if mean is not None:
                out[parts[2]][parts[1]] = mean
    return out


def _mean_composition(ms: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {"share": {}, "effective_share": {}}
    for kind in out:
        buckets = sorted({b for m in ms for b in m["composition"][kind]})
        for b in buckets:
            out[kind][b] = float(np.mean([m["composition"][kind][b] for m in ms if b in m["composition"][kind]]))
    return out


def _paired(per_seed: dict[str, dict[int, dict[str, Any]]], a: str, b: str, kind: str, measure: str) -> list:
    seeds = sorted(set(per_seed.get(a, {})) & set(per_seed.get(b, {})))
    return [(per_seed[a][s]["reached"][kind][measure], per_seed[b][s]["reached"][kind][measure]) for s in seeds]


def _ok_runs(runs: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    by: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in runs:
        if r.get("status") == "ok" and r.get("curve"):
            by[r["strategy"]][r["seed"]] = r
    return by


def to_baseline_final(runs: list[dict[str, Any]], strategies: list[str], baseline: str, confidence: float = 0.95,
                      key: str = TARGETS["accuracy"]) -> dict[str, Any]:
    """Completions to reach ``baseline``'s final ``key`` (one pool size), as a share of the baseline's completions.

    Target: the baseline's final value, averaged over its seeds. Per seed: the strategy's first crossing of the
    target in cumulative completions (:func:`~benchmarks.study.stats.crossing_bracket`: linear interpolation
    between the two evaluations around it, which are kept as ``low`` / ``high`` so the evaluation spacing shows),
    divided by the completions the baseline run of the same seed spent in all (its last evaluation). Summary:
    geometric mean over seeds with a t-interval on the log-ratios (:func:`~benchmarks.study.stats.ratio_summary`;
    seeds that never reach the target are censored and counted). Without a baseline run ``target`` is None and
    ``strategies`` empty.
    """
    by = _ok_runs(runs)
    base = by.get(baseline, {})
    finals = [r["curve"][-1].get(key) for r in base.values()]
    finals = [f for f in finals if f is not None]
    out: dict[str, Any] = {"baseline": baseline, "key": key, "target": float(np.mean(finals)) if finals else None,
                           "baseline_seeds": sorted(base), "strategies": {}}
    if out["target"] is None:
        return out
    for s in strategies:
        pairs, rows = [], []
        for seed in sorted(set(by.get(s, {})) & set(base)):
            curve = by[s][seed]["curve"]
            denominator = float(base[seed]["curve"][-1]["completions"])
            found = crossing_bracket([p["completions"] for p in curve], [p.get(key) for p in curve], out["target"])
            x = None if found is None else found[0]
            pairs.append((x, denominator))
            rows.append({"seed": seed, "completions": x, "baseline_completions": denominator,
                         "ratio": None if found is None else found[0] / denominator,
                         "low": None if found is None else found[1] / denominator,
                         "high": None if found is None else found[2] / denominator})
        out["strategies"][s] = {"per_seed": rows, "summary": ratio_summary(pairs, confidence)}
    return out


def paired_at_marks(runs: list[dict[str, Any]], strategies: list[str], marks: list[int], baseline: str = "uniform",
                    confidence: float = 0.95, key: str = TARGETS["accuracy"]) -> dict[str, Any]:
    """``key`` minus the baseline's, paired by seed, at each completion mark: each curve linearly interpolated at the
    mark (``np.interp`` over cumulative completions; evaluations land on or just past the marks). Per strategy a
    list of ``mean_interval`` summaries, one per mark, each with ``identical`` (every paired difference exactly 0)."""
    by = _ok_runs(runs)
    base = by.get(baseline, {})
    out: dict[str, Any] = {"baseline": baseline, "marks": list(marks), "strategies": {}}
    for s in strategies:
        seeds = sorted(set(by.get(s, {})) & set(base))
        if not seeds or s == baseline:
            continue
        cells = []
        for m in marks:
            diffs = []
            for seed in seeds:
                a = [(p["completions"], p[key]) for p in by[s][seed]["curve"] if p.get(key) is not None]
                b = [(p["completions"], p[key]) for p in base[seed]["curve"] if p.get(key) is not None]
                diffs.append(float(np.interp(m, *zip(*a)) - np.interp(m, *zip(*b))))
            cell = mean_interval(diffs, confidence)
            cell["identical"] = all(d == 0.0 for d in diffs)
            cells.append(cell)
        out["strategies"][s] = cells
    return out


def summarise_pool(runs: list[dict[str, Any]], strategies: list[str], confidence: float,
                   marks: list[int] | None = None) -> dict[str, Any]:
    """All derived figures of one pool size."""
    targets = compute_targets(runs)
    per_seed: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in runs:
        if r.get("status") == "ok" and r.get("curve"):
            per_seed[r["strategy"]][r["seed"]] = run_metrics(r, targets)
    table: dict[str, Any] = {}
    for s in strategies:
        ms = list(per_seed.get(s, {}).values())
        row: dict[str, Any] = {
            "n_ok": len(ms), "n_failed": sum(1 for r in runs if r["strategy"] == s and r.get("status") != "ok"),
            "final_accuracy_learnable": mean_interval([m["final"].get(TARGETS["accuracy"]) for m in ms], confidence),
            "final_accuracy": mean_interval([m["final"].get("val/accuracy") for m in ms], confidence),
            "final_train_reward": mean_interval([m["final"].get("train_pool_reward") for m in ms], confidence),
            "start_accuracy_learnable": mean_interval([m["start"].get(TARGETS["accuracy"]) for m in ms], confidence),
            "steps": mean_interval([m["final"]["step"] for m in ms], confidence),
            "train_wall_s": mean_interval([m["final"]["wall_s"] for m in ms], confidence),
            "mean_effective_ratio": mean_interval([m["mean_effective_ratio"] for m in ms], confidence),
            "fresh_effective_ratio": mean_interval([m["fresh_effective_ratio"] for m in ms], confidence),
            "dots_pearson": mean_interval([m["dots_pearson"] for m in ms], confidence),
            "cold_start_pearson": mean_interval([m["cold_start_pearson"] for m in ms], confidence),
            "dots_reference_pearson": mean_interval([m["dots_reference_pearson"] for m in ms], confidence),
            "dps_accuracy": mean_interval([m["dps_accuracy"] for m in ms], confidence),
            "overhead_share": mean_interval([m["overhead_share"] for m in ms], confidence),
            "non_train_share": mean_interval([m["non_train_share"] for m in ms], confidence),
            "composition": _mean_composition(ms),
            "distinct_prompts": mean_interval([m["distinct_prompts"] for m in ms], confidence),
            "repeat_share": mean_interval([m["repeat_share"] for m in ms], confidence),
            "reached": {k: sum(1 for m in ms if m["reached"][k]["completions"] is not None) for k in TARGETS},
            "vs_uniform": {k: {m: ratio_summary(_paired(per_seed, s, "uniform", k, m), confidence)
                               for m in MEASURES} for k in TARGETS},
        }
        common = sorted(set(per_seed.get(s, {})) & set(per_seed.get("uniform", {})))
        for kind, key in TARGETS.items():  # paired final difference: informative even when nobody reaches a target
            diffs = [per_seed[s][x]["final"].get(key, np.nan) - per_seed["uniform"][x]["final"].get(key, np.nan)
                     for x in common]
            row[f"final_{kind}_diff_vs_uniform"] = mean_interval(diffs, confidence)
        eff = [(per_seed[s][x]["mean_effective_ratio"], per_seed["uniform"][x]["mean_effective_ratio"])
               for x in sorted(set(per_seed.get(s, {})) & set(per_seed.get("uniform", {})))]
        eff = [(a, b) for a, b in eff if a and b]  # both positive (an all-degenerate run has no ratio)
        row["effective_ratio_vs_uniform"] = ratio_summary(eff, confidence)
        table[s] = row
    comparisons = {}
    for a, b in COMPARISONS:
        if a in per_seed and b in per_seed:
            comparisons[f"{a}_vs_{b}"] = {k: {m: ratio_summary(_paired(per_seed, a, b, k, m), confidence)
                                              for m in MEASURES} for k in TARGETS}
            common = sorted(set(per_seed[a]) & set(per_seed[b]))
            for kind, key in TARGETS.items():  # the paired final difference at equal rollouts
                diffs = [per_seed[a][x]["final"].get(key, np.nan) - per_seed[b][x]["final"].get(key, np.nan)
                         for x in common]
                comparisons[f"{a}_vs_{b}"][kind]["final_diff"] = mean_interval(diffs, confidence)
    return {"targets": targets, "strategies": table, "comparisons": comparisons,
            "to_baseline_final": {b: to_baseline_final(runs, strategies, b, confidence) for b in FINAL_BASELINES
                                  if b in per_seed},
            "at_marks": paired_at_marks(runs, strategies, marks, "uniform", confidence) if marks else None,
            "per_run": {f"{s}-seed{seed}": m for s, d in per_seed.items() for seed, m in d.items()}}
