"""``python -m benchmarks.study.docs``: the generated parts of the results page, rebuilt from the recorded study.

    python -m benchmarks.study.docs           # rewrite docs/results/study_tables.md and the blocks in docs/results.md
    python -m benchmarks.study.docs --check   # exit 1 and say what is out of date (what tests/study checks)

``docs/results.md`` is written by hand except between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``:
those blocks are built here from ``docs/results/study.json`` (its recorded configuration, runs and the callbacks
every run recorded) with the study's own code (:mod:`lit_rlft.study.summary`, :mod:`benchmarks.study.tables`).
``docs/results/study_tables.md`` is the whole report (``results.md``) rebuilt the same way. The README and
``benchmarks/README.md`` hold blocks of their own (:func:`extra_blocks`): the time-to-TRL tables, from
``benchmarks/results/time_to_trl_*.json``, and the saving against passes, from ``docs/results/passes/``.

The check also requires that every run of a recorded study (this one and the product studies of
:data:`PRODUCT_STUDIES`) recorded the callback settings its arm gives now (:meth:`~lit_rlft.study.strategies.Arm.
settings` of the shipped overlay in ``configs/study/`` with the study's recorded ``--set`` overrides, defaults read
from the callbacks' signatures): changing a callback's default, or a setting in a ``configs/study/*.yaml``, without
re-running the affected runs and regenerating the page fails it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.study import auto as auto_study
from benchmarks.study.config import StudyConfig
from benchmarks.study.passes import block as passes_block, policy_lines
from benchmarks.study.recorded import STUDY_JSON, load_study
from benchmarks.study.tables import baseline_final_lines, results_markdown, settings_lines
from benchmarks.study.trl_tables import result_table
from lit_rlft.records.jsonio import read_json
from lit_rlft.study.overrides import apply_overrides, parse_override
from lit_rlft.study.report import at_marks_rows, table
from lit_rlft.study.strategies import STRATEGIES, ArmError, resolve_arm, settings_match

REPO = Path(__file__).resolve().parents[2]
RESULTS_MD = REPO / "docs" / "results.md"
#: Other pages with generated blocks (only the blocks of :func:`extra_blocks`: time to TRL's accuracy, the passes,
#: the demos, the product studies and probes): the README, the benchmarks' README and the site's pages.
EXTRA_PAGES = (REPO / "README.md", REPO / "benchmarks" / "README.md",
               *sorted(p for p in (REPO / "docs").rglob("*.md") if p.parent != REPO / "docs" or p.name != "results.md"))
#: ``time_to_trl.json`` results by block name (``python -m benchmarks.time_to_trl``, copied into benchmarks/results).
TIME_TO_TRL = {"time-to-trl-pool4000": REPO / "benchmarks" / "results" / "time_to_trl_pool4000.json",
               "time-to-trl-skewed1000": REPO / "benchmarks" / "results" / "time_to_trl_skewed_pool1000.json",
               # issue 58: the pool of 4,000 again, with the update leaving out the rows that teach nothing
               "time-to-trl-pool4000-issue58": REPO / "benchmarks" / "results" / "time_to_trl_pool4000_issue58.json"}
TABLES_MD = REPO / "docs" / "results" / "study_tables.md"
#: The strategies of the results page's "at each evaluation" table (the ones that tie uniform at the end).
AT_MARKS_STRATEGIES = ("dps_c8", "mopps", "greso")

_BLOCK = re.compile(r"(<!-- generated:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)


def _at_marks_block(cfg: StudyConfig, study: dict[str, Any]) -> list[str]:
    rows: list[list[str]] = []
    for size in cfg.pool_sizes:
        rows += [[f"{size:,}", *row] for row in at_marks_rows(study["pools"][str(size)], list(AT_MARKS_STRATEGIES))]
    return table(["pool", "strategy", *[f"{m:,}" for m in cfg.eval_marks()]], rows)


def time_to_trl_lines(path: Path) -> list[str]:
    """A recorded ``time_to_trl.json``'s table, with its command and seeds."""
    result = read_json(path)
    if result is None:
        raise FileNotFoundError(f"{path}: missing or unreadable")
    return [f"`{result['command']}` (seeds {result['seeds']}, pool {result['pool_size']:,}; "
            f"`{path.relative_to(REPO)}`):", "", *result_table(result, source=str(path)).splitlines()]


