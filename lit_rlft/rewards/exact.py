"""Exact-match reward: the stripped completion must equal the stripped gold answer.

Limits: none needed; a string comparison, linear in the completion's length, parses nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["exact_match_reward"]


def exact_match_reward(completions: list[str], answer: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """Reward 1.0 when ``completion.strip() == str(answer).strip()``, else 0.0.

    Args:
        completions: ``N`` generated texts.
        answer: ``N`` gold answers (converted with ``str``); a None answer gives a None (unscored) score.
        **kwargs: other data set columns, ignored.
    """
    return [
        None if gold is None else float(completion.strip() == str(gold).strip())
        for completion, gold in zip(completions, answer, strict=True)
    ]
