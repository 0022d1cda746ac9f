"""``lit-rlft study`` end to end on the tiny policy: two arms, one seed, in this process; resume; a run's config redone
alone gives the run's measurements; the start evaluation is shared; bad input fails before any run starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lit_rlft.cli import main as cli_main
from lit_rlft.study import StudySettings, run_study, study as study_module
from tests.conftest import TINY_SMALL

REWARD = "tests.study.helpers.contains_one"


def tiny_run_config(tmp_path: Path, **data) -> Path:
    """A lit-rlft fit config on the tiny policy with a reward it earns about half the time."""
    cfg = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "max_steps": 3, "log_every_n_steps": 1,
                    "callbacks": [{"class_path": "lit_rlft.callbacks.CompletionLogger",
                                   "init_args": {"every_n_steps": 100}},
                                  {"class_path": "lit_rlft.callbacks.DPSCallback", "init_args": {"decay": 0.5}},
                                  {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint"}]},
        "model": {"model": "tiny", "tiny": TINY_SMALL, "reward_funcs": [REWARD],
                  "generation": {"num_generations": 4, "max_completion_length": 8}, "optim": {"learning_rate": 1e-2}},
        "data": {"train": {"class_path": "lit_rlft.data.CountdownTask", "init_args": {"size": 64, "split": "train"}},
                 "val": {"class_path": "lit_rlft.data.CountdownTask", "init_args": {"size": 16, "split": "test"}},
                 "answer_field": None, "batch_size": 4, **data},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def settings(tmp_path: Path, **overrides) -> StudySettings:
    kw = dict(configs=[str(tiny_run_config(tmp_path))], strategies=["uniform", "mopps"], seeds=[0], completions=48,
              eval_every=24, jobs=0, out=str(tmp_path / "study"), train_subset=8)
    kw.update(overrides)
    return StudySettings(**kw)


def test_two_arms_one_seed_end_to_end_then_resume(tmp_path):
    s = settings(tmp_path)
    study = run_study(s, progress=False)
    out = Path(s.out)
    runs = {r["run"]: r for r in study["runs"]}
    assert set(runs) == {"uniform-seed0", "mopps-seed0"} and all(r["status"] == "ok" for r in runs.values())
    for r in runs.values():
        curve = r["curve"]
        # the start and the two marks, every point past its mark, the clock from the first step
        assert [p["completions"] for p in curve] == [0, 32, 48]  # 16 per step: 24 is crossed at 32
        assert curve[0]["wall_s"] == 0.0 and 0 < curve[1]["wall_s"] < curve[2]["wall_s"]
        assert curve[2]["wall_s"] == pytest.approx(sum(x["step_s"] for x in r["step_log"]))
        assert {"val/accuracy", "val/accuracy/difficulty_2", "train_pool_reward"} <= set(curve[-1])
        assert r["steps"] == 3 and r["budget"]["completions"] == 48 and len(r["step_log"]) == 3
        assert r["environment"]["packages"]["torch"] and r["environment"]["torch_threads"] >= 1
        assert (out / "arms" / r["run"] / "tb").is_dir()
    # one start evaluation for both arms (the second reuses the first's: same probe, same settings)
    first, second = (runs[n]["curve"][0] for n in ("uniform-seed0", "mopps-seed0"))
    assert second.get("shared_start") and not first.get("shared_start")
    assert {k: v for k, v in first.items() if k.startswith("val/")} == \
        {k: v for k, v in second.items() if k.startswith("val/")}
    assert 0 < first["val/accuracy"] < 1  # the reward moves: the figures below mean something
    # the config's own strategy, budget stop and checkpointing were replaced; its logger callback kept
    assert set(study["dropped_callbacks"]) == {"lit_rlft.callbacks.DPSCallback",
                                               "lightning.pytorch.callbacks.ModelCheckpoint"}
    config = yaml.safe_load((out / "arms" / "mopps-seed0" / "config.yaml").read_text())
    paths = [c["class_path"] for c in config["trainer"]["callbacks"]]
    assert paths == ["lit_rlft.callbacks.CompletionLogger", "lit_rlft.callbacks.MoPPSCallback",
                     "lit_rlft.callbacks.BatchCompositionLogger", "lit_rlft.callbacks.RolloutBudgetStop",
                     "lit_rlft.study.StudyCallback"]
    assert config["model"]["generation"]["seed"] == 0 and config["data"]["seed"] == 0
    report = (out / "report.md").read_text()
    assert "## Verdict" in report and "- **mopps**: final held-out accuracy" in report
    assert "| mopps | `MoPPSCallback` |" in report
    # the probe ran first, on the study's config, and heads the report (one seed: no claim on discrimination)
    assert study["summary"]["discriminates"] is None
    assert report.splitlines()[2].startswith("Probe before training (")
    assert study["probe"]["verdict"] and study["probe"]["summary"]["splits"]["train"]["prompts"] == s.probe_prompts
    assert (out / "probe" / "probe.png").stat().st_size > 1000
    for png in ("accuracy_vs_completions.png", "accuracy_vs_time.png"):
        assert (out / png).stat().st_size > 1000
    summary = study["summary"]["strategies"]["mopps"]
    diff = runs["mopps-seed0"]["curve"][-1]["val/accuracy"] - runs["uniform-seed0"]["curve"][-1]["val/accuracy"]
    assert summary["final_diff"]["accuracy"]["mean"] == pytest.approx(diff)

    # Resume: nothing runs again; a strategy's setting re-runs that strategy only.
    again = run_study(s, progress=False)
    assert again["timings"]["runs_executed"] == 0 and again["timings"]["runs_reused"] == 2
    assert [r["curve"] for r in again["runs"]] == [r["curve"] for r in study["runs"]]
    assert again["probe"] == study["probe"]  # the probe of the same config is reused too
    s.overrides = ["MoPPSCallback.decay=1.0"]
    changed = run_study(s, progress=False)
    assert changed["timings"]["runs_executed"] == 1
    assert {r["run"]: r["callbacks"] for r in changed["runs"]}["mopps-seed0"][0]["args"]["decay"] == 1.0


def test_a_runs_config_redone_alone_gives_its_measurements(tmp_path):
    """Each arm is a normal fit: `lit-rlft fit --config arms/<run>/config.yaml` measures what the study measured."""
    s = settings(tmp_path, strategies=["mopps"], baseline="mopps", train_subset=0)
    study = run_study(s, progress=False)
    recorded = study["runs"][0]
    path = Path(s.out) / "arms" / "mopps-seed0" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    again = tmp_path / "again"
    for entry in config["trainer"]["callbacks"]:
        if entry["class_path"] == "lit_rlft.study.StudyCallback":
            entry["init_args"].update(out=str(again / "m.json"), start_cache=None)
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(again)
    redo = tmp_path / "redo.yaml"
    redo.write_text(yaml.safe_dump(config))
    cli_main(["fit", "--config", str(redo)])
    measured = json.loads((again / "m.json").read_text())
    keys = ("step", "completions", "val/accuracy", "val/pass@1")
    assert [{k: p[k] for k in keys} for p in measured["curve"]] == [{k: p[k] for k in keys} for p in recorded["curve"]]


def test_a_two_arm_study_through_fabric_measures_what_the_trainer_measures(tmp_path):
    """``--loop fabric``: each arm runs through FabricLoop, the same step, callbacks and measurement over the declared
    step context, so every figure of every point equals the Trainer's (the two drivers train bit for bit alike)."""
    trainer = run_study(settings(tmp_path, out=str(tmp_path / "trainer")), progress=False)
    fabric = run_study(settings(tmp_path, out=str(tmp_path / "fabric"), loop="fabric"), progress=False)
    config = yaml.safe_load((tmp_path / "fabric" / "arms" / "mopps-seed0" / "config.yaml").read_text())
    assert config["trainer"]["callbacks"][-1]["class_path"] == "lit_rlft.study.StudyCallback"
    for a, b in zip(trainer["runs"], fabric["runs"], strict=True):
        assert a["run"] == b["run"] and b["status"] == "ok", b.get("log_tail")
        assert a["fingerprint"] != b["fingerprint"]  # another driver is another run: neither reuses the other
        assert len(b["curve"]) == 3 and not any("val/accuracy" not in p for p in b["curve"])
        for p, q in zip(a["curve"], b["curve"], strict=True):
            assert {k: v for k, v in p.items() if not k.endswith("_s")} == \
                {k: v for k, v in q.items() if not k.endswith("_s")}
        assert [x["zero_spread_completions"] for x in a["step_log"]] == \
            [x["zero_spread_completions"] for x in b["step_log"]]
        untimed = [{k: v for k, v in r["budget"].items() if not k.endswith("_s")} for r in (a, b)]
        assert untimed[0] == untimed[1] and a["steps"] == b["steps"] == 3
        assert b["series"]["reward"] == a["series"]["reward"]  # Fabric's TensorBoard under the run's folder
        assert b["series"].get("mopps/effective_ratio") == a["series"].get("mopps/effective_ratio")
    assert fabric["summary"]["strategies"]["mopps"]["final_diff"] == \
        trainer["summary"]["strategies"]["mopps"]["final_diff"]
    assert fabric["settings"]["loop"] == "fabric"


