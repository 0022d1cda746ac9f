"""Where a completion states its final answer: ``<answer>`` tags, the last line, a ``#### `` marker or the last number.

    extract_answer("Adding them: <answer>7</answer>", "answer_tags")   # -> "7"
    write_answer("7", "marker")                                          # -> "#### 7" (an SFT target)
    AnswerFormatReward("answer_tags")(["<answer>7</answer>", "7"])       # -> [1.0, 0.0]

One definition serves the task that writes warm-start targets (:class:`~lit_rlft.data.ReasoningGymTask`'s
``solution``), the reward that reads answers (:class:`~lit_rlft.rewards.ReasoningGymReward`) and the format reward
beside it, so the three never disagree on what "in the format" means. Every extraction runs in linear time (reverse
string searches, one linear pattern) and reads at most :data:`MAX_COMPLETION_CHARS` of a completion.
"""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

__all__ = ["ANSWER_FORMATS", "MAX_COMPLETION_CHARS", "AnswerFormat", "AnswerFormatReward", "check_answer_format",
           "extract_answer", "write_answer"]

AnswerFormat = Literal["answer_tags", "last_line", "marker", "last_number"]
#: The answer formats, as the ``answer_format`` options take them.
ANSWER_FORMATS: tuple[str, ...] = get_args(AnswerFormat)
MAX_COMPLETION_CHARS = 200_000
"""Longest completion read at all (characters); a longer one has no answer."""

_OPEN, _CLOSE, _MARKER = "<answer>", "</answer>", "####"
# A number as written: digits with optional comma groups and decimals (each repeat starts with its separator, so the
# match is linear); a minus only where it cannot be a binary minus (not after a word character, ``)`` or ``]``).
_NUMBER = re.compile(r"(?:(?<![\w)\]])-)?\d+(?:[.,]\d+)*")


def check_answer_format(answer_format: str, option: str = "answer_format") -> str:
    """``answer_format`` when it is one of :data:`ANSWER_FORMATS`, else a ValueError naming ``option``."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"{option} must be one of {', '.join(ANSWER_FORMATS)}; got {answer_format!r}")
    return answer_format


def extract_answer(completion: Any, answer_format: AnswerFormat = "answer_tags") -> str | None:
    """The answer ``completion`` states in ``answer_format`` (stripped), or None when it states none.

    - ``answer_tags``: the content of the last ``<answer>...</answer>`` pair (an unclosed tag is no answer);
    - ``last_line``: the last non-empty line;
    - ``marker``: what follows the last ``####`` on its line;
    - ``last_number``: the last number written (lenient: for probing a model that ignores the format).

    An empty answer is None; a completion that is not a string or is longer than :data:`MAX_COMPLETION_CHARS`
    states none.

    >>> extract_answer("I think <answer> 12 </answer> done", "answer_tags")
    '12'
    >>> extract_answer("3 + 4 is\\n7\\n", "last_line")
    '7'
    >>> extract_answer("so 3 + 4 = 7.", "last_number")
    '7'
    """
    if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
        return None
    if answer_format == "answer_tags":
        end = completion.rfind(_CLOSE)
        start = completion.rfind(_OPEN, 0, end) if end >= 0 else -1
        answer = completion[start + len(_OPEN):end] if start >= 0 else None
    elif answer_format == "last_line":
        lines = [line for line in completion.splitlines() if line.strip()]
        answer = lines[-1] if lines else None
    elif answer_format == "marker":
        at = completion.rfind(_MARKER)
        answer = completion[at + len(_MARKER):].split("\n", 1)[0] if at >= 0 else None
    elif answer_format == "last_number":
        numbers = _NUMBER.findall(completion)
        answer = numbers[-1] if numbers else None
    else:
        check_answer_format(answer_format)
        answer = None
    if answer is None:
        return None
    answer = answer.strip()
    return answer or None


def write_answer(answer: str, answer_format: AnswerFormat = "answer_tags") -> str:
    """The completion that states ``answer`` in ``answer_format`` (a warm start's target), the inverse of
    :func:`extract_answer`: ``<answer>7</answer>``, ``7``, ``#### 7``, ``7``.

    >>> write_answer("7", "answer_tags")
    '<answer>7</answer>'
    """
    check_answer_format(answer_format)
    if answer_format == "answer_tags":
        return f"{_OPEN}{answer}{_CLOSE}"
    if answer_format == "marker":
        return f"{_MARKER} {answer}"
    return str(answer)


class AnswerFormatReward:
    """Reward 1.0 when a completion states an answer in ``answer_format`` (right or wrong), else 0.0: the shaping term
    a small model needs before the task's reward can pay. Give it a small weight beside the task reward (e.g. 0.2
    against 1.0), below ``success_threshold``, so it never makes a completion count as correct. Picklable (reward
    workers).

    Args:
        answer_format: one of :data:`ANSWER_FORMATS` (the task reward's).

    >>> AnswerFormatReward("answer_tags")(["<answer>7</answer>", "7", "<answer></answer>"])
    [1.0, 0.0, 0.0]
    """

    #: The probe reads a reward with this flag as the share of completions in the answer format.
    is_format_reward = True

    def __init__(self, answer_format: AnswerFormat = "answer_tags"):
        self.answer_format = check_answer_format(answer_format)
        self.__name__ = f"answer_format_{answer_format}"

    def __call__(self, completions: list[str], **columns: Any) -> list[float]:
        """``N`` scores for ``N`` completions; ``columns`` are ignored."""
        return [0.0 if extract_answer(c, self.answer_format) is None else 1.0 for c in completions]

    def __repr__(self) -> str:
        return f"AnswerFormatReward({self.answer_format!r})"
