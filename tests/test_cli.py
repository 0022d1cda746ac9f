"""The command line: a 3-step GRPO fit from a YAML file, --print_config, the SFT warm start, and the TensorBoard
event file holding the metric names users know from TRL."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_rlft.cli import main
from tests.conftest import TINY_SMALL

EXPECTED_SCALARS = [
    "reward", "reward_std", "frac_reward_zero_std", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean",
    "clip_ratio/region_mean", "completions/mean_length", "completions/clipped_ratio", "budget/prompts",
    "budget/completions", "budget/generated_tokens", "budget/generation_seconds", "time/generation_s", "loss",
    "val/accuracy",
]


def _config(tmp_path: Path, **model) -> Path:
    cfg = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "max_steps": 3, "log_every_n_steps": 1, "enable_checkpointing": False,
            "num_sanity_val_steps": 0, "enable_progress_bar": False, "default_root_dir": str(tmp_path),
            "val_check_interval": 3, "check_val_every_n_epoch": None,
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                       "init_args": {"save_dir": str(tmp_path), "name": "tb"}},
            "callbacks": [{"class_path": "lit_rlft.callbacks.CompletionLogger", "init_args": {"every_n_steps": 1}}],
        },
        "model": {"model": "tiny", "tiny": TINY_SMALL, "reward_funcs": ["lit_rlft.rewards.countdown_reward"],
                  "num_generations": 4, "max_completion_length": 8, "beta": 0.04, **model},
        "data": {
            "train": {"class_path": "lit_rlft.data.CountdownTask", "init_args": {"size": 64, "split": "train"}},
            "val": {"class_path": "lit_rlft.data.CountdownTask", "init_args": {"size": 8, "split": "test"}},
            "answer_field": None, "batch_size": 4,
        },
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_fit_three_steps_from_yaml_writes_tensorboard_metrics(tmp_path):
    main(["fit", "--config", str(_config(tmp_path))])
    events = list(tmp_path.glob("tb/version_0/events.out.tfevents.*"))
    assert events, "no TensorBoard event file"
    acc = EventAccumulator(str(events[0]), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    tags = set(acc.Tags()["scalars"])
    missing = [t for t in EXPECTED_SCALARS + ["kl"] if t not in tags]
    assert not missing, f"missing scalars: {missing}"
    assert len(acc.Scalars("reward")) == 3
    assert "completions/text_summary" in acc.Tags()["tensors"]  # sample completions as text


def test_print_config_round_trips(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(_config(tmp_path)), "--print_config"])
    assert exc.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["reward_funcs"] == ["lit_rlft.rewards.countdown_reward"]
    assert printed["data"]["train"]["class_path"] == "lit_rlft.data.CountdownTask"


def test_bad_choice_is_rejected_with_the_valid_ones(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(_config(tmp_path)), "--model.loss_type", "ppo"])
    err = capsys.readouterr().err
    assert "loss_type" in err and "dr_grpo" in err


def test_sft_saves_a_checkpoint_that_grpo_loads(tmp_path, monkeypatch):
    out = tmp_path / "sft_model"
    cfg = {
        "trainer": {"accelerator": "cpu", "max_steps": 3, "logger": False, "enable_checkpointing": False,
                    "enable_progress_bar": False, "default_root_dir": str(tmp_path)},
        "model": {"model": "tiny", "tiny": TINY_SMALL, "warmup_steps": 1, "output_dir": str(out)},
        "data": {"train": {"class_path": "lit_rlft.data.CountdownTask", "init_args": {"size": 64}},
                 "batch_size": 8},
    }
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(cfg))
    argv = ["lit-rlft", "sft", "--config", str(path)]
    monkeypatch.setattr(sys, "argv", argv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main()
    assert sys.argv is argv  # restored after LightningCLI parsed the dispatched args
    assert not [w for w in caught if "args parameter" in str(w.message)]  # no "both args and sys.argv" warning
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    grpo_dir = tmp_path / "grpo"
    grpo_dir.mkdir()
    cfg_path = _config(grpo_dir)
    grpo = yaml.safe_load(cfg_path.read_text())
    grpo["model"]["model"] = str(out)
    grpo["model"].pop("tiny")
    cfg_path.write_text(yaml.safe_dump(grpo))
    main(["fit", "--config", str(cfg_path)])


def test_the_engine_is_chosen_in_yaml(tmp_path):
    from lit_rlft.cli import grpo_cli
    from lit_rlft.rollout import HFEngine

    cli = grpo_cli(["--config", str(_config(tmp_path)), "--model.engine", "lit_rlft.rollout.HFEngine",
                    "--model.engine.max_batch_size", "3"], run=False)
    assert isinstance(cli.model.engine, HFEngine) and cli.model.engine.max_batch_size == 3
