"""The arms of a study: shipped strategies and a user's overlay file, and what the study does to the run config."""

from __future__ import annotations

import dataclasses

import pytest

from lit_rlft.study.compose import dropped_callbacks, merge, run_config
from lit_rlft.study.strategies import ArmError, resolve_arm


def test_an_overlay_file_is_an_arm_named_after_it_with_the_runs_seed(tmp_path):
    path = tmp_path / "my_dps.yaml"
    path.write_text("trainer:\n  callbacks:\n"
                    "    - class_path: lit_rlft.callbacks.CompletionLogger\n      init_args: {every_n_steps: 5}\n"
                    "    - class_path: lit_rlft.callbacks.DPSCallback\n      init_args: {decay: 0.7}\n"
                    "    - class_path: lit_rlft.callbacks.MoPPSCallback\n      init_args: {seed: 11}\n")
    arm = resolve_arm(str(path))
    assert arm.name == "my_dps" and arm.selection_name() == "dps"
    specs = arm.specs(seed=3)
    # the logger is left to the base config; a seed the file does not give is the run's, one it gives is kept
    assert [(s.cls.__name__, s.kwargs.get("seed")) for s in specs] == [("DPSCallback", 3), ("MoPPSCallback", 11)]
    assert specs[0].config() == {"class_path": "lit_rlft.callbacks.DPSCallback",
                                 "init_args": {"decay": 0.7, "seed": 3}}
    settings = arm.settings(seed=3)
    assert settings[0]["args"]["decay"] == 0.7 and settings[0]["args"]["prior"] == "uniform"  # defaults included


@pytest.mark.parametrize("text, message", [
    ("trainer: {callbacks: []}\n: bad", "not valid YAML"),
    ("model: {model: tiny}\n", "no trainer.callbacks list"),
    ("trainer:\n  callbacks:\n    - class_path: lit_rlft.callbacks.NoSuch\n", "trainer.callbacks[0]: cannot resolve"),
    ("trainer:\n  callbacks:\n    - lit_rlft.callbacks.DPSCallback\n", "expected a mapping with class_path"),
])
def test_a_bad_overlay_names_the_file_and_the_entry(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ArmError, match=message.replace("[", r"\[").replace("]", r"\]")):
        resolve_arm(str(path))


def test_the_shipped_strategies_configs_are_their_callbacks():
    arm = resolve_arm("dps_c8_handback")
    assert [s.config()["class_path"] for s in arm.specs(0)] == [
        "lit_rlft.callbacks.DPSCallback", "lit_rlft.callbacks.UniformHandbackCallback"]
    assert resolve_arm("uniform").specs(0) == []


def test_the_run_config_replaces_strategies_stops_and_checkpoints_and_sets_the_seed():
    base = {"trainer": {"max_steps": 7, "val_check_interval": 5, "check_val_every_n_epoch": None,
                        "callbacks": [{"class_path": "lit_rlft.callbacks.CompletionLogger"},
                                      {"class_path": "lit_rlft.callbacks.GRESOCallback"},
                                      {"class_path": "lit_rlft.callbacks.RolloutBudgetStop",
                                       "init_args": {"max_completions": 5}},
                                      {"class_path": "lightning.pytorch.callbacks.EarlyStopping",
                                       "init_args": {"monitor": "val/accuracy"}}]},
            "model": {"generation": {"num_generations": 4, "seed": 9}}, "data": {"batch_size": 2, "seed": 9}}
    assert dropped_callbacks(base) == ["lit_rlft.callbacks.GRESOCallback", "lit_rlft.callbacks.RolloutBudgetStop",
                                       "lightning.pytorch.callbacks.EarlyStopping"]
    arm = [{"class_path": "lit_rlft.callbacks.DPSCallback"}]
    study = [{"class_path": "lit_rlft.study.StudyCallback"}]
    config = run_config(base, arm, study, seed=4, run_dir="out/dps-seed4", max_steps=99)
    t = config["trainer"]
    assert [c["class_path"] for c in t["callbacks"]] == ["lit_rlft.callbacks.CompletionLogger",
                                                         "lit_rlft.callbacks.DPSCallback", "lit_rlft.study.StudyCallback"]
    assert t["max_steps"] == 99 and t["limit_val_batches"] == 0 and "val_check_interval" not in t
    assert t["logger"]["init_args"] == {"save_dir": "out/dps-seed4", "name": "tb", "version": ""}
    assert config["seed_everything"] == 4 and config["model"]["generation"] == {"num_generations": 4, "seed": 4}
    assert config["data"] == {"batch_size": 2, "seed": 4}
    assert base["model"]["generation"]["seed"] == 9  # the user's config is not changed


def test_config_files_merge_as_jsonargparse_merges_them():
    assert merge({"a": {"b": 1, "c": [1, 2]}, "d": 1}, {"a": {"c": [3]}, "e": 2}) == {"a": {"b": 1, "c": [3]},
                                                                                       "d": 1, "e": 2}


def test_every_shipped_strategy_is_an_overlay_file_under_configs_study():
    from lit_rlft.study.strategies import PRESETS, STRATEGIES

    assert sorted(p.stem for p in PRESETS.glob("*.yaml")) == sorted(STRATEGIES)
    for name in STRATEGIES:
        arm = resolve_arm(name)
        assert arm.shipped and arm.name == name and arm.path == str(PRESETS / f"{name}.yaml")
        # the file read as a user's overlay is the same arm
        assert dataclasses.replace(resolve_arm(str(PRESETS / f"{name}.yaml")), shipped=True) == arm
