"""The study says exactly what ran (issue 19): the results page's settings and tables are generated from the
recorded study and the callbacks' real arguments, the DPS paper's metric is computed as the issue computed it by
hand, and the command line's help reads the config's defaults. No training here: everything reads recorded runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import benchmarks.study.cli as bench_cli
from benchmarks.study import docs
from benchmarks.study.config import TARGETS, StudyConfig
from benchmarks.study.recorded import load_study
from lit_rlft.callbacks import GRESOCallback
from lit_rlft.study.overrides import apply_overrides, parse_override
from lit_rlft.study.stats import crossing, crossing_bracket
from lit_rlft.study.strategies import resolve_arm
from lit_rlft.study.summary import to_baseline_final

#: Every run's learnable-accuracy curve as docs/results/study.json recorded it before the MoPPS rerun of issue 19.
BEFORE = Path(__file__).parent / "data" / "curves_before_mopps_rerun.json"


def _ratios(table: dict, strategy: str) -> tuple[list[float | None], float | None]:
    row = table["strategies"][strategy]
    return [r["ratio"] for r in row["per_seed"]], row["summary"]["ratio"]


# -- the DPS paper's metric, against figures computed by hand in the issue ------------------------------------------
def test_completions_to_dynamic_samplings_final_accuracy_by_the_one_crossing_rule():
    runs = [r for r in json.loads(BEFORE.read_text())["runs"] if r["pool_size"] == 4000]
    key = TARGETS["accuracy"]
    table = to_baseline_final(runs, ["dps_c8", "uniform", "mopps", "dots"], "dynamic_sampling", key=key)
    target = table["target"]
    assert target == pytest.approx(0.285, abs=5e-4)  # dynamic sampling's final accuracy, mean of 3 seeds
    # the denominator: the same seed's dynamic-sampling run's own first crossing of that target (not its budget)
    curves = {(r["strategy"], r["seed"]): r["curve"] for r in runs}

    def first(strategy, seed):
        c = curves[(strategy, seed)]
        return crossing([p["completions"] for p in c], [p[key] for p in c], target)

    own = [first("dynamic_sampling", s) for s in (0, 1, 2)]
    assert own[2] is None and all(0 < x < 38_912 for x in own[:2])  # its seed 2 never reaches its own mean
    for strategy in ("dps_c8", "uniform"):
        rows = table["strategies"][strategy]["per_seed"]
        want = [first(strategy, s) / own[s] for s in (0, 1)]
        assert [r["ratio"] for r in rows] == [pytest.approx(want[0]), pytest.approx(want[1]), None]
        summary = table["strategies"][strategy]["summary"]
        assert summary["n_used"] == 2 and summary["b_not_reached"] == 1
        assert summary["ratio"] == pytest.approx(float(np.sqrt(want[0] * want[1])))  # geometric mean of the pairs
    per_seed, mean = _ratios(table, "dps_c8")
    assert np.round(per_seed[:2], 2).tolist() == [0.63, 0.48] and round(mean, 2) == 0.55
    row = table["strategies"]["dps_c8"]["per_seed"][0]
    # the evaluations around the crossing bracket it (every 6,400 completions)
    assert row["low"] <= row["ratio"] <= row["high"] and row["high"] - row["low"] == pytest.approx(6400 / own[0])
    assert table["strategies"]["dots"]["summary"]["status"] == "not_reached"


def test_the_recorded_study_gives_the_same_figures_for_the_runs_a_mopps_rerun_leaves_alone():
    _, study = load_study()
    table = study["pools"]["4000"]["to_baseline_final"]["dynamic_sampling"]
    assert table["target"] == pytest.approx(0.2852, abs=1e-4)
    assert np.round(_ratios(table, "dps_c8")[0][:2], 2).tolist() == [0.63, 0.48]
    assert np.round(_ratios(table, "uniform")[0][:2], 2).tolist() == [0.59, 0.46]
    against_uniform = study["pools"]["4000"]["to_baseline_final"]["uniform"]
    assert against_uniform["target"] == pytest.approx(0.3193, abs=1e-4)
    assert against_uniform["strategies"]["dynamic_sampling"]["summary"]["status"] == "not_reached"


def test_crossing_bracket_interpolates_between_the_evaluations_around_it():
    xs, ys = [0, 100, 200, 300], [0.1, 0.2, 0.4, 0.5]
    assert crossing_bracket(xs, ys, 0.3) == (150.0, 100.0, 200.0)
    assert crossing(xs, ys, 0.3) == 150.0
    assert crossing_bracket(xs, ys, 0.05) == (0.0, 0.0, 0.0)  # met at the start
    assert crossing_bracket(xs, ys, 0.6) is None


# -- the settings: recorded, generated, checked ---------------------------------------------------------------------
def test_the_results_page_and_tables_say_what_ran():
    assert docs.check() == []


def test_changing_a_callback_default_without_rerunning_breaks_the_check(monkeypatch):
    defaults = list(GRESOCallback.__init__.__defaults__)
    defaults[1] = 0.5  # hard_fraction: the study does not pass it, so the callback's default is what ran
    monkeypatch.setattr(GRESOCallback.__init__, "__defaults__", tuple(defaults))
    problems = docs.check()
    assert any(p.startswith("study.json: greso-pool4000-seed0:") for p in problems)
    assert any("'settings'" in p for p in problems)  # the documented block no longer matches
    assert not any(p.startswith("mopps-") for p in problems)


def test_changing_a_shipped_overlay_breaks_the_check(monkeypatch, tmp_path):
    """The recorded runs are checked against configs/study/*.yaml: a preset edited without re-running fails."""
    import lit_rlft.study.strategies as strategies

    presets = tmp_path / "study"
    presets.mkdir()
    for path in strategies.PRESETS.glob("*.yaml"):
        (presets / path.name).write_text(path.read_text().replace("target: 0.5", "target: 0.4"))
    monkeypatch.setattr(strategies, "PRESETS", presets)
    problems = docs.check()
    assert any(p.startswith("study.json: mopps-pool1000-seed2:") and "'target': 0.4" in p for p in problems)
    assert any(p.startswith("gym_smollm2_study.json: mopps-seed2:") for p in problems)  # the product studies too
    assert not any("uniform-" in p or "greso-" in p for p in problems)


def test_settings_include_the_callbacks_defaults_and_mopps_runs_as_the_reference_countdown_scripts():
    [greso] = resolve_arm("greso").settings(seed=3)
    assert greso == {"callback": "GRESOCallback", "args": {
        "target_zero_variance": 0.25, "hard_fraction": 2 / 3, "initial_p": 0.5, "step_size": 0.01, "min_keep": 0.01,
        "seed": 3}}
    [mopps] = resolve_arm("mopps").settings(seed=0)
    assert mopps["args"] == {"candidate_ratio": 8, "target": 0.5, "prior": [1.0, 1.0], "decay": 0.5, "seed": 0}
    [cold] = resolve_arm("dps_cold_start").settings(seed=0)
    assert "cache_dir" not in cold["args"]["cold_start"] and cold["args"]["cold_start"]["reference_size"] == 32
    assert resolve_arm("uniform").settings(0) == []


def test_a_strategy_setting_changes_that_strategys_runs_only():
    """A finished run is reused while its fingerprint matches: the shared settings and its own callbacks."""
    from lit_rlft.study.compose import fingerprint

    cfg = StudyConfig(strategies=["uniform", "mopps", "greso"], seeds=[0], pool_sizes=[64])
    changed = StudyConfig(**{**cfg.to_dict(), "overrides": ["MoPPSCallback.decay=1.0"]})
    assert changed.run_fingerprint() == cfg.run_fingerprint()  # shared settings unchanged ...
    assert changed.run_config(64, "tiny") == cfg.run_config(64, "tiny")
    arms = {name: resolve_arm(name) for name in cfg.strategies}
    after, _ = apply_overrides(arms, [parse_override(o) for o in changed.overrides])
    for name, same in (("mopps", False), ("greso", True), ("uniform", True)):
        before_settings, after_settings = arms[name].settings(0), after[name].settings(0)
        assert (fingerprint(before_settings) == fingerprint(after_settings)) is same, name  # ... mopps' are not


# -- the command line ----------------------------------------------------------------------------------------------
def test_cli_help_states_the_config_defaults(monkeypatch):
    helps = {a.dest: a.help for a in bench_cli.parser()._actions}
    full, quick = StudyConfig(), StudyConfig.quick()
    assert helps["sweep_seeds"].endswith(f"(default {full.sweep_seeds})") and full.sweep_seeds == 3
    assert helps["seeds"].endswith("(default 0,1,2; --quick: 0)")
    assert f"(default {full.budget_completions}; --quick: {quick.budget_completions})" in helps["budget_completions"]
    for dest, text in helps.items():  # every option that sets a StudyConfig field says its default
        if dest in bench_cli._FIELDS and bench_cli.default_text(dest):
            assert text.endswith(f"({bench_cli.default_text(dest)})"), dest

    class Other(StudyConfig):  # a changed default changes the help
        def __init__(self, **kw):
            super().__init__(**{"sweep_seeds": 5, **kw})

    monkeypatch.setattr(bench_cli, "StudyConfig", Other)
    assert {a.dest: a.help for a in bench_cli.parser()._actions}["sweep_seeds"].endswith("(default 5)")


# -- a product study recorded for the pages -------------------------------------------------------------------------
def test_a_recorded_product_study_renders_from_its_runs_and_a_hand_edited_digit_fails_the_check(tmp_path, monkeypatch):
    from lit_rlft.study import run_study
    from tests.study.test_study import settings

    s = settings(tmp_path, train_subset=0)
    run_study(s, progress=False)
    dest = tmp_path / "recorded.json"
    monkeypatch.setattr(docs, "REPO", tmp_path)  # paths on the page are relative to the repository
    docs.record(tmp_path / "study" / "study.json", dest, "lit-rlft study --config run.yaml")
    recorded = json.loads(dest.read_text())
    assert set(recorded["runs"][0]["series"]) <= set(docs.RECORDED_SERIES) and "log_tail" not in recorded["runs"][0]
    lines = docs.product_study_lines(dest)
    assert lines[0].startswith("`lit-rlft study --config run.yaml` (`recorded.json`;")
    final = {r["strategy"]: r["curve"][-1]["val/accuracy"] for r in recorded["runs"]}
    row = next(line for line in lines if line.startswith("| mopps |"))
    assert f"{final['mopps']:.3f}" in row and f"{final['mopps'] - final['uniform']:+.3f}" in row
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- generated:gsm8k-smollm2 -->\nold\n<!-- /generated:gsm8k-smollm2 -->\n")
    monkeypatch.setattr(docs, "PRODUCT_STUDIES", {"gsm8k-smollm2": dest})
    assert docs.render(page.read_text(), docs.extra_blocks()).count(row) == 1
    page.write_text(docs.render(page.read_text(), docs.extra_blocks()))
    assert docs.render(page.read_text(), docs.extra_blocks()) == page.read_text()  # up to date
    edited = page.read_text().replace(f"{final['mopps']:.3f}", f"{final['mopps'] + 0.1:.3f}", 1)
    assert docs.render(edited, docs.extra_blocks()) != edited  # the check sees a hand-edited digit


# -- the README's demo table, from the recorded demo report ----------------------------------------------------------
def _demo_report() -> dict:
    before = {"val/accuracy": 0.39, "val/accuracy/difficulty_2": 0.806, "val/accuracy/difficulty_3": 0.327,
              "val/accuracy/difficulty_4": 0.001, "val/accuracy/learnable": 0.164}
    after = {"val/accuracy": 0.534, "val/accuracy/difficulty_2": 0.84, "val/accuracy/difficulty_3": 0.495,
             "val/accuracy/difficulty_4": 0.241, "val/accuracy/learnable": 0.367, "val/n/accuracy": 1800.0,
             "val/n/accuracy/difficulty_2": 633.0, "val/n/accuracy/difficulty_3": 581.0,
             "val/n/accuracy/difficulty_4": 586.0, "val/n/accuracy/learnable": 1167.0}
    return {"before": before, "after": after}


def test_the_demo_table_is_the_readmes_format_computed_by_hand(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_demo_report()))
    lines = docs.demo_lines(path)
    assert lines[0] == "| held-out bucket | n problems | warm start | after GRPO | change |"
    assert "| 4 numbers (learnable, never in SFT) | 586 | 0.001 | 0.241 | **+0.240** |" in lines
    assert "| learnable part (3 + 4 numbers, pooled) | 1,167 | 0.164 | 0.367 | **+0.203** |" in lines  # 0.367-0.164
    assert lines[-1] == "| all | 1,800 | 0.390 | 0.534 | +0.144 |"


@pytest.mark.parametrize("name", ["demo-table", "demo-table-avx512"])
def test_a_hand_edited_digit_in_the_demo_pages_table_fails_the_docs_check(tmp_path, name):
    """Each kind of CPU's recorded table (:data:`benchmarks.study.docs.DEMO_REPORTS`), on the site's demo page."""
    readme = (docs.REPO / "docs" / "results" / "demo.md").read_text(encoding="utf-8")
    block = readme.split(f"<!-- generated:{name} -->\n", 1)[1].split(f"<!-- /generated:{name} -->", 1)[0]
    assert block.rstrip("\n").splitlines() == docs.demo_lines(docs.DEMO_REPORTS[name])  # the recorded report's
    row = next(line for line in block.splitlines() if line.startswith("| all |"))
    cells = row.split(" | ")
    cells[3] = f"{float(cells[3]) + 0.001:.3f}"  # the after-GRPO accuracy of "all", one digit off
    page = tmp_path / "demo.md"
    page.write_text(readme.replace(row, " | ".join(cells)), encoding="utf-8")
    problems = docs.check(pages=(page,))
    assert problems == [f"{page}: generated block(s) out of date (python -m benchmarks.study.docs)"]
    page.write_text(readme, encoding="utf-8")
    assert docs.check(pages=(page,)) == []
