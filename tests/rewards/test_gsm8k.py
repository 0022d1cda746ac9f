"""Tests of the GSM8K reward: final-number extraction and numeric comparison."""

from fractions import Fraction

import pytest

from lit_rlft.rewards import gsm8k_gold, gsm8k_prediction, gsm8k_reward, parse_number

SOLUTION = "She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (SOLUTION, "18"),
        ("so ... \n#### 1,450,000", "1450000"),
        ("#### -3", "-3"),
        ("18.00", "18"),
        ("0.50", "0.5"),
        (" $1,000. ", "1000"),
        (42, "42"),
        ("no number", None),
        (None, None),
    ],
)
def test_gsm8k_gold(answer: object, expected: str | None) -> None:
    assert gsm8k_gold(answer) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,234.50", Fraction(246_9, 2)),
        ("$18.", Fraction(18)),
        ("-7", Fraction(-7)),
        ("1,2", None),
        ("abc", None),
    ],
)
def test_parse_number(text: str, expected: Fraction | None) -> None:
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("blah 3 blah\n#### 18", Fraction(18)),
        ("#### 5 then more text 7", Fraction(5)),
        (r"so $\boxed{18}$ dollars, from 4 eggs", Fraction(18)),
        (r"\boxed{\$1,000}", Fraction(1000)),
        (r"\boxed{9 \times 2 = 18}", Fraction(18)),
        ("she pays 16 - 3 - 4 = 9 dollars", Fraction(9)),
        ("the result is -5.", Fraction(-5)),
        ("10-5", Fraction(5)),
        ("total: 1,200 eggs", Fraction(1200)),
        ("no number at all", None),
    ],
)
def test_gsm8k_prediction(completion: str, expected: Fraction | None) -> None:
    assert gsm8k_prediction(completion) == expected


def test_gsm8k_reward() -> None:
    completions = ["#### 18", "The answer is $18.00.", r"\boxed{18}", "#### 17", "nothing", "#### 18,000", "#### 1"]
    answers = [SOLUTION] * 5 + ["#### 18000", "no gold number"]
    assert gsm8k_reward(completions, answer=answers, question=["q"] * 7) == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, None]


def test_format_reward_checks_the_answer_line_only():
    from lit_rlft.rewards import gsm8k_format_reward

    completions = ["3 + 4 = 7\n#### 7", "so the answer is 7", "#### seven", "#### 1,000.", ""]
    assert gsm8k_format_reward(completions) == [1.0, 0.0, 0.0, 1.0, 0.0]
