"""``python -m benchmarks.study.passes``: what selection saves against passes over the pool, from recorded studies.

    python -m benchmarks.study.passes --add runs/many_pass_skewed_200/study.json   # record a finished study
    python -m benchmarks.study.passes            # rewrite docs/results/saving_vs_passes.png and print the tables
    python -m benchmarks.study.docs              # rewrite the results page's generated blocks, this one included
    python -m benchmarks.study.docs --check      # checks the block too (it is one of the page's generated blocks)

Every ``docs/results/passes/*.json`` is one recorded study (``study.json`` as ``python -m benchmarks.study`` writes
it) of one pool size: the same warm start, budget and settings, only the pool's size and composition (balanced or
skewed) differ, so the budget is ``budget / (G x pool)`` passes over the pool. Each file's summaries are recomputed
from its runs with the study's current code (:func:`benchmarks.study.docs.load_study`). Per strategy and setting:

- ``x uniform's completions``: the completions at which the strategy's held-out curve first reaches uniform's final
  accuracy (3+4 numbers, mean over uniform's seeds), over the completions of the same seed's uniform run; geometric
  mean over seeds [95% t-interval on log-ratios]; seeds that never reach it are counted, not averaged
  (:func:`benchmarks.study.derived.to_baseline_final`). The saving is 1 minus it;
- the paired final difference to uniform [95% t-interval];
- the DPS paper's metric where dynamic sampling ran: the same ratio against dynamic sampling's final accuracy and
  total completions;
- the training wall-clock (evaluation excluded) and the distinct prompts trained on.

The figure draws the first two against passes, one panel per composition.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.study.config import StudyConfig
from benchmarks.study.report import at_marks_rows

REPO = Path(__file__).resolve().parents[2]
PASSES_DIR = REPO / "docs" / "results" / "passes"
FIGURE = REPO / "docs" / "results" / "saving_vs_passes.png"
#: Table and figure order.
ORDER = ("uniform", "dps_c8", "dps", "mopps", "greso", "dots_replay", "dynamic_sampling", "dps_c8_handback")


def composition(cfg: StudyConfig) -> str:
    return "skewed" if cfg.bucket_weights or cfg.five_numbers else "balanced"


def passes(cfg: StudyConfig, pool_size: int) -> float:
    """Prompt draws of a uniform run over the pool's size: ``budget / (G x pool)``."""
    return cfg.budget_completions / (cfg.num_generations * pool_size)


def settings(directory: Path = PASSES_DIR) -> list[dict[str, Any]]:
    """One row per (recorded study, strategy), sorted by composition, passes and :data:`ORDER`."""
    from benchmarks.study.docs import load_study

    paths = sorted(directory.glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"{directory}: no recorded studies (*.json)")
    rows = []
    for path in paths:
        cfg, study = load_study(path)
        if len(cfg.pool_sizes) != 1:
            raise ValueError(f"{path}: one pool size per recorded study, got {cfg.pool_sizes}")
        size = cfg.pool_sizes[0]
        pool = study["pools"][str(size)]
        to_final = pool["to_baseline_final"]
        marks = {r[0]: r[1:] for r in at_marks_rows(pool, cfg.strategies_at(size))}
        for s in cfg.strategies_at(size):
            row = pool["strategies"][s]
            if not row["n_ok"]:
                continue
            to_uniform = to_final.get("uniform", {}).get("strategies", {}).get(s, {}).get("summary")
            to_dynamic = to_final.get("dynamic_sampling", {}).get("strategies", {}).get(s, {}).get("summary")
            rows.append({"file": path.name, "composition": composition(cfg), "pool": size,
                         "passes": passes(cfg, size), "strategy": s, "seeds": row["n_ok"],
                         "final": row["final_accuracy_learnable"]["mean"],
                         "diff": row["final_accuracy_diff_vs_uniform"], "to_uniform": to_uniform,
                         "to_dynamic": to_dynamic, "wall_s": row["train_wall_s"]["mean"],
                         "distinct": row["distinct_prompts"]["mean"],
                         "train_reward": row["final_train_reward"]["mean"],
                         "effective_ratio": row["mean_effective_ratio"]["mean"],
                         "trained": row["composition"], "marks": cfg.eval_marks(), "at_marks": marks.get(s)})
    rank = {s: i for i, s in enumerate(ORDER)}
    return sorted(rows, key=lambda r: (r["composition"], r["passes"], rank.get(r["strategy"], len(ORDER)),
                                       r["strategy"]))


def _ratio(summary: dict[str, Any] | None) -> str:
    if not summary or summary.get("n", 0) == 0:
        return "-"
    never = summary.get("a_not_reached", 0)
    if summary.get("ratio") is None:
        return f"never ({never}/{summary['n']} seeds)"
    cell = f"{summary['ratio']:.2f}x"
    if summary.get("low") is not None:
        cell += f" [{summary['low']:.2f}, {summary['high']:.2f}]"
    return cell + (f", {never}/{summary['n']} never" if never else "")


