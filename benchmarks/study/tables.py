"""``results.md``: the Countdown study's tables (markdown), from the product's summaries
(:mod:`lit_rlft.study.summary`) of each pool; the formatting is the product's (:mod:`lit_rlft.study.report`)."""

from __future__ import annotations

from typing import Any

from benchmarks.study.config import StudyConfig
from lit_rlft.study.report import DASH, at_marks_rows, fmt_mean, fmt_ratio, fmt_value, pct, settings_rows, table

__all__ = ["at_marks_rows", "baseline_final_lines", "degeneracy_lines", "results_markdown", "settings_lines"]

def degeneracy_lines(degeneracy: dict[str, Any]) -> list[str]:
    lines = []
    for size, d in degeneracy.items():
        if "error" in d:
            lines += [f"Pool {size}: measurement failed: `{d['error']}`", ""]
            continue
        rows = [[k, str(v["n"]), f"{v['all_correct']:.3f}", f"{v['all_wrong']:.3f}", f"{v['mixed']:.3f}",
                 f"**{v['degenerate']:.3f}**"] for k, v in [*d["by_difficulty"].items(), ("all", d["overall"])]]
        target = d.get("target", 0.5)  # studies before pool composition: the "at least half" requirement
        meets = d.get("meets_target", d.get("meets_half_degenerate"))
        verdict = "meets" if meets else "does NOT meet"
        hint = "" if meets else " (change the pool's composition: --five-numbers, --bucket-weights)"
        composition = d.get("composition")
        made_of = (" (" + ", ".join(f"{k} numbers {v:.0%}" for k, v in composition.items()) + " of the pool)"
                   if composition else "")
        lines += [f"Pool {size}{made_of}, {d['sampled']} prompts x G={d['G']} under the warm start, T=1: {verdict} "
                  f"the 'at least {target:.0%} degenerate' target{hint}.", "",
                  *table(["numbers", "prompts", "all correct", "all wrong", "mixed", "degenerate"], rows), ""]
    return lines


def main_lines(pool: dict[str, Any], strategies: list[str]) -> list[str]:
    t = pool["strategies"]
    rows = [[s, f"{t[s]['n_ok']}" + (f" (+{t[s]['n_failed']} failed)" if t[s]["n_failed"] else ""),
             fmt_mean(t[s]["final"]["accuracy"]), fmt_mean(t[s]["final_diff"]["accuracy"], 3, True),
             fmt_mean(t[s]["final_accuracy"]), fmt_mean(t[s]["final"]["train_reward"]),
             fmt_mean(t[s]["final_diff"]["train_reward"], 3, True), fmt_mean(t[s]["mean_effective_ratio"]),
             fmt_mean(t[s]["steps"], 0), fmt_mean(t[s]["train_wall_s"], 0)] for s in strategies if s in t]
    return table(["strategy", "runs", "final held-out acc 3+4", "minus uniform's (paired)", "final held-out acc (all)",
                  "final train-pool reward", "minus uniform's (paired)", "mean effective ratio", "steps",
                  "train wall s"], rows)


def cost_lines(pool: dict[str, Any], strategies: list[str]) -> list[str]:
    t = pool["strategies"]
    rows = []
    for s in strategies:
        if s not in t:
            continue
        v = t[s]["vs_baseline"]
        r = t[s]["reached"]
        n = t[s]["n_ok"]
        rows.append([s, f"{r['accuracy']}/{n}", fmt_ratio(v["accuracy"]["completions"]),
                     fmt_ratio(v["accuracy"]["step"]), fmt_ratio(v["accuracy"]["wall_s"]),
                     f"{r['train_reward']}/{n}", fmt_ratio(v["train_reward"]["completions"]),
                     fmt_ratio(v["train_reward"]["step"]), fmt_ratio(v["train_reward"]["wall_s"])])
    return table(["strategy", "reached acc target", "rollouts (acc)", "steps (acc)", "wall (acc)",
                  "reached reward target", "rollouts (reward)", "steps (reward)", "wall (reward)"], rows)


