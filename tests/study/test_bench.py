"""The Countdown study (`python -m benchmarks.study`) end to end in a tiny form: two strategies, an untrained tiny
policy, a 64-prompt pool, a few steps, run by the product (`lit_rlft.study`) as subprocesses side by side; checks the
structure of every output (not the numbers)."""

from __future__ import annotations

import json

import pytest

import benchmarks.study.cli as bench_cli
from benchmarks.study.config import RunSpec, StudyConfig
from lit_rlft.study.stats import crossing, ratio_summary
from tests.conftest import TINY_SMALL

TINY_STUDY = dict(
    warm_start="tiny", tiny=TINY_SMALL, pool_sizes=[64], seeds=[0], batch_size=4, num_generations=4,
    max_completion_length=8, warmup_steps=1, budget_completions=48, num_evals=2, eval_size=16,
    train_subset_size=16, degeneracy_sample=64,
    overrides=["DOTSCallback.reference_size=4", "DOTSCallback.update_every=2", "DOTSCallback.online_steps_per_update=1",
               "ReplayCallback.capacity=8"],
)


def test_bench_end_to_end_two_strategies(tmp_path, monkeypatch):
    # The CLI's flags cover the common options; the tiny sizes go through StudyConfig.
    monkeypatch.setattr(bench_cli, "config_from_args", lambda a: StudyConfig(
        strategies=a.strategies, jobs=a.jobs, **TINY_STUDY))
    out = tmp_path / "bench"
    bench_cli.main(["--out", str(out), "--strategies", "uniform,dps", "--jobs", "2", "--no-progress"])

    for name in ("uniform-seed0", "dps-seed0"):  # the product's study of pool 64
        run = json.loads((out / "pool64" / "runs" / f"{name}.json").read_text())
        assert run["status"] == "ok", run.get("log_tail")
        assert run["budget"]["completions"] >= 48 and run["steps"] >= 3
        curve = run["curve"]
        assert len(curve) >= 3 and curve[0]["step"] == 0
        for point in curve:
            for key in ("step", "completions", "wall_s", "val/accuracy", "val/accuracy/learnable",
                        "val/accuracy/difficulty_2", "train_pool_reward"):
                assert key in point, key
        assert [p["completions"] for p in curve] == sorted(p["completions"] for p in curve)
        for tag in ("effective_ratio", "reward", "time/step_s", "time/generation_s", "budget/completions"):
            assert len(run["series"][tag]) == run["steps"], tag
    dps = json.loads((out / "pool64" / "runs" / "dps-seed0.json").read_text())
    assert "dps/overhead_s" in dps["series"] and "dps/accuracy" in dps["series"]
    # every run records its callbacks with every argument, defaults included
    assert dps["callbacks"] == [{"callback": "DPSCallback", "args": {
        "decay": 0.5, "prior": "uniform", "entropy_bonus": 0.0, "confusion_every_n_steps": 50, "cold_start": None,
        "candidate_ratio": None, "seed": 0}}]
    assert len(dps["series"]["composition/difficulty_2/share"]) == dps["steps"]  # what the batch held, per step

    study = json.loads((out / "study.json").read_text())
    assert study["config"]["strategies"] == ["uniform", "dps"]
    assert [r["run"] for r in study["runs"]] == ["uniform-pool64-seed0", "dps-pool64-seed0"]
    deg = study["degeneracy"]["64"]
    assert set(deg["overall"]) >= {"all_correct", "all_wrong", "mixed", "degenerate"}
    pool = study["pools"]["64"]
    assert set(pool["targets"]) == {"accuracy", "train_reward"}
    row = pool["strategies"]["dps"]
    assert set(row["vs_baseline"]) == {"accuracy", "train_reward"}
    assert set(row["vs_baseline"]["accuracy"]) == {"completions", "step", "wall_s"}
    assert row["dps_accuracy"]["n"] == 1 and row["overhead_share"]["n"] == 1

    assert set(pool["to_baseline_final"]) == {"uniform"}  # no dynamic-sampling run here
    assert pool["at_marks"]["marks"] == [24, 48] and set(pool["at_marks"]["strategies"]) == {"dps"}

    results = (out / "results.md").read_text()
    assert "| strategy |" in results and "| uniform |" in results and "| dps |" in results
    assert "| dps | `DPSCallback` | – | decay=0.5, prior='uniform'" in results  # the settings, generated
    assert "Completions to reach a baseline's final accuracy (pool 64)" in results
    # the evaluation spacing is said against the baseline's own crossings, when a baseline seed crossed its target
    crossed = any(r["baseline_completions"] for t in study["pools"]["64"]["to_baseline_final"].values()
                  for row in t["strategies"].values() for r in row["per_seed"])
    assert ("Evaluations come every 24 completions" in results) == crossed
    assert "## What each strategy trained on" in results and "share 2 numbers" in results
    assert "distinct prompts trained" in results
    for png in ("accuracy_vs_rollouts.png", "accuracy_vs_time.png", "effective_ratio.png"):
        assert (out / png).stat().st_size > 1000, png

    # A re-run resumes: both runs are reused, nothing is trained again.
    bench_cli.main(["--out", str(out), "--strategies", "uniform,dps", "--jobs", "2", "--no-progress"])
    again = json.loads((out / "study.json").read_text())
    assert again["timings"]["runs_reused"] == 2 and again["timings"]["runs_executed"] == 0