#: ``make demo``'s report (``runs/demo/report.json`` of a fresh clone, copied here): the README's demo table.
DEMO_REPORT = REPO / "docs" / "results" / "demo_report.json"
#: The recorded demo reports by README block: one per kind of CPU, whose kernels give other last bits and so another
#: warm start (``demo-table``: AMD EPYC, AVX2; ``demo-table-avx512``: Intel Xeon, AVX-512).
DEMO_REPORTS = {"demo-table": DEMO_REPORT, "demo-table-avx512": REPO / "docs" / "results" / "demo_report_avx512.json"}


def demo_lines(path: Path | None = None) -> list[str]:
    """The README's demo table, from the recorded demo report (:func:`lit_rlft.cli.demo.demo_table`)."""
    from lit_rlft.cli.demo import demo_table

    report = read_json(path or DEMO_REPORT)
    if report is None:
        raise FileNotFoundError(f"{path or DEMO_REPORT}: missing or unreadable (make demo; copy runs/demo/report.json)")
    return demo_table(report["before"], report["after"])


#: Studies of the product (``lit-rlft study``) recorded for the pages, by block name (:func:`record`).
PRODUCT_STUDIES = {"gsm8k-smollm2": REPO / "docs" / "results" / "gsm8k_smollm2_study.json",
                   "gym-smollm2": REPO / "docs" / "results" / "gym_smollm2_study.json"}
#: ``lit-rlft probe`` results recorded for the pages (``<out>/probe.json``), by block name (``--record-probe``).
PRODUCT_PROBES = {"gsm8k-probe": REPO / "docs" / "results" / "gsm8k_smollm2_probe.json",
                  "gym-probe": REPO / "docs" / "results" / "gym_smollm2_probe.json"}
#: ``make demo-llm``'s report (``runs/demo_llm/report.json``, copied here by ``--record-llm-demo``).
LLM_DEMO_REPORT = REPO / "docs" / "results" / "llm_demo_report.json"


def probe_block_lines(path: Path) -> list[str]:
    """A recorded probe: its command, then the probe's own markdown (:func:`lit_rlft.study.probe.probe_markdown`)
    without its heading."""
    from lit_rlft.study.probe import probe_markdown

    recorded = read_json(path)
    if recorded is None or "summary" not in recorded:
        raise FileNotFoundError(f"{path}: missing or not a lit-rlft probe's probe.json")
    env = recorded.get("environment") or {}
    body = probe_markdown(recorded).splitlines()[2:]
    return [f"`{recorded.get('command', '?')}` (`{path.relative_to(REPO)}`; {env.get('cpu', '?')}):", "", *body]


def llm_demo_lines(path: Path = LLM_DEMO_REPORT) -> list[str]:
    """``make demo-llm``'s table from its recorded report (:func:`lit_rlft.cli.demo.accuracy_table`)."""
    from lit_rlft.cli.demo import accuracy_table

    report = read_json(path)
    if report is None or "before" not in report:
        raise FileNotFoundError(f"{path}: missing or unreadable (make demo-llm; --record-llm-demo "
                                "runs/demo_llm/report.json)")
    t, env = report.get("timings") or {}, report.get("environment") or {}
    return [f"`make demo-llm` (`{path.relative_to(REPO)}`; {env.get('cpu', '?')}, {env.get('torch_threads', '?')} "
            f"threads): warm start {t.get('sft_s', 0) / 60:.1f} min, {report.get('steps')} GRPO steps "
            f"({(report.get('budget') or {}).get('completions', 0):,} completions) "
            f"{t.get('grpo_s', 0) / 60:.1f} min with the held-out evaluations; {t.get('total_s', 0) / 60:.1f} min "
            "in all.", "", *accuracy_table(report["before"], report["after"])]


