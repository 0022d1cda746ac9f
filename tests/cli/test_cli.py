"""The command line: a 3-step GRPO fit from a YAML file, --print_config, the SFT warm start, and the TensorBoard
event file holding the metric names users know from TRL."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_rlft.cli import main
from tests.conftest import REPO, TINY_SMALL

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
                  "generation": {"num_generations": 4, "max_completion_length": 8}, "loss": {"beta": 0.04}, **model},
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
        main(["fit", "--config", str(_config(tmp_path)), "--model.loss.loss_type", "ppo"])
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
    assert isinstance(cli.model.grpo.source.engine, HFEngine) and cli.model.grpo.source.engine.max_batch_size == 3


# -- the whole surface -------------------------------------------------------------------------------------------
def test_top_level_help_lists_every_command_with_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lit-rlft <command> [options]\n")
    commands = [line.split()[0] for line in out.split("commands:\n")[1].split("\n\n")[0].splitlines()]
    assert commands == ["fit", "validate", "sft", "probe", "study", "dots-adapters", "serve"]
    assert "  validate       held-out evaluation (data.val) of a policy or a --ckpt_path\n" in out
    assert "Not offered: test and predict" in out and "python -m benchmarks.study --help" in out


@pytest.mark.parametrize(("argv", "message"), [
    ([], "lit-rlft: error: a command is required: fit, validate, sft, probe, study, dots-adapters, serve (see `lit-rlft --help`)"),
    (["predict", "--config", "x.yaml"], "lit-rlft: error: 'predict' is not offered: GRPOModule has no predict_step "
     "(generation runs inside fit and validate); `lit-rlft validate` runs the held-out evaluation (data.val)"),
    (["test"], "lit-rlft: error: 'test' is not offered: GRPOModule has no test_step; `lit-rlft validate` runs the "
     "held-out evaluation (data.val)"),
    (["fitt"], "lit-rlft: error: unknown command 'fitt': choose from fit, validate, sft, probe, study, dots-adapters, "
     "serve (see `lit-rlft --help`)"),
])
def test_missing_unknown_and_unoffered_commands(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == message


@pytest.mark.parametrize(("argv", "usage"), [
    (["sft", "--help"], "usage: lit-rlft sft "),
    (["dots-adapters", "--help"], "usage: lit-rlft dots-adapters "),
    (["serve", "--help"], "usage: lit-rlft serve "),
    (["fit", "--help"], "usage: lit-rlft [options] fit "),
    (["validate", "--help"], "usage: lit-rlft [options] validate "),
])
def test_each_command_help_names_the_command(capsys, argv, usage):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(usage)


def test_validate_runs_the_held_out_evaluation(tmp_path):
    from lit_rlft.cli import grpo_cli

    cli = grpo_cli(["validate", "--config", str(_config(tmp_path))])
    assert cli.trainer.callback_metrics["val/n/accuracy"] == 8


# -- one-line errors ---------------------------------------------------------------------------------------------
def _error(capsys, argv: list[str]) -> str:
    """The CLI's stderr for ``argv``, which must exit with status 2 after one line."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line and not line.startswith("Seed set")]
    assert len(lines) == 1, lines
    return lines[0]


DPS_OPTIONS = "decay, prior, entropy_bonus, confusion_every_n_steps, cold_start, candidate_ratio, seed"


def test_unknown_callback_option_on_the_command_line(tmp_path, capsys):
    err = _error(capsys, ["fit", "--config", str(_config(tmp_path)),
                          "--trainer.callbacks+=lit_rlft.callbacks.DPSCallback", "--trainer.callbacks.init_args.bogus=1"])
    assert err == (f"lit-rlft fit: error: trainer.callbacks (lit_rlft.callbacks.DPSCallback): unknown option 'bogus'; "
                   f"valid options: {DPS_OPTIONS}")