def test_a_failed_run_is_recorded_and_reported(tmp_path):
    from benchmarks.study.study import run_countdown_study

    # reference_size larger than the pool makes DOTS fail in setup; uniform still runs.
    cfg = StudyConfig(strategies=["uniform", "dots"], jobs=0,
                      **{**TINY_STUDY, "overrides": [*TINY_STUDY["overrides"], "DOTSCallback.reference_size=100"]})
    study = run_countdown_study(cfg, tmp_path, progress=False)
    status = {r["run"]: r["status"] for r in study["runs"]}
    assert status == {"uniform-pool64-seed0": "ok", "dots-pool64-seed0": "failed"}
    failed = json.loads((tmp_path / "pool64" / "runs" / "dots-seed0.json").read_text())
    assert "reference_size" in failed["error"] and "reference_size" in failed["log_tail"]
    assert "dots-pool64-seed0" in (tmp_path / "results.md").read_text()


def test_study_config_runs_and_quick():
    cfg = StudyConfig(strategies=["uniform", "dps", "history"], seeds=[0, 1, 2], pool_sizes=[4000, 1000],
                      sweep_seeds=2)
    names = [s.name for s in cfg.runs()]
    assert names[:3] == ["uniform-pool4000-seed0", "dps-pool4000-seed0", "history-pool4000-seed0"]
    # the multi-epoch pool runs the sweep strategies only (history is not one), with the first 2 seeds
    assert len(names) == 3 * 3 + 2 * 2 and RunSpec("dps", 1000, 1).name in names
    assert RunSpec("history", 1000, 0).name not in names
    assert StudyConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    default = StudyConfig()
    assert len(default.runs()) == 22 * 3 + 7 * 3  # the study's design: 87 runs
    quick = StudyConfig.quick()
    assert len(quick.runs()) == 22 and quick.budget_completions < cfg.budget_completions
    with pytest.raises(ValueError, match="unknown strategies"):
        StudyConfig(strategies=["nope"])


