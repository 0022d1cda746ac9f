"""``python -m benchmarks.study.auto``: ``auto`` beside uniform, its selector and the hand-back on the pass map.

    python -m benchmarks.study --skewed --warm-start runs/time_to_trl/sft/model --out runs/auto_map \\
        --pool-sizes 1000,200,400,4000 --strategies uniform,mopps,dps_c8_handback,auto --seeds 0,1,2,3,4 \\
        --sweep-seeds 5 --jobs 2
    python -m benchmarks.study.auto --add runs/auto_map/study.json   # record it, one file per pool
    python -m benchmarks.study.auto --merge --add runs/again/study.json  # a later study of some arms joins them
    python -m benchmarks.study.auto           # print the tables, rewrite docs/results/auto_share.png
    python -m benchmarks.study.docs           # rewrite the pages' generated blocks, ``auto-pass-map`` included

Every ``docs/results/auto/*.json`` is one pool of the recorded study (as :mod:`benchmarks.study.passes` records
them: its configuration, warm start and runs; the summaries are recomputed from the runs when read). The block gives,
per setting: the passes table of :mod:`benchmarks.study.passes` (final held-out accuracy, paired difference to
uniform, completions to uniform's final accuracy by the one crossing rule), then for ``auto``: the held-out accuracy
per number count minus uniform's (paired by seed), the share of its selector's gain it kept where a fixed selector
is ahead beyond the spread, and what it decided (mean share, final share, transfer, the held-back probe's share of
the budget). The figure draws the share and the transfer against completions, one line per setting (mean over
seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.study.config import StudyConfig
from benchmarks.study.passes import at_marks_lines, composition_lines, diff_cell, settings, table_lines
from lit_rlft.records.jsonio import read_json
from lit_rlft.study.stats import mean_interval

REPO = Path(__file__).resolve().parents[2]
AUTO_DIR = REPO / "docs" / "results" / "auto"
FIGURE = REPO / "docs" / "results" / "auto_share.png"
#: The arm under test and the fixed arms it is compared with.
AUTO, SELECTORS, HANDBACK = "auto", ("mopps", "dps_c8"), "dps_c8_handback"


#: Settings a merged study may differ in from the recorded one (which arms and seeds ran).
_ARM_KEYS = ("strategies", "seeds", "sweep_seeds", "sweep_strategies", "strategy_seeds", "jobs", "run_timeout_s")


def add(study_json: Path, directory: Path = AUTO_DIR, merge: bool = False) -> list[Path]:
    """Record a finished ``python -m benchmarks.study`` (``<out>/study.json``) as one file per pool size,
    ``<composition>_pool<size>.json`` in ``directory``.

    ``merge``: keep the recorded file's runs of the arms and seeds the new study did not run (its runs replace the
    recorded ones of the same arm and seed). The two must share the warm start's policy and every setting but the
    arms and seeds, and a uniform run of a seed both ran must give the same curve but for its clock readings (the
    warm start reproduces), or the merge is refused."""
    from benchmarks.study.passes import composition, recorded_policy

    study = read_json(study_json)
    if study is None or "config" not in study or "runs" not in study:
        raise FileNotFoundError(f"{study_json}: not a finished study's study.json")
    cfg = StudyConfig.from_dict(study["config"])
    policy = recorded_policy(cfg, str(study.get("warm_start", "")))
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for size in cfg.pool_sizes:
        seeds = cfg.seeds if size == cfg.pool_sizes[0] else cfg.seeds[: cfg.sweep_seeds]
        config = {**study["config"], "pool_sizes": [size], "seeds": list(seeds)}
        keep = {k: study[k] for k in ("warm_start", "environment") if k in study}
        keep.update(config=config, policy=policy, runs=[r for r in study["runs"] if r.get("pool_size") == size],
                    degeneracy={str(size): (study.get("degeneracy") or {}).get(str(size))})
        path = directory / f"{composition(cfg)}_pool{size}.json"
        if merge and path.exists():
            keep = _merged(path, keep)
        path.write_text(json.dumps(keep, separators=(",", ":"), allow_nan=False), encoding="utf-8")
        paths.append(path)
    return paths


def _merged(path: Path, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` (one pool of a study) with the runs of ``path`` it does not replace; see :func:`add`."""
    old = read_json(path) or {}
    if old.get("policy") != new["policy"]:
        raise ValueError(f"{path}: recorded with policy {old.get('policy')}, the new study's is {new['policy']}")
    differ = sorted(k for k in set(old.get("config", {})) | set(new["config"])
                    if k not in _ARM_KEYS and old.get("config", {}).get(k) != new["config"].get(k))
    if differ:
        raise ValueError(f"{path}: the new study differs from the recorded one in {differ}; only arms and seeds may")
    fresh = {(r["strategy"], int(r["seed"])): r for r in new["runs"]}
    for r in old.get("runs", []):
        twin = fresh.get((r["strategy"], int(r["seed"])))
        if r["strategy"] == "uniform" and twin is not None and _untimed(twin) != _untimed(r):
            raise ValueError(f"{path}: uniform seed {r['seed']} ran to another curve than the recorded one: the warm "
                             "start does not reproduce here, so the recorded arms cannot stand beside the new ones")
    runs = [r for r in old.get("runs", []) if (r["strategy"], int(r["seed"])) not in fresh] + new["runs"]
    config = dict(new["config"])
    config["strategies"] = list(dict.fromkeys([*old["config"]["strategies"], *new["config"]["strategies"]]))
    config["seeds"] = sorted({*old["config"]["seeds"], *new["config"]["seeds"]})
    return {**old, **{k: v for k, v in new.items() if k != "runs"}, "config": config, "runs": runs}