def _edited(tmp_path: Path, edit) -> str:
    path = _config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    edit(cfg)
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_wrong_type_for_a_callback_option_in_yaml(tmp_path, capsys):
    cfg = _edited(tmp_path, lambda c: c["trainer"]["callbacks"][0]["init_args"].update(every_n_steps="often"))
    assert _error(capsys, ["fit", "--config", cfg]) == (
        "lit-rlft fit: error: trainer.callbacks (lit_rlft.callbacks.CompletionLogger): option 'every_n_steps': "
        "expected int, got 'often'")


def test_misspelt_option_of_a_class_in_yaml_gets_the_closest_one(tmp_path, capsys):
    cfg = _edited(tmp_path, lambda c: c["data"]["train"]["init_args"].update(sise=3))
    err = _error(capsys, ["fit", "--config", cfg])
    assert err.startswith("lit-rlft fit: error: data.train (lit_rlft.data.CountdownTask): unknown option 'sise' "
                          "(did you mean 'size'?); valid options: size, num_numbers, ")


def test_plain_option_typos_and_types_keep_jsonargparse_messages(tmp_path, capsys):
    cfg = _edited(tmp_path, lambda c: c["model"]["generation"].update(num_generation=4))
    err = _error(capsys, ["fit", "--config", cfg])  # jsonargparse's wording: Group ... or Subcommand 'fit' ...
    assert err.startswith("lit-rlft fit: error: model.generation (lit_rlft.GenerationConfig): unknown option "
                          "'num_generation' (did you mean 'num_generations'?); valid options: num_generations, ")
    assert _error(capsys, ["fit", "--config", str(_config(tmp_path)), "--model.generation.num_generationz", "4"]) == (
        err.replace("'num_generation'", "'num_generationz'"))
    assert _error(capsys, ["fit", "--config", str(_config(tmp_path)), "--model.num_generationz", "4"]) == (
        "lit-rlft fit: error: unrecognized arguments: --model.num_generationz 4: did you mean --model.generation? "
        "(see `lit-rlft fit --help`)")
    assert _error(capsys, ["fit", "--config", str(_config(tmp_path)), "--model.generation.num_generations",
                           "four"]) == ("lit-rlft fit: error: model.generation (lit_rlft.GenerationConfig): option 'num_generations': "
                                     "expected int, got 'four'")
    err = _error(capsys, ["fit", "--config", str(_config(tmp_path)), "--model.loss.loss_type", "ppo"])
    assert err.startswith("lit-rlft fit: error: model.loss (lit_rlft.GRPOLoss): option 'loss_type': expected one of "
                          "'grpo', 'dapo', 'dr_grpo', ") and err.endswith(", got 'ppo'")


@pytest.mark.parametrize("where", ["yaml", "command line"])
def test_a_key_of_lit_rlft_0_2_points_to_its_new_place(tmp_path, capsys, where):
    if where == "yaml":
        args = ["fit", "--config", _edited(tmp_path, lambda c: c["model"].update(learning_rate=3e-5))]
    else:
        args = ["fit", "--config", str(_config(tmp_path)), "--model.learning_rate", "3e-5"]
    assert _error(capsys, args) == (
        "lit-rlft fit: error: model.learning_rate moved to model.optim.learning_rate in lit_rlft 0.3 (YAML: nest it "
        "under model.optim; command line: --model.optim.learning_rate)")


@pytest.mark.parametrize("where", ["yaml", "command line"])
def test_an_asynchronous_key_of_lit_rlft_0_3_points_to_its_new_group(tmp_path, capsys, where):
    """The pipeline's settings left ``model.generation`` (sampling) for ``model.asynchronous``: the old key fails
    with its new place."""
    if where == "yaml":
        args = ["fit", "--config", _edited(tmp_path, lambda c: c["model"].setdefault("generation", {}).update(
            async_depth=1))]
    else:
        args = ["fit", "--config", str(_config(tmp_path)), "--model.generation.async_depth", "1"]
    assert _error(capsys, args) == (
        "lit-rlft fit: error: model.generation.async_depth moved to model.asynchronous.depth after lit_rlft 0.3 "
        "(YAML: model.asynchronous: {depth: ...}; command line: --model.asynchronous.depth)")