def test_a_killed_study_resumes_with_the_finished_runs_and_runs_the_rest(tmp_path):
    s = settings(tmp_path, train_subset=0)
    run_study(s, progress=False)
    out = Path(s.out)
    killed = out / "runs" / "mopps-seed0.json"
    record = json.loads(killed.read_text())
    killed.write_text(json.dumps({**record, "status": "failed", "error": "killed"}))  # as a kill leaves it
    again = run_study(s, progress=False)
    assert again["timings"]["runs_executed"] == 1 and again["timings"]["runs_reused"] == 1
    assert all(r["status"] == "ok" for r in again["runs"])


def test_runs_in_subprocesses_side_by_side_with_a_trl_arm(tmp_path):
    pytest.importorskip("trl")
    s = settings(tmp_path, strategies=["uniform", "trl"], jobs=2, train_subset=0)
    study = run_study(s, progress=False)
    runs = {r["run"]: r for r in study["runs"]}
    assert all(r["status"] == "ok" for r in runs.values()), {k: r.get("log_tail") for k, r in runs.items()}
    trl = runs["trl-seed0"]
    assert [p["completions"] for p in trl["curve"]] == [0, 32, 48]
    assert len(trl["step_log"]) == 3 and all(x["zero_spread_completions"] is not None for x in trl["step_log"])
    # TRL's start is lit_rlft's start: the same policy (the probe matched), so the shared evaluation served it
    starts = [r["curve"][0] for r in runs.values()]
    assert sum(bool(p.get("shared_start")) for p in starts) == 1
    assert starts[0]["val/accuracy"] == starts[1]["val/accuracy"]
    assert "reward" in trl["series"] and "frac_reward_zero_std" in trl["series"]
    assert (Path(s.out) / "arms" / "trl-seed0" / "log.txt").read_text().startswith("$ ")
    assert trl["environment"]["packages"]["trl"] and trl["environment"]["torch_threads"] >= 1  # its measurements'