def _untimed(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A run's curve without its clock readings (``wall_s``, ``eval_s``: they differ between two runs of one seed)."""
    return [{k: v for k, v in point.items() if not k.endswith("_s")} for point in run.get("curve", [])]


def _runs(directory: Path) -> dict[tuple[int, str], dict[int, dict[str, Any]]]:
    """``(pool, strategy) -> seed -> run`` of every recorded file's finished runs."""
    out: dict[tuple[int, str], dict[int, dict[str, Any]]] = {}
    for path in sorted(directory.glob("*.json")):
        for r in (read_json(path) or {}).get("runs", []):
            if r.get("status") == "ok" and r.get("curve"):
                out.setdefault((int(r["pool_size"]), r["strategy"]), {})[int(r["seed"])] = r
    return out


def _series(run: dict[str, Any], tag: str) -> np.ndarray:
    """``[n, 2]`` (step, value) of a run's per-step series (empty when it did not log it)."""
    values = np.asarray(run.get("series", {}).get(tag) or [], dtype=np.float64)
    return values.reshape(-1, 2)


def per_difficulty(runs: dict, pool: int, strategy: str) -> dict[str, dict[str, Any]]:
    """Final held-out accuracy per number count minus uniform's, paired by seed (mean and t-interval)."""
    mine, base = runs.get((pool, strategy), {}), runs.get((pool, "uniform"), {})
    seeds = sorted(set(mine) & set(base))
    if not seeds:
        return {}
    tags = sorted(t for t in mine[seeds[0]]["curve"][-1] if t.startswith("val/accuracy/difficulty_"))
    return {t.rsplit("_", 1)[1]: mean_interval([mine[s]["curve"][-1][t] - base[s]["curve"][-1][t] for s in seeds])
            for t in tags}


def decisions(runs: dict, pool: int) -> dict[str, float] | None:
    """What ``auto`` decided at pool ``pool``, means over seeds: its mean and final share, its final transfer, and
    the held-back probe's completions as a share of the run's."""
    mine = runs.get((pool, AUTO), {})
    if not mine:
        return None
    share = [_series(r, "auto/share")[:, 1] for r in mine.values()]
    transfer = [_series(r, "auto/transfer")[:, 1] for r in mine.values()]
    probe = [r["budget"].get("by_purpose", {}).get("auto", 0) / max(r["budget"]["completions"], 1)
             for r in mine.values()]
    return {"mean_share": float(np.mean([s.mean() for s in share if s.size])),
            "final_share": float(np.mean([s[-1] for s in share if s.size])),
            "final_transfer": float(np.mean([t[-1] for t in transfer if t.size])),
            "probe_share": float(np.mean(probe)), "seeds": len(mine)}


def auto_lines(directory: Path = AUTO_DIR) -> list[str]:
    """``auto``'s rows: per setting, its per-difficulty differences, the gain it kept and what it decided."""
    rows = {(r["pool"], r["strategy"]): r for r in settings(directory, policy=None)}
    runs = _runs(directory)
    pools = sorted({p for p, s in rows if s == AUTO}, reverse=True)
    buckets = sorted({b for p in pools for b in per_difficulty(runs, p, AUTO)})
    head = (["| pool | passes | auto minus uniform | " + " | ".join(f"{b} numbers" for b in buckets)
             + " | best fixed selector (minus uniform) | share of its gain kept | hand-back minus uniform | "
             "mean share | final share | final transfer | probe's share of the budget |"],
            "|---|---|---|" + "---|" * len(buckets) + "---|---|---|---|---|---|---|")
    lines = [head[0][0], head[1]]
    for p in pools:
        auto = rows[(p, AUTO)]
        diffs = per_difficulty(runs, p, AUTO)
        fixed = [rows[(p, s)] for s in SELECTORS if (p, s) in rows and rows[(p, s)]["diff"].get("mean") is not None]
        best = max(fixed, key=lambda r: r["diff"]["mean"], default=None)
        ahead = best is not None and best["diff"].get("low") is not None and best["diff"]["low"] > 0
        kept = f"{auto['diff']['mean'] / best['diff']['mean']:.0%}" if ahead else "(no selector ahead)"
        d = decisions(runs, p) or {}
        hand = rows.get((p, HANDBACK))
        cells = [diff_cell(diffs[b]) if b in diffs else "-" for b in buckets]
        lines.append(f"| {p:,} | {auto['passes']:.1f} | {diff_cell(auto['diff'])} | " + " | ".join(cells)
                     + f" | {best['strategy'] + ' ' + diff_cell(best['diff']) if best else '-'} | {kept} | "
                     f"{diff_cell(hand['diff']) if hand else '-'} | {d.get('mean_share', float('nan')):.2f} | "
                     f"{d.get('final_share', float('nan')):.2f} | {d.get('final_transfer', float('nan')):.2f} | "
                     f"{d.get('probe_share', float('nan')):.1%} |")
    return lines


def block(directory: Path = AUTO_DIR) -> list[str]:
    """The ``auto-pass-map`` block of the results pages."""
    if not sorted(directory.glob("*.json")):
        return ["No study of `auto` is recorded yet (`python -m benchmarks.study.auto --add STUDY_JSON`)."]
    rows = settings(directory, policy=None)
    return ["Generated by `python -m benchmarks.study.auto` from `docs/results/auto/*.json` (one pool of the "
            "recorded study per file). Bold: the interval excludes 0.", "", *table_lines(rows), "",
            "`auto` per setting: its final held-out accuracy minus uniform's overall and per number count (paired by "
            "seed, 95% t-interval), the best fixed selector's difference and the share of it `auto` kept (where that "
            "selector is ahead beyond the spread), the hand-back's difference, and what `auto` decided (its selected "
            "share, mean over the run and at the end; the transfer it measured at the end; the completions its "
            "held-back probe spent, of the run's budget; means over seeds):", "", *auto_lines(directory), "",
            "Held-out accuracy minus uniform's at each evaluation (completions; paired by seed, 95% t-interval):", "",
            *at_marks_lines(rows), "",
            "What the runs trained on (as on the passes page; means over seeds):", "", *composition_lines(rows)]


def plot(directory: Path = AUTO_DIR, path: Path = FIGURE) -> Path:
    """``auto``'s share and transfer against completions, one line per pool (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _runs(directory)
    pools = sorted({p for p, s in runs if s == AUTO}, reverse=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, p in enumerate(pools):
        seeds = runs[(p, AUTO)].values()
        cfg = StudyConfig.from_dict(read_json(next(directory.glob(f"*_pool{p}.json")))["config"])
        step_completions = cfg.batch_size * cfg.num_generations
        label = f"pool {p:,} ({cfg.budget_completions / (cfg.num_generations * p):.1f} passes)"
        for ax, tag in ((left, "auto/share"), (right, "auto/transfer")):
            curves = [_series(r, tag) for r in seeds]
            n = min(len(c) for c in curves)
            if n == 0:
                continue
            mean = np.mean([c[:n, 1] for c in curves], axis=0)
            ax.plot(curves[0][:n, 0] * step_completions, mean, color=f"C{i}", label=label)
    left.set_title("auto: share of each batch its selector (MoPPS) picks")
    left.set_ylim(0, 1)
    right.set_title("auto: transfer (held-back success slope / trained pool's)")
    right.set_ylim(0, 1.05)
    for ax in (left, right):
        ax.set_xlabel("training completions (steps x B x G)")
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.study.auto", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=AUTO_DIR, help=f"recorded studies (default {AUTO_DIR})")
    p.add_argument("--figure", type=Path, default=FIGURE, help=f"where the figure goes (default {FIGURE})")
    p.add_argument("--add", type=Path, nargs="*", default=[], metavar="STUDY_JSON",
                   help="record finished studies (their study.json) in --dir first, one file per pool")
    p.add_argument("--merge", action="store_true",
                   help="keep the recorded runs of the arms and seeds a study added with --add did not run")
    a = p.parse_args(argv)
    for path in a.add:
        for recorded in add(path, a.dir, merge=a.merge):
            print(f"recorded {recorded}")
    print("\n".join(block(a.dir)))
    print(f"wrote {plot(a.dir, a.figure)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