def test_constructor_errors_name_the_class(tmp_path, capsys):
    cfg = str(_config(tmp_path))
    assert _error(capsys, ["fit", "--config", cfg, "--model.generation.num_generations", "1"]) == (
        "lit-rlft fit: error: model.generation.num_generations must be >= 2 for group-relative advantages, got 1")
    assert _error(capsys, ["fit", "--config", cfg, "--trainer.callbacks+=lit_rlft.callbacks.DPSCallback",
                           "--trainer.callbacks.candidate_ratio=-1"]) == (
        "lit-rlft fit: error: trainer.callbacks (lit_rlft.callbacks.dps.DPSCallback): `candidate_ratio` must be an "
        "integer >= 1 or None (the whole pool), got -1")


def test_sft_errors_name_the_sft_command(capsys):
    assert _error(capsys, ["sft", "--model.bogus", "1"]).startswith(
        "lit-rlft sft: error: unrecognized arguments: --model.bogus 1")
    sft = str(REPO / "configs" / "sft_countdown_tiny.yaml")
    assert _error(capsys, ["sft", "--config", sft, "--model.lora.r", "0"]) == (
        "lit-rlft sft: error: lit_rlft.models.loading.LoRAConfig: lora.r must be >= 1, got 0")
    assert _error(capsys, ["sft", "--config", sft, "--model.model", "/no/such/model"]) == (
        "lit-rlft sft: error: model path '/no/such/model' does not exist")


# -- model paths, data files and checkpoints, before step 0 ------------------------------------------------------
def test_missing_model_path_is_one_line_before_training(tmp_path, capsys):
    missing = tmp_path / "runs" / "sft" / "model"
    err = _error(capsys, ["fit", "--config", str(_config(tmp_path)), "--model.model", str(missing)])
    assert err == (f"lit-rlft fit: error: model path '{missing}' does not exist: it looks like the output of "
                   "`lit-rlft sft` (model.output_dir); run the SFT warm start first")
    assert not (tmp_path / "tb").exists()  # nothing ran


