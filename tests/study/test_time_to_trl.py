"""``benchmarks/time_to_trl.py`` in its smallest setting, end to end: TRL's ``GRPOTrainer`` and lit_rlft's uniform and
DPS (candidate sets) runs on an untrained tiny policy, a 16-prompt pool and a few steps; checks what each run records and that the
summary is computed from the curves (not the numbers' meaning)."""

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
    assert time_to_trl.main(["--out", str(out), "--pool-size", "16", "--seeds", "0", "--set", *settings]) == 0
    result = json.loads((out / "time_to_trl.json").read_text())
    trl = json.loads((out / "runs" / "trl-pool16-seed0.json").read_text())
    assert trl["same_prompt_tokens"] and trl["steps"] == 3
    assert trl["mixed_precision"] == "no"  # TRL's default bf16=True would autocast even on a CPU
    assert [p["completions"] for p in trl["curve"]] == [0, 8, 12]  # the start and the marks (6 and 12): 4 per step
    for name in ("uniform-pool16-seed0", "dps_c8-pool16-seed0"):
        run = json.loads((out / "runs" / f"{name}.json").read_text())
        assert run["status"] == "ok" and run["curve"][0]["completions"] == 0
    summary = result["summary"]
    assert summary["trl_final_accuracy"] == trl["curve"][-1]["val/accuracy/learnable"]
    assert set(summary["arms"]) == {"uniform", "dps_c8"}
    for arm in summary["arms"].values():
        assert arm["seeds"] == 1 and 0 <= arm["reached"] <= 1
    assert "TRL's final held-out accuracy" in result["table_markdown"]


def test_time_to_is_the_first_crossing_of_the_curve():
    record = {"curve": [{"completions": 0, "wall_s": 0.0, "val/accuracy/learnable": 0.1},
                        {"completions": 100, "wall_s": 10.0, "val/accuracy/learnable": 0.3},
                        {"completions": 200, "wall_s": 30.0, "val/accuracy/learnable": 0.5}]}
    assert time_to_trl.time_to(record, 0.4) == {"completions": 150.0, "wall_s": 20.0}
    assert time_to_trl.time_to(record, 0.6) == {"completions": None, "wall_s": None}