# -- bad input: one line, before any run starts ----------------------------------------------------------------------
def _study_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        cli_main(["study", *argv])
    assert exc.value.code == 2
    return capsys.readouterr().err.strip()


def test_bad_input_fails_before_any_run(tmp_path, capsys, monkeypatch):
    cfg = str(tiny_run_config(tmp_path))
    out = tmp_path / "out"
    base = ["--config", cfg, "--out", str(out), "--seeds", "0", "--jobs", "0"]
    err = _study_error(capsys, [*base, "--strategies", "uniform,dsp"])
    assert "lit-rlft study: error: --strategies: unknown strategy 'dsp': choose from uniform," in err
    err = _study_error(capsys, [*base, "--strategies", "uniform,mine.yaml"])
    assert err == "lit-rlft study: error: --strategies: strategy overlay mine.yaml: no such file"
    overlay = tmp_path / "bad.yaml"
    overlay.write_text("trainer:\n  callbacks:\n    - class_path: lit_rlft.callbacks.DPSCallback\n"
                       "      init_args: {decy: 0.5}\n")
    err = _study_error(capsys, [*base, "--strategies", str(overlay)])
    assert f"strategy overlay {overlay}: trainer.callbacks[0]: DPSCallback got an unexpected keyword argument 'decy'" \
        in err
    err = _study_error(capsys, [*base, "--strategies", "uniform,dps", "--set", "dsp:DPSCallback.decay=0.7"])
    assert err == ("lit-rlft study: error: --set 'dsp:DPSCallback.decay=0.7': the study has no arm 'dsp' (arms: "
                   "uniform, dps)")
    err = _study_error(capsys, [*base, "--strategies", "uniform,dps", "--set", "DPSCallback.decy=0.7"])
    assert err.startswith("lit-rlft study: error: --set 'DPSCallback.decy=0.7': DPSCallback takes no argument 'decy' "
                          "(it takes decay, prior,")
    err = _study_error(capsys, [*base, "--completions", "15"])
    assert err == ("lit-rlft study: error: --completions 15 is less than one step: data.batch_size (4) x "
                   "model.generation.num_generations (4) = 16")
    err = _study_error(capsys, ["--config", str(tiny_run_config(tmp_path, val=None)), "--out", str(out)])
    assert "has no held-out data: the study measures held-out accuracy on data.val" in err
    monkeypatch.setattr(study_module, "cores", lambda: 2)
    err = _study_error(capsys, [*base[:-2], "--jobs", "3"])
    assert err == "lit-rlft study: error: --jobs 3: this machine has 2 cores; give 0 (in this process) to 2"
    err = _study_error(capsys, ["--config", str(tmp_path / "missing.yaml"), "--out", str(out)])
    assert err == f"lit-rlft study: error: --config {tmp_path / 'missing.yaml'}: no such file"
    assert not out.exists()  # nothing started


