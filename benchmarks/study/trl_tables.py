"""The tables of a recorded ``time_to_trl.json`` (``python -m benchmarks.time_to_trl``), for the script that writes
it and for the pages' ``time-to-trl-*`` blocks (:mod:`benchmarks.study.docs`).

Format 2 is the product's summary (``lit-rlft study --baseline trl``); ``benchmarks/results/time_to_trl_*.json``
recorded before the product (format 1) are rendered as they were recorded (:func:`table`).
"""

from __future__ import annotations

from typing import Any


def table(summary: dict[str, Any]) -> str:
    """The table of a format-1 record (made before the product; kept as it was recorded)."""
    per_seed = ", ".join(f"{a:.3f}" for a in summary["trl_final_accuracy_per_seed"])
    lines = [f"TRL's final held-out accuracy (3 and 4 numbers): {summary['trl_final_accuracy']:.3f} (per seed {per_seed}) "
             f"after {summary['trl_completions']:,.0f} completions and {summary['trl_train_wall_s']:.0f} s of training.", "",
             "| lit_rlft | final accuracy | minus TRL's (paired) | reached TRL's (seeds) | completions to it "
             "(x TRL's) | training wall-clock to it (x TRL's) | training wall-clock for the budget (x TRL's) |",
             "|---|---|---|---|---|---|---|"]
    trl_wall = summary["trl_train_wall_s"]
    for name, a in summary["arms"].items():
        comps = (f"{a['median_completions']:,.0f} ({a['completions_ratio_to_trl']:.2f}x)"
                 if a["median_completions"] is not None else "never")
        wall = (f"{a['median_wall_s']:.1f} s ({a['wall_ratio_to_trl']:.2f}x)" if a["median_wall_s"] is not None
                else "never")
        d = a["final_diff_vs_trl"]
        diff = (f"{d['mean']:+.3f}" + (f" [{d['low']:+.3f}, {d['high']:+.3f}]" if d["low"] is not None else ""))
        lines.append(f"| {name} | {a['final_accuracy']:.3f} | {diff} | {a['reached']}/{a['seeds']} | {comps} | {wall} "
                     f"| {a['train_wall_s']:.0f} s ({a['train_wall_s'] / trl_wall:.2f}x) |")
    return "\n".join(lines)


def result_table(result: dict[str, Any]) -> str:
    """The table of a ``time_to_trl.json``: format 2 (the product's summary) or a format-1 record."""
    if result.get("format") != 2:
        return table(result["summary"])
    from lit_rlft.study.report import main_rows, verdicts

    summary = result["summary"]
    arms = ["trl", "uniform", *result["recipes"]]
    return "\n".join([*verdicts(summary, arms), "", *main_rows(summary, arms)])
