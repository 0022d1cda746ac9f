"""ReasoningGymReward: a reasoning-gym dataset's own ``score_answer`` on the answer a completion states.

    model:
      reward_funcs:
        - class_path: lit_rlft.rewards.ReasoningGymReward
          init_args: {answer_format: answer_tags}
        - class_path: lit_rlft.rewards.AnswerFormatReward
          init_args: {answer_format: answer_tags}
      reward_weights: [1.0, 0.2]

Each row's ``task`` column names its dataset and ``metadata`` holds what the dataset generated
(:class:`~lit_rlft.data.ReasoningGymTask` writes both), so one reward scores a mix of tasks, each by its own rule.
The answer is extracted as ``answer_format`` says (:mod:`~lit_rlft.rewards.answer_format`), at most
``max_answer_chars`` long (a longer one scores 0 without reaching the dataset's scorer, whose parsing may not be
linear), then scored; a score outside [0, 1] or a scorer that raises is "could not be scored" (None), which the
reward runner counts and scores as its fallback. The reward is picklable (it holds its settings only; each process
looks the scorers up once) and deterministic; reward workers bound its time (``model.reward_timeout_s``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lit_rlft.rewards.answer_format import AnswerFormat, check_answer_format, extract_answer
from lit_rlft.runtime.imports import require

__all__ = ["GYM_EXTRA", "ReasoningGymReward", "gym_score"]

#: The optional extra that installs reasoning-gym.
GYM_EXTRA = "pip install 'lit_rlft[gym]'"
_SCORERS: dict[str, Any] = {}  # dataset name -> its score_answer, per process


def _scorer(task: str) -> Any:
    fn = _SCORERS.get(task)
    if fn is None:
        factory = require("reasoning_gym.factory", GYM_EXTRA, what="reasoning-gym tasks")
        if task not in factory.DATASETS:
            raise ValueError(f"unknown reasoning-gym task {task!r}")
        fn = _SCORERS[task] = factory.get_score_answer_fn(task)
    return fn


def gym_score(task: str, answer: str | None, question: str, gold: str, metadata: dict[str, Any]) -> float:
    """reasoning-gym's own score of ``answer`` for the entry ``{question, answer: gold, metadata}`` of dataset
    ``task`` (its ``score_answer``; in [0, 1], 1.0 for a correct answer)."""
    return float(_scorer(task)(answer, {"question": question, "answer": gold, "metadata": metadata}))


class ReasoningGymReward:
    """Score completions with each row's reasoning-gym dataset (see the module docstring).

    Args:
        answer_format: where a completion states its answer: ``answer_tags`` (``<answer>...</answer>``, the
            reasoning-gym convention), ``last_line``, ``marker`` (``#### ...``) or ``last_number`` (lenient).
        max_answer_chars: longest extracted answer scored; a longer one scores 0.

    The columns it reads: ``task`` (dataset name), ``answer`` (gold), ``metadata`` and ``question`` (the raw
    question; the prompt text when there is no such column). ``N`` completions in, ``N`` scores out.
    """

    def __init__(self, answer_format: AnswerFormat = "answer_tags", max_answer_chars: int = 1_000):
        self.answer_format = check_answer_format(answer_format, "ReasoningGymReward.answer_format")
        if isinstance(max_answer_chars, bool) or not isinstance(max_answer_chars, int) or max_answer_chars < 1:
            raise ValueError(f"ReasoningGymReward.max_answer_chars must be an integer >= 1, got {max_answer_chars!r}")
        self.max_answer_chars = max_answer_chars
        self.__name__ = "reasoning_gym"

    def __call__(self, completions: list[str], answer: Sequence[Any], task: Sequence[str],
                 metadata: Sequence[dict[str, Any]], question: Sequence[str] | None = None,
                 **columns: Any) -> list[float | None]:
        questions = question if question is not None else columns.get("prompt", [""] * len(completions))
        scores: list[float | None] = []
        for text, gold, name, meta, q in zip(completions, answer, task, metadata, questions, strict=True):
            stated = extract_answer(text, self.answer_format)
            if stated is None or len(stated) > self.max_answer_chars:
                scores.append(0.0)
                continue
            try:
                score = gym_score(str(name), stated, str(q), str(gold), dict(meta or {}))
            except Exception:  # the dataset's scorer on untrusted text: a failure is "not scored", counted
                scores.append(None)
                continue
            scores.append(score if math.isfinite(score) and 0.0 <= score <= 1.0 else None)
        return scores

    def __repr__(self) -> str:
        return f"ReasoningGymReward({self.answer_format!r}, max_answer_chars={self.max_answer_chars})"
