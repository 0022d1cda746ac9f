"""``benchmarks/time_to_trl.py`` in its smallest setting, end to end: a study of the product with TRL's
``GRPOTrainer`` as the baseline arm beside lit_rlft's uniform and DPS (candidate sets) runs, on an untrained tiny
policy, a 16-prompt pool and a few steps; checks what each run records and that the summary is the product's (the
numbers' meaning is the product's tests' business)."""

from __future__ import annotations

import json

import pytest

from benchmarks import time_to_trl
from tests.conftest import TINY_SMALL

pytest.importorskip("trl")

SMALLEST = {"warm_start": "tiny", "tiny": TINY_SMALL, "batch_size": 2, "num_generations": 2,
            "max_completion_length": 4, "warmup_steps": 1, "budget_completions": 12, "num_evals": 2, "eval_size": 8,
            "train_subset_size": 4, "train_subset_generations": 2, "eval_num_generations": 2}


def test_the_smallest_setting_runs_trl_and_lit_rlft_and_summarises_the_crossings(tmp_path):
    """The tiny policy's own tokenizer is saved with the warm start, so TRL sees lit_rlft's prompt tokens (the run
    refuses otherwise); every run is measured at the start and at the study's marks."""
    from lit_rlft.models.tiny import TinyConfig, save_tiny_policy

    warm = save_tiny_policy(tmp_path / "warm", TinyConfig(**TINY_SMALL))
    settings = [f"{k}={json.dumps(v)}" for k, v in {**SMALLEST, "warm_start": str(warm)}.items() if k != "tiny"]
    out = tmp_path / "out"
    assert time_to_trl.main(["--out", str(out), "--pool-size", "16", "--seeds", "0", "--jobs", "2",
                             "--set", *settings]) == 0
    result = json.loads((out / "time_to_trl.json").read_text())
    assert result["format"] == 2
    trl = json.loads((out / "study" / "runs" / "trl-seed0.json").read_text())
    assert trl["status"] == "ok", trl.get("log_tail")
    assert [p["completions"] for p in trl["curve"]] == [0, 8, 12]  # the start and the marks (6 and 12): 4 per step
    for name in ("uniform-seed0", "dps_c8-seed0"):
        run = json.loads((out / "study" / "runs" / f"{name}.json").read_text())
        assert run["status"] == "ok" and run["curve"][0]["completions"] == 0
    summary = result["summary"]
    assert summary["baseline"] == "trl"
    assert summary["targets"]["accuracy"] == trl["curve"][-1]["val/accuracy/learnable"]
    assert set(summary["strategies"]) == {"trl", "uniform", "dps_c8"}
    # TRL's own crossing of its target by the same rule: one seed, so it reaches it at or before its end
    assert summary["strategies"]["trl"]["reached"]["accuracy"] == 1
    assert "| trl |" in result["table_markdown"] and "- **uniform**" in result["table_markdown"]


def test_the_recorded_tables_are_format_two_and_a_format_one_record_is_refused_with_its_command():
    from pathlib import Path

    for name in ("time_to_trl_pool4000.json", "time_to_trl_skewed_pool1000.json"):
        recorded = json.loads((Path(time_to_trl.REPO) / "benchmarks" / "results" / name).read_text())
        assert recorded["format"] == 2
        trl = recorded["summary"]["strategies"]["trl"]["final"]["accuracy"]["mean"]
        assert time_to_trl.result_table(recorded) == recorded["table_markdown"]
        assert f"against trl's {trl:.3f}" in recorded["table_markdown"]
    old = {"command": "python -m benchmarks.time_to_trl --out runs/x", "summary": {"trl_final_accuracy": 0.3}}
    with pytest.raises(ValueError, match=r"old\.json is a time-to-TRL record of format 1.*regenerate it with: "
                                         r"python -m benchmarks\.time_to_trl --out runs/x"):
        time_to_trl.result_table(old, source="old.json")