def test_strategy_seeds_run_some_strategies_on_fewer_seeds_without_changing_a_run():
    cfg = StudyConfig(strategies=["uniform", "dps", "greso"], seeds=[0, 1, 2, 3, 4], pool_sizes=[200],
                      strategy_seeds={"dps": 3})
    names = [s.name for s in cfg.runs()]
    assert len(names) == 5 + 3 + 5
    assert RunSpec("dps", 200, 2).name in names and RunSpec("dps", 200, 3).name not in names
    assert RunSpec("greso", 200, 4).name in names
    assert names[:3] == ["uniform-pool200-seed0", "dps-pool200-seed0", "greso-pool200-seed0"]  # seed-major
    assert cfg.seeds_of("dps") == [0, 1, 2] and cfg.seeds_of("uniform") == [0, 1, 2, 3, 4]
    # a run's identity does not depend on how many seeds its strategy gets: finished runs are reused
    assert cfg.run_fingerprint() == StudyConfig(strategies=["uniform", "dps", "greso"], seeds=[0, 1, 2, 3, 4],
                                                pool_sizes=[200]).run_fingerprint()
    a = bench_cli.parser().parse_args(["--set", 'strategy_seeds={"dps": 3}'])
    assert bench_cli.config_from_args(a).strategy_seeds == {"dps": 3}
    with pytest.raises(ValueError, match="strategy_seeds names unknown strategies"):
        StudyConfig(strategy_seeds={"dsp": 3})
    with pytest.raises(ValueError, match="at least 1 seed"):
        StudyConfig(strategy_seeds={"dps": 0})


def test_set_overrides_any_study_field_and_rejects_unknown_ones(capsys):
    a = bench_cli.parser().parse_args(["--set", "num_generations=16", "--set", "DOTSCallback.alpha=0.3",
                                       "--set", "num_numbers=[3, 4]", "--seeds", "0", "--set", "dots:DOTSCallback.tau=1"])
    cfg = bench_cli.config_from_args(a)
    assert (cfg.num_generations, cfg.num_numbers, cfg.seeds) == (16, [3, 4], [0])
    assert cfg.overrides == ["DOTSCallback.alpha=0.3", "dots:DOTSCallback.tau=1"]  # lit-rlft study's --set, in order
    assert cfg.study_settings(4000, "c.yaml", "out").overrides == cfg.overrides
    with pytest.raises(SystemExit):
        bench_cli.parser().parse_args(["--set", "num_generatoins=16"])
    assert "StudyConfig field" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_cli.parser().parse_args(["--set", "DOTSCallback.alpha"])
    assert "expected [ARM:]Callback.argument" in capsys.readouterr().err


def test_crossing_is_interpolated_and_censored():
    assert crossing([0, 100, 200], [0.1, 0.3, 0.5], 0.4) == pytest.approx(150)
    assert crossing([0, 100], [0.1, 0.2], 0.4) is None
    s = ratio_summary([(50.0, 100.0), (None, 100.0), (80.0, 100.0)])
    assert s["status"] == "partial" and s["a_not_reached"] == 1 and s["low"] is not None
    assert ratio_summary([(None, 1.0)])["status"] == "not_reached"


def test_pool_composition_follows_the_bucket_weights_and_is_recorded():
    from collections import Counter

    from benchmarks.study.tasks import pool_task

    skewed = StudyConfig.skewed()
    assert skewed.pool_num_numbers == [2, 3, 4, 5] and skewed.degenerate_target == 0.7
    assert skewed.pool_composition == pytest.approx({2: 0.3, 3: 0.1, 4: 0.3, 5: 0.3})
    counts = Counter(r.data["difficulty"] for r in pool_task(skewed, 2000).records())
    shares = {k: counts[k] / 2000 for k in (2, 3, 4, 5)}
    assert shares == pytest.approx({2: 0.3, 3: 0.1, 4: 0.3, 5: 0.3}, abs=0.03)  # drawn: +-3 sd of 2,000 draws
    balanced = Counter(r.data["difficulty"] for r in pool_task(StudyConfig(), 2000).records())
    assert max(balanced.values()) - min(balanced.values()) < 150  # equal parts without weights
    assert StudyConfig.from_dict(json.loads(json.dumps(skewed.to_dict()))) == skewed  # study.json round trip
    # the balanced study's runs keep their fingerprints; a composition changes the fingerprint
    assert StudyConfig(bucket_weights=None).run_fingerprint() == StudyConfig().run_fingerprint()
    assert StudyConfig(bucket_weights=[1, 1, 2]).run_fingerprint() != StudyConfig().run_fingerprint()
    assert StudyConfig(degenerate_target=0.9).run_fingerprint() == StudyConfig().run_fingerprint()


