"""``python -m benchmarks.study.passes``: what selection saves against passes over the pool, from recorded studies.

    python -m benchmarks.study.passes --add runs/many_pass_skewed_200/study.json   # record a finished study
    python -m benchmarks.study.passes --add runs/h256_skewed_1000/study.json       # ... of another policy size
    python -m benchmarks.study.passes            # rewrite docs/results/saving_vs_passes.png and print the tables
    python -m benchmarks.study.docs              # rewrite the results page's generated blocks, this one included
    python -m benchmarks.study.docs --check      # checks the block too (it is one of the page's generated blocks)

Every ``docs/results/passes/*.json`` is one recorded study (``study.json`` as ``python -m benchmarks.study`` writes
it) of one pool size: the same warm start, budget and settings, only the pool's size and composition (balanced or
skewed) differ, so the budget is ``budget / (G x pool)`` passes over the pool. Each file's summaries are recomputed
from its runs with the study's current code (:func:`benchmarks.study.recorded.load_study`). Per strategy and setting:

- ``x uniform's completions``: the completions at which the strategy's held-out curve first reaches uniform's final
  accuracy (3+4 numbers, mean over uniform's seeds), over the completions at which the same seed's uniform run first
  reached it (the one crossing rule); geometric mean over the seed pairs where both reached it [95% t-interval on
  log-ratios], with the pairs it rests on; seeds that never reach it are counted, not averaged
  (:func:`lit_rlft.study.summary.to_baseline_final`). The saving is 1 minus it;
- the paired final difference to uniform [95% t-interval];
- where dynamic sampling ran: the same ratio against dynamic sampling's final accuracy and its own crossings;
- the training wall-clock (evaluation excluded) and the distinct prompts trained on.

The figure draws the first two against passes, one panel per composition.

The policy: each record names the warm start's size (``policy``: hidden size, layers, parameters, read from its
``config.json`` when it is recorded; a record without one is the demo's tiny policy, :class:`TinyConfig`'s defaults).
The ``saving-vs-passes`` block covers the demo's policy; a larger policy's records (``<composition>_pool<size>_<label>
.json``) go to the ``policy-size`` block, beside the demo policy's figures at the same settings, and into the figure
as squares on dashed lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.study.config import StudyConfig
from lit_rlft.study.report import at_marks_rows

REPO = Path(__file__).resolve().parents[2]
PASSES_DIR = REPO / "docs" / "results" / "passes"
FIGURE = REPO / "docs" / "results" / "saving_vs_passes.png"
#: Table and figure order.
ORDER = ("uniform", "dps_c8", "dps", "mopps", "greso", "dots_replay", "dynamic_sampling", "dps_c8_handback")


def policy_of(config: dict[str, Any]) -> dict[str, Any]:
    """A policy's size from its HF ``config.json`` contents: hidden size, layers and parameter count (a model built
    on the meta device, so nothing is allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    return {"hidden_size": hf.hidden_size, "num_hidden_layers": hf.num_hidden_layers,
            "parameters": sum(p.numel() for p in model.parameters())}


def demo_policy() -> dict[str, Any]:
    """The demo's tiny policy (:class:`TinyConfig`'s defaults), which every record without a ``policy`` used."""
    from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2

    model = tiny_qwen2(char_tokenizer(), TinyConfig())
    return policy_of(model.config.to_dict())


def policy_label(policy: dict[str, Any]) -> str:
    """``"hidden 256, 8 layers (8.4M)"``."""
    return f"hidden {policy['hidden_size']}, {policy['num_hidden_layers']} layers ({policy['parameters'] / 1e6:.1f}M)"


def composition(cfg: StudyConfig) -> str:
    return "skewed" if cfg.bucket_weights or cfg.five_numbers else "balanced"


def passes(cfg: StudyConfig, pool_size: int) -> float:
    """Prompt draws of a uniform run over the pool's size: ``budget / (G x pool)``."""
    return cfg.budget_completions / (cfg.num_generations * pool_size)


def settings(directory: Path = PASSES_DIR, policy: str | None = "demo") -> list[dict[str, Any]]:
    """One row per (recorded study, strategy), sorted by policy size, composition, passes and :data:`ORDER`.

    ``policy``: ``"demo"`` keeps the demo policy's records, ``"larger"`` the others, ``None`` all of them.
    """
    from benchmarks.study.recorded import load_study

    paths = sorted(directory.glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"{directory}: no recorded studies (*.json)")
    demo = demo_policy()
    rows = []
    for path in paths:
        cfg, study = load_study(path)
        size_of = study.get("policy") or demo
        if policy is not None and (policy == "demo") != (size_of == demo):
            continue
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
            rows.append({"file": path.name, "policy": size_of, "composition": composition(cfg), "pool": size,
                         "passes": passes(cfg, size), "strategy": s, "seeds": row["n_ok"],
                         "final": row["final"]["accuracy"]["mean"],
                         "diff": row["final_diff"]["accuracy"], "to_uniform": to_uniform,
                         "to_dynamic": to_dynamic, "wall_s": row["train_wall_s"]["mean"],
                         "distinct": row["distinct_prompts"]["mean"],
                         "train_reward": row["final"]["train_reward"]["mean"],
                         "effective_ratio": row["mean_effective_ratio"]["mean"],
                         "trained": row["composition"], "marks": cfg.eval_marks(), "at_marks": marks.get(s)})
    rank = {s: i for i, s in enumerate(ORDER)}
    return sorted(rows, key=lambda r: (r["policy"]["parameters"], r["composition"], r["passes"],
                                       rank.get(r["strategy"], len(ORDER)), r["strategy"]))


