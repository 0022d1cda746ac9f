"""Prompt pools, the batch plan, templates and generated tasks."""

from lit_rlft.data.datamodule import PromptDataModule
from lit_rlft.data.gsm8k import GSM8KTask
from lit_rlft.data.plan import BatchPlan
from lit_rlft.data.pool import PromptPool, build_pool
from lit_rlft.data.sources import DataValidationError, Record, load_records
from lit_rlft.data.tasks import ArithmeticTask, CountdownTask, Task, write_jsonl
from lit_rlft.data.templates import BOXED_SYSTEM_PROMPT, render_prompt

__all__ = [
    "BOXED_SYSTEM_PROMPT", "ArithmeticTask", "BatchPlan", "CountdownTask", "DataValidationError", "GSM8KTask",
    "PromptDataModule",
    "PromptPool", "Record", "Task", "build_pool", "load_records", "render_prompt", "write_jsonl",
]
