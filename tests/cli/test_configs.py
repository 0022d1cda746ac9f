"""Every shipped config parses (and every strategy overlay composes with its base config) through the CLI."""

from __future__ import annotations

import pytest
import yaml

from lit_rlft.cli import main
from lit_rlft.study.strategies import LOCATION_ARGS, STRATEGIES, resolve_arm
from tests.conftest import REPO

CONFIGS = REPO / "configs"
OVERLAYS = sorted((CONFIGS / "strategies").glob("*.yaml"))


def _print_config(capsys, *configs) -> dict:
    args = ["fit"]
    for c in configs:
        args += ["--config", str(c)]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--print_config"])
    assert exc.value.code == 0, capsys.readouterr().err
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.stem)
def test_strategy_overlay_composes_with_its_base(overlay, capsys):
    base = "math_qwen2.5-math-1.5b.yaml" if overlay.stem.startswith("paper_") else "countdown_tiny.yaml"
    cfg = _print_config(capsys, CONFIGS / base, overlay)
    callbacks = [c["class_path"].rsplit(".", 1)[-1] for c in cfg["trainer"]["callbacks"]]
    assert "CompletionLogger" in callbacks
    if overlay.stem != "uniform":
        assert len(callbacks) >= 2


def test_paper_config_is_the_papers_setting(capsys):
    cfg = _print_config(capsys, CONFIGS / "math_qwen2.5-math-1.5b.yaml")
    m = cfg["model"]
    assert (m["generation"]["num_generations"], m["generation"]["temperature"], m["loss"]["beta"],
            m["scale_rewards"]) == (8, 0.6, 0.0, "none")
    assert cfg["data"]["system_prompt"].endswith("\\boxed{}.")


