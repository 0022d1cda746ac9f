"""MATH-style reward: the last ``\\boxed{...}`` of a completion, verified against the gold answer with math-verify.

Limits (each scores the completion 0 before sympy sees it; the runner's per-completion time bound, which kills
the worker process, stays the backstop):

- a completion longer than :data:`MAX_COMPLETION_CHARS` characters, a boxed prediction longer than
  :data:`MAX_ANSWER_CHARS` or nested deeper than :data:`MAX_NESTING`;
- operators that make sympy evaluate (``\\sum``, ``\\prod``, ``\\int``, ``\\lim``...), unless the gold answer
  uses them too: ``\\prod_{k=1}^{10^9} k`` would never finish;
- numbers sympy would have to expand: a power whose exponent exceeds :data:`MAX_EXPONENT` or whose value has more
  than :data:`MAX_DIGITS` digits (``(10^{99999})^{99999}``), a factorial or binomial of more than
  :data:`MAX_FACTORIAL`.

Extraction of the boxed answer is a single linear scan. math-verify's own ``signal.alarm`` timeouts only work in
a main thread, so they are disabled here (``parsing_timeout=None``, ``timeout_seconds=None``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_COMPLETION_CHARS",
    "MAX_DIGITS",
    "MAX_EXPONENT",
    "MAX_FACTORIAL",
    "MAX_NESTING",
    "extract_boxed",
    "math_answer_from_solution",
    "math_reward",
    "verify_math_answer",
]

MAX_ANSWER_CHARS = 1000
"""Longest boxed prediction that is parsed; a longer one scores 0 (MATH answers are far shorter)."""
MAX_COMPLETION_CHARS = 200_000
"""Longest completion read at all (characters); a longer one scores 0."""
MAX_EXPONENT = 100_000
"""Largest numeric exponent allowed in a prediction; beyond it scores 0."""
MAX_DIGITS = 100_000
"""Most decimal digits a power in a prediction may have (``|exponent| * log10|base|``); beyond it scores 0."""
MAX_FACTORIAL = 10_000
"""Largest factorial / binomial / subfactorial argument allowed in a prediction; beyond it scores 0."""
MAX_NESTING = 10
"""Deepest nesting of braces, parentheses and brackets allowed in a prediction (the LaTeX parser is slow on deep
nesting: 16 braces take 25 s, 10 about 1.5 s; MATH gold answers nest at most 3 deep); beyond it scores 0."""
_EVALUATING = ("\\sum", "\\prod", "\\int", "\\oint", "\\iint", "\\lim", "\\coprod", "∑", "∏", "∫")
"""LaTeX that makes sympy compute (sums, products, integrals, limits): refused unless the gold answer has it."""


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


def _nesting(text: str) -> int:
    """Deepest nesting of ``{([`` in ``text`` (unbalanced closers ignored), in one pass."""
    depth = deepest = 0
    for char in text:
        if char in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "})]" and depth:
            depth -= 1
    return deepest


def _magnitude(node: Any) -> float | None:
    """``|node|`` as a float (``inf`` when too large for one), None when it is not a number sympy can evaluate."""
    if not node.is_number:
        return None
    try:
        return abs(complex(node.evalf(15)))
    except (TypeError, ValueError):
        return None
    except OverflowError:
        return math.inf


def _is_huge(node: Any, allow_evaluating: bool = False) -> bool:
    """Whether one sympy node would make sympy compute a gigantic number (``10^{10^{10}}``,
    ``(10^{99999})^{99999}``, ``(10^9)!``) or evaluate a sum, product, integral or limit."""
    import sympy

    if isinstance(node, (sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit)):
        return not allow_evaluating
    if isinstance(node, sympy.Pow):
        exponent = _magnitude(node.exp)
        if exponent is None:
            return False
        if exponent > MAX_EXPONENT:
            return True
        base = _magnitude(node.base)
        return base is not None and base > 1 and exponent * math.log10(base) > MAX_DIGITS
    if isinstance(node, (sympy.factorial, sympy.factorial2, sympy.binomial, sympy.subfactorial)):
        sizes = [_magnitude(argument) for argument in node.args]
        return any(size is not None and size > MAX_FACTORIAL for size in sizes)
    return False


def _is_safe(parsed: list[Any], allow_evaluating: bool = False) -> bool:
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
            if any(_is_huge(node, allow_evaluating) for node in sympy.postorder_traversal(entry)):
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
    if len(prediction) > MAX_ANSWER_CHARS or _nesting(prediction) > MAX_NESTING:
        return 0.0
    gold_evaluates = any(command in str(answer) for command in _EVALUATING)
    if not gold_evaluates and any(command in prediction for command in _EVALUATING):
        return 0.0
    pred = _parse(prediction)
    if not pred or not _is_safe(pred, allow_evaluating=gold_evaluates):
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
        prediction = None if len(completion) > MAX_COMPLETION_CHARS else extract_boxed(completion)
        scores.append(0.0 if prediction is None else verify_math_answer(prediction, str(gold)))
    return scores
