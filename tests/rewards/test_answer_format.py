"""Answer extraction and writing (lit_rlft.rewards.answer_format): each format, hostile inputs, the inverse."""

from __future__ import annotations

import time

import pytest

from lit_rlft.rewards.answer_format import (
    ANSWER_FORMATS,
    MAX_COMPLETION_CHARS,
    AnswerFormatReward,
    extract_answer,
    write_answer,
)


@pytest.mark.parametrize(("text", "fmt", "expected"), [
    ("<answer>7</answer>", "answer_tags", "7"),
    ("first <answer>3</answer> then <answer> 12 </answer>", "answer_tags", "12"),   # the last pair
    ("<answer>7", "answer_tags", None),                                              # unclosed
    ("7</answer>", "answer_tags", None),                                             # no opening tag
    ("</answer><answer>7", "answer_tags", None),                                     # the close before the open
    ("<answer>  </answer>", "answer_tags", None),                                    # empty
    ("working\n\n  -4  \n\n", "last_line", "-4"),
    ("", "last_line", None),
    ("sum is 5\n#### 12 apples\nbye", "marker", "12 apples"),
    ("#### ", "marker", None),
    ("3 - 5 = -2, so -2.", "last_number", "-2"),
    ("10-5", "last_number", "5"),                                                    # a binary minus
    ("total 1,000.5 units", "last_number", "1,000.5"),
    ("no digits here", "last_number", None),
])
def test_extract_answer(text, fmt, expected):
    assert extract_answer(text, fmt) == expected


@pytest.mark.parametrize("fmt", ANSWER_FORMATS)
def test_write_then_extract_is_the_answer(fmt):
    for answer in ["7", "-42", "1000"]:
        assert extract_answer(write_answer(answer, fmt), fmt) == answer


def test_not_a_string_or_too_long_states_nothing():
    assert extract_answer(None, "answer_tags") is None
    assert extract_answer("<answer>1</answer>" + "x" * MAX_COMPLETION_CHARS, "answer_tags") is None


@pytest.mark.parametrize("fmt", ANSWER_FORMATS)
def test_hostile_lengths_run_in_linear_time(fmt):
    # patterns that make a backtracking extractor quadratic: unclosed tags, a long run of digits and commas
    texts = ["<answer>" * 20_000, "1," * 50_000 + "x", "-" * 100_000, "####" * 20_000, "\n" * 100_000]
    start = time.perf_counter()
    for text in texts:
        extract_answer(text, fmt)
    assert time.perf_counter() - start < 2.0  # a quadratic scan of 100k characters takes minutes


def test_unknown_format_is_refused_naming_the_option():
    with pytest.raises(ValueError, match="answer_format must be one of answer_tags, last_line, marker, last_number"):
        AnswerFormatReward("boxed")
    with pytest.raises(ValueError, match="answer_format"):
        write_answer("1", "xml")


def test_format_reward_scores_the_format_not_the_answer():
    reward = AnswerFormatReward("answer_tags")
    assert reward(["<answer>wrong</answer>", "7", "<answer></answer>", ""]) == [1.0, 0.0, 0.0, 0.0]
    assert reward.is_format_reward
