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


def configure_adamw(policy: torch.nn.Module, optim: Any, total_steps: int | None) -> dict[str, Any]:
    """AdamW and its scheduler for ``policy`` from an :class:`~lit_rlft.step.config.OptimConfig`; warns (rank 0)
    when AdamW would update bfloat16 / float16 weights in place. ``total_steps``: optimizer steps of the run (the
    cosine schedule's length; None if unknown)."""
    import warnings

    import torch.distributed as dist

    from lit_rlft.models.sharding import low_precision_warning

    warning = low_precision_warning(policy, optim.learning_rate)
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if warning and rank == 0:
        warnings.warn(warning, UserWarning, stacklevel=2)
    return adamw_with_warmup(policy.parameters(), optim.learning_rate, optim.adam_betas, optim.weight_decay,
                             optim.warmup_steps, optim.lr_scheduler, total_steps)
