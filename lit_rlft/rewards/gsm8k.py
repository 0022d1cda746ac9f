"""GSM8K reward: the final number of a completion compared numerically with the gold ``#### <number>``.

Limits: a completion longer than :data:`MAX_COMPLETION_CHARS` scores 0; a number with more than
:data:`MAX_NUMBER_DIGITS` digits is not read as a number (Python refuses to convert more than 4,300 digits, and
no GSM8K answer has more than a dozen). Every pattern here is matched in linear time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Any

from lit_rlft.rewards.math import extract_boxed

__all__ = ["MAX_COMPLETION_CHARS", "MAX_NUMBER_DIGITS", "gsm8k_format_reward", "gsm8k_gold", "gsm8k_prediction", "gsm8k_reward", "parse_number"]

# A number: ``1,234.5`` (thousands groups), ``1234``, ``.5``; a leading minus only when it cannot be a binary
# minus (not preceded by a digit, letter, ``)`` or ``]``), so ``10-5`` reads as 10 and 5.
_NUMBER = re.compile(r"(?:(?<![\w)\]])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)?(?:\.\d+)?")
_WHOLE_NUMBER = re.compile(r"-?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)")
_MARKER = "####"
MAX_COMPLETION_CHARS = 200_000
"""Longest completion read at all (characters); a longer one scores 0."""
MAX_NUMBER_DIGITS = 100
"""Most digits a number may have to be read; a longer digit string is not a number."""


def _find_numbers(text: str) -> list[str]:
    """All numbers in ``text`` in order of appearance, as written (commas kept)."""
    return [m.group(0) for m in _NUMBER.finditer(text) if any(c.isdigit() for c in m.group(0))]


def parse_number(text: str) -> Fraction | None:
    """Exact value of a written number, ignoring thousands commas, ``$`` and a trailing period; None if not a number.

    >>> parse_number("$1,000.00.")
    Fraction(1000, 1)
    """
    cleaned = text.replace("$", "").replace("\\", "").strip().rstrip(".").strip()
    if sum(c.isdigit() for c in cleaned) > MAX_NUMBER_DIGITS or not _WHOLE_NUMBER.fullmatch(cleaned):
        return None
    return Fraction(cleaned.replace(",", ""))


def _format(value: Fraction) -> str:
    """Canonical string of a GSM8K number: ``18`` for 18.00, a decimal otherwise."""
    if value.denominator == 1:
        return str(value.numerator)
    return str(Decimal(value.numerator) / Decimal(value.denominator))


def _number_in_segment(segment: str) -> Fraction | None:
    """The number a final-answer segment (after ``####`` or inside a box) states.

    The whole segment if it is a number; else, after the last ``=`` if any, the first number written.
    """
    whole = parse_number(segment)
    if whole is not None:
        return whole
    tail = segment.rsplit("=", 1)[-1]
    numbers = _find_numbers(tail)
    return parse_number(numbers[0]) if numbers else None


def gsm8k_gold(answer: Any) -> str | None:
    """Canonical gold number from a GSM8K worked solution (``... #### 1,000``) or a bare number.

    Returns None when no number can be read.

    >>> gsm8k_gold("She makes 9 * 2 = $18 every day.\\n#### 18")
    '18'
    """
    if answer is None:
        return None
    text = str(answer)
    segment = text.rsplit(_MARKER, 1)[1] if _MARKER in text else text
    value = _number_in_segment(segment)
    return None if value is None else _format(value)


def gsm8k_prediction(completion: str) -> Fraction | None:
    """The number a completion answers: after its last ``####``, else in its last ``\\boxed{}``, else its last
    number. None when the completion contains no number there, or is longer than :data:`MAX_COMPLETION_CHARS`."""
    if len(completion) > MAX_COMPLETION_CHARS:
        return None
    if _MARKER in completion:
        return _number_in_segment(completion.rsplit(_MARKER, 1)[1])
    boxed = extract_boxed(completion)
    if boxed is not None:
        return _number_in_segment(boxed)
    numbers = _find_numbers(completion)
    return parse_number(numbers[-1]) if numbers else None


def gsm8k_reward(completions: list[str], answer: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """Reward 1.0 when a completion's final number equals the gold GSM8K answer, else 0.0.

    Args:
        completions: ``N`` generated texts.
        answer: ``N`` gold answers: worked solutions ending in ``#### <number>`` or bare numbers.
        **kwargs: other data set columns, ignored.

    Returns:
        ``N`` scores: 1.0 / 0.0; None where the gold answer has no readable number.
    """
    scores: list[float | None] = []
    for completion, gold_text in zip(completions, answer, strict=True):
        gold = gsm8k_gold(gold_text)
        if gold is None:
            scores.append(None)
            continue
        prediction = gsm8k_prediction(completion)
        scores.append(1.0 if prediction is not None and prediction == Fraction(gold) else 0.0)
    return scores


def gsm8k_format_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """Reward 1.0 when a completion states its answer in GSM8K's format, ``#### <number>`` (the number readable),
    else 0.0; right or wrong does not matter. A shaping term for small models that first have to learn to finish
    their answer: give it a small weight next to :func:`gsm8k_reward` (e.g. 0.2 against 1.0), below
    ``success_threshold`` so that it never makes a completion count as correct.

    Args:
        completions: ``N`` generated texts.
        **kwargs: data set columns, ignored.
    """
    return [1.0 if len(c) <= MAX_COMPLETION_CHARS and _MARKER in c
            and _number_in_segment(c.rsplit(_MARKER, 1)[1]) is not None else 0.0 for c in completions]


gsm8k_format_reward.is_format_reward = True  # what `lit-rlft probe` reads as the share in the answer format
