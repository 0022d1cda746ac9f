"""The README's and the site's doctested blocks run as written (the Trainer block with the two changes its doctest
comment names: the tiny model and two steps): every ``<!-- doctest: <tag> -->`` block of ``README.md`` and
``docs/**/*.md`` is found by its tag, whichever page holds it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

README = (REPO / "README.md").read_text()
#: The README and every page of the site, where doctested blocks may live.
PAGES = "\n".join([README, *(p.read_text() for p in sorted((REPO / "docs").rglob("*.md")))])
BIN = Path(sys.executable).parent


def _block(tag: str, text: str = PAGES) -> str:
    """The fenced code block right after ``<!-- doctest: <tag> ... -->`` (in the README or any page of the site)."""
    matches = re.findall(rf"<!-- doctest: {tag}(?![\w-]).*?-->\n```\w*\n(.*?)```", text, re.S)
    assert len(matches) == 1, f"{len(matches)} doctest blocks {tag!r} (one expected)"
    return matches[0]


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> str:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    env.pop("MASTER_PORT", None)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc.stdout + proc.stderr


def _scalars(folder: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = list(folder.rglob("events.out.tfevents.*"))
    return set(EventAccumulator(str(events), size_guidance={"scalars": 0}).Reload().Tags()["scalars"])


def test_the_trainer_quick_start_runs(tmp_path):
    code = _block("trainer")
    assert 'model="runs/sft/model"' in code and "max_steps=10_000" in code
    code = code.replace('model="runs/sft/model"', 'model="tiny"').replace("max_steps=10_000", "max_steps=2")
    (tmp_path / "quickstart.py").write_text(code)
    _run([sys.executable, "quickstart.py"], tmp_path)
    assert {"reward", "dps/effective_ratio", "replay/replayed_groups"} <= _scalars(tmp_path / "runs" / "quickstart")


def test_the_plain_pytorch_loop_of_the_design_notes_runs_until_its_budget_stops_it(tmp_path):
    (tmp_path / "plain.py").write_text(_block("plain"))
    out = _run([sys.executable, "plain.py"], tmp_path)
    lines = [line.split() for line in out.splitlines() if re.fullmatch(r"\d+ \S+ \d+", line.strip())]
    assert [int(x[0]) for x in lines] == list(range(len(lines))) and len(lines) >= 2  # steps 0, 1, ...
    assert int(lines[-1][2]) >= 160 > int(lines[-2][2])  # the step that spent the budget was the last
    assert f"RolloutBudgetStop: {lines[-1][2]} completions generated, max_completions=160" in out


@pytest.mark.distributed
def test_the_fabric_block_runs_on_two_processes_with_a_logger_and_checkpoints(tmp_path):
    (tmp_path / "fabric_train.py").write_text(_block("fabric"))
    out = _run([sys.executable, "fabric_train.py"], tmp_path)
    assert "rollout steps" in out  # the progress bar
    assert (tmp_path / "runs" / "fabric" / "step=2.ckpt").exists() and (tmp_path / "runs" / "fabric" / "step=4.ckpt").exists()
    assert {"reward", "dps/effective_ratio", "dist/world_size"} <= _scalars(tmp_path / "runs" / "fabric" / "tb")


FABRIC_COMMANDS = _block("fabric-commands").splitlines()


@pytest.mark.distributed
@pytest.mark.parametrize("command", FABRIC_COMMANDS, ids=lambda c: c.split()[0])
def test_the_fabric_example_runs_with_each_launcher_as_written(tmp_path, command):
    (tmp_path / "examples").mkdir()
    shutil.copy(REPO / "examples" / "fabric_countdown.py", tmp_path / "examples")
    program, *args = command.split()
    executable = sys.executable if program == "python" else str(BIN / program)
    out = _run([executable, *args], tmp_path)
    assert re.search(r"4 rollout steps, \d+ completions, held-out accuracy \d\.\d{3}", out), out[-3000:]
    assert (tmp_path / "runs" / "fabric_countdown" / "last.ckpt").exists()


def test_the_rewards_yaml_parses_as_an_overlay(tmp_path: Path) -> None:
    """Every kind of reward in the README's rewards block is a valid ``model.reward_funcs`` entry for LightningCLI."""
    overlay = tmp_path / "rewards.yaml"
    overlay.write_text(_block("rewards-yaml"))
    out = _run([str(BIN / "lit-rlft"), "fit", "--config", "configs/countdown_tiny.yaml", "--config", str(overlay),
                "--print_config"], REPO)
    for expected in ("runs/learned_reward/rm", "class_path: lit_rlft.rewards.JudgeReward",
                     "class_path: lit_rlft.rewards.OpenAIJudge", "class_path: lit_rlft.rewards.RemoteReward",
                     "protocol: openrlhf"):
        assert expected in out, out[-3000:]


def test_the_study_quick_start_runs(tmp_path):
    """The README's `run_study` block, on the tiny policy's config (tests/study) with a budget of 48 completions."""
    from tests.study.test_study import tiny_run_config

    code = _block("study")
    for old in ('configs=["configs/gsm8k_smollm2_study.yaml"]', "seeds=[0, 1, 2]", "completions=3072",
                "eval_every=768", "jobs=2"):
        assert old in code, old
    config = tiny_run_config(tmp_path)
    code = (code.replace('configs=["configs/gsm8k_smollm2_study.yaml"]', f'configs=["{config}"]')
            .replace("seeds=[0, 1, 2]", "seeds=[0]").replace("completions=3072", "completions=48")
            .replace("eval_every=768", "eval_every=24").replace("jobs=2", "jobs=1"))
    (tmp_path / "study.py").write_text(code)
    out = _run([sys.executable, "study.py"], tmp_path)
    assert "'mean':" in out and "'status':" in out
    assert (tmp_path / "runs" / "study" / "report.md").exists()


def test_the_tool_environment_block_builds_its_step(tmp_path):
    (tmp_path / "tools.py").write_text(_block("tool-env"))
    _run([sys.executable, "tools.py"], tmp_path)


def test_the_custom_environment_block_scores_an_episode(tmp_path):
    code = _block("custom-env") + """
env = MyEnv()
assert env.step([{"role": "assistant", "content": "<answer>7</answer>"}], {"answer": "7"}).reward == 1.0
assert env.step([{"role": "assistant", "content": "thinking"}], {"answer": "7"}).observation[0]["content"] == "keep going"
"""
    (tmp_path / "env.py").write_text(code)
    _run([sys.executable, "env.py"], tmp_path)