def test_the_readme_demo_before_its_warm_start_says_to_run_sft(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    if Path("runs/sft/model").exists():
        pytest.skip("the SFT warm start has been run in this checkout")
    assert _error(capsys, ["fit", "--config", "configs/countdown_tiny.yaml"]) == (
        "lit-rlft fit: error: model path 'runs/sft/model' does not exist: it is written by the SFT warm start; run "
        "`lit-rlft sft --config configs/sft_countdown_tiny.yaml` first")


def test_the_demo_runs_end_to_end_and_reports_the_step_and_budget(tmp_path):
    """``make demo``'s path (shipped configs, SFT, validation, GRPO, report) at one step each and a small held-out
    set; the report's step count and completions come from the step that ran."""
    from lit_rlft.cli.demo import run

    small = ["--data.batch_size", "4", "--data.train.init_args.size", "64", "--data.val.init_args.size", "12",
             "--data.val_batch_size", "12", "--trainer.val_check_interval", "1"]
    report = run(tmp_path, threads=1, grpo_steps=1, sft_steps=1, grpo_overrides=small)
    assert report["steps"] == 1
    assert report["budget"]["completions"] == 4 * 8  # one step: 4 prompts x 8 completions, nothing else generated
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["steps"] == 1
    assert written["environment"]["torch_threads"] == 1  # the demo's threads, recorded with its result
    md = (tmp_path / "report.md").read_text()
    assert md.splitlines()[2].startswith("1 GRPO steps, 32 completions")
    assert "| accuracy | 12 |" in md and (tmp_path / "curves.png").is_file()
    assert "This table differs from the README's recorded ones (AMD EPYC, AVX2; " in md  # the clone's records


def test_empty_data_file_is_one_line_naming_the_option_and_file(tmp_path, capsys):
    empty = tmp_path / "train.jsonl"
    empty.write_text("")
    err = _error(capsys, ["fit", "--config", str(_config(tmp_path)), "--data.train", str(empty)])
    assert err == (f"lit-rlft fit: error: data.train: data file '{empty}' holds no records (it is empty, or only "
                   "blank lines)")


def test_checkpoints_are_written_atomically_and_bad_ones_refused_in_one_line(tmp_path, capsys):
    from lit_rlft.cli import grpo_cli
    from lit_rlft.lightning.checkpointing import AtomicCheckpointIO

    every_2 = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
               "init_args": {"dirpath": str(tmp_path / "ckpts"), "every_n_train_steps": 2}}
    cfg = _edited(tmp_path, lambda c: c["trainer"].update(enable_checkpointing=True, max_steps=2, logger=False,
                                                          callbacks=[every_2]))
    cli = grpo_cli(["fit", "--config", cfg])
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    (saved,) = (tmp_path / "ckpts").iterdir()
    assert saved.name == "epoch=0-step=2.ckpt"  # and no <name>.tmp-<pid> left beside it
    grpo_cli(["validate", "--config", cfg, "--ckpt_path", str(saved)])  # a good one loads
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(saved.read_bytes()[:4096])
    assert _error(capsys, ["fit", "--config", cfg, "--ckpt_path", str(truncated)]) == (
        f"lit-rlft fit: error: --ckpt_path: checkpoint '{truncated}' is not a lit_rlft / Lightning checkpoint, or is "
        "truncated (no zip end-of-archive record in its 4096 bytes)")
    corrupt = tmp_path / "corrupt.ckpt"
    data = bytearray(saved.read_bytes())
    start = data.index(b"data.pkl") + 40
    data[start : start + 20] = b"\xff" * 20  # the archive's directory intact, its pickle not
    corrupt.write_bytes(bytes(data))
    err = _error(capsys, ["validate", "--config", cfg, "--ckpt_path", str(corrupt)])
    assert err.startswith(f"lit-rlft validate: error: --ckpt_path: checkpoint '{corrupt}' is not a lit_rlft / "
                          "Lightning checkpoint, or is truncated (")
    assert "weights_only" not in err
    assert _error(capsys, ["fit", "--config", cfg, "--ckpt_path", str(tmp_path / "nope.ckpt")]) == (
        f"lit-rlft fit: error: --ckpt_path: checkpoint '{tmp_path / 'nope.ckpt'}' does not exist")


LOSS_VARIANTS = {
    "grpo": ["--model.loss.loss_type", "grpo"],
    "bnpo": ["--model.loss.loss_type", "bnpo"],
    "dr_grpo": ["--model.loss.loss_type", "dr_grpo", "--model.loss.delta", "2.0"],
    "gspo": ["--model.loss.importance_sampling_level", "sequence"],
    "cispo": ["--model.loss.loss_type", "cispo", "--model.loss.epsilon_high", "5.0",
              "--model.loss.importance_sampling_level", "sequence"],
    "sapo": ["--model.loss.loss_type", "sapo"],
    "luspo": ["--model.loss.loss_type", "luspo"],
    "vespo": ["--model.loss.loss_type", "vespo"],
    "entropy": ["--model.loss.top_entropy_quantile", "0.2", "--model.loss.entropy_coef", "0.01",
                "--model.loss.use_adaptive_entropy", "true", "--model.loss.off_policy_mask_threshold", "0.5"],
}