def test_a_reward_that_cannot_score_the_held_out_rows_fails_before_any_run(tmp_path, capsys):
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": "#### 3"}) + "\n" for i in range(4)))
    cfg = yaml.safe_load(tiny_run_config(tmp_path).read_text())
    cfg["model"]["reward_funcs"] = ["lit_rlft.rewards.countdown_reward"]
    cfg["data"]["val"] = str(val)  # GSM8K-like rows: no nums, no target
    path = tmp_path / "gsm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    err = _study_error(capsys, ["--config", str(path), "--out", str(tmp_path / "out")])
    assert "reward 'countdown_reward' cannot score the held-out rows of data.val (columns " in err
    assert "missing 2 required positional arguments: 'nums' and 'target'" in err
    assert not (tmp_path / "out").exists()


def test_a_config_that_does_not_build_names_the_key(tmp_path, capsys):
    cfg = yaml.safe_load(tiny_run_config(tmp_path).read_text())
    cfg["model"]["generation"]["num_generatoins"] = 4
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    err = _study_error(capsys, ["--config", str(path), "--out", str(tmp_path / "out")])
    assert err.startswith("lit-rlft study: error: the run config does not build:") and "num_generatoins" in err


@pytest.mark.parametrize("loop", ["trainer", "fabric"])
def test_a_run_killed_mid_way_resumes_from_its_last_mark_and_measures_what_the_whole_run_measures(tmp_path, loop):
    """A checkpoint after every evaluation but the last: the killed run goes on from its last mark (selection state,
    plan, curve and clocks restored) and ends with the uninterrupted run's measurements, under either driver."""
    flag = tmp_path / "kill"
    cfg = yaml.safe_load(tiny_run_config(tmp_path).read_text())
    cfg["trainer"]["callbacks"].append({"class_path": "tests.study.helpers.CrashAt",
                                        "init_args": {"step": 3, "flag": str(flag)}})
    path = tmp_path / "crash.yaml"
    path.write_text(yaml.safe_dump(cfg))
    kw = dict(strategies=["mopps"], baseline="mopps", completions=64, eval_every=16, train_subset=0, loop=loop)
    whole = run_study(settings(tmp_path, out=str(tmp_path / "whole"), **kw), progress=False)["runs"][0]
    flag.touch()
    s = settings(tmp_path, configs=[str(path)], **kw)
    killed = run_study(s, progress=False)["runs"][0]
    run_dir = Path(s.out) / "arms" / "mopps-seed0"
    assert killed["status"] == "failed" and "killed" in killed["error"] + killed["log_tail"]
    assert [p["completions"] for p in killed["curve"]] == [0, 16, 32] and (run_dir / "resume.ckpt").exists()
    flag.unlink()
    resumed = run_study(s, progress=False)["runs"][0]
    assert resumed["status"] == "ok" and resumed["resumed_from"] == str(run_dir / "resume.ckpt")
    keys = ("step", "completions", "val/accuracy", "val/pass@1", "val/accuracy/difficulty_3")
    assert [{k: p[k] for k in keys} for p in resumed["curve"]] == [{k: p[k] for k in keys} for p in whole["curve"]]
    assert [x["zero_spread_completions"] for x in resumed["step_log"]] == \
        [x["zero_spread_completions"] for x in whole["step_log"]]
    assert resumed["series"]["reward"] == whole["series"]["reward"]  # the same batches, chosen by the same MoPPS
    assert resumed["curve"][2]["wall_s"] == killed["curve"][2]["wall_s"]  # the clock went on from the checkpoint
    assert not (run_dir / "resume.ckpt").exists()  # finished: deleted
