"""SuccessRateRecorder: write every observed (prompt, success rate) pair to JSON lines.

The file is what ``lit-rlft dots-adapters`` trains DOTS' adapters on offline, and a record of which prompts a run
trained on and how the policy did on them.
"""

from __future__ import annotations

import json
from pathlib import Path

from lit_rlft.callbacks.base import StepCallback
from lit_rlft.step.context import StepContext, StepOutput


class SuccessRateRecorder(StepCallback):
    """Append ``{"prompt_id", "prompt", "success_rate", "step"}`` per fresh group (all ranks) to ``path`` every step.

    Example::

        trainer = L.Trainer(callbacks=[SuccessRateRecorder("runs/x/success_rates.jsonl")])

    Args:
        path: the JSON-lines file; ``None`` writes ``success_rates.jsonl`` in the trainer's log directory.
    """

    def __init__(self, path: str | None = None):
        self.path = path
        self._file: Path | None = None

    def setup_step(self, ctx: StepContext) -> None:
        self._file = Path(self.path) if self.path else Path(ctx.log_dir) / "success_rates.jsonl"

    def after_step(self, ctx: StepContext, output: StepOutput) -> None:
        if ctx.collective.rank != 0:
            return
        fresh = output.record.fresh()  # every rank's fresh groups
        step = ctx.rollout_step - 1
        ids = fresh.prompt_ids.numpy()
        texts = ctx.data.prompt_texts(ids) if ids.size else []
        self._file.parent.mkdir(parents=True, exist_ok=True)
        with self._file.open("a") as f:
            for pid, text, rate in zip(ids.tolist(), texts, fresh.success_rates.tolist()):
                row = {"prompt_id": int(pid), "prompt": text, "success_rate": rate, "step": step}
                f.write(json.dumps(row) + "\n")