#: Per-step series a recorded product study keeps (the rest of each run's TensorBoard stays in its run folder).
RECORDED_SERIES = ("reward", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio",
                   "time/step_s", "time/generation_s", "budget/completions")


def record(study_json: Path, dest: Path, command: str) -> Path:
    """Record a finished ``lit-rlft study`` (``<out>/study.json``) for the pages: its settings, base config,
    environment, ``command`` and runs (curves, per-step logs, budgets, callbacks, environments and a few series);
    the summaries are recomputed from the runs whenever the pages are generated."""
    study = read_json(study_json)
    if study is None or "settings" not in study or "runs" not in study:
        raise FileNotFoundError(f"{study_json}: not a finished lit-rlft study's study.json")
    runs = [{**{k: v for k, v in r.items() if k not in ("series", "log_tail")},
             "series": {t: v for t, v in (r.get("series") or {}).items() if t in RECORDED_SERIES}}
            for r in study["runs"]]
    keep = ("settings", "configs", "base_config", "dropped_callbacks", "marks", "step_completions", "threads",
            "timings", "environment", "probe")
    from lit_rlft.records.jsonio import write_json

    return write_json(dest, {**{k: study.get(k) for k in keep}, "command": command, "runs": runs})


def product_study_lines(path: Path) -> list[str]:
    """A recorded product study: its command, the verdicts and the outcomes table, recomputed from its runs with the
    product's code (:func:`lit_rlft.study.study.summarise_study`)."""
    from lit_rlft.study.report import discrimination_sentence, held_out_rows, main_rows, probe_lines, verdicts
    from lit_rlft.study.settings import StudySettings
    from lit_rlft.study.study import summarise_study

    recorded = read_json(path)
    if recorded is None:
        raise FileNotFoundError(f"{path}: missing or unreadable")
    settings = StudySettings.from_dict(recorded["settings"])
    summary = summarise_study(settings, recorded["runs"])
    arms = settings.arm_names
    env = recorded.get("environment") or {}
    packages = env.get("packages") or {}
    versions = ", ".join(f"{k} {packages[k]}" for k in ("torch", "transformers", "lightning") if packages.get(k))
    target = summary["targets"].get("accuracy")
    lines = [f"`{recorded['command']}` (`{path.relative_to(REPO)}`; {env.get('cpu', '?')}, {versions}; "
             f"{recorded.get('timings', {}).get('runs_total_s', 0) / 3600:.1f} h of runs):", ""]
    blind = discrimination_sentence(summary, settings.confidence)
    if blind:
        lines += [blind, ""]
    if recorded.get("probe"):
        lines += [probe_lines(recorded["probe"]), ""]
    if target is not None:
        lines += [f"Target: {summary['baseline']}'s final held-out accuracy, {target:.3f}.", ""]
    return [*lines, *verdicts(summary, arms, settings.confidence), "", *main_rows(summary, arms), "",
            *held_out_rows(summary, arms)]


def extra_blocks() -> dict[str, Callable[[], list[str]]]:
    """Blocks built from their own records, not from ``docs/results/study.json``: the saving against passes and
    by policy size (:mod:`benchmarks.study.passes`), the time-to-TRL tables (:data:`TIME_TO_TRL`) and the product
    studies (:data:`PRODUCT_STUDIES`) and the demo's tables (:data:`DEMO_REPORTS`)."""
    out: dict[str, Callable[[], list[str]]] = {"saving-vs-passes": passes_block, "policy-size": policy_lines,
                                               "auto-pass-map": auto_study.block}
    for name, path in DEMO_REPORTS.items():
        out[name] = lambda p=path: demo_lines(p)
    for name, path in TIME_TO_TRL.items():
        out[name] = lambda p=path: time_to_trl_lines(p)
    for name, path in PRODUCT_STUDIES.items():
        out[name] = lambda p=path: product_study_lines(p)
    for name, path in PRODUCT_PROBES.items():
        out[name] = lambda p=path: probe_block_lines(p)
    out["llm-demo-table"] = llm_demo_lines
    return out


