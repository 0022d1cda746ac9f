"""SuccessRateRecorder: write every observed (prompt, success rate) pair to JSON lines.

The file is what ``lit-rlft dots-adapters`` trains DOTS' adapters on offline, and a record of which prompts a run
trained on and how the policy did on them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_only


class SuccessRateRecorder(L.Callback):
    """Append ``{"prompt_id", "prompt", "success_rate", "step"}`` per fresh group (all ranks) to ``path`` every step.

    Example::

        trainer = L.Trainer(callbacks=[SuccessRateRecorder("runs/x/success_rates.jsonl")])

    Args:
        path: the JSON-lines file; ``None`` writes ``success_rates.jsonl`` in the trainer's log directory.
    """

    def __init__(self, path: str | None = None):
        self.path = path
        self._file: Path | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        root = trainer.log_dir or trainer.default_root_dir
        self._file = Path(self.path) if self.path else Path(root) / "success_rates.jsonl"

    @rank_zero_only
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        fresh = outputs["record"].fresh()  # every rank's fresh groups
        step = pl_module.rollout_step - 1
        ids = fresh.prompt_ids.numpy()
        texts = trainer.datamodule.prompt_texts(ids) if ids.size else []
        self._file.parent.mkdir(parents=True, exist_ok=True)
        with self._file.open("a") as f:
            for pid, text, rate in zip(ids.tolist(), texts, fresh.success_rates.tolist()):
                row = {"prompt_id": int(pid), "prompt": text, "success_rate": rate, "step": step}
                f.write(json.dumps(row) + "\n")
