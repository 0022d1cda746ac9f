"""MATH-style reward: the last ``\\boxed{...}`` of a completion, verified against the gold answer with math-verify.

math-verify guards parsing and comparison with ``signal.alarm`` timeouts, which only work in the main thread.
:class:`~lit_rlft.rewards.runner.RewardRunner` calls reward functions from a worker thread, so every call here
disables math-verify's own timeouts (``parsing_timeout=None``, ``timeout_seconds=None``) and relies on the
runner's timeout instead. sympy can also hang in uninterruptible C code (``10^{10^{10}}``), which no timeout
stops and which a timed-out thread would keep computing: predictions with gigantic exponents or factorials, or
longer than :data:`MAX_ANSWER_CHARS`, score 0 before sympy evaluates them.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_EXPONENT",
    "extract_boxed",
    "math_answer_from_solution",
    "math_reward",
    "verify_math_answer",
]

MAX_ANSWER_CHARS = 1000
"""Longest boxed prediction that is parsed; a longer one scores 0 (MATH answers are far shorter)."""
MAX_EXPONENT = 100_000
"""Largest numeric exponent (and factorial / binomial argument) allowed in a prediction; beyond it scores 0."""


_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _last_box_command(text: str) -> tuple[int, int] | None:
    """Start and end index of the last ``\\boxed`` / ``\\fbox`` command in ``text`` (None if absent).

    A command is only counted when it is not the prefix of a longer macro name (``\\boxedfoo``).
    """
    best: tuple[int, int] | None = None
    for command in _BOX_COMMANDS:
        start = text.rfind(command)
        while start != -1:
            end = start + len(command)
            if end >= len(text) or not text[end].isalpha():
                break
            start = text.rfind(command, 0, start)
        if start != -1 and (best is None or start > best[0]):
            best = (start, start + len(command))
    return best


def _braced_group(text: str, open_index: int) -> str | None:
    """Content of the brace group opening at ``text[open_index] == "{"``; None if it is never closed.

    Escaped braces (``\\{``, ``\\}``) and any other backslash pair are skipped, so ``\\boxed{\\{1, 2\\}}`` works.
    """
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
        i += 1
    return None


def _unbraced_argument(text: str, start: int) -> str | None:
    """Argument of ``\\boxed 5`` style commands: the text up to the next ``$`` or line end, stripped."""
    rest = text[start:]
    for stop in ("$", "\n"):
        rest = rest.split(stop, 1)[0]
    rest = rest.strip()
    return rest or None


def extract_boxed(text: str) -> str | None:
    """Content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, nested braces included.

    ``\\boxed 5`` (argument without braces) is read up to the next ``$`` or line end. Returns None when there is
    no boxed answer or when the last one is never closed (a truncated completion).

    >>> extract_boxed(r"so $x = \\boxed{\\frac{1}{2}}$.")
    '\\\\frac{1}{2}'
    """
    found = _last_box_command(text)
    if found is None:
        return None
    _, end = found
    i = end
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        content = _braced_group(text, i)
        return None if content is None else content.strip()
    if i > end:  # ``\boxed 5``: a space separates the command from its argument
        return _unbraced_argument(text, i)
    return None


def math_answer_from_solution(solution: str) -> str:
    """Final answer of a MATH worked solution: the content of its last ``\\boxed{}``.

    Raises:
        ValueError: the solution has no (closed) boxed answer.
    """
    answer = extract_boxed(solution)
    if answer is None:
        raise ValueError(f"no \\boxed{{}} answer in MATH solution: {solution[-200:]!r}")
    return answer


def _parse(latex: str) -> list[Any]:
    """math-verify ``parse`` of ``$latex$`` with its signal-based timeout disabled (thread-safe)."""
    from math_verify import parse

    return parse(f"${latex}$", parsing_timeout=None)


@lru_cache(maxsize=8192)
def _parse_gold(answer: str) -> tuple[Any, ...] | None:
    """Parsed gold answer (cached: a batch repeats each gold answer ``G`` times); None if unparseable."""
    text = answer.strip()
    if not text:
        return None
    boxed = extract_boxed(text)
    if boxed is not None:  # a gold answer given as a whole solution or already boxed
        text = boxed
    parsed = _parse(text)
    return tuple(parsed) if parsed else None


def _is_huge(node: Any) -> bool:
    """Whether one sympy node would make sympy compute a gigantic integer (``10^{10^{10}}``, ``(10^9)!``)."""
    import sympy

    if isinstance(node, sympy.Pow):
        arguments = [node.exp]
    elif isinstance(node, (sympy.factorial, sympy.factorial2, sympy.binomial, sympy.subfactorial)):
        arguments = list(node.args)
    else:
        return False
    for argument in arguments:
        if not argument.is_number:
            continue
        try:
            if abs(complex(argument.evalf(5))) > MAX_EXPONENT:
                return True
        except (TypeError, ValueError, OverflowError):
            continue
    return False


def _is_safe(parsed: list[Any]) -> bool:
    """Cheap guard against predictions whose comparison would hang sympy in C code (uninterruptible).

    Sub-expressions are checked innermost first, so an exponent is only evaluated once its own exponents are
    known to be small. This is a guard, not a sandbox: the runner's timeout remains the backstop.
    """
    import sympy

    for item in parsed:
        if isinstance(item, sympy.MatrixBase):
            entries = list(item)
        elif isinstance(item, sympy.Basic):
            entries = [item]
        else:
            continue
        for entry in entries:
            if any(_is_huge(node) for node in sympy.postorder_traversal(entry)):
                return False
    return True


def verify_math_answer(prediction: str, answer: str) -> float | None:
    """1.0 if ``prediction`` (the content of a box) equals ``answer`` mathematically, else 0.0.

    Returns None when the gold ``answer`` cannot be parsed.
    """
    from math_verify import verify

    gold = _parse_gold(str(answer))
    if gold is None:
        return None
    if len(prediction) > MAX_ANSWER_CHARS:
        return 0.0
    pred = _parse(prediction)
    if not pred or not _is_safe(pred):
        return 0.0
    return 1.0 if verify(list(gold), pred, timeout_seconds=None) else 0.0


def math_reward(completions: list[str], answer: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """Reward 1.0 when the last ``\\boxed{}`` of a completion is equivalent to the gold ``answer``, else 0.0.

    Args:
        completions: ``N`` generated texts.
        answer: ``N`` gold answers (LaTeX without ``$``, e.g. ``\\frac{1}{2}``; a boxed solution also works).
        **kwargs: other data set columns, ignored.

    Returns:
        ``N`` scores: 1.0 / 0.0, 0.0 when there is no boxed answer, None when the gold answer is unparseable.
    """
    scores: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        if gold is None or _parse_gold(str(gold)) is None:
            scores.append(None)
            continue
        prediction = extract_boxed(completion)
        scores.append(0.0 if prediction is None else verify_math_answer(prediction, str(gold)))
    return scores