def _ratio(summary: dict[str, Any] | None) -> str:
    """``0.53x [0.27, 1.04] (3/3 seed pairs)``: the one crossing rule's ratio and the seed pairs it rests on."""
    if not summary or summary.get("n", 0) == 0:
        return "-"
    never, base_never = summary.get("a_not_reached", 0), summary.get("b_not_reached", 0)
    if summary.get("status") == "at_start":
        return "met at start"
    if summary.get("ratio") is None:
        return f"never ({never}/{summary['n']} seeds)" if never else f"baseline never ({base_never}/{summary['n']})"
    cell = f"{summary['ratio']:.2f}x"
    equal = summary.get("low") is not None and summary["low"] == summary["high"]
    if summary.get("low") is not None and not equal:
        cell += f" [{summary['low']:.2f}, {summary['high']:.2f}]"
    notes = [f"{summary['n_used']}/{summary['n']} seed pairs" + (", all equal" if equal else "")]
    if never:
        notes.append(f"{never} never")
    if base_never:
        notes.append(f"baseline {base_never} never")
    return cell + f" ({'; '.join(notes)})"


def diff_cell(d: dict[str, Any]) -> str:
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
        diff = "(baseline)" if r["strategy"] == "uniform" else diff_cell(r["diff"])
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
    """The results page's ``saving-vs-passes`` block (the demo policy's records)."""
    rows = settings(directory)
    return ["Generated by `python -m benchmarks.study.passes` from `docs/results/passes/*.json` (one recorded study per "
            "row group). Bold: the interval excludes 0.", "", *table_lines(rows), "",
            "Held-out accuracy minus uniform's at each evaluation (completions; paired by seed, 95% t-interval):", "",
            *at_marks_lines(rows), "",
            "What the runs trained on: the share of trained groups with 2-5 numbers (in brackets: the share that were "
            "informative, with both outcomes), the mean share of informative groups per step, and the final reward on "
            "a fixed 256-prompt subset of the training pool beside the held-out accuracy (means over seeds):", "",
            *composition_lines(rows)]


def policy_lines(directory: Path = PASSES_DIR) -> list[str]:
    """The ``policy-size`` block: every larger policy's setting and strategy beside the demo policy's at the same
    setting (pool size and composition), then what the larger policy's runs trained on."""
    larger = settings(directory, policy="larger")
    if not larger:
        return ["No larger policy's study is recorded yet (`python -m benchmarks.study.passes --add STUDY_JSON`)."]
    demo = {(r["composition"], r["pool"], r["strategy"]): r for r in settings(directory, policy="demo")}
    names = {policy_label(r["policy"]) for r in larger}
    head = ["| pool | passes | strategy | policy | seeds | final held-out accuracy | minus uniform's (paired) | "
            "completions to uniform's final accuracy (x uniform's) | training wall-clock |", "|---|---|---|---|---|---|---|---|---|"]
    lines = []
    for r in larger:
        for row in (demo.get((r["composition"], r["pool"], r["strategy"])), r):
            if row is None:
                continue
            diff = "(baseline)" if row["strategy"] == "uniform" else diff_cell(row["diff"])
            lines.append(f"| {row['composition']} {row['pool']:,} | {row['passes']:.1f} | {row['strategy']} | "
                         f"{policy_label(row['policy'])} | {row['seeds']} | {row['final']:.3f} | {diff} | "
                         f"{_ratio(row['to_uniform'])} | {_number(row['wall_s'], ' s')} |")
    return ["Generated by `python -m benchmarks.study.passes` from `docs/results/passes/*.json`: each setting and "
            f"strategy of the larger policy ({', '.join(sorted(names))}) under the demo policy's at the same setting. "
            "Bold: the interval excludes 0.", "", *head, *lines, "",
            "What the larger policy's runs trained on (as in the block above; means over seeds):", "",
            *composition_lines(larger)]