def comparison_lines(pool: dict[str, Any]) -> list[str]:
    rows = []
    for name, c in pool["comparisons"].items():
        for kind in ("accuracy", "train_reward"):
            rows.append([name.replace("_vs_", " / "), kind, fmt_mean(c[kind].get("final_diff"), 3, True),
                         fmt_ratio(c[kind]["completions"]), fmt_ratio(c[kind]["step"]), fmt_ratio(c[kind]["wall_s"])])
    return table(["pair", "target", "final difference at equal rollouts (paired)", "rollouts to target (ratio)",
                  "steps (ratio)", "wall time (ratio)"], rows) if rows else []


def diagnostic_lines(pool: dict[str, Any], strategies: list[str]) -> list[str]:
    t = pool["strategies"]
    rows = [[s, fmt_ratio(t[s]["effective_ratio_vs_baseline"]), fmt_mean(t[s]["fresh_effective_ratio"]),
             fmt_mean(t[s]["dots_pearson"]), fmt_mean(t[s].get("dots_reference_pearson")),
             fmt_mean(t[s]["cold_start_pearson"]), fmt_mean(t[s]["dps_accuracy"]), fmt_mean(t[s]["overhead_share"], 4),
             fmt_mean(t[s]["non_train_share"])] for s in strategies if s in t]
    return table(["strategy", "effective ratio / uniform's", "fresh-batch effective ratio",
                  "DOTS Pearson (selected batch)", "DOTS Pearson (new reference set, out of sample)",
                  "cold-start Pearson (selected batch)", "DPS prediction accuracy",
                  "selection overhead share of step time", "share of completions not for training"], rows)


def composition_lines(pool: dict[str, Any], strategies: list[str]) -> list[str]:
    """Mean share of each bucket in the trained batch (all / informative groups); empty without the series."""
    t = pool["strategies"]
    buckets = sorted({b for s in strategies if s in t for b in t[s].get("composition", {}).get("share", {})},
                     key=lambda b: (len(b), b))
    if not buckets:
        return []
    rows = []
    for s in strategies:
        c = t.get(s, {}).get("composition", {"share": {}, "effective_share": {}})
        if not c["share"]:
            continue
        rows.append([s, *[pct(c["share"].get(b)) for b in buckets], *[pct(c["effective_share"].get(b)) for b in buckets],
                     fmt_mean(t[s].get("distinct_prompts"), 0), fmt_mean(t[s].get("repeat_share"))])
    names = [b.replace("difficulty_", "") + (" numbers" if b.startswith("difficulty_") else "") for b in buckets]
    return table(["strategy", *[f"share {n}" for n in names], *[f"informative share {n}" for n in names],
                  "distinct prompts trained", "fresh prompts trained before (share)"], rows)


def sweep_lines(pools: dict[str, Any], strategies: list[str]) -> list[str]:
    sizes = list(pools)
    header = ["strategy", *[f"acc 3+4 @ {s}" for s in sizes], *[f"train-pool reward @ {s}" for s in sizes],
              *[f"rollouts to acc target vs uniform @ {s}" for s in sizes]]
    rows = []
    for st in strategies:
        rows.append([st, *[fmt_mean(pools[s]["strategies"].get(st, {}).get("final", {}).get("accuracy")) for s in sizes],
                     *[fmt_mean(pools[s]["strategies"].get(st, {}).get("final", {}).get("train_reward")) for s in sizes],
                     *[fmt_ratio(pools[s]["strategies"][st]["vs_baseline"]["accuracy"]["completions"])
                       if st in pools[s]["strategies"] else DASH for s in sizes]])
    return table(header, rows)