@pytest.mark.parametrize("name", sorted(LOSS_VARIANTS))
def test_every_loss_variant_trains_from_the_command_line(tmp_path, name):
    """TRL's option names under model.loss, one training step each (with a KL term, and DAPO's soft overlong
    punishment from YAML as a second reward), logging TRL's metric names where TRL has one."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overlong = {"class_path": "lit_rlft.rewards.SoftOverlongPunishment",
                "init_args": {"max_completion_length": 8, "soft_punish_cache": 4}}
    cfg = _edited(tmp_path, lambda c: c["model"].update(reward_funcs=["lit_rlft.rewards.countdown_reward", overlong]))
    from lit_rlft.cli import grpo_cli

    args = LOSS_VARIANTS[name]
    cli = grpo_cli(["fit", "--config", cfg, "--trainer.max_steps", "1", *args])
    trained = cli.model.grpo.updater.loss_fn  # the loss the update ran with carries every option given
    for option, text in zip(args[::2], args[1::2]):
        field = option.removeprefix("--model.loss.")
        actual = getattr(trained, field)
        expected = text == "true" if isinstance(actual, bool) else type(actual)(text)
        assert actual == expected, (field, actual, text)
    (events,) = list(tmp_path.glob("tb/version_0/events.out.tfevents.*"))
    tags = set(EventAccumulator(str(events), size_guidance={"scalars": 0}).Reload().Tags()["scalars"])
    assert {"loss", "kl", "rewards/soft_overlong_punishment/mean"} <= tags
    expected = {"cispo": "cispo_clip_ratio", "vespo": "vespo/phi_seq_mean", "entropy": "entropy_coef",
                "sapo": "loss"}  # SAPO gates softly: there is no clip to count
    assert expected.get(name, "clip_ratio/region_mean") in tags, sorted(tags)


def test_the_guessing_game_configs_run_from_yaml(tmp_path):
    """The shipped multi-turn configs as a user runs them (shortened): the warm start, then GRPO with the
    environment; TensorBoard gets the episode scalars and the transcripts."""
    configs = REPO / "configs" / "envs"
    sft_out = tmp_path / "guess_sft"
    main(["sft", "--config", str(configs / "sft_guess_number_tiny.yaml"), "--trainer.max_steps", "3",
          "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
          "--trainer.default_root_dir", str(tmp_path), "--model.tiny", yaml.safe_dump(TINY_SMALL, default_flow_style=True),
          "--model.output_dir", str(sft_out), "--data.train.init_args.size", "256", "--data.batch_size", "16"])
    main(["fit", "--config", str(configs / "guess_number_tiny.yaml"), "--trainer.max_steps", "2",
          "--trainer.val_check_interval", "2", "--trainer.enable_progress_bar", "false",
          "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
          "--trainer.callbacks.init_args.every_n_steps", "1", "--model.model", str(sft_out),
          "--model.generation.num_generations", "4", "--data.train.init_args.size", "64",
          "--data.val.init_args.size", "8", "--data.batch_size", "4", "--data.val_batch_size", "8"])
    events = EventAccumulator(str(next(tmp_path.rglob("events.out.tfevents.*")).parent))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for tag in ("episodes/turns_mean", "episodes/ended_by_env", "budget/generated_tokens_train", "val/accuracy"):
        assert tag in scalars, (tag, sorted(scalars))
    assert events.Tags()["tensors"] or events.Tags().get("text"), "no transcript table logged"


def test_the_calculator_configs_run_from_yaml(tmp_path):
    """The tool-calling example as a user runs it (shortened): the calculator warm start (here from a fresh tiny
    policy instead of the Countdown one), then GRPO with the calculator tool."""
    configs = REPO / "configs" / "envs"
    sft_out = tmp_path / "calculator_sft"
    main(["sft", "--config", str(configs / "sft_calculator_countdown_tiny.yaml"), "--trainer.max_steps", "2",
          "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
          "--trainer.default_root_dir", str(tmp_path), "--model.model", "tiny",
          "--model.tiny", yaml.safe_dump(TINY_SMALL, default_flow_style=True),
          "--model.output_dir", str(sft_out), "--data.train.init_args.size", "64", "--data.batch_size", "16"])
    main(["fit", "--config", str(configs / "calculator_countdown_tiny.yaml"), "--trainer.max_steps", "1",
          "--trainer.val_check_interval", "1", "--trainer.enable_progress_bar", "false",
          "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
          "--model.model", str(sft_out), "--model.generation.num_generations", "2",
          "--model.generation.max_completion_length", "24", "--model.episodes.max_tokens", "64",
          "--data.train.init_args.size", "32", "--data.val.init_args.size", "4", "--data.batch_size", "2",
          "--data.val_batch_size", "4"])
    events = EventAccumulator(str(next(tmp_path.rglob("events.out.tfevents.*")).parent))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for tag in ("episodes/tool_calls_mean", "episodes/tool_failure_rate", "rewards/countdown_reward/mean",
                "val/accuracy"):
        assert tag in scalars, (tag, sorted(scalars))


# -- NaN and infinite numbers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("group, key, value, shown", [
    ("generation", "temperature", float("nan"), "nan"), ("optim", "learning_rate", float("inf"), "inf"),
    ("loss", "epsilon", float("-inf"), "-inf"),
])
def test_a_nan_or_infinite_number_in_yaml_is_refused_naming_its_key(tmp_path, capsys, group, key, value, shown):
    """``temperature: .nan`` passes ``<= 0`` (every comparison with NaN is False) and gave NaN log-probs silently."""
    cfg = _edited(tmp_path, lambda c: c["model"].setdefault(group, {}).update({key: value}))
    assert _error(capsys, ["fit", "--config", cfg]) == (
        f"lit-rlft fit: error: model.{group}.{key}: must be a finite number, got {shown}")


def test_a_nan_reward_weight_and_a_nan_on_the_command_line_are_refused(tmp_path, capsys):
    cfg = _edited(tmp_path, lambda c: c["model"].update(reward_weights=[float("nan")]))
    assert _error(capsys, ["fit", "--config", cfg]) == (
        "lit-rlft fit: error: model.reward_weights[0]: must be a finite number, got nan")
    err = _error(capsys, ["fit", "--config", str(_config(tmp_path)), "--model.generation.temperature", "nan"])
    assert "model.generation" in err and "'temperature'" in err


def test_a_nan_in_a_callbacks_yaml_settings_is_refused_naming_the_key(tmp_path, capsys):
    cfg = _edited(tmp_path, lambda c: c["trainer"]["callbacks"].append(
        {"class_path": "lit_rlft.callbacks.DPSCallback", "init_args": {"decay": float("nan")}}))
    assert _error(capsys, ["fit", "--config", cfg]) == (
        "lit-rlft fit: error: trainer.callbacks[1].init_args.decay: must be a finite number, got nan")


@pytest.mark.parametrize("init_args, expected", [
    ({"name": "chain_summ"}, "data.train (lit_rlft.data.ReasoningGymTask): unknown reasoning-gym dataset "
                             "'chain_summ' (did you mean chain_sum, decimal_chain_sum?)"),
    ({"name": "chain_sum", "config": {"min_term": 2}}, "data.train (lit_rlft.data.ReasoningGymTask): chain_sum has no "
                                                       "config key(s) min_term (its keys: min_terms, max_terms, "),
])
def test_an_unknown_reasoning_gym_task_or_config_key_fails_before_step_0_naming_it(tmp_path, capsys, init_args,
                                                                                  expected):
    pytest.importorskip("reasoning_gym")
    cfg = _edited(tmp_path, lambda c: c["data"].update(
        train={"class_path": "lit_rlft.data.ReasoningGymTask", "init_args": {**init_args, "size": 8}}))
    err = _error(capsys, ["fit", "--config", cfg])
    assert err.startswith("lit-rlft fit: error: ") and expected in err, err
    assert "Expected a <class" not in err  # the member of `str | Task` that was meant, not the first tried