def blocks(cfg: StudyConfig, study: dict[str, Any]) -> dict[str, Callable[[], list[str]]]:
    """The generated blocks of ``docs/results.md`` by name (each a function giving its markdown lines)."""
    main, *others = [str(z) for z in cfg.pool_sizes]
    out: dict[str, Callable[[], list[str]]] = {
        "settings": lambda: settings_lines(study),
        "at-marks": lambda: _at_marks_block(cfg, study),
        **extra_blocks(),
    }
    for size in [main, *others]:  # the method is said once, in the first pool's block
        out[f"to-baseline-final-{size}"] = (lambda z=size: baseline_final_lines(
            cfg, study["pools"][z], z, cfg.strategies_at(int(z)), heading=False, intro=z == main))
    return out


def settings_problems(runs: list[dict[str, Any]], overrides: list[str], where: str) -> list[str]:
    """Runs of a shipped strategy whose recorded callbacks differ from what its overlay in ``configs/study/`` with
    ``overrides`` gives now (or that recorded none); ``where`` (the study's file) begins each problem."""
    names = sorted({r["strategy"] for r in runs if r["strategy"] in STRATEGIES})
    try:
        arms, _ = apply_overrides({n: resolve_arm(n) for n in names}, [parse_override(o) for o in overrides])
    except ArmError as e:
        return [f"{where}: {e}"]
    problems = []
    for r in runs:
        arm = arms.get(r["strategy"])
        if arm is None:  # TRL's trainer, or a user's overlay file
            continue
        now = arm.settings(r["seed"])
        if not settings_match(r.get("callbacks"), now):
            problems.append(f"{where}: {r['run']}: recorded callbacks {r.get('callbacks')} but {_shown(arm.path)} gives {now}")
    return problems


