"""Derived figures of a study: targets, per-run costs to reach them, and per-strategy summaries across seeds.

Targets (from the baseline's runs, ``uniform`` by default): for each ``kind -> curve key`` of ``targets`` (the
product's default ``{"accuracy": "val/accuracy"}``; the Countdown study's held-out accuracy on 3 and 4 numbers and
its training-pool reward), the baseline's final value averaged over its seeds.

One crossing rule for every arm, the baseline included (:func:`~lit_rlft.study.stats.crossing`): a run's cost to
reach a target is the first crossing of its curve, linearly interpolated between evaluation points, in cumulative
completions, rollout steps and training wall-clock; a curve that starts at or above the target costs 0; a run that
never reaches it is censored ("not reached"). Ratios to the baseline are paired by seed (the baseline's own first
crossing of the same target as denominator) and summarised by :func:`~lit_rlft.study.stats.ratio_summary`.

The DPS paper's metric by the same rule, :func:`to_baseline_final`: the completions a strategy needs to reach a
*baseline's* final value (the mean over the baseline's seeds), over the completions the baseline itself needed to
reach it (same seed, same crossing rule; the paper divides by the baseline's whole budget), for the baselines of
``final_baselines``. :func:`paired_at_marks`: the paired difference
to the baseline at every evaluation mark.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from lit_rlft.study.stats import crossing, crossing_bracket, mean_interval, ratio_summary

#: The product's default target: the config's held-out accuracy.
TARGETS = {"accuracy": "val/accuracy"}
MEASURES = ("completions", "step", "wall_s")


#: Budget purposes whose completions join the groups they were generated for: the planned batch (``train``) and the
#: extra completions of sequential sampling and of the allocation (the groups those drop at the end included).
TRAINING_PURPOSES = ("train", "sequential", "allocation")


def _series_values(run: dict[str, Any], tag: str) -> np.ndarray:
    return np.asarray([v for _, v in run.get("series", {}).get(tag, []) if v is not None], dtype=float)


def _finite_mean(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else None


def compute_targets(runs: list[dict[str, Any]], targets: dict[str, str] | None = None,
                    baseline: str = "uniform") -> dict[str, float | None]:
    """Targets from the ``baseline`` runs given: each kind's final value, the mean over the baseline's seeds."""
    uniform = [r for r in runs if r["strategy"] == baseline and r.get("status") == "ok" and r.get("curve")]
    out: dict[str, float | None] = {}
    for kind, key in (targets or TARGETS).items():
        finals = [r["curve"][-1].get(key) for r in uniform]
        finals = [f for f in finals if f is not None]
        out[kind] = float(np.mean(finals)) if finals else None
    return out


def run_metrics(run: dict[str, Any], targets: dict[str, float | None],
                keys: dict[str, str] | None = None) -> dict[str, Any]:
    """Per-run figures: start and final curve values, costs to reach each target (``targets``: kind -> value;
    ``keys``: kind -> curve key), series means, the completions wasted on groups without reward spread."""
    curve = run["curve"]
    out: dict[str, Any] = {"final": dict(curve[-1]), "start": dict(curve[0]), "reached": {}}
    for kind, key in (keys or TARGETS).items():
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
    out["wasted_share"] = wasted_share(run)
    return out


def held_out_figures(metrics: list[dict[str, Any]], confidence: float = 0.95) -> dict[str, dict[str, Any]]:
    """Every held-out figure the runs measured (``val/...`` but the counts, and the training-pool reward), at the
    start and at the end: ``{key: {"start": mean_interval, "final": mean_interval}}`` over the runs given."""
    keys = sorted({k for m in metrics for k in m["final"] if (k.startswith("val/") and not k.startswith("val/n/"))
                   or k.startswith("train_pool_reward")})
    return {k: {"start": mean_interval([m["start"].get(k) for m in metrics], confidence),
                "final": mean_interval([m["final"].get(k) for m in metrics], confidence)} for k in keys}


def wasted_share(run: dict[str, Any]) -> float | None:
    """The share of all the run's completions (every purpose) that were generated in groups without reward spread
    (the study's per-step ``zero_spread_completions``); None for runs recorded without them."""
    log = run.get("step_log") or []
    total = (run.get("budget") or {}).get("completions")
    if not log or not total:
        return None
    return sum(s.get("zero_spread_completions", 0) for s in log) / total


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
    """Completions to reach ``baseline``'s final ``key`` (one pool size), over the baseline's own completions to it.

    Target: the baseline's final value, averaged over its seeds. Per seed: the strategy's first crossing of the
    target in cumulative completions (:func:`~benchmarks.study.stats.crossing_bracket`: linear interpolation
    between the two evaluations around it, which are kept as ``low`` / ``high`` so the evaluation spacing shows),
    divided by the baseline run's of the same seed, found by the same rule (the one crossing rule of every ratio
    to a baseline: the baseline is not charged its whole budget; a baseline seed that never reaches its own mean is
    censored and counted, as a strategy's). Summary: geometric mean over the seed pairs where both crossed, with a
    t-interval on the log-ratios (:func:`~benchmarks.study.stats.ratio_summary`, ``n_used`` the pairs it rests on).
    Without a baseline run ``target`` is None and ``strategies`` empty.
    """
    by = _ok_runs(runs)
    base = by.get(baseline, {})
    finals = [r["curve"][-1].get(key) for r in base.values()]
    finals = [f for f in finals if f is not None]
    out: dict[str, Any] = {"baseline": baseline, "key": key, "target": float(np.mean(finals)) if finals else None,
                           "baseline_seeds": sorted(base), "strategies": {}}
    if out["target"] is None:
        return out

    def first(curve: list[dict[str, Any]]) -> tuple[float, float, float] | None:
        return crossing_bracket([p["completions"] for p in curve], [p.get(key) for p in curve], out["target"])

    for s in strategies:
        pairs, rows = [], []
        for seed in sorted(set(by.get(s, {})) & set(base)):
            found, own = first(by[s][seed]["curve"]), first(base[seed]["curve"])
            x, b = (None if found is None else found[0]), (None if own is None else own[0])
            pairs.append((x, b))
            usable = x is not None and b is not None and b > 0
            rows.append({"seed": seed, "completions": x, "baseline_completions": b,
                         "ratio": x / b if usable else None,
                         "low": found[1] / b if usable else None, "high": found[2] / b if usable else None})
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


def _gain(metrics: dict[str, Any], key: str) -> float | None:
    """A run's final value of ``key`` minus its start value (None when either is missing)."""
    start, final = metrics["start"].get(key), metrics["final"].get(key)
    return None if start is None or final is None else float(final) - float(start)


def discriminates(gain: dict[str, Any] | None) -> bool | None:
    """Whether a study can tell its arms apart: the baseline's held-out gain from the start (``gain``, a
    :func:`~lit_rlft.study.stats.mean_interval` over its seeds) lies beyond its own seed spread (the interval excludes
    0). False when the interval includes 0: the baseline did not measurably learn, so a difference between arms is
    not a difference in learning. None without an interval (one seed, or no baseline run)."""
    if not gain or gain.get("low") is None:
        return None
    return bool(gain["low"] > 0 or gain["high"] < 0)


def summarise(runs: list[dict[str, Any]], strategies: list[str], confidence: float = 0.95,
              marks: list[int] | None = None, targets: dict[str, str] | None = None, baseline: str = "uniform",
              comparisons: tuple[tuple[str, str], ...] = (), final_baselines: tuple[str, ...] = ()
              ) -> dict[str, Any]:
    """All derived figures of one set of runs (one study, or one pool size of the Countdown study).

    Args:
        runs: run records (``strategy``, ``seed``, ``status``, ``curve``, ``series``, ``budget``, ``step_log``).
        strategies: the arms, in table order.
        confidence: of every interval.
        marks: the evaluation marks (completions) of the paired differences at each mark (None: none).
        targets: kind -> curve key (default :data:`TARGETS`); the first is the primary one (the marks' table).
        baseline: the arm every other is compared with (its final values are the targets).
        comparisons: extra ``(arm, other arm)`` paired comparisons.
        final_baselines: baselines of :func:`to_baseline_final` (the DPS paper's metric), where they ran.

    Per arm: ``final`` / ``start`` / ``final_diff`` (paired, minus the baseline's) / ``gain`` (final minus start, per
    run) per target kind, ``reached`` (seeds
    that reached each target), ``crossing`` (the first crossings, per measure), ``vs_baseline`` (the crossings'
    ratios to the baseline's own, paired), the wasted share, the selection overhead share and the diagnostics.
    ``discriminates``: whether the baseline's gain on the primary target is beyond its seed spread
    (:func:`discriminates`).
    """
    keys = dict(targets or TARGETS)
    primary = next(iter(keys))
    values = compute_targets(runs, keys, baseline)
    per_seed: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in runs:
        if r.get("status") == "ok" and r.get("curve"):
            per_seed[r["strategy"]][r["seed"]] = run_metrics(r, values, keys)

    def paired_final(a: str, b: str, key: str) -> dict[str, Any]:
        common = sorted(set(per_seed.get(a, {})) & set(per_seed.get(b, {})))
        return mean_interval([per_seed[a][x]["final"].get(key, np.nan) - per_seed[b][x]["final"].get(key, np.nan)
                              for x in common], confidence)

    def mi(values: list[Any]) -> dict[str, Any]:
        return mean_interval(values, confidence)

    table: dict[str, Any] = {}
    for s in strategies:
        ms = list(per_seed.get(s, {}).values())
        row: dict[str, Any] = {
            "n_ok": len(ms), "n_failed": sum(1 for r in runs if r["strategy"] == s and r.get("status") != "ok"),
            "seeds": sorted(per_seed.get(s, {})),
            "final": {k: mi([m["final"].get(key) for m in ms]) for k, key in keys.items()},
            "start": {k: mi([m["start"].get(key) for m in ms]) for k, key in keys.items()},
            "final_diff": {k: paired_final(s, baseline, key) for k, key in keys.items()},
            "gain": {k: mi([_gain(m, key) for m in ms]) for k, key in keys.items()},
            "final_accuracy": mi([m["final"].get("val/accuracy") for m in ms]),
            "steps": mi([m["final"]["step"] for m in ms]),
            "train_wall_s": mi([m["final"]["wall_s"] for m in ms]),
            "completions": mi([m["completions"] for m in ms]),
            "wasted_share": mi([m["wasted_share"] for m in ms]),
            "mean_effective_ratio": mi([m["mean_effective_ratio"] for m in ms]),
            "fresh_effective_ratio": mi([m["fresh_effective_ratio"] for m in ms]),
            "dots_pearson": mi([m["dots_pearson"] for m in ms]),
            "cold_start_pearson": mi([m["cold_start_pearson"] for m in ms]),
            "dots_reference_pearson": mi([m["dots_reference_pearson"] for m in ms]),
            "dps_accuracy": mi([m["dps_accuracy"] for m in ms]),
            "overhead_share": mi([m["overhead_share"] for m in ms]),
            "non_train_share": mi([m["non_train_share"] for m in ms]),
            "composition": _mean_composition(ms),
            "distinct_prompts": mi([m["distinct_prompts"] for m in ms]),
            "repeat_share": mi([m["repeat_share"] for m in ms]),
            "held_out": held_out_figures(ms, confidence),
            "reached": {k: sum(1 for m in ms if m["reached"][k]["completions"] is not None) for k in keys},
            "crossing": {k: {m: [x["reached"][k][m] for x in ms] for m in MEASURES} for k in keys},
            "vs_baseline": {k: {m: ratio_summary(_paired(per_seed, s, baseline, k, m), confidence)
                                for m in MEASURES} for k in keys},
        }
        eff = [(per_seed[s][x]["mean_effective_ratio"], per_seed[baseline][x]["mean_effective_ratio"])
               for x in sorted(set(per_seed.get(s, {})) & set(per_seed.get(baseline, {})))]
        eff = [(a, b) for a, b in eff if a and b]  # both positive (an all-degenerate run has no ratio)
        row["effective_ratio_vs_baseline"] = ratio_summary(eff, confidence)
        table[s] = row
    pairs = {}
    for a, b in comparisons:
        if a in per_seed and b in per_seed:
            pairs[f"{a}_vs_{b}"] = {k: {m: ratio_summary(_paired(per_seed, a, b, k, m), confidence)
                                        for m in MEASURES} for k in keys}
            for kind, key in keys.items():  # the paired final difference at equal rollouts
                pairs[f"{a}_vs_{b}"][kind]["final_diff"] = paired_final(a, b, key)
    return {"targets": values, "target_keys": keys, "baseline": baseline, "strategies": table, "comparisons": pairs,
            "discriminates": discriminates(table.get(baseline, {}).get("gain", {}).get(primary)),
            "to_baseline_final": {b: to_baseline_final(runs, strategies, b, confidence, keys[primary])
                                  for b in final_baselines if b in per_seed},
            "at_marks": (paired_at_marks(runs, strategies, marks, baseline, confidence, keys[primary])
                         if marks else None),
            "per_run": {f"{s}-seed{seed}": m for s, d in per_seed.items() for seed, m in d.items()}}