def plot(rows: list[dict[str, Any]], path: Path = FIGURE) -> Path:
    """Two rows of panels (completions to uniform's final accuracy; final accuracy minus uniform's) by composition;
    the demo policy's settings as circles on solid lines, a larger policy's as squares on dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = sorted({r["composition"] for r in rows})
    demo_size = demo_policy()["parameters"]
    fig, axes = plt.subplots(2, len(comps), figsize=(6.5 * len(comps), 8.5), squeeze=False, sharex="col")
    colors = {s: f"C{i}" for i, s in enumerate(ORDER)}
    never_y = 1.35
    for j, comp in enumerate(comps):
        top, bottom = axes[0][j], axes[1][j]
        mine = [r for r in rows if r["composition"] == comp]
        groups = dict.fromkeys((r["policy"]["parameters"], r["strategy"]) for r in mine)
        for k, (size, s) in enumerate(groups):
            pts = [r for r in mine if r["strategy"] == s and r["policy"]["parameters"] == size]
            shift = 1 + 0.025 * (k - 3)  # strategies side by side at each pass count (log axis)
            demo = size == demo_size
            marker, ls = ("o", "-") if demo else ("s", "--")
            label = s if demo else f"{s}, {policy_label(pts[0]['policy'])}"
            xs = [r["passes"] * shift for r in pts]
            if s != "uniform":  # uniform against its own mean final accuracy is no saving: table only
                for r, x in zip(pts, xs):
                    t = r["to_uniform"] or {}
                    ratio, never, n = t.get("ratio"), t.get("a_not_reached", 0), t.get("n", 0)
                    if ratio is None:  # no seed reached it
                        top.plot([x], [never_y], marker="x", color=colors.get(s), markersize=10 if demo else 7)
                        continue
                    err = [[ratio - t["low"]], [t["high"] - ratio]] if t.get("low") is not None else None
                    top.errorbar([x], [ratio], yerr=err, color=colors.get(s), marker=marker, capsize=3,
                                 markerfacecolor="none" if never else colors.get(s))
                    if never:  # censored seeds: the mean is over the seeds that reached it
                        top.annotate(f"{n - never}/{n}", (x, ratio), textcoords="offset points", xytext=(4, 4),
                                     fontsize=7, color=colors.get(s))
                top.plot(xs, [(r["to_uniform"] or {}).get("ratio") or never_y for r in pts], color=colors.get(s),
                         lw=0.8, alpha=0.6, ls=ls, label=label)
            if s != "uniform":
                d = [r["diff"] for r in pts]
                dy = [x.get("mean") if x.get("mean") is not None else float("nan") for x in d]
                dlo = [0 if x.get("low") is None else x["mean"] - x["low"] for x in d]
                dhi = [0 if x.get("high") is None else x["high"] - x["mean"] for x in d]
                bottom.errorbar(xs, dy, yerr=[dlo, dhi], color=colors.get(s), marker=marker, ls=ls, capsize=3, label=label)
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
    (its configuration, warm start, degeneracy, runs and environment as written; the summaries are recomputed when
    read)."""
    import json

    from lit_rlft.records.jsonio import read_json

    study = read_json(study_json)
    if study is None or "config" not in study or "runs" not in study:
        raise FileNotFoundError(f"{study_json}: not a finished study's study.json")
    cfg = StudyConfig.from_dict(study["config"])
    if len(cfg.pool_sizes) != 1:
        raise ValueError(f"{study_json}: one pool size per recorded study, got {cfg.pool_sizes}")
    keep = {k: study[k] for k in ("config", "warm_start", "degeneracy", "runs", "environment") if k in study}
    keep["policy"] = recorded_policy(cfg, str(study.get("warm_start", "")))
    suffix = "" if keep["policy"] == demo_policy() else f"_h{keep['policy']['hidden_size']}l{keep['policy']['num_hidden_layers']}"
    path = directory / f"{composition(cfg)}_pool{cfg.pool_sizes[0]}{suffix}.json"
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(keep, separators=(",", ":"), allow_nan=False), encoding="utf-8")
    return path


def recorded_policy(cfg: StudyConfig, warm_start: str) -> dict[str, Any]:
    """The size of the study's warm start: its checkpoint's ``config.json``, or the tiny policy of ``cfg.tiny``."""
    import json

    if warm_start == "tiny":
        from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2

        return policy_of(tiny_qwen2(char_tokenizer(), TinyConfig(**(cfg.tiny or {}))).config.to_dict())
    config = Path(warm_start) / "config.json"
    if not config.exists():
        raise FileNotFoundError(f"the study's warm start {warm_start!r} has no config.json here: its size cannot be "
                                "recorded (record the study where its warm start is)")
    return policy_of(json.loads(config.read_text(encoding="utf-8")))


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
    print("\n".join(table_lines(settings(a.dir))))
    print("\n".join(policy_lines(a.dir)))
    print(f"wrote {plot(settings(a.dir, policy=None), a.figure)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