# -- what ran -----------------------------------------------------------------------------------------------------
def settings_lines(study: dict[str, Any]) -> list[str]:
    """The settings every run shares (from the recorded configuration) and, per strategy, every argument of every
    callback as its runs recorded it, split into the ones that differ from the callback's default and the rest."""
    cfg = study["config"]
    lines = [
        f"- GRPO: B={cfg['batch_size']}, G={cfg['num_generations']}, T={cfg['temperature']:g}, "
        f"{cfg['max_completion_length']} new tokens, AdamW lr {cfg['learning_rate']:g} (betas "
        f"{fmt_value(cfg['adam_betas'])}, {cfg['warmup_steps']} warm-up steps, gradient norm clipped at "
        f"{cfg['max_grad_norm']:g}), loss `{cfg['loss_type']}`, advantages scaled by `{cfg['scale_rewards']}`, "
        f"clip epsilon {cfg['epsilon']:g}.",
        f"- Budget: {cfg['budget_completions']:,} completions per run, every purpose counted; evaluated at the start "
        f"and at {', '.join(f'{m:,}' for m in StudyConfig.from_dict(cfg).eval_marks())} completions.",
        "",
        "Strategy settings: every constructor argument of every callback, as the runs recorded it (defaults "
        "included; file locations left out; a callback's `seed` is always the run's seed). 'Differs from the "
        "default' compares with the callback's signature.",
        "",
    ]
    return lines + settings_rows(study["runs"], cfg["strategies"])


# -- the DPS paper's metric ----------------------------------------------------------------------------------------
#: How the completions-to-a-baseline's-final-accuracy tables are computed (said above them).
BASELINE_FINAL_METHOD = (
    "The DPS paper's headline: completions to reach dynamic sampling's final accuracy, as a share of dynamic "
    "sampling's own. Here for every strategy against dynamic sampling and against uniform. Target: the baseline's "
    "final held-out accuracy on 3+4 numbers, the mean over its seeds. Per seed: the completions at which the "
    "strategy's curve first reaches it (linear interpolation between the two evaluations around the crossing), "
    "divided by the completions at which the same seed's baseline run first reached it by the same rule (the one "
    "crossing rule of every ratio to a baseline: the baseline is not charged its whole budget). Geometric mean over "
    "the seed pairs where both reached it [95% t-interval on log-ratios], with the pairs it rests on; a seed of "
    "either side that never reaches the target is counted and left out of the mean. Ratio < 1: fewer completions "
    "than the baseline needed.")


def _ratio_cell(row: dict[str, Any], brackets: bool = True) -> str:
    if row["ratio"] is None:
        return "not reached"
    if row["completions"] == 0:
        return "met at start"
    text = f"{row['ratio']:.2f}"
    return text + (f" ({row['low']:.2f}-{row['high']:.2f})" if brackets else "")


def _spacing_text(cfg: StudyConfig, denominators: list[float | None]) -> str:
    spacing = cfg.budget_completions / cfg.num_evals
    denominators = [d for d in denominators if d]
    if not denominators:
        return ""
    lo, hi = min(denominators), max(denominators)
    span = f"{lo:,.0f}" if lo == hi else f"{lo:,.0f}-{hi:,.0f}"
    share = f"{spacing / hi:.2f}" if f"{spacing / hi:.2f}" == f"{spacing / lo:.2f}" else \
        f"{spacing / hi:.2f}-{spacing / lo:.2f}"
    return (f"Evaluations come every {spacing:,.0f} completions, {share} of the "
            f"baseline's crossings ({span}), so a crossing is only known to lie between two evaluations: the bracket after each "
            "per-seed ratio is (last evaluation below the target, first at or above it) over the same denominator, "
            "and the ratio itself interpolates linearly between them.") if lo > 0 else ""


