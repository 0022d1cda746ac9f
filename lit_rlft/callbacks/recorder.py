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
    """Append ``{"prompt_id", "prompt", "success_rate", "step"}`` per fresh group to ``path`` after every step.

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
        r = outputs["rollouts"]
        step = pl_module.rollout_step - 1
        rates = r.success_rates.tolist()
        self._file.parent.mkdir(parents=True, exist_ok=True)
        with self._file.open("a") as f:
            for b in range(r.num_groups):
                if bool(r.is_replay[b]):
                    continue
                row = {"prompt_id": int(r.prompt_ids[b]), "prompt": r.prompts[b] if r.prompts else None,
                       "success_rate": rates[b], "step": step}
                f.write(json.dumps(row) + "\n")