def _diff(d: dict[str, Any]) -> str:
    if d.get("mean") is None:
        return "-"
    if d.get("low") is None:
        return f"{d['mean']:+.3f}"
    bold = d["low"] > 0 or d["high"] < 0
    cell = f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
    return f"**{cell}**" if bold else cell


def _number(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.0f}{unit}"


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of :func:`settings`' rows."""
    lines = ["| pool | passes | strategy | seeds | final held-out accuracy | minus uniform's (paired) | "
             "completions to uniform's final accuracy (x uniform's) | to dynamic sampling's (x its) | "
             "training wall-clock | distinct prompts |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = "(baseline)" if r["strategy"] == "uniform" else _diff(r["diff"])
        lines.append(f"| {r['composition']} {r['pool']:,} | {r['passes']:.1f} | {r['strategy']} | {r['seeds']} | "
                     f"{r['final']:.3f} | {diff} | {_ratio(r['to_uniform'])} | {_ratio(r['to_dynamic'])} | "
                     f"{_number(r['wall_s'], ' s')} | {_number(r['distinct'])} |")
    return lines


def at_marks_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Held-out accuracy minus uniform's, paired by seed, at every evaluation mark, per setting and strategy."""
    marks = rows[0]["marks"] if rows else []
    lines = ["| pool | passes | strategy | " + " | ".join(f"{m:,}" for m in marks) + " |",
             "|---|---|---|" + "---|" * len(marks)]
    for r in rows:
        if r["at_marks"] is not None:
            lines.append(f"| {r['composition']} {r['pool']:,} | {r['passes']:.1f} | {r['strategy']} | "
                         + " | ".join(r["at_marks"]) + " |")
    return lines


def composition_lines(rows: list[dict[str, Any]]) -> list[str]:
    """What each run trained on: the share of trained groups per number count (and the share that had both
    outcomes), the mean effective ratio and the final training-pool reward (fixed subset), mean over seeds."""
    buckets = sorted({b for r in rows for b in r["trained"].get("share", {})})
    names = [b.replace("difficulty_", "") + " numbers" for b in buckets]
    lines = ["| pool | passes | strategy | " + " | ".join(names) + " | informative groups | training-pool reward | "
             "held-out accuracy |", "|---|---|---|" + "---|" * (len(buckets) + 3)]
    for r in rows:
        share, eff = r["trained"].get("share", {}), r["trained"].get("effective_share", {})
        cells = [f"{share[b]:.2f} ({eff.get(b, 0.0):.2f})" if b in share else "-" for b in buckets]
        ratio = "-" if r["effective_ratio"] is None else f"{r['effective_ratio']:.2f}"
        reward = "-" if r["train_reward"] is None else f"{r['train_reward']:.3f}"
        lines.append(f"| {r['composition']} {r['pool']:,} | {r['passes']:.1f} | {r['strategy']} | "
                     + " | ".join(cells) + f" | {ratio} | {reward} | {r['final']:.3f} |")
    return lines


def block(directory: Path = PASSES_DIR) -> list[str]:
    """The results page's ``saving-vs-passes`` block."""
    rows = settings(directory)
    return ["Generated by `python -m benchmarks.study.passes` from `docs/results/passes/*.json` (one recorded study per "
            "row group). Bold: the interval excludes 0.", "", *table_lines(rows), "",
            "Held-out accuracy minus uniform's at each evaluation (completions; paired by seed, 95% t-interval):", "",
            *at_marks_lines(rows), "",
            "What the runs trained on: the share of trained groups with 2-5 numbers (in brackets: the share that were "
            "informative, with both outcomes), the mean share of informative groups per step, and the final reward on "
            "a fixed 256-prompt subset of the training pool beside the held-out accuracy (means over seeds):", "",
            *composition_lines(rows)]


def plot(rows: list[dict[str, Any]], path: Path = FIGURE) -> Path:
    """Two rows of panels (completions to uniform's final accuracy; final accuracy minus uniform's) by composition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = sorted({r["composition"] for r in rows})
    fig, axes = plt.subplots(2, len(comps), figsize=(6.5 * len(comps), 8.5), squeeze=False, sharex="col")
    colors = {s: f"C{i}" for i, s in enumerate(ORDER)}
    never_y = 1.35
    for j, comp in enumerate(comps):
        top, bottom = axes[0][j], axes[1][j]
        mine = [r for r in rows if r["composition"] == comp]
        for k, s in enumerate(dict.fromkeys(r["strategy"] for r in mine)):
            pts = [r for r in mine if r["strategy"] == s]
            shift = 1 + 0.025 * (k - 3)  # strategies side by side at each pass count (log axis)
            xs = [r["passes"] * shift for r in pts]
            if s != "uniform":  # uniform against its own mean final accuracy is no saving: table only
                for r, x in zip(pts, xs):
                    t = r["to_uniform"] or {}
                    ratio, never, n = t.get("ratio"), t.get("a_not_reached", 0), t.get("n", 0)
                    if ratio is None:  # no seed reached it
                        top.plot([x], [never_y], marker="x", color=colors.get(s), markersize=10)
                        continue
                    err = [[ratio - t["low"]], [t["high"] - ratio]] if t.get("low") is not None else None
                    top.errorbar([x], [ratio], yerr=err, color=colors.get(s), marker="o", capsize=3,
                                 markerfacecolor="none" if never else colors.get(s))
                    if never:  # censored seeds: the mean is over the seeds that reached it
                        top.annotate(f"{n - never}/{n}", (x, ratio), textcoords="offset points", xytext=(4, 4),
                                     fontsize=7, color=colors.get(s))
                top.plot(xs, [(r["to_uniform"] or {}).get("ratio") or never_y for r in pts], color=colors.get(s),
                         lw=0.8, alpha=0.6, label=s)
            if s != "uniform":
                d = [r["diff"] for r in pts]
                dy = [x.get("mean") if x.get("mean") is not None else float("nan") for x in d]
                dlo = [0 if x.get("low") is None else x["mean"] - x["low"] for x in d]
                dhi = [0 if x.get("high") is None else x["high"] - x["mean"] for x in d]
                bottom.errorbar(xs, dy, yerr=[dlo, dhi], color=colors.get(s), marker="o", capsize=3, label=s)
        top.axhline(1.0, color="grey", lw=0.8)
        top.axhline(0.5, color="grey", lw=0.8, ls="--")
        top.text(0.02, 0.5, " goal 0.5x", transform=top.get_yaxis_transform(), va="bottom", fontsize=8)
        top.axhline(never_y, color="lightgrey", lw=0.5)
        top.text(0.02, never_y, " never (x); hollow: some seeds never (k/n reached)",
                 transform=top.get_yaxis_transform(), va="bottom", fontsize=8)
        top.set_ylim(0, never_y + 0.15)
        top.set_title(f"{comp} pool: completions to uniform's final accuracy")
        top.set_ylabel("x uniform's completions (geometric mean, 95% CI)")
        bottom.axhline(0.0, color="grey", lw=0.8)
        bottom.set_title(f"{comp} pool: final held-out accuracy minus uniform's (paired)")
        bottom.set_ylabel("accuracy difference (95% CI)")
        bottom.set_xlabel("passes over the pool (budget / (G x pool size))")
        bottom.set_xscale("log")
        ticks = sorted({r["passes"] for r in rows})  # every panel shows every setting's pass count
        bottom.set_xlim(min(ticks) / 1.3, max(ticks) * 1.3)
        bottom.set_xticks(ticks)
        bottom.set_xticklabels([f"{t:.1f}\n(pool {int(round(rows[0]['passes'] * rows[0]['pool'] / t)):,})"
                                for t in ticks])
        bottom.minorticks_off()
        if j == len(comps) - 1:
            top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def add(study_json: Path, directory: Path = PASSES_DIR) -> Path:
    """Record a finished study (``<out>/study.json``) as ``<composition>_pool<size>.json`` in ``directory``, compact
    (its configuration, warm start, degeneracy and runs as written; the summaries are recomputed when read)."""
    import json

    from benchmarks.study.jsonio import read_json

    study = read_json(study_json)
    if study is None or "config" not in study or "runs" not in study:
        raise FileNotFoundError(f"{study_json}: not a finished study's study.json")
    cfg = StudyConfig.from_dict(study["config"])
    if len(cfg.pool_sizes) != 1:
        raise ValueError(f"{study_json}: one pool size per recorded study, got {cfg.pool_sizes}")
    keep = {k: study[k] for k in ("config", "warm_start", "degeneracy", "runs") if k in study}
    path = directory / f"{composition(cfg)}_pool{cfg.pool_sizes[0]}.json"
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(keep, separators=(",", ":"), allow_nan=False), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.study.passes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=PASSES_DIR, help=f"recorded studies (default {PASSES_DIR})")
    p.add_argument("--figure", type=Path, default=FIGURE, help=f"where the figure goes (default {FIGURE})")
    p.add_argument("--add", type=Path, nargs="*", default=[], metavar="STUDY_JSON",
                   help="record finished studies (their study.json) in --dir first")
    a = p.parse_args(argv)
    for path in a.add:
        print(f"recorded {add(path, a.dir)}")
    rows = settings(a.dir)
    print("\n".join(table_lines(rows)))
    print(f"wrote {plot(rows, a.figure)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
