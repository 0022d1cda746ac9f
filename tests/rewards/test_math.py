"""Tests of the MATH reward: boxed extraction and math-verify equivalence."""

import threading

import pytest

from lit_rlft.rewards import extract_boxed, math_answer_from_solution, math_reward


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"The answer is $\boxed{5}$.", "5"),
        (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
        (r"nested $\boxed{\frac{\sqrt{3}}{2}}$", r"\frac{\sqrt{3}}{2}"),
        (r"first \boxed{1} then \boxed{2}", "2"),
        (r"escaped braces \boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"fbox \fbox{7}", "7"),
        (r"\boxed{1} and later \fbox{3}", "3"),
        (r"our answer is $\boxed 2$.", "2"),
        (r"\boxed { 12 }", "12"),
        ("no box here: 42", None),
        (r"truncated \boxed{\frac{1}{2", None),
        (r"\boxed", None),
        (r"\boxedfoo{3}", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_math_answer_from_solution() -> None:
    assert math_answer_from_solution(r"So $x = \boxed{\left( 3, \frac{\pi}{2} \right)}.$") == (
        r"\left( 3, \frac{\pi}{2} \right)"
    )
    with pytest.raises(ValueError, match="boxed"):
        math_answer_from_solution("no answer")


def test_math_reward_equivalences() -> None:
    completions = [
        r"... so the answer is $\boxed{\frac{1}{2}}$",
        r"\boxed{0.5}",
        r"\boxed{\dfrac12}",
        r"\boxed{\frac{1}{3}}",
        "the answer is 1/2",  # no boxed answer
        r"\boxed{1/2} then a truncated \boxed{",
    ]
    scores = math_reward(completions, answer=[r"\frac{1}{2}"] * len(completions))
    assert scores == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_math_reward_structures_and_ignores_columns() -> None:
    completions = [
        r"\boxed{\left( 3, \frac{\pi}{2} \right)}",
        r"\boxed{(3, \pi/2)}",
        r"\boxed{2\sqrt{2}}",
        r"\boxed{\sqrt{8}}",
        r"\boxed{10\%}",
    ]
    answers = [r"\left( 3, \frac{\pi}{2} \right)", r"\left( 3, \frac{\pi}{2} \right)", r"\sqrt{8}", r"2\sqrt2", "10"]
    scores = math_reward(completions, answer=answers, prompts=["p"] * 5, level=[1] * 5)
    assert scores == [1.0, 1.0, 1.0, 1.0, 1.0]


def test_math_reward_unparseable_gold_is_none() -> None:
    assert math_reward([r"\boxed{1}", r"\boxed{1}"], answer=["", None]) == [None, None]


def test_math_reward_gold_given_as_solution() -> None:
    assert math_reward([r"\boxed{4}"], answer=[r"2+2 = $\boxed{4}$"]) == [1.0]


def test_math_reward_works_in_a_worker_thread() -> None:
    """math-verify's signal timeouts only work in the main thread; ours are disabled so threads are fine."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(math_reward([r"\boxed{\frac{2}{4}}"], answer=["1/2"])))
    thread.start()
    thread.join(30)
    assert out == [[1.0]]


@pytest.mark.parametrize(
    "prediction",
    [r"10^{10^{10}}", r"9^{9^{9^{9}}}", r"(10^{9})!", r"\begin{pmatrix} 10^{10^{10}} \\ 1 \end{pmatrix}", "1" * 1001],
)
def test_math_reward_rejects_gigantic_predictions_fast(prediction: str) -> None:
    """sympy would compute these integers in uninterruptible C code (hours, gigabytes): they score 0 at once."""
    assert math_reward([rf"\boxed{{{prediction}}}"], answer=["5"]) == [0.0]


def test_math_reward_keeps_reasonable_powers() -> None:
    assert math_reward([r"\boxed{2^{2^{2^{2}}}}", r"\boxed{2^{10}}"], answer=["65536", "1024"]) == [1.0, 1.0]