@pytest.mark.parametrize("weights, match", [([1.0, 1.0], "2 entries for the pool's 3 number counts"),
                                            ([1.0, -1.0, 1.0], ">= 0 with a positive sum"),
                                            ([0.0, 0.0, 0.0], ">= 0 with a positive sum")])
def test_bad_bucket_weights_name_the_setting(weights, match):
    with pytest.raises(ValueError, match=match):
        StudyConfig(bucket_weights=weights)


def test_skewed_flag_sets_the_pool_under_explicit_options():
    a = bench_cli.parser().parse_args(["--skewed", "--seeds", "0"])
    cfg = bench_cli.config_from_args(a)
    assert (cfg.five_numbers, cfg.bucket_weights, cfg.degenerate_target) == (True, [0.3, 0.1, 0.3, 0.3], 0.7)
    a = bench_cli.parser().parse_args(["--skewed", "--quick", "--bucket-weights", "0.1,0.2,0.3,0.4"])
    cfg = bench_cli.config_from_args(a)
    assert cfg.bucket_weights == [0.1, 0.2, 0.3, 0.4] and cfg.budget_completions == StudyConfig.quick().budget_completions


def test_degeneracy_report_states_the_target_and_composition():
    from benchmarks.study.tables import degeneracy_lines

    fractions = {"n": 10, "all_correct": 0.2, "all_wrong": 0.6, "mixed": 0.2, "degenerate": 0.8, "mean_success": 0.3}
    d = {"sampled": 10, "G": 8, "overall": fractions, "by_difficulty": {"5": fractions}, "target": 0.7,
         "meets_target": True, "composition": {"2": 0.3, "3": 0.1, "4": 0.3, "5": 0.3}}
    text = "\n".join(degeneracy_lines({"4000": d}))
    assert "meets the 'at least 70% degenerate' target" in text and "5 numbers 30% of the pool" in text
    old = {k: v for k, v in d.items() if k not in ("target", "meets_target", "composition")}
    old["meets_half_degenerate"] = False
    assert "does NOT meet the 'at least 50% degenerate' target" in "\n".join(degeneracy_lines({"4000": old}))


def test_degeneracy_only_measures_without_training_and_judges_against_todays_target(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_cli, "config_from_args", lambda a: StudyConfig(**TINY_STUDY))
    bench_cli.main(["--out", str(tmp_path), "--degeneracy-only"])
    measured = json.loads((tmp_path / "degeneracy.json").read_text())["pools"]["64"]
    fractions = measured["overall"]
    assert fractions["n"] == 64 and fractions["all_correct"] + fractions["all_wrong"] + fractions["mixed"] == (
        pytest.approx(1.0))
    assert measured["meets_target"] == (fractions["degenerate"] >= 0.5) and not (tmp_path / "runs").exists()
    # the target is not part of the cached measurement: a new target judges the cached fractions anew
    from benchmarks.study.study import pool_degeneracy

    strict = pool_degeneracy(StudyConfig(**TINY_STUDY, degenerate_target=1.0), tmp_path, "tiny")["64"]
    assert strict["overall"] == fractions and strict["target"] == 1.0
    assert strict["meets_target"] == (fractions["degenerate"] >= 1.0)


def test_an_argument_added_later_at_its_old_behaviour_keeps_recorded_runs_current():
    from lit_rlft.study.strategies import settings_match

    recorded = [{"callback": "DPSCallback", "args": {"decay": 0.5, "cold_start": {"reference_size": 32}}}]
    now = [{"callback": "DPSCallback", "args": {"decay": 0.5, "cold_start": {"reference_size": 32,
                                                                             "reference": "rollout"}}}]
    assert settings_match(recorded, now)
    now[0]["args"]["cold_start"]["reference"] = "observed"  # a new behaviour: the run is stale
    assert not settings_match(recorded, now)
    assert not settings_match(recorded, [{"callback": "DPSCallback", "args": {"decay": 0.5, "new_option": 1,
                                                                              "cold_start": {"reference_size": 32}}}])
    assert not settings_match(recorded, [{"callback": "DPSCallback", "args": {"decay": 0.7,
                                                                              "cold_start": {"reference_size": 32}}}])
