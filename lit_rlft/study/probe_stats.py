"""What a probe's groups say, as plain numbers: pass rates, their histogram, the share of groups with something to
teach, the share of completions in the answer format, per split and per task and difficulty; and the verdict.

    rows = [ProbeRow("train", "chain_sum", "sum2x1", correct=[1, 0, 1, 1], rewards=[1.2, 0.2, 1.2, 1.2],
                     formatted=[1, 1, 1, 1]), ...]
    summary = summarise_probe(rows)          # {"splits": {"train": {...}, "val": {...}}, "groups": {...}}
    lines = verdict(summary)                 # the first line is the plain verdict

No torch, no Lightning: the probe (:mod:`~lit_rlft.study.probe`) turns its rollouts into rows, the study's report
reads the summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["EDGE", "ProbeRow", "group_summary", "summarise_probe", "verdict"]

#: The pass-rate band a pool should start in for selection to have prompts to pick (the issue's "model's edge").
EDGE = (0.2, 0.6)
#: Below this share of groups with mixed correctness, the verdict says selection has little to pick from.
LOW_MIXED = 0.3
#: Below this share of completions in the answer format, the verdict says to teach the format first.
LOW_FORMAT = 0.5


@dataclass
class ProbeRow:
    """One prompt's group.

    Attributes:
        split: ``"train"`` or ``"val"``.
        task: the row's task (``task`` column; ``""`` without one).
        difficulty: its ``difficulty`` value (``""`` without one).
        correct: ``[G]`` whether each completion counts as correct (reward >= the success threshold).
        rewards: ``[G]`` total rewards (the gradient sees their spread).
        formatted: ``[G]`` whether each completion is in the answer format (None: no format reward to tell).
    """

    split: str
    task: str
    difficulty: str
    correct: Sequence[bool]
    rewards: Sequence[float]
    formatted: Sequence[bool] | None = None


def group_summary(rows: Sequence[ProbeRow]) -> dict[str, Any]:
    """The figures of a set of groups (all of one size ``G`` or not: the histogram is over ``k / G`` in bins of the
    largest ``G``).

    Returns ``prompts``, ``completions``, ``pass_rate`` (mean over completions), ``mixed`` (share of groups with
    0 < k < G: correctness spread, what selection looks for), ``all_wrong``, ``all_right``, ``reward_spread`` (share
    of groups whose total rewards differ: a non-zero GRPO gradient, the format reward's included), ``format`` (share
    of completions in the answer format, None when not known), ``histogram`` (prompts with k correct, k = 0..G) and
    ``num_generations`` (G, the largest).
    """
    if not rows:
        return {"prompts": 0, "completions": 0, "pass_rate": None, "mixed": None, "all_wrong": None,
                "all_right": None, "reward_spread": None, "format": None, "histogram": [], "num_generations": 0}
    g = max(len(r.correct) for r in rows)
    hist = np.zeros(g + 1, dtype=np.int64)
    k_all = []
    mixed = wrong = right = spread = 0
    completions = 0
    formatted = []
    for r in rows:
        c = np.asarray(r.correct, dtype=bool)
        k, n = int(c.sum()), len(c)
        completions += n
        k_all.append(k)
        hist[round(k * g / n) if n else 0] += 1
        mixed += 0 < k < n
        wrong += k == 0
        right += k == n
        rw = np.asarray(r.rewards, dtype=np.float64)
        spread += bool(rw.size) and float(rw.max() - rw.min()) > 0
        if r.formatted is not None:
            formatted.extend(bool(x) for x in r.formatted)
    p = len(rows)
    known = all(r.formatted is not None for r in rows)
    return {"prompts": p, "completions": completions, "pass_rate": float(sum(k_all) / completions),
            "mixed": mixed / p, "all_wrong": wrong / p, "all_right": right / p, "reward_spread": spread / p,
            "format": float(np.mean(formatted)) if known and formatted else None,
            "histogram": hist.tolist(), "num_generations": g}


def summarise_probe(rows: Sequence[ProbeRow]) -> dict[str, Any]:
    """``{"splits": {split: figures}, "groups": {split: {"<task>/<difficulty>": figures}}}`` (figures:
    :func:`group_summary`; groups in sorted order, a group key without a task is its difficulty alone)."""
    splits: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for split in sorted({r.split for r in rows}, key=lambda s: (s != "train", s)):
        mine = [r for r in rows if r.split == split]
        splits[split] = group_summary(mine)
        keys = sorted({_key(r) for r in mine})
        groups[split] = {k: group_summary([r for r in mine if _key(r) == k]) for k in keys}
    return {"splits": splits, "groups": groups}


def _key(row: ProbeRow) -> str:
    parts = [str(p) for p in (row.task, row.difficulty) if str(p)]
    return "/".join(parts) if parts else "all"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def verdict(summary: dict[str, Any]) -> list[str]:
    """Plain sentences, the first the verdict: whether selection has prompts to pick and GRPO a gradient, what to
    change otherwise (the pool easier or harder, G larger, the format taught first), and each group that sits at 0
    or at 1 (a difficulty label that does not grade the pool for this model)."""
    train = summary["splits"].get("train") or next(iter(summary["splits"].values()), None)
    if not train or not train["prompts"]:
        return ["The probe has no groups to judge."]
    g = train["num_generations"]
    lines: list[str] = []
    no_signal = 1 - train["mixed"]
    if train["mixed"] < LOW_MIXED:
        if train["all_wrong"] >= train["all_right"]:
            fix = "make the pool easier, warm-start the model, or make G larger"
        else:
            fix = "make the pool harder, or make G larger"
        lines.append(f"{_pct(no_signal)} of training groups would give no gradient for the task at G = {g} "
                     f"({_pct(train['all_wrong'])} all wrong, {_pct(train['all_right'])} all right): selection has "
                     f"little to pick from: {fix}.")
    else:
        lines.append(f"{_pct(train['mixed'])} of training groups have mixed correctness at G = {g} (pass rate "
                     f"{train['pass_rate']:.2f}): GRPO has a gradient and selection has prompts to pick.")
    if train["format"] is not None and train["format"] < LOW_FORMAT:
        lines.append(f"Only {_pct(train['format'])} of completions state an answer in the format: teach the format "
                     "first (a short SFT warm start on it, or a format reward), or the task reward cannot pay.")
    val = summary["splits"].get("val")
    if val and val["prompts"]:
        low, high = EDGE
        where = ("at the model's edge" if low <= val["pass_rate"] <= high
                 else "below the model's edge: little for RL to lift" if val["pass_rate"] < low
                 else "above the model's edge: little left to gain")
        lines.append(f"Held-out pass rate {val['pass_rate']:.2f} ({where}; the band is {low:.1f}-{high:.1f}).")
    if train["reward_spread"] > train["mixed"] + 0.05:
        lines.append(f"{_pct(train['reward_spread'])} of training groups have reward spread but only "
                     f"{_pct(train['mixed'])} mixed correctness: the rest of the gradient comes from shaping terms "
                     "(a format reward), not from the task.")
    for key, fig in summary["groups"].get("train", {}).items():
        if len(summary["groups"]["train"]) > 1 and fig["prompts"] >= 4 and fig["mixed"] < 0.1:
            side = "solved" if fig["all_right"] > fig["all_wrong"] else "unsolved"
            lines.append(f"Group {key} is {side} ({fig['pass_rate']:.2f} pass rate, {_pct(fig['mixed'])} mixed over "
                         f"{fig['prompts']} prompts): its difficulty label does not grade this model.")
    return lines