def baseline_final_lines(cfg: StudyConfig, pool: dict[str, Any], size: str, strategies: list[str],
                         heading: bool = True, intro: bool = True) -> list[str]:
    """Both baselines side by side, then per baseline: completions to reach its final held-out accuracy, per seed
    (with the evaluation bracket) and as a geometric mean, as a share of the baseline's own completions
    (``heading`` / ``intro``: the section title and the paragraph saying how it is computed)."""
    tables = pool.get("to_baseline_final") or {}
    if not tables:
        return []
    lines = [f"### Completions to reach a baseline's final accuracy (pool {size}): the DPS paper's metric", ""]
    lines = lines if heading else []
    lines += [BASELINE_FINAL_METHOD, ""] if intro else []
    summary_rows = []
    for s in strategies:
        cells = []
        for t in tables.values():
            row = t["strategies"].get(s)
            if row is None or not row["per_seed"]:
                cells += [DASH, DASH]
                continue
            reached = sum(r["ratio"] is not None for r in row["per_seed"])
            cells += [f"{reached}/{len(row['per_seed'])}", fmt_ratio(row["summary"])]
        summary_rows.append([s, *cells])
    header = ["strategy"]
    for b, t in tables.items():
        target = DASH if t["target"] is None else f"{t['target']:.3f}"
        header += [f"reached {b}'s final ({target})", f"completions / {b}'s"]
    lines += [*table(header, summary_rows), ""]
    for b, t in tables.items():
        if t["target"] is None:
            continue
        seeds = t["baseline_seeds"]
        denominators = [r["baseline_completions"] for row in t["strategies"].values() for r in row["per_seed"]]
        rows = []
        for s in strategies:
            row = t["strategies"].get(s)
            if row is None or not row["per_seed"]:
                continue
            by_seed = {r["seed"]: r for r in row["per_seed"]}
            rows.append([s, *[_ratio_cell(by_seed[x]) if x in by_seed else DASH for x in seeds],
                         fmt_ratio(row["summary"])])
        lines += [f"Per seed, against {b} (target {t['target']:.3f}). {_spacing_text(cfg, denominators)}", "",
                  *table(["strategy", *[f"seed {x}" for x in seeds], "geometric mean [95% interval]"], rows), ""]
    return lines


def at_marks_lines(pool: dict[str, Any], strategies: list[str]) -> list[str]:
    """:func:`at_marks_rows` as a table (empty without the figures)."""
    at = pool.get("at_marks")
    rows = at_marks_rows(pool, strategies)
    return table(["strategy", *[f"{m:,}" for m in at["marks"]]], rows) if at and rows else []


def pool_lines(cfg: StudyConfig, pool: dict[str, Any], size: str, strategies: list[str], title: str) -> list[str]:
    """Outcomes, cost to target, comparisons, diagnostics and batch composition of one pool."""
    tg = pool["targets"]
    fmt_t = {k: (f"{v:.3f}" if v is not None else "n/a (no uniform run)") for k, v in tg.items()}
    lines = [
        f"## {title}: outcomes (pool {size})", "", "Mean over seeds [95% t-interval across seeds]; 'minus uniform's' "
        "is the paired (same seed) difference of the final values.", "",
        *main_lines(pool, strategies), "",
        f"### Cost to reach uniform's final level (pool {size}), as a ratio to uniform", "",
        f"Targets: held-out accuracy 3+4 = {fmt_t['accuracy']}, training-pool reward = {fmt_t['train_reward']} "
        "(uniform's final values, mean over its seeds). Ratio < 1: the strategy gets there with less. Geometric mean "
        "of per-seed ratios (paired by seed) [95% t-interval on log-ratios]; censored seeds are said in words and "
        "left out of the estimate.", "",
        *cost_lines(pool, strategies), "",
        *baseline_final_lines(cfg, pool, size, strategies),
        *([f"### Held-out accuracy minus uniform's at each evaluation (pool {size}, paired)", "",
           "Held-out accuracy on 3+4 numbers minus uniform's, paired by seed, each curve interpolated linearly at "
           "the evaluation marks (in completions) [95% t-interval across seeds]; bold: the interval excludes 0.", "",
           *at_marks_lines(pool, strategies), ""] if pool.get("at_marks") else []),
        *(["### Paired comparisons", "", *comparison_lines(pool), ""] if pool["comparisons"] else []),
        f"### Diagnostics (pool {size})", "", *diagnostic_lines(pool, strategies), "",
    ]
    composition = composition_lines(pool, strategies)
    if composition:
        lines += [f"### What each strategy trained on (pool {size})", "", "Mean over steps (and seeds) of the trained "
                  "batch's groups by number count: share of all groups, and share that are informative "
                  "(0 < success < 1; the informative shares sum to the mean effective ratio).", "", *composition, ""]
    return lines