def _shown(path: str | None) -> str:
    """``path`` relative to the repository where it lies in it."""
    p = Path(path or "?")
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def render(text: str, generated: dict[str, Callable[[], list[str]]]) -> str:
    """``text`` with every generated block replaced; unknown block names raise."""
    def body(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in generated:
            raise KeyError(f"docs/results.md has a generated block {name!r} that benchmarks.study.docs does not know")
        return m.group(1) + "\n".join(generated[name]()).rstrip("\n") + "\n" + m.group(4)

    return _BLOCK.sub(body, text)


def check(study_path: Path = STUDY_JSON, results_md: Path = RESULTS_MD, tables_md: Path = TABLES_MD,
          pages: tuple[Path, ...] = EXTRA_PAGES) -> list[str]:
    """Everything out of date, in words (empty: the page says what ran)."""
    cfg, study = load_study(study_path)
    problems = settings_problems(study["runs"], cfg.overrides, study_path.name)
    for path in PRODUCT_STUDIES.values():
        recorded = read_json(path) or {}
        problems += settings_problems(recorded.get("runs", []), recorded.get("settings", {}).get("overrides", []),
                                      path.name)
    for path in sorted(auto_study.AUTO_DIR.glob("*.json")):  # auto's pass map (python -m benchmarks.study.auto)
        recorded = read_json(path) or {}
        problems += settings_problems(recorded.get("runs", []), recorded.get("config", {}).get("overrides", []),
                                      path.name)
    text = results_md.read_text(encoding="utf-8")
    expected = render(text, blocks(cfg, study))
    names = [m.group("name") for m in _BLOCK.finditer(text)]
    for name in ("settings", "at-marks", f"to-baseline-final-{cfg.pool_sizes[0]}"):
        if name not in names:
            problems.append(f"{results_md}: no generated block {name!r}")
    if expected != text:
        changed = [m.group("name") for m, e in zip(_BLOCK.finditer(text), _BLOCK.finditer(expected))
                   if m.group(0) != e.group(0)]
        problems.append(f"{results_md}: generated block(s) {changed} out of date (python -m benchmarks.study.docs)")
    if tables_md.read_text(encoding="utf-8") != results_markdown(cfg, study):
        problems.append(f"{tables_md}: out of date (python -m benchmarks.study.docs)")
    for page in pages:
        text = page.read_text(encoding="utf-8")
        if render(text, extra_blocks()) != text:
            problems.append(f"{page}: generated block(s) out of date (python -m benchmarks.study.docs)")
    return problems


def write(study_path: Path = STUDY_JSON, results_md: Path = RESULTS_MD, tables_md: Path = TABLES_MD,
          pages: tuple[Path, ...] = EXTRA_PAGES) -> None:
    """Rewrite the generated blocks of ``results_md`` and ``pages`` and the whole of ``tables_md``."""
    cfg, study = load_study(study_path)
    results_md.write_text(render(results_md.read_text(encoding="utf-8"), blocks(cfg, study)), encoding="utf-8")
    tables_md.write_text(results_markdown(cfg, study), encoding="utf-8")
    for page in pages:
        page.write_text(render(page.read_text(encoding="utf-8"), extra_blocks()), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.study.docs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="only say what is out of date (exit 1 if anything is)")
    p.add_argument("--study", type=Path, default=STUDY_JSON, help=f"recorded study (default {STUDY_JSON})")
    p.add_argument("--record", nargs=2, metavar=("STUDY_JSON", "NAME"),
                   help=f"record a finished lit-rlft study as the pages' block NAME ({', '.join(PRODUCT_STUDIES)}), "
                        "with --command, then regenerate")
    p.add_argument("--record-probe", nargs=2, metavar=("PROBE_JSON", "NAME"),
                   help=f"record a lit-rlft probe's probe.json as the pages' block NAME ({', '.join(PRODUCT_PROBES)}), "
                        "with --command, then regenerate")
    p.add_argument("--record-llm-demo", type=Path, metavar="REPORT_JSON",
                   help="record make demo-llm's report (runs/demo_llm/report.json) as the llm-demo-table block")
    p.add_argument("--command", help="the command that made the recorded study or probe (with --record, "
                                     "--record-probe)")
    p.add_argument("--record-demo", type=Path, metavar="REPORT_JSON",
                   help="record a fresh clone's make demo report (runs/demo/report.json) as the README's demo "
                        "table --demo-block, then regenerate")
    p.add_argument("--demo-block", default="demo-table", choices=sorted(DEMO_REPORTS),
                   help="which recorded demo report --record-demo writes (one per kind of CPU; default demo-table: "
                        f"{DEMO_REPORT.name})")
    a = p.parse_args(argv)
    if a.record:
        source, name = a.record
        if name not in PRODUCT_STUDIES or not a.command:
            p.error(f"--record STUDY_JSON NAME needs NAME in {', '.join(PRODUCT_STUDIES)} and --command")
        print(f"recorded {record(Path(source), PRODUCT_STUDIES[name], a.command)}")
    if a.record_probe:
        source, name = a.record_probe
        probe = read_json(Path(source))
        if name not in PRODUCT_PROBES or not a.command or probe is None or "summary" not in probe:
            p.error(f"--record-probe PROBE_JSON NAME needs a probe.json, NAME in {', '.join(PRODUCT_PROBES)} and "
                    "--command")
        from lit_rlft.records.jsonio import write_json

        print(f"recorded {write_json(PRODUCT_PROBES[name], {**probe, 'command': a.command})}")
    if a.record_llm_demo:
        report = read_json(a.record_llm_demo)
        if report is None or "before" not in report or "after" not in report:
            p.error(f"--record-llm-demo {a.record_llm_demo}: not a make demo-llm report.json")
        from lit_rlft.records.jsonio import write_json

        print(f"recorded {write_json(LLM_DEMO_REPORT, report)}")
    if a.record_demo:
        report = read_json(a.record_demo)
        if report is None or "before" not in report or "after" not in report:
            p.error(f"--record-demo {a.record_demo}: not a make demo report.json (no 'before'/'after')")
        from lit_rlft.records.jsonio import write_json

        print(f"recorded {write_json(DEMO_REPORTS[a.demo_block], report)}")
    if not a.check:
        write(a.study)
    problems = check(a.study)
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
