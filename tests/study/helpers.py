"""What the study's tests plug into a run config: a reward an untrained tiny policy earns about half the time (so that
curves move), and a callback that kills a run at a given step (so that resume can be tested)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lit_rlft.callbacks.base import StepCallback


def contains_one(completions: list[str], **columns: Any) -> list[float]:
    """1 when the completion contains the character ``1``, else 0."""
    return [1.0 if "1" in c else 0.0 for c in completions]


class CrashAt(StepCallback):
    """Raise after rollout step ``step`` has run, while the file ``flag`` exists: a run killed mid-way (under the
    Trainer or FabricLoop)."""

    def __init__(self, step: int, flag: str):
        self.step, self.flag = step, flag

    def after_step(self, ctx: Any, output: Any) -> None:
        if ctx.rollout_step == self.step and Path(self.flag).exists():
            raise RuntimeError("killed (tests.study.helpers.CrashAt)")


def even_answer(completions: list[str], answer: list[Any], **columns: Any) -> list[float]:
    """1 when the row's gold answer is an even number, whatever the completion: every group is all right or all
    wrong, by the data alone (a probe's histogram checked by hand)."""
    return [1.0 if int(a) % 2 == 0 else 0.0 for a in answer]


def contains_digit(completions: list[str], **columns: Any) -> list[float]:
    """1 when the completion contains a digit: the probe's answer format in tests."""
    return [1.0 if any(ch.isdigit() for ch in c) else 0.0 for c in completions]


contains_digit.is_format_reward = True
