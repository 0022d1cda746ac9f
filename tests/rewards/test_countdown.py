"""Tests of the Countdown reward and its untrusted-expression parser."""

import time
from fractions import Fraction

import pytest

from lit_rlft.rewards import CountdownReward, countdown_answer, countdown_reward, parse_expression
from lit_rlft.rewards.countdown import MAX_DEPTH, MAX_LENGTH


@pytest.mark.parametrize(
    ("text", "value", "numbers"),
    [
        ("(12-3)*9", Fraction(81), [12, 3, 9]),
        (" 1 + 2 * 3 ", Fraction(7), [1, 2, 3]),
        ("(1+2)*3", Fraction(9), [1, 2, 3]),
        ("10-4-3", Fraction(3), [10, 4, 3]),
        ("24/4/2", Fraction(3), [24, 4, 2]),
        ("7/2", Fraction(7, 2), [7, 2]),
        ("(7/2)*2", Fraction(7), [7, 2, 2]),
        ("((((5))))", Fraction(5), [5]),
        ("1\n+\t2", Fraction(3), [1, 2]),
    ],
)
def test_parse_expression_valid(text: str, value: Fraction, numbers: list[int]) -> None:
    assert parse_expression(text) == (value, numbers)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "__import__('os').system('echo hi')",
        "2**100",
        "2 ** 3",
        "-3+5",
        "3*-5",
        "(1+2",
        "1+2)",
        "()",
        "1 2",
        "1+",
        "3(4)",
        "1.5*2",
        "8/(4-4)",
        "8/0",
        "1e3",
        "x+1",
        "1+2=3",
        "٣+1",  # a non-ASCII digit
        "1" * 13,  # literal too long
        "1+" * 100 + "1",  # longer than MAX_LENGTH
        "(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1),
    ],
)
def test_parse_expression_invalid(text: str) -> None:
    with pytest.raises(ValueError):
        parse_expression(text)


def test_depth_and_length_caps_are_inclusive() -> None:
    assert parse_expression("(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH) == (Fraction(1), [1])
    text = "+".join(["1"] * (MAX_LENGTH // 2)) + "1"
    assert len(text) == MAX_LENGTH
    assert parse_expression(text)[0] == MAX_LENGTH // 2 - 1 + 11


def test_huge_input_is_rejected_fast() -> None:
    start = time.perf_counter()
    for text in ["9" * 1_000_000, "(" * 100_000, "1+" * 500_000 + "1"]:
        with pytest.raises(ValueError):
            parse_expression(text)
    assert time.perf_counter() - start < 1.0


def test_parse_expression_rejects_non_strings() -> None:
    with pytest.raises(ValueError):
        parse_expression(None)  # type: ignore[arg-type]


def test_countdown_answer() -> None:
    assert countdown_answer("think <answer>1+2</answer> then <answer> 3*4 </answer> bye") == "3*4"
    assert countdown_answer("  (12-3)*9\n") == "(12-3)*9"
    assert countdown_answer("<answer>\n1+2\n</answer>") == "1+2"


def test_countdown_reward_cases() -> None:
    cases = [
        ("(12-3)*9", 1.0),  # correct
        ("9*(12-3)", 1.0),  # correct, other order
        ("<answer>(12 - 3) * 9</answer>", 1.0),  # correct, tagged
        ("(12-3)*9+0", 0.1),  # uses a number not given
        ("12*9-3", 0.1),  # right numbers, wrong value
        ("(12-3)*12", 0.1),  # reuses a number, misses one
        ("12-3", 0.1),  # misses a number
        ("__import__('os')", 0.0),
        ("2**100", 0.0),
        ("9/(12-12)", 0.0),  # division by zero
        ("", 0.0),
    ]
    completions = [c for c, _ in cases]
    n = len(cases)
    scores = countdown_reward(completions, nums=[[12, 3, 9]] * n, target=[81] * n, format_reward=0.1, prompts=["p"] * n)
    assert scores == [expected for _, expected in cases]
    assert countdown_reward(completions, nums=[[12, 3, 9]] * n, target=[81] * n) == [
        1.0 if expected == 1.0 else 0.0 for _, expected in cases
    ]


def test_countdown_reward_duplicates_and_division() -> None:
    completions = ["(6/4)*(6-2)", "6/4*6", "(6+6)/(4-2)"]
    scores = countdown_reward(completions, nums=[[6, 6, 4, 2]] * 3, target=["6", 9, 6.0], format_reward=0.5)
    assert scores == [1.0, 0.5, 1.0]


def test_countdown_reward_bad_rows_are_unscored() -> None:
    assert countdown_reward(["1+2", "1+2"], nums=[[1, 2], ["x"]], target=["three", 3]) == [None, None]


def test_countdown_reward_class() -> None:
    reward = CountdownReward(format_reward=0.1)
    assert reward.name == "countdown_reward"
    assert reward(["1+2", "1*2", "oops"], nums=[[1, 2]] * 3, target=[3] * 3, answer=["ignored"] * 3) == [1.0, 0.1, 0.0]
    assert CountdownReward()(["1*2"], nums=[[1, 2]], target=[3]) == [0.0]


def test_countdown_reward_nums_as_string() -> None:
    assert countdown_reward(["(12-3)*9", "(12-3)*9"], nums=["12 3 9", "12,3,9"], target=[81, "81"]) == [1.0, 1.0]
