"""Rewards and parsers under hostile model output: a corpus of our own and property-based tests (hypothesis).

What must hold for every reward function and every input: it returns one finite score from its documented set
(or None only when the gold row itself is unusable), raises nothing, executes nothing, and finishes quickly.
"""

import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lit_rlft.rewards import (
    countdown_answer,
    countdown_reward,
    exact_match_reward,
    extract_boxed,
    gsm8k_format_reward,
    gsm8k_reward,
    math_reward,
    parse_expression,
    parse_number,
)

MB = 1_000_000
PWNED = Path("/tmp/lit_rlft_pwned")

HOSTILE = [
    "",
    " ",
    "\x00",
    # huge numbers: exponents, towers, products, sums, factorials
    r"\boxed{10^{10^{10}}}",
    r"\boxed{(10^{99999})^{99999}}",
    r"\boxed{2^{2^{2^{2^{2}}}}}",
    r"\boxed{\prod_{k=1}^{10^{9}} k}",
    r"\boxed{\sum_{k=1}^{10^{100}} k}",
    r"\boxed{\int_0^{10^{9}} e^{x^2} dx}",
    r"\boxed{\lim_{n\to\infty} (1+1/n)^{n^{n}}}",
    r"\boxed{(10^{9})!}",
    r"\boxed{\binom{10^{12}}{10^{6}}}",
    "#### " + "9" * 5000,  # past Python's 4,300-digit int conversion limit
    "#### 1e309",
    "<answer>" + "9" * 5000 + "</answer>",
    # deep nesting
    r"\boxed{" + "{" * 400 + "1" + "}" * 400 + "}",
    r"\boxed{" + "(" * 400 + "1" + ")" * 400 + "}",
    r"\boxed{" + r"\frac{1}{" * 200 + "2" + "}" * 200 + "}",
    "<answer>" + "(" * 10_000 + "1" + ")" * 10_000 + "</answer>",
    # megabyte strings, unclosed tags and boxes
    "a" * MB,
    "<answer>" * (MB // 8),
    "<answer>" + "1+" * (MB // 2),
    r"\boxed{" * (MB // 7),
    "\\boxed" * (MB // 6),
    "####" * (MB // 4),
    "1," * (MB // 2),
    "-" * MB + "5",
    "9" * MB,
    # odd unicode and invalid UTF-8 as decoders leave it
    "\u202e\u200b\u2066 \\boxed{５} ٣ ⁵ ½",
    "e\u0301" * 1000 + "\\boxed{1}",
    "\ud800\udfff #### 12",  # lone surrogates
    b"\xff\xfe #### 7 \x80".decode("utf-8", errors="surrogateescape"),
    b"\xff\xfe #### 7 \x80".decode("utf-8", errors="replace"),
    "🙂" * 10_000,
    # injection-looking text
    f"<answer>__import__('os').system('touch {PWNED}')</answer>",
    f"\\boxed{{__import__('os').system('touch {PWNED}')}}",
    "#### {{7*7}} ${7*7} `touch /tmp/lit_rlft_pwned` '; DROP TABLE prompts; --",
    r"\boxed{\input{/etc/passwd}}",
    # non-finite literals
    "nan",
    "inf",
    "#### nan",
    "#### inf",
    r"\boxed{\infty}",
    r"\boxed{\text{NaN}}",
    "<answer>1/0</answer>",
]

REWARDS = {
    "math_reward": (lambda c: math_reward(c, answer=["5"] * len(c)), {0.0, 1.0}),
    "gsm8k_reward": (lambda c: gsm8k_reward(c, answer=["#### 11"] * len(c)), {0.0, 1.0}),
    "gsm8k_format_reward": (lambda c: gsm8k_format_reward(c), {0.0, 1.0}),
    "countdown_reward": (
        lambda c: countdown_reward(c, nums=[[1, 2, 4]] * len(c), target=[7] * len(c), format_reward=0.1),
        {0.0, 0.1, 1.0},
    ),
    "exact_match_reward": (lambda c: exact_match_reward(c, answer=["5"] * len(c)), {0.0, 1.0}),
}


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_hostile_corpus_scores_finite_fast_and_executes_nothing(name: str) -> None:
    reward, allowed = REWARDS[name]
    PWNED.unlink(missing_ok=True)
    slowest = (0.0, "")
    for completion in HOSTILE:
        start = time.perf_counter()
        scores = reward([completion])
        elapsed = time.perf_counter() - start
        slowest = max(slowest, (elapsed, completion[:60]))
        assert len(scores) == 1 and scores[0] in allowed, (completion[:80], scores)
    # the per-call bound these functions document (the runner's timeout is the backstop): seconds, not minutes
    assert slowest[0] < 5.0, slowest
    assert not PWNED.exists()


def test_hostile_corpus_does_not_score_correct() -> None:
    """None of the hostile texts is a right answer (a guard that scored 1 would be a reward hack); the format
    reward is left out, since it does not look at the answer."""
    for name, (reward, _) in REWARDS.items():
        if name == "gsm8k_format_reward":
            continue
        scores = reward(HOSTILE)
        assert max(scores) < 1.0, name


def test_guards_keep_legitimate_answers() -> None:
    assert math_reward([r"so \boxed{10^{5}}", r"\boxed{5!}", r"\boxed{\frac{1}{2}}"],
                       answer=["100000", "120", "0.5"]) == [1.0, 1.0, 1.0]
    assert math_reward([r"\boxed{\sum_{k=1}^{3} k}"], answer=[r"\sum_{k=1}^{3} k"]) == [1.0]  # gold uses it too
    assert gsm8k_reward(["#### 1,234,567,890,123"], answer=["#### 1234567890123"]) == [1.0]
    assert countdown_reward(["<answer>(4 + 2) + 1</answer>"], nums=[[1, 2, 4]], target=[7]) == [1.0]


def test_linear_time_on_unclosed_tags() -> None:
    """Quadratic extraction would take minutes here (80,000 characters took 3.4 s with a lazy regex)."""
    text = "<answer>" * 100_000
    start = time.perf_counter()
    assert countdown_answer(text) == text.strip()
    assert extract_boxed("\\boxed{" * 100_000) is None
    assert time.perf_counter() - start < 2.0


# ------------------------------------------------------------------------------------------ property-based
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=300) | st.text(
    alphabet="\\boxed{}()[]^_0123456789-+*/.,#$<>answer/ \n", max_size=300
)


@PROPERTY
@given(texts)
def test_every_reward_scores_any_text(text: str) -> None:
    for name, (reward, allowed) in REWARDS.items():
        scores = reward([text])
        assert len(scores) == 1 and scores[0] in allowed, (name, text)


@PROPERTY
@given(texts)
def test_extractors_return_substrings(text: str) -> None:
    boxed = extract_boxed(text)
    assert boxed is None or boxed in text
    assert countdown_answer(text) in text


@PROPERTY
@given(texts)
def test_parsers_fail_only_with_value_error(text: str) -> None:
    value = parse_number(text)
    assert value is None or isinstance(value, Fraction)
    try:
        result, numbers = parse_expression(text)
    except ValueError:
        return
    assert isinstance(result, Fraction) and all(isinstance(n, int) for n in numbers)


@PROPERTY
@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_parse_number_reads_written_integers_exactly(n: int) -> None:
    assert parse_number(str(n)) == n
    assert parse_number(f"{n:,}") == n
    assert gsm8k_reward([f"so the answer is #### {n:,}"], answer=[f"#### {n}"]) == [1.0]


@st.composite
def expressions(draw: st.DrawFn, depth: int = 0) -> tuple[str, Fraction]:
    """A random expression of the Countdown grammar and its exact value (None on division by zero)."""
    if depth > 3 or draw(st.booleans()):
        n = draw(st.integers(min_value=0, max_value=999))
        return str(n), Fraction(n)
    left_text, left = draw(expressions(depth + 1))
    right_text, right = draw(expressions(depth + 1))
    op = draw(st.sampled_from("+-*/"))
    if left is None or right is None or (op == "/" and right == 0):
        return f"({left_text}{op}{right_text})", None
    value = {"+": left + right, "-": left - right, "*": left * right, "/": left / right if right else None}[op]
    return f"({left_text} {op} {right_text})", value


@PROPERTY
@given(expressions())
def test_parse_expression_evaluates_exactly(case: tuple[str, Fraction | None]) -> None:
    text, value = case
    if value is None:
        with pytest.raises(ValueError):
            parse_expression(text)
        return
    if len(text) > 200:  # beyond MAX_LENGTH the parser refuses
        with pytest.raises(ValueError, match="longer"):
            parse_expression(text)
        return
    assert parse_expression(text)[0] == value
