"""Prompt pools, the batch plan, templates and generated tasks.

``PromptDataModule`` (a ``LightningDataModule``) is imported on first use (PEP 562): the rest of the package, which
rollout workers, reward workers and environments import, does not import Lightning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lit_rlft.data.gsm8k import GSM8KTask
from lit_rlft.data.loading import DataValidationError, Record, load_records
from lit_rlft.data.plan import BatchPlan
from lit_rlft.data.pool import PromptPool, build_pool
from lit_rlft.data.reasoning_gym import GymSpec, ReasoningGymTask
from lit_rlft.data.tasks import ArithmeticTask, CountdownTask, Task, write_jsonl
from lit_rlft.data.templates import BOXED_SYSTEM_PROMPT, render_prompt

__all__ = [
    "BOXED_SYSTEM_PROMPT", "ArithmeticTask", "BatchPlan", "CountdownTask", "DataValidationError", "GSM8KTask", "GymSpec",
    "PromptDataModule", "ReasoningGymTask",
    "PromptPool", "Record", "Task", "build_pool", "load_records", "render_prompt", "write_jsonl",
]


def __getattr__(name: str) -> Any:
    if name == "PromptDataModule":
        from lit_rlft.data.datamodule import PromptDataModule

        globals()[name] = PromptDataModule
        return PromptDataModule
    raise AttributeError(f"module 'lit_rlft.data' has no attribute {name!r}")


if TYPE_CHECKING:
    from lit_rlft.data.datamodule import PromptDataModule
