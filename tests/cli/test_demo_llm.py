"""``make demo-llm``'s driver end to end on the tiny policy (the real model takes a quarter of an hour): the warm start
on the gym answer format, held-out before, GRPO, held-out after, per chain-sum setting; a rerun reuses the warm
start."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("reasoning_gym")

from lit_rlft.cli import demo_llm  # noqa: E402
from tests.conftest import TINY_SMALL  # noqa: E402

TINY = ["--model.model", "tiny", "--model.tiny", json.dumps(TINY_SMALL), "--data.chat_template", "false"]


def test_the_demo_on_the_tiny_policy_reports_every_setting_before_and_after(tmp_path):
    out = tmp_path / "demo"
    sft = (*TINY, "--data.train.init_args.size", "32", "--model.learning_rate", "1e-3")
    grpo = ("--model.tiny", json.dumps(TINY_SMALL), "--data.chat_template", "false",
            "--data.train.init_args.size", "16", "--data.val.init_args.size", "8", "--trainer.val_check_interval", "2",
            "--model.generation.eval_num_generations", "2")
    report = demo_llm.run(out, threads=1, grpo_steps=2, sft_steps=2, grpo_overrides=grpo, sft_overrides=sft)
    labels = {"sum2x1", "sum3x1", "sum2x2", "sum3x2"}
    settings = {k.rsplit("_", 1)[1] for k in report["after"] if k.startswith("val/accuracy/difficulty_")}
    assert settings <= labels and settings and set(report["before"]) >= {"val/accuracy"}
    assert report["steps"] == 2 and report["budget"]["completions"] == 2 * 4 * 8
    text = (out / "report.md").read_text()
    assert "| accuracy | 8 |" in text and (out / "curves.png").stat().st_size > 1000
    stamp = (out / "sft" / "model" / "config.json").stat().st_mtime_ns
    demo_llm.run(out, threads=1, grpo_steps=1, sft_steps=2, grpo_overrides=grpo, sft_overrides=sft)
    assert (out / "sft" / "model" / "config.json").stat().st_mtime_ns == stamp  # the warm start is reused
