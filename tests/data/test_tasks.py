"""Synthetic tasks: determinism, correct solutions, disjoint held-out splits, difficulty mix, argument checks."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from lit_rlft.data.loading import load_records
from lit_rlft.data.pool import build_pool
from lit_rlft.data.tasks import (
    ArithmeticTask,
    CountdownTask,
    arithmetic_value,
    countdown_key,
    held_out,
    task_records,
    write_jsonl,
)

TOKEN = re.compile(r"\d+|[-+*()]")


def safe_eval(expr: str) -> tuple[int, list[int]]:
    """Evaluate an expression of non-negative integers, ``+ - *`` and parentheses; returns (value, numbers used)."""
    tokens = TOKEN.findall(expr)
    assert "".join(tokens) == expr, f"unexpected characters in {expr!r}"
    used: list[int] = []
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def atom() -> int:
        tok = take()
        if tok == "(":
            value = expr_()
            assert take() == ")"
            return value
        assert tok.isdigit(), f"expected a number in {expr!r}"
        used.append(int(tok))
        return int(tok)

    def term() -> int:
        value = atom()
        while peek() == "*":
            take()
            value *= atom()
        return value

    def expr_() -> int:
        value = term()
        while peek() in ("+", "-"):
            value = value + term() if take() == "+" else value - term()
        return value

    result = expr_()
    assert pos == len(tokens), f"trailing tokens in {expr!r}"
    return result, used


# ------------------------------------------------------------------------------------------------------ Countdown


def test_countdown_record_format_and_solutions() -> None:
    records = CountdownTask(size=2000, seed=1, split="all").records()
    assert len(records) == 2000
    for i, rec in enumerate(records):
        d = rec.data
        assert set(d) == {"prompt", "nums", "target", "solution", "difficulty"}
        assert rec.origin == f"generated:countdown#{i}"
        assert d["prompt"] == " ".join(map(str, d["nums"])) + f">{d['target']}="
        assert d["difficulty"] == len(d["nums"]) in (2, 3, 4)
        assert all(1 <= n <= 15 for n in d["nums"]) and 0 <= d["target"] <= 99
        assert " " not in d["solution"]
        value, used = safe_eval(d["solution"])
        assert value == d["target"], d
        assert sorted(used) == sorted(d["nums"]), d
        assert value == eval(d["solution"])  # generated strings are digits and + - * ( ) only


def test_countdown_deterministic_per_seed() -> None:
    a = [r.data for r in CountdownTask(size=300, seed=3).records()]
    b = [r.data for r in CountdownTask(size=300, seed=3).records()]
    c = [r.data for r in CountdownTask(size=300, seed=4).records()]
    assert a == b and a != c


def test_countdown_train_test_disjoint_and_fraction() -> None:
    train = CountdownTask(size=1500, seed=0, split="train").records()
    test = CountdownTask(size=500, seed=1, split="test").records()
    train_keys = {countdown_key(r.data["nums"], r.data["target"]) for r in train}
    test_keys = {countdown_key(r.data["nums"], r.data["target"]) for r in test}
    assert not train_keys & test_keys
    assert all(held_out(k, 0.2) for k in test_keys) and not any(held_out(k, 0.2) for k in train_keys)
    everything = CountdownTask(size=10000, seed=2, split="all").records()
    frac = sum(held_out(countdown_key(r.data["nums"], r.data["target"]), 0.2) for r in everything) / len(everything)
    assert 0.18 < frac < 0.22


def test_countdown_difficulty_follows_weights() -> None:
    records = CountdownTask(size=6000, num_numbers=[2, 3, 4], weights=[1, 2, 7], seed=5).records()
    counts = Counter(r.data["difficulty"] for r in records)
    for k, expected in ((2, 0.1), (3, 0.2), (4, 0.7)):
        assert abs(counts[k] / len(records) - expected) < 0.03
    uniform = Counter(r.data["difficulty"] for r in CountdownTask(size=3000, seed=6).records())
    assert all(abs(uniform[k] / 3000 - 1 / 3) < 0.04 for k in (2, 3, 4))


def test_countdown_unique_and_small_space_error() -> None:
    records = CountdownTask(size=50, num_numbers=[2], max_number=6, unique=True, split="all").records()
    keys = [countdown_key(r.data["nums"], r.data["target"]) for r in records]
    assert len(set(keys)) == len(keys)
    with pytest.raises(ValueError, match="too small"):
        CountdownTask(size=10_000, num_numbers=[2], max_number=3, unique=True, split="all").records()


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"size": 0}, "size"),
        ({"num_numbers": [1, 3]}, "num_numbers"),
        ({"num_numbers": []}, "num_numbers"),
        ({"max_number": 0}, "max_number"),
        ({"max_target": -1}, "max_target"),
        ({"held_out_fraction": 1.0}, "held_out_fraction"),
        ({"held_out_fraction": -0.1}, "held_out_fraction"),
        ({"weights": [1.0]}, "weights"),
        ({"weights": [1.0, -1.0, 1.0]}, "weights"),
        ({"split": "valid"}, "split"),
        ({"split": "test", "held_out_fraction": 0.0}, "held_out_fraction"),
    ],
)
def test_countdown_argument_errors(kwargs: dict, option: str) -> None:
    with pytest.raises(ValueError, match=option):
        CountdownTask(**kwargs)


def test_countdown_pool_roundtrip(tmp_path: Path) -> None:
    task = CountdownTask(size=50, seed=0)
    write_jsonl(task_records(task), tmp_path / "sub" / "cd.jsonl")
    loaded = load_records(str(tmp_path / "sub" / "cd.jsonl"))
    assert [r.data for r in loaded] == [r.data for r in task.records()]
    pool = build_pool(loaded, answer_field=None)
    assert set(pool.columns) == {"nums", "target", "solution", "difficulty"}
    assert len(pool) == 50


# ----------------------------------------------------------------------------------------------------- Arithmetic


def test_arithmetic_format_and_answers() -> None:
    records = ArithmeticTask(size=2000, digits=[1, 2, 3], operators="+-*", num_operands=3, seed=0).records()
    for i, rec in enumerate(records):
        d = rec.data
        assert set(d) == {"prompt", "answer", "solution", "difficulty"}
        assert rec.origin == f"generated:arithmetic#{i}"
        assert d["prompt"].endswith("=") and " " not in d["prompt"]
        operands = [int(x) for x in re.split(r"[-+*]", d["prompt"][:-1])]
        assert len(operands) == 3
        assert all(len(str(x)) == d["difficulty"] for x in operands)
        value, _ = safe_eval(d["prompt"][:-1])
        assert d["answer"] == d["solution"] == str(value)
        assert value >= 0


def test_arithmetic_subtraction_non_negative_and_operators() -> None:
    records = ArithmeticTask(size=500, digits=[2], operators="-", seed=1, split="all").records()
    for rec in records:
        a, b = (int(x) for x in rec.data["prompt"][:-1].split("-"))
        assert a >= b and rec.data["answer"] == str(a - b)
    plus = ArithmeticTask(size=200, seed=2).records()
    assert all(re.fullmatch(r"\d+\+\d+=", r.data["prompt"]) for r in plus)
    assert arithmetic_value([2, 3, 4], ["+", "*"]) == 14
    assert arithmetic_value([20, 3, 4], ["-", "-"]) == 13


def test_arithmetic_determinism_split_and_weights() -> None:
    a = [r.data for r in ArithmeticTask(size=300, seed=7).records()]
    assert a == [r.data for r in ArithmeticTask(size=300, seed=7).records()]
    assert a != [r.data for r in ArithmeticTask(size=300, seed=8).records()]
    train = {r.data["prompt"] for r in ArithmeticTask(size=1500, digits=[2, 3], seed=0).records()}
    test = {r.data["prompt"] for r in ArithmeticTask(size=500, digits=[2, 3], seed=1, split="test").records()}
    assert not train & test
    everything = ArithmeticTask(size=10000, digits=[3], split="all", seed=3).records()
    frac = sum(held_out(r.data["prompt"], 0.2) for r in everything) / len(everything)
    assert 0.18 < frac < 0.22
    mix = Counter(r.data["difficulty"] for r in ArithmeticTask(size=5000, digits=[1, 4], weights=[3, 1]).records())
    assert abs(mix[1] / 5000 - 0.75) < 0.03


def test_arithmetic_errors() -> None:
    for kwargs, option in [
        ({"digits": [0]}, "digits"),
        ({"num_operands": 1}, "num_operands"),
        ({"operators": "/"}, "operators"),
        ({"operators": ""}, "operators"),
        ({"size": -1}, "size"),
    ]:
        with pytest.raises(ValueError, match=option):
            ArithmeticTask(**kwargs)
    with pytest.raises(ValueError, match="too small"):
        ArithmeticTask(size=500, digits=[1], unique=True, split="all").records()


def test_write_jsonl_dicts(tmp_path: Path) -> None:
    write_jsonl([{"prompt": "é", "answer": "1"}], tmp_path / "x.jsonl")
    assert json.loads((tmp_path / "x.jsonl").read_text(encoding="utf-8")) == {"prompt": "é", "answer": "1"}
