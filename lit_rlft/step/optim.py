"""AdamW with linear warm-up then a constant or cosine learning rate, shared by GRPO and SFT."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

import torch


def warmup_factor(step: int, warmup_steps: int, schedule: Literal["constant", "cosine"], total_steps: int | None) -> float:
    """Learning-rate multiplier at optimizer ``step``: linear warm-up, then constant or cosine to 0 at
    ``total_steps``."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "cosine":
        if not total_steps:
            raise ValueError("lr_scheduler: cosine needs trainer.max_steps")
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0


def adamw_with_warmup(
    params: Iterable[torch.nn.Parameter],
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    warmup_steps: int,
    schedule: Literal["constant", "cosine"],
    total_steps: int | None,
) -> dict[str, Any]:
    """What ``configure_optimizers`` returns: AdamW over the trainable ``params`` and a per-step scheduler."""
    trainable = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"lr_scheduler must be constant or cosine, got {schedule!r}")
    if schedule == "cosine" and not total_steps:
        raise ValueError("lr_scheduler: cosine needs trainer.max_steps")
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: warmup_factor(step, warmup_steps, schedule, total_steps)
    )
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
