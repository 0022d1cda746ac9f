"""``results.md``: the study's tables (markdown), from the summaries of :mod:`benchmarks.study.derived`."""

from __future__ import annotations

from typing import Any

from benchmarks.study.config import StudyConfig

DASH = "–"


def fmt_mean(mi: dict[str, Any] | None, digits: int = 3, signed: bool = False) -> str:
    """``mean [low, high]``, or the mean alone with one seed."""
    if mi is None or mi.get("mean") is None:
        return DASH
    sign = "+" if signed else ""
    text = f"{mi['mean']:{sign}.{digits}f}"
    if mi.get("low") is not None:
        text += f" [{mi['low']:{sign}.{digits}f}, {mi['high']:{sign}.{digits}f}]"
    return text


def fmt_ratio(rs: dict[str, Any]) -> str:
    """A ratio summary as ``0.71 [0.52, 0.97]``, with censoring said in words."""
    status = rs["status"]
    if status == "no_data":
        return DASH
    if status == "not_reached":
        both = " (nor the baseline)" if rs["b_not_reached"] == rs["n"] else ""
        return f"not reached ({rs['a_not_reached']}/{rs['n']}){both}"
    if status == "baseline_not_reached":
        return "baseline not reached"
    if status == "at_start":
        return "met at start"
    text = f"{rs['ratio']:.2f}"
    if rs["low"] is not None:
        text += f" [{rs['low']:.2f}, {rs['high']:.2f}]"
    notes = []
    if rs["a_not_reached"]:
        notes.append(f"{rs['a_not_reached']}/{rs['n']} not reached")
    if rs["b_not_reached"]:
        notes.append(f"baseline {rs['b_not_reached']}/{rs['n']} not reached")
    if rs.get("at_start"):
        notes.append(f"{rs['at_start']}/{rs['n']} met at start")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def degeneracy_lines(degeneracy: dict[str, Any]) -> list[str]:
    lines = []
    for size, d in degeneracy.items():
        if "error" in d:
            lines += [f"Pool {size}: measurement failed: `{d['error']}`", ""]
            continue
        rows = [[k, str(v["n"]), f"{v['all_correct']:.3f}", f"{v['all_wrong']:.3f}", f"{v['mixed']:.3f}",
                 f"**{v['degenerate']:.3f}**"] for k, v in [*d["by_difficulty"].items(), ("all", d["overall"])]]
        verdict = "meets" if d["meets_half_degenerate"] else "does NOT meet (add 5-number problems: --five-numbers)"
        lines += [f"Pool {size} ({d['sampled']} prompts x G={d['G']} under the warm start, T=1): {verdict} the "
                  "'at least half degenerate' requirement.", "",
                  *_table(["numbers", "prompts", "all correct", "all wrong", "mixed", "degenerate"], rows), ""]
    return lines


def main_lines(pool: dict[str, Any], strategies: list[str]) -> list[str]:
    t = pool["strategies"]
    rows = [[s, f"{t[s]['n_ok']}" + (f" (+{t[s]['n_failed']} failed)" if t[s]["n_failed"] else ""),
             fmt_mean(t[s]["final_accuracy_learnable"]), fmt_mean(t[s]["final_accuracy_diff_vs_uniform"], 3, True),
             fmt_mean(t[s]["final_accuracy"]), fmt_mean(t[s]["final_train_reward"]),
             fmt_mean(t[s]["final_train_reward_diff_vs_uniform"], 3, True), fmt_mean(t[s]["mean_effective_ratio"]),
             fmt_mean(t[s]["steps"], 0), fmt_mean(t[s]["train_wall_s"], 0)] for s in strategies if s in t]
    return _table(["strategy", "runs", "final held-out acc 3+4", "minus uniform's (paired)", "final held-out acc (all)",
                   "final train-pool reward", "minus uniform's (paired)", "mean effective ratio", "steps",
                   "train wall s"], rows)


def cost_lines(pool: dict[str, Any], strategies: list[str]) -> list[str]:
    t = pool["strategies"]
    rows = []
    for s in strategies:
        if s not in t:
            continue
        v = t[s]["vs_uniform"]
        r = t[s]["reached"]
        n = t[s]["n_ok"]
        rows.append([s, f"{r['accuracy']}/{n}", fmt_ratio(v["accuracy"]["completions"]),
                     fmt_ratio(v["accuracy"]["step"]), fmt_ratio(v["accuracy"]["wall_s"]),
                     f"{r['train_reward']}/{n}", fmt_ratio(v["train_reward"]["completions"]),
                     fmt_ratio(v["train_reward"]["step"]), fmt_ratio(v["train_reward"]["wall_s"])])
    return _table(["strategy", "reached acc target", "rollouts (acc)", "steps (acc)", "wall (acc)",
                   "reached reward target", "rollouts (reward)", "steps (reward)", "wall (reward)"], rows)


