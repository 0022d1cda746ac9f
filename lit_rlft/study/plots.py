"""A study's plots: mean across seeds (line) with a +-1 standard deviation band, one line per arm, the baseline
black and dashed. Needs matplotlib (``pip install 'lit_rlft[plots]'``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lit_rlft.records import pyplot, smooth

#: ``(curve key, axis label, target kind)`` of each panel of :func:`plot_curves`: the product's default.
PANELS = (("val/accuracy", "held-out accuracy", "accuracy"),)
X_AXES = {"completions": "cumulative completions (all purposes)",
          "wall_s": "training wall-clock (s, from the first step, evaluation excluded)"}


def _mean_band(curves: list[tuple[np.ndarray, np.ndarray]], points: int = 120):
    """Interpolate each ``(x, y)`` curve onto a common grid over the range all of them cover."""
    curves = [(x, y) for x, y in curves if len(x) > 0]
    if not curves:
        return None
    hi = min(float(x[-1]) for x, _ in curves)
    lo = max(float(x[0]) for x, _ in curves)
    if len(curves) == 1 or hi <= lo:
        x, y = curves[0]
        return x, y, None
    grid = np.linspace(lo, hi, points)
    ys = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, ys.mean(axis=0), ys.std(axis=0, ddof=1)


def _draw(ax: Any, curves: dict[str, list[tuple[np.ndarray, np.ndarray]]], reference: str = "uniform") -> None:
    for i, (strategy, cs) in enumerate(curves.items()):
        mb = _mean_band(cs)
        if mb is None:
            continue
        x, mean, sd = mb
        baseline = strategy == reference  # the reference: black, dashed and on top, so no strategy hides it
        color = "black" if baseline else f"C{i % 10}"
        ax.plot(x, mean, color=color, label=f"{strategy} (n={len(cs)})", marker="o" if len(x) < 30 else None, ms=3,
                ls="--" if baseline else "-", lw=2.0 if baseline else 1.5, zorder=3 if baseline else 2)
        if sd is not None:
            ax.fill_between(x, mean - sd, mean + sd, color=color, alpha=0.15)


def _curve_xy(run: dict[str, Any], x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(p[x_key], p[y_key]) for p in run["curve"] if p.get(y_key) is not None]
    return np.asarray([a for a, _ in pts], float), np.asarray([b for _, b in pts], float)


def plot_curves(runs: list[dict[str, Any]], strategies: list[str], targets: dict[str, float | None], x_key: str,
                path: Path, title: str, panels: Sequence[tuple[str, str, str]] = PANELS,
                baseline: str = "uniform") -> Path:
    """Each panel's curve key (``panels``: key, label, target kind) against ``x_key`` (``completions`` or
    ``wall_s``), with the target (the baseline's final value) as a grey line."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.6), squeeze=False)
    axes = axes[0]
    for ax, (y_key, label, target_kind) in zip(axes, panels):
        curves = {s: [_curve_xy(r, x_key, y_key) for r in runs if r["strategy"] == s] for s in strategies}
        _draw(ax, {s: c for s, c in curves.items() if c}, baseline)
        if targets.get(target_kind) is not None:
            ax.axhline(targets[target_kind], color="gray", ls="--", lw=1, label=f"target ({baseline}'s final)")
        ax.set_xlabel(X_AXES[x_key])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_effective_ratio(runs: list[dict[str, Any]], strategies: list[str], path: Path, title: str,
                         window: int = 10) -> Path:
    """Per-step effective ratio of the trained batch (``window``-step mean) against cumulative completions."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.6))
    curves: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for s in strategies:
        for r in runs:
            if r["strategy"] != s:
                continue
            eff = dict((int(k), v) for k, v in r["series"].get("effective_ratio", []))
            done = dict((int(k), v) for k, v in r["series"].get("budget/completions", []))
            steps = sorted(set(eff) & set(done))
            if steps:
                x = np.asarray([done[k] for k in steps], float)
                y = np.asarray(smooth([eff[k] for k in steps], window), float)
                curves.setdefault(s, []).append((x, y))
    _draw(ax, curves)
    ax.set_xlabel(X_AXES["completions"])
    ax.set_ylabel(f"effective ratio of the trained batch ({window}-step mean)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_probe(result: dict[str, Any], path: Path) -> Path:
    """A probe's two panels: per split, the share of prompts with k of G completions correct (the pass-rate
    histogram); per task / difficulty group of the training sample, the shares of groups all wrong, mixed and all
    right (stacked), with its pass rate above each bar."""
    plt = pyplot()
    s = result["summary"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.4))
    width = 0.8 / max(1, len(s["splits"]))
    for i, (split, fig_) in enumerate(s["splits"].items()):
        hist = np.asarray(fig_["histogram"], dtype=float)
        if not hist.size:
            continue
        k = np.arange(len(hist))
        left.bar(k + (i - (len(s["splits"]) - 1) / 2) * width, hist / hist.sum(), width=width,
                 label=f"{split} ({fig_['prompts']} prompts, pass rate {fig_['pass_rate']:.2f})")
    g = max((f["num_generations"] for f in s["splits"].values()), default=0)
    left.set_xticks(range(g + 1))
    left.set_xlabel(f"completions correct of G = {g}")
    left.set_ylabel("share of prompts")
    left.set_title("pass-rate histogram (0 and G: no gradient for the task)")
    left.legend(fontsize=8)
    groups = s["groups"].get("train") or next(iter(s["groups"].values()), {})
    names = list(groups)
    wrong = np.asarray([groups[n]["all_wrong"] for n in names])
    mixed = np.asarray([groups[n]["mixed"] for n in names])
    solved = np.asarray([groups[n]["all_right"] for n in names])
    x = np.arange(len(names))
    right.bar(x, wrong, color="#c44", label="all wrong")
    right.bar(x, mixed, bottom=wrong, color="#4a4", label="mixed (selection's pick)")
    right.bar(x, solved, bottom=wrong + mixed, color="#48c", label="all right")
    for xi, n in zip(x, names):
        right.text(xi, 1.01, f"{groups[n]['pass_rate']:.2f}", ha="center", fontsize=8)
    right.set_xticks(x)
    right.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    right.set_ylim(0, 1.1)
    right.set_ylabel("share of groups (training sample)")
    right.set_title("groups by task / difficulty (pass rate above)")
    right.legend(fontsize=8, loc="lower right")
    fig.suptitle(result["verdict"][0] if len(result["verdict"][0]) < 150 else result["verdict"][0][:147] + "...",
                 fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