def _reference_sets(cfg: StudyConfig, study: dict[str, Any]) -> str:
    """`` (R prompts x G every U steps = ... completions per step, ...% of a uniform step)`` of the DOTS arm as its
    runs recorded it (empty when no run used DOTS)."""
    for r in study["runs"]:
        for cb in r.get("callbacks") or []:
            if cb["callback"] == "DOTSCallback":
                size, every = cb["args"]["reference_size"], cb["args"]["update_every"]
                return (f" ({size} prompts x G every {every} steps = {size * cfg.num_generations / every:.0f} "
                        f"completions per step, {size / every / cfg.batch_size:.0%} of a uniform step)")
    return ""


def results_markdown(cfg: StudyConfig, study: dict[str, Any]) -> str:
    pools = study["pools"]
    main = str(cfg.pool_sizes[0])
    step = cfg.batch_size * cfg.num_generations
    lines = [
        "# The strategy study: online data selection for GRPO on Countdown, at equal rollout budgets", "",
        f"Main comparison: pool {main}, seeds {cfg.seeds}; budget {cfg.budget_completions:,} completions per run "
        f"(all purposes; {cfg.budget_completions // step} uniform steps of B={cfg.batch_size} x G={cfg.num_generations}); "
        f"{cfg.num_evals} evaluations after the start on {cfg.eval_size} held-out prompts x {cfg.eval_num_generations} "
        f"samples at T={cfg.temperature}. Warm start: `{study['warm_start']}`. This invocation took "
        f"{study['timings'].get('study_s', 0):.0f} s ({study['timings'].get('runs_executed', 0)} runs executed, "
        f"{study['timings'].get('runs_reused', 0)} reused); the runs took {study['timings'].get('runs_total_s', 0):.0f} "
        f"s in all ({cfg.jobs or 1} side by side).", "",
        "## Settings (from the recorded configuration and the callbacks' arguments)", "", *settings_lines(study), "",
        "## Pool degeneracy at the start", "", *degeneracy_lines(study["degeneracy"]),
        *pool_lines(cfg, pools[main], main, cfg.strategies_at(int(main)), "Main comparison"),
        "Selection overhead = time in the selection callback except reference rollouts, over (training step + that "
        "time + reference rollouts). Not-for-training completions: DOTS / cold-start reference sets"
        f"{_reference_sets(cfg, study)}, dynamic sampling's "
        "discarded rounds and screening's rounds (its kept screening completions included); sequential sampling's "
        "and the allocation's extra completions count as training (the groups they drop at the end included).", "",
    ]
    sweep_seeds = cfg.seeds[: cfg.sweep_seeds]
    for size in cfg.pool_sizes[1:]:
        passes = cfg.budget_completions / (size * cfg.num_generations)
        if len(sweep_seeds) >= 2:
            lines += [f"Pool {size}: the same budget is {passes:.1f} passes over the pool, seeds {sweep_seeds}.", "",
                      *pool_lines(cfg, pools[str(size)], str(size), cfg.strategies_at(size),
                                  f"Multi-epoch setting ({passes:.1f} passes)")]
    if len(pools) > 1:
        strategies = [s for s in cfg.strategies if all(s in cfg.strategies_at(z) for z in cfg.pool_sizes)]
        lines += ["## Across pool sizes", "", f"Seeds {cfg.seeds} at pool {main}, {sweep_seeds} elsewhere.", "",
                  *sweep_lines(pools, strategies), ""]
    failed = [r for r in study["runs"] if r.get("status") != "ok"]
    lines += ["## Failed runs", ""]
    lines += [f"- `{r['run']}`: {r.get('error', 'unknown error')}" for r in failed] or ["None."]
    lines += ["", "![accuracy vs rollouts](accuracy_vs_rollouts.png)", "",
              "![accuracy vs time](accuracy_vs_time.png)", "", "![effective ratio](effective_ratio.png)", ""]
    for size in cfg.pool_sizes[1:]:
        if len(sweep_seeds) >= 2:
            lines += [f"![accuracy vs rollouts, pool {size}](accuracy_vs_rollouts_pool{size}.png)", "",
                      f"![effective ratio, pool {size}](effective_ratio_pool{size}.png)", ""]
    return "\n".join(lines)
