"""Countdown reward: an arithmetic expression over given numbers that must hit a target.

The completion is untrusted model output. It is read by a small hand-written recursive-descent parser over
integers, ``+ - * /``, parentheses and whitespace, with caps on length and nesting depth, and evaluated exactly
with :class:`fractions.Fraction`. Nothing is ever passed to ``eval``, ``ast`` or ``compile``. The answer tag is
found with two reverse string searches (linear time, also when a tag is never closed); the expression is read only
up to :data:`MAX_LENGTH` characters, :data:`MAX_DEPTH` parentheses deep, with integers of at most
:data:`MAX_DIGITS` digits.

Grammar (no unary minus, no implicit multiplication, no ``**``)::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | "(" expr ")"
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "MAX_LENGTH",
    "CountdownReward",
    "countdown_answer",
    "countdown_reward",
    "parse_expression",
]

MAX_LENGTH = 200
"""Longest expression (characters, after stripping) the parser reads."""
MAX_DEPTH = 32
"""Deepest parenthesis nesting the parser accepts."""
MAX_DIGITS = 12
"""Longest integer literal the parser accepts (Countdown numbers are small)."""

_TOKEN = re.compile(r"\s*(?:([0-9]+)|([-+*/()]))")
_OPEN, _CLOSE = "<answer>", "</answer>"


def _tokenize(text: str) -> list[str]:
    """Split a stripped ``text`` into integer and operator tokens; ValueError on any other character."""
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ValueError(f"unexpected character {text[pos:].lstrip()[:1]!r}")
        number, operator = match.groups()
        if number is not None and len(number) > MAX_DIGITS:
            raise ValueError(f"integer literal longer than {MAX_DIGITS} digits")
        tokens.append(number if number is not None else operator)
        pos = match.end()
    return tokens


class _Parser:
    """Recursive-descent parser and exact evaluator over a token list."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0
        self.numbers: list[int] = []

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise ValueError("unexpected end of expression")
        self.pos += 1
        return token

    def parse(self) -> Fraction:
        """Parse the whole token list; ValueError if anything is left over."""
        if not self.tokens:
            raise ValueError("empty expression")
        value = self._expr()
        if self.pos != len(self.tokens):
            raise ValueError(f"unexpected token {self.tokens[self.pos]!r}")
        return value

    def _expr(self) -> Fraction:
        value = self._term()
        while self._peek() in ("+", "-"):
            operator = self._take()
            right = self._term()
            value = value + right if operator == "+" else value - right
        return value

    def _term(self) -> Fraction:
        value = self._factor()
        while self._peek() in ("*", "/"):
            operator = self._take()
            right = self._factor()
            if operator == "*":
                value = value * right
            elif right == 0:
                raise ValueError("division by zero")
            else:
                value = value / right
        return value

    def _factor(self) -> Fraction:
        token = self._take()
        if token == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ValueError(f"parentheses nested deeper than {MAX_DEPTH}")
            value = self._expr()
            if self._take() != ")":
                raise ValueError("expected ')'")
            self.depth -= 1
            return value
        if token.isdigit():
            self.numbers.append(int(token))
            return Fraction(int(token))
        raise ValueError(f"unexpected token {token!r}")


def parse_expression(text: str) -> tuple[Fraction, list[int]]:
    """Parse and evaluate an untrusted arithmetic expression.

    Returns:
        The exact value and the integer literals used, in order of appearance.

    Raises:
        ValueError: not a valid expression (other characters, unary minus, ``**``, unbalanced parentheses,
            longer than :data:`MAX_LENGTH`, nested deeper than :data:`MAX_DEPTH`, division by zero).

    >>> parse_expression("(12 - 3) * 9")
    (Fraction(81, 1), [12, 3, 9])
    """
    if not isinstance(text, str):
        raise ValueError(f"expression must be a string, got {type(text).__name__}")
    text = text.strip()
    if len(text) > MAX_LENGTH:
        raise ValueError(f"expression longer than {MAX_LENGTH} characters")
    parser = _Parser(_tokenize(text))
    value = parser.parse()
    return value, parser.numbers


def countdown_answer(completion: str) -> str:
    """The answer text of a completion: the content of its last closed ``<answer>...</answer>`` (from the last
    ``<answer>`` before the last ``</answer>``), else the whole completion. Linear time."""
    end = completion.rfind(_CLOSE)
    start = completion.rfind(_OPEN, 0, end) if end != -1 else -1
    if start == -1:
        return completion.strip()
    return completion[start + len(_OPEN) : end].strip()


def _as_fraction(target: Any) -> Fraction:
    """Target as an exact number (int, integral float or numeric string)."""
    return Fraction(str(target).strip()) if isinstance(target, str) else Fraction(target)


def _score_one(completion: str, nums: Sequence[Any], target: Any, format_reward: float) -> float | None:
    """Score a single completion; None when the row itself (``nums`` / ``target``) is unusable."""
    if isinstance(nums, str):  # "12 7 3" or "12,7,3"
        nums = [n for n in re.split(r"[\s,]+", nums.strip()) if n]
    try:
        goal = _as_fraction(target)
        allowed = Counter(int(n) for n in nums)
    except (TypeError, ValueError):
        return None
    try:
        value, used = parse_expression(countdown_answer(completion))
    except ValueError:
        return 0.0
    if value == goal and Counter(used) == allowed:
        return 1.0
    return float(format_reward)


def countdown_reward(
    completions: list[str],
    nums: Sequence[Sequence[int]],
    target: Sequence[int],
    format_reward: float = 0.0,
    **kwargs: Any,
) -> list[float | None]:
    """Reward 1.0 when a completion is an expression that uses every number of ``nums`` exactly once and
    equals ``target``; ``format_reward`` when it parses but is wrong; 0.0 when it does not parse.

    Args:
        completions: ``N`` generated texts; the answer is the last ``<answer>...</answer>`` if present, else the
            whole (stripped) completion.
        nums: ``N`` lists of the available numbers (a ``"12 7 3"`` string also works).
        target: ``N`` targets.
        format_reward: score of a well-formed but wrong expression (the DPS paper uses 0.1).
        **kwargs: other data set columns, ignored.

    Returns:
        ``N`` scores; None where ``nums`` / ``target`` of a row cannot be read.
    """
    return [
        _score_one(completion, row_nums, row_target, format_reward)
        for completion, row_nums, row_target in zip(completions, nums, target, strict=True)
    ]


class CountdownReward:
    """:func:`countdown_reward` with a fixed ``format_reward``, for YAML (``class_path`` + ``init_args``).

    Args:
        format_reward: score of a well-formed but wrong expression (the DPS paper uses 0.1).
        name: name under which the runner logs this reward.
    """

    def __init__(self, format_reward: float = 0.0, name: str = "countdown_reward") -> None:
        self.format_reward = float(format_reward)
        self.name = name

    def __call__(
        self, completions: list[str], nums: Sequence[Sequence[int]], target: Sequence[int], **kwargs: Any
    ) -> list[float | None]:
        """Score ``completions``; see :func:`countdown_reward`."""
        return countdown_reward(completions, nums, target, format_reward=self.format_reward)

    def __repr__(self) -> str:
        return f"CountdownReward(format_reward={self.format_reward}, name={self.name!r})"