def comparison_lines(pool: dict[str, Any]) -> list[str]:
    rows = []
    for name, c in pool["comparisons"].items():
        for kind in ("accuracy", "train_reward"):
            rows.append([name.replace("_vs_", " / "), kind, fmt_mean(c[kind].get("final_diff"), 3, True),
                         fmt_ratio(c[kind]["completions"]), fmt_ratio(c[kind]["step"]), fmt_ratio(c[kind]["wall_s"])])
    return _table(["pair", "target", "final difference at equal rollouts (paired)", "rollouts to target (ratio)",
                   "steps (ratio)", "wall time (ratio)"], rows) if rows else []


def diagnostic_lines(pool: dict[str, Any], strategies: list[str]) -> list[str]:
    t = pool["strategies"]
    rows = [[s, fmt_ratio(t[s]["effective_ratio_vs_uniform"]), fmt_mean(t[s]["fresh_effective_ratio"]),
             fmt_mean(t[s]["dots_pearson"]), fmt_mean(t[s].get("dots_reference_pearson")),
             fmt_mean(t[s]["cold_start_pearson"]), fmt_mean(t[s]["dps_accuracy"]), fmt_mean(t[s]["overhead_share"], 4),
             fmt_mean(t[s]["non_train_share"])] for s in strategies if s in t]
    return _table(["strategy", "effective ratio / uniform's", "fresh-batch effective ratio",
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
        rows.append([s, *[_pct(c["share"].get(b)) for b in buckets], *[_pct(c["effective_share"].get(b)) for b in buckets],
                     fmt_mean(t[s].get("distinct_prompts"), 0), fmt_mean(t[s].get("repeat_share"))])
    names = [b.replace("difficulty_", "") + (" numbers" if b.startswith("difficulty_") else "") for b in buckets]
    return _table(["strategy", *[f"share {n}" for n in names], *[f"informative share {n}" for n in names],
                   "distinct prompts trained", "fresh prompts trained before (share)"], rows)


def _pct(x: float | None) -> str:
    return DASH if x is None else f"{x:.0%}"


def sweep_lines(pools: dict[str, Any], strategies: list[str]) -> list[str]:
    sizes = list(pools)
    header = ["strategy", *[f"acc 3+4 @ {s}" for s in sizes], *[f"train-pool reward @ {s}" for s in sizes],
              *[f"rollouts to acc target vs uniform @ {s}" for s in sizes]]
    rows = []
    for st in strategies:
        rows.append([st, *[fmt_mean(pools[s]["strategies"].get(st, {}).get("final_accuracy_learnable")) for s in sizes],
                     *[fmt_mean(pools[s]["strategies"].get(st, {}).get("final_train_reward")) for s in sizes],
                     *[fmt_ratio(pools[s]["strategies"][st]["vs_uniform"]["accuracy"]["completions"])
                       if st in pools[s]["strategies"] else DASH for s in sizes]])
    return _table(header, rows)


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
        *(["### Paired comparisons", "", *comparison_lines(pool), ""] if pool["comparisons"] else []),
        f"### Diagnostics (pool {size})", "", *diagnostic_lines(pool, strategies), "",
    ]
    composition = composition_lines(pool, strategies)
    if composition:
        lines += [f"### What each strategy trained on (pool {size})", "", "Mean over steps (and seeds) of the trained "
                  "batch's groups by number count: share of all groups, and share that are informative "
                  "(0 < success < 1; the informative shares sum to the mean effective ratio).", "", *composition, ""]
    return lines


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
        "## Pool degeneracy at the start", "", *degeneracy_lines(study["degeneracy"]),
        *pool_lines(cfg, pools[main], main, cfg.strategies_at(int(main)), "Main comparison"),
        "Selection overhead = time in the selection callback except reference rollouts, over (training step + that "
        "time + reference rollouts). Not-for-training completions: DOTS / cold-start reference sets "
        f"({cfg.reference_size} prompts x G every {cfg.update_every} steps = "
        f"{cfg.reference_size * cfg.num_generations / cfg.update_every:.0f} completions per step, "
        f"{cfg.reference_size / cfg.update_every / cfg.batch_size:.0%} of a uniform step) and dynamic sampling's "
        "discarded rounds.", "",
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
