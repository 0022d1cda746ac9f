"""Every shipped config parses (and every strategy overlay composes with its base config) through the CLI."""

from __future__ import annotations

import pytest
import yaml

from lit_rlft.cli import main
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
    assert (m["num_generations"], m["temperature"], m["beta"], m["scale_rewards"]) == (8, 0.6, 0.0, "none")
    assert cfg["data"]["system_prompt"].endswith("\\boxed{}.")


def test_sft_config_parses(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sft", "--config", str(CONFIGS / "sft_countdown_tiny.yaml"), "--print_config"])
    assert exc.value.code == 0
