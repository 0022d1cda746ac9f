"""``lit-rlft probe``: the figures of groups worked out by hand, the verdict's sentences, and the probe end to end on
the tiny policy with a reasoning-gym task (a reward whose groups are known from the data alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lit_rlft.study.probe_stats import ProbeRow, group_summary, summarise_probe, verdict
from tests.conftest import TINY_SMALL


def rows(split, label, groups, formatted=None, task="t"):
    out = []
    for i, c in enumerate(groups):
        f = None if formatted is None else formatted[i]
        out.append(ProbeRow(split, task, label, correct=[bool(x) for x in c], rewards=[float(x) for x in c],
                            formatted=f))
    return out


def test_group_summary_by_hand():
    # G = 4: k = 0, 0, 2, 4, 1 correct
    got = group_summary(rows("train", "a", [[0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 1]],
                             formatted=[[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]))
    assert got["histogram"] == [2, 1, 1, 0, 1]
    assert got["pass_rate"] == pytest.approx(7 / 20)
    assert got["mixed"] == pytest.approx(2 / 5) and got["all_wrong"] == pytest.approx(2 / 5)
    assert got["all_right"] == pytest.approx(1 / 5) and got["reward_spread"] == pytest.approx(2 / 5)
    assert got["format"] == pytest.approx(11 / 20) and got["prompts"] == 5 and got["completions"] == 20


def test_reward_spread_counts_shaping_terms_and_format_unknown_is_none():
    r = [ProbeRow("train", "", "", correct=[False, False], rewards=[0.2, 0.0])]  # a format reward's spread only
    got = group_summary(r)
    assert got["mixed"] == 0 and got["reward_spread"] == 1 and got["format"] is None


def test_summary_per_split_and_group():
    s = summarise_probe(rows("val", "b", [[1, 1]]) + rows("train", "a", [[1, 0]]) + rows("train", "b", [[0, 0]]))
    assert list(s["splits"]) == ["train", "val"]
    assert list(s["groups"]["train"]) == ["t/a", "t/b"] and s["groups"]["train"]["t/a"]["mixed"] == 1


def test_verdict_says_what_to_change():
    hard = summarise_probe(rows("train", "hard", [[0] * 8] * 9 + [[1] + [0] * 7]) + rows("val", "hard", [[0] * 8] * 4))
    lines = verdict(hard)
    assert lines[0].startswith("90% of training groups would give no gradient for the task at G = 8 (90% all wrong, "
                               "0% all right): selection has little to pick from: make the pool easier")
    assert any("below the model's edge" in line for line in lines)
    easy = verdict(summarise_probe(rows("train", "x", [[1] * 4] * 8 + [[1, 0, 1, 1]])))
    assert "make the pool harder" in easy[0]
    edge = summarise_probe(rows("train", "e", [[1, 0, 0, 1]] * 6 + [[0] * 4] * 2, formatted=[[1, 0, 0, 0]] * 8)
                           + rows("train", "z", [[0] * 4] * 4, formatted=[[0] * 4] * 4)
                           + rows("val", "e", [[1, 0, 0, 0]] * 4))
    lines = verdict(edge)
    assert lines[0].startswith("50% of training groups have mixed correctness at G = 4")
    assert any(line.startswith("Only 17% of completions state an answer in the format") for line in lines)
    assert any("at the model's edge" in line for line in lines)
    assert any(line.startswith("Group t/z is unsolved (0.00 pass rate, 0% mixed over 4 prompts)") for line in lines)


def gym_config(tmp_path: Path, **model) -> Path:
    tasks = [{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
              "label": "one"},
             {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2},
              "label": "two"}]
    cfg = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "max_steps": 1, "log_every_n_steps": 1},
        "model": {"model": "tiny", "tiny": TINY_SMALL,
                  "reward_funcs": ["tests.study.helpers.even_answer", "tests.study.helpers.contains_digit"],
                  "reward_weights": [1.0, 0.1],
                  "generation": {"num_generations": 4, "max_completion_length": 6}, **model},
        "data": {"train": {"class_path": "lit_rlft.data.ReasoningGymTask",
                           "init_args": {"tasks": tasks, "size": 12, "split": "train", "seed": 0}},
                 "val": {"class_path": "lit_rlft.data.ReasoningGymTask",
                         "init_args": {"tasks": tasks, "size": 6, "split": "test", "seed": 0}},
                 "prompt_field": "question", "batch_size": 4, "val_batch_size": 5},
    }
    path = tmp_path / "gym.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_the_probe_on_the_tiny_policy_gives_the_histogram_the_data_says(tmp_path):
    pytest.importorskip("reasoning_gym")
    from lit_rlft.data import ReasoningGymTask
    from lit_rlft.study.probe import ProbeSettings, run_probe

    config = gym_config(tmp_path)
    cfg = yaml.safe_load(config.read_text())
    train = ReasoningGymTask(**cfg["data"]["train"]["init_args"]).records()
    val = ReasoningGymTask(**cfg["data"]["val"]["init_args"]).records()
    result = run_probe(ProbeSettings(configs=[str(config)], prompts=64, val_prompts=64, out=str(tmp_path / "p")),
                       progress=False)
    s = result["summary"]
    for split, records in (("train", train), ("val", val)):
        even = sum(int(r.data["answer"]) % 2 == 0 for r in records)
        # every group is all right (even gold answer) or all wrong (odd), whatever the tiny policy wrote
        assert s["splits"][split]["histogram"] == [len(records) - even, 0, 0, 0, even]
        assert s["splits"][split]["mixed"] == 0
        for label in ("one", "two"):
            mine = [r for r in records if r.data["difficulty"] == label]
            fig = s["groups"][split][f"chain_sum/{label}"]
            assert fig["prompts"] == len(mine)
            assert fig["pass_rate"] == pytest.approx(sum(int(r.data["answer"]) % 2 == 0 for r in mine) / len(mine))
    assert result["verdict"][0].startswith("100% of training groups would give no gradient for the task at G = 4")
    assert result["format_measured"] and 0 <= s["splits"]["train"]["format"] <= 1
    out = tmp_path / "p"
    assert json.loads((out / "probe.json").read_text())["summary"] == s
    assert (out / "probe.png").stat().st_size > 1000
    md = (out / "probe.md").read_text()
    assert "| train chain_sum/one |" in md and result["verdict"][0] in md
    # seeded: the same figures again
    again = run_probe(ProbeSettings(configs=[str(config)], prompts=64, val_prompts=64, out=str(tmp_path / "q")),
                      progress=False)
    assert again["rows"] == result["rows"]


def test_probe_cli_errors(tmp_path, capsys):
    from lit_rlft.cli import main as cli_main

    with pytest.raises(SystemExit) as e:
        cli_main(["probe", "--config", str(tmp_path / "missing.yaml")])
    assert e.value.code == 2
    assert "lit-rlft probe: error: --config" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["probe", "--config", "x.yaml", "--prompts", "0", "--val-prompts", "0"])
    assert "nothing to probe" in capsys.readouterr().err