@pytest.mark.parametrize(("name", "hidden", "layers"), [("sft_countdown_tiny", 128, 4), ("sft_countdown_h256", 256, 8)])
def test_sft_configs_parse_to_their_policy_size(name, hidden, layers, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sft", "--config", str(CONFIGS / f"{name}.yaml"), "--print_config"])
    assert exc.value.code == 0
    tiny = yaml.safe_load(capsys.readouterr().out)["model"]["tiny"] or {}
    assert (tiny.get("hidden_size", 128), tiny.get("num_hidden_layers", 4)) == (hidden, layers)


@pytest.mark.parametrize("overlay", sorted((CONFIGS / "parallel").glob("*.yaml")), ids=lambda p: p.stem)
def test_parallel_overlays_compose(overlay, capsys):
    base = "math_qwen2.5-math-1.5b.yaml" if "2x8" in overlay.stem else "countdown_tiny.yaml"
    cfg = _print_config(capsys, CONFIGS / base, overlay)
    strategy = cfg["trainer"]["strategy"]
    if overlay.stem == "ddp":
        assert strategy == "ddp"
    else:
        assert strategy["class_path"].endswith("ModelParallelStrategy")
        assert strategy["init_args"]["tensor_parallel_size"] == 1


def test_the_two_node_recipe_composes_and_divides_by_the_ranks(capsys):
    """The SLURM script's configs: FSDP2 over 16 ranks, LoRA, DPS + replay, float32 weights with bf16 compute."""
    cfg = _print_config(capsys, CONFIGS / "math_qwen2.5-math-1.5b.yaml", CONFIGS / "parallel" / "fsdp2_2x8.yaml",
                        CONFIGS / "lora.yaml", CONFIGS / "strategies" / "paper_dps_replay.yaml")
    ranks = cfg["trainer"]["devices"] * cfg["trainer"]["num_nodes"]
    assert ranks == cfg["trainer"]["strategy"]["init_args"]["data_parallel_size"] == 16
    optim = cfg["model"]["optim"]  # the LoRA overlay changes the learning rate and keeps the recipe's other settings
    assert (optim["learning_rate"], optim["num_mini_batches"], optim["micro_batch_tokens"],
            optim["gradient_checkpointing"]) == (1e-5, 4, 32768, True)
    replay = next(c for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("ReplayCallback"))
    batch = cfg["data"]["batch_size"]
    fresh = -(-int(replay["init_args"]["delta"] * 1000) * batch // 1000)
    assert batch % ranks == 0 and fresh % ranks == 0
    assert cfg["model"]["lora"]["r"] == 64
    assert (cfg["model"]["dtype"], cfg["trainer"]["precision"]) == ("float32", "bf16-mixed")
    script = (REPO / "scripts" / "slurm_2x8_fsdp_lora_dps_replay.sh").read_text()
    for part in ("fsdp2_2x8.yaml", "lora.yaml", "paper_dps_replay.yaml", "--ntasks-per-node=8", "--nodes=2"):
        assert part in script


def test_the_smollm2_gsm8k_config_parses_with_and_without_vllm(capsys):
    cfg = _print_config(capsys, CONFIGS / "gsm8k_smollm2_lora.yaml")
    assert cfg["model"]["model"] == "smollm2-135m-instruct" and cfg["model"]["lora"]["r"] == 16
    assert cfg["model"]["reward_funcs"] == ["lit_rlft.rewards.gsm8k_reward", "lit_rlft.rewards.gsm8k_format_reward"]
    assert cfg["data"]["chat_template"] is True
    for overlay in ("vllm_cpu.yaml", "vllm_gpu.yaml"):
        cfg = _print_config(capsys, CONFIGS / "gsm8k_smollm2_lora.yaml", CONFIGS / "engines" / overlay)
        assert cfg["model"]["engine"]["class_path"] == "lit_rlft.rollout.engines.vllm.VLLMEngine"


def test_the_environment_configs_parse(capsys):
    cfg = _print_config(capsys, CONFIGS / "envs" / "guess_number_tiny.yaml")
    assert cfg["model"]["environment"]["class_path"] == "lit_rlft.envs.GuessNumberEnv"
    assert cfg["model"]["episodes"]["max_turns"] == 4
    cfg = _print_config(capsys, CONFIGS / "envs" / "calculator_countdown_tiny.yaml")
    assert cfg["model"]["environment"]["init_args"]["tools"] == ["lit_rlft.envs.calculator"]
    assert cfg["model"]["model"] == "runs/calculator_sft/model"  # the tool-calling warm start's output
    cfg = _print_config(capsys, CONFIGS / "gsm8k_smollm2_lora.yaml", CONFIGS / "envs" / "calculator_gsm8k_smollm2.yaml")
    assert cfg["model"]["episodes"]["observation_format"] == "chat" and cfg["model"]["lora"]["r"] == 16
    for warm_start in ("sft_guess_number_tiny.yaml", "sft_calculator_countdown_tiny.yaml"):
        with pytest.raises(SystemExit) as exc:
            main(["sft", "--config", str(CONFIGS / "envs" / warm_start), "--print_config"])
        assert exc.value.code == 0


def test_the_servers_overlay_and_the_trainer_plus_servers_recipe_compose(capsys):
    """configs/engines/servers.yaml makes the engine a ServerEngine; the SLURM recipe's trainer node divides the
    batch by its 8 ranks and names the overlays it uses."""
    cfg = _print_config(capsys, CONFIGS / "countdown_tiny.yaml", CONFIGS / "engines" / "servers.yaml")
    engine = cfg["model"]["engine"]
    assert engine["class_path"] == "lit_rlft.rollout.ServerEngine" and engine["init_args"]["urls"] == ["127.0.0.1:8001"]
    cfg = _print_config(capsys, CONFIGS / "math_qwen2.5-math-1.5b.yaml", CONFIGS / "parallel" / "fsdp2_1x8.yaml",
                        CONFIGS / "lora.yaml", CONFIGS / "strategies" / "paper_dps_replay.yaml")
    ranks = cfg["trainer"]["devices"] * cfg["trainer"]["num_nodes"]
    assert ranks == cfg["trainer"]["strategy"]["init_args"]["data_parallel_size"] == 8
    assert cfg["data"]["batch_size"] % ranks == 0
    script = (REPO / "scripts" / "slurm_trainer_plus_servers.sh").read_text()
    for part in ("fsdp2_1x8.yaml", "lora.yaml", "paper_dps_replay.yaml", "lit_rlft.rollout.ServerEngine",
                 "lit-rlft serve", "--sync-rendezvous", "LIT_RLFT_SYNC_TOKEN"):
        assert part in script


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_study_preset_is_a_fit_overlay_that_builds_what_the_study_records(name, capsys):
    """configs/study/<name>.yaml given to `lit-rlft fit` makes the callbacks a study's run records (seed 0)."""
    cfg = _print_config(capsys, CONFIGS / "countdown_tiny.yaml", CONFIGS / "study" / f"{name}.yaml")

    def located(value):  # the printed arguments less the folders, as the study records them
        if isinstance(value, dict):
            return {k: located(v) for k, v in value.items() if k not in LOCATION_ARGS}
        return value

    printed = [{"callback": c["class_path"].rsplit(".", 1)[-1], "args": located(c.get("init_args") or {})}
               for c in cfg["trainer"]["callbacks"]]
    assert printed == resolve_arm(name).settings(seed=0)
