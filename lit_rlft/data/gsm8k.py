"""GSM8KTask: GSM8K rows (a file, a directory or a hub name) with a ``difficulty`` column, the number of calculation
steps of each gold solution, a ``solution`` column (the worked solution without its calculator annotations: what a
supervised warm start learns), and the subset a run trains or evaluates on.

    data:
      train:
        class_path: lit_rlft.data.GSM8KTask
        init_args: {source: ../shared/data/gsm8k/train.jsonl, max_steps: 2, size: 1000, seed: 0}
      val:
        class_path: lit_rlft.data.GSM8KTask
        init_args: {source: ../shared/data/gsm8k/test.jsonl, max_steps: 2, size: 200, seed: 0}

The steps are the ``<<a+b=c>>`` calculator annotations GSM8K's solutions carry (a solution without any counts as one
step): a static difficulty, like MATH's levels, that the study reports per value and that selection strategies can be
compared against. The subset is reproducible: the rows within the step range, then ``size`` of them drawn with
``seed`` (kept in file order), so a held-out subset is the same for every run that names it.
"""

from __future__ import annotations

import random
import re

from lit_rlft.data.loading import DataValidationError, Record, load_records
from lit_rlft.data.tasks import Task

__all__ = ["GSM8KTask", "calculation_steps", "plain_solution"]

_ANNOTATION = re.compile(r"<<[^<>]*>>")


def calculation_steps(solution: str) -> int:
    """The calculation steps of a GSM8K worked solution: its ``<<...>>`` annotations, at least 1.

    >>> calculation_steps("48/2 = <<48/2=24>>24 clips.\\n48+24 = <<48+24=72>>72 clips.\\n#### 72")
    2
    """
    return max(1, len(_ANNOTATION.findall(str(solution))))


def plain_solution(solution: str) -> str:
    """A GSM8K worked solution without its calculator annotations.

    >>> plain_solution("48/2 = <<48/2=24>>24 clips.\n#### 24")
    '48/2 = 24 clips.\n#### 24'
    """
    return _ANNOTATION.sub("", str(solution))


class GSM8KTask(Task):
    """GSM8K problems with their number of calculation steps as ``difficulty`` (see the module docstring).

    Args:
        source: a ``.jsonl`` / ``.json`` / ``.parquet`` file, a directory or a hub name (as ``data.train`` takes),
            whose rows hold ``question`` and ``answer`` (the worked solution ending in ``#### <number>``).
        split: the split, for a directory or a hub name.
        min_steps: keep problems with at least this many calculation steps.
        max_steps: keep problems with at most this many (None: no bound).
        size: keep this many of them, drawn with ``seed`` (None: all).
        seed: the draw's seed.
        answer_field: the field holding the worked solution.
    """

    def __init__(self, source: str, split: str = "train", min_steps: int = 1, max_steps: int | None = None,
                 size: int | None = None, seed: int = 0, answer_field: str = "answer"):
        if min_steps < 1 or (max_steps is not None and max_steps < min_steps):
            raise ValueError(f"GSM8KTask: need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
        if size is not None and size < 1:
            raise ValueError(f"GSM8KTask: size must be >= 1, got {size}")
        self.source, self.split, self.min_steps, self.max_steps = source, split, min_steps, max_steps
        self.size, self.seed, self.answer_field = size, seed, answer_field

    def records(self) -> list[Record]:
        kept = []
        for r in load_records(self.source, split=self.split):
            if self.answer_field not in r.data:
                raise DataValidationError(f"{r.origin}: field {self.answer_field!r} is missing (available: "
                                          f"{', '.join(r.data)})")
            steps = calculation_steps(r.data[self.answer_field])
            if steps >= self.min_steps and (self.max_steps is None or steps <= self.max_steps):
                kept.append(Record({**r.data, "difficulty": steps,
                                    "solution": plain_solution(r.data[self.answer_field])}, r.origin))
        if not kept:
            raise DataValidationError(f"{self.source}: no problem with {self.min_steps} to {self.max_steps} "
                                      "calculation steps")
        if self.size is not None and self.size < len(kept):
            chosen = sorted(random.Random(self.seed).sample(range(len(kept)), self.size))
            kept = [kept[i] for i in chosen]
        return kept
