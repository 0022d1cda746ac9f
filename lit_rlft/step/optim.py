"""AdamW with linear warm-up then a constant or cosine learning rate, shared by GRPO and SFT."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

import torch

SCHEDULES = ("constant", "cosine")


def check_schedule(schedule: str, total_steps: int | None, option: str = "lr_scheduler") -> None:
    """The one check of a schedule: its name, and (when ``total_steps`` is known to be needed: ``0``) that cosine has
    a length. ``total_steps=None`` checks the name only (a config, before the run's length is known)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"{option} must be constant or cosine, got {schedule!r}")
    if schedule == "cosine" and total_steps is not None and total_steps <= 0:
        raise ValueError(f"{option}: cosine needs trainer.max_steps (the schedule decays to 0 there)")


def warmup_factor(step: int, warmup_steps: int, schedule: Literal["constant", "cosine"], total_steps: int | None) -> float:
    """Learning-rate multiplier at optimizer ``step``: linear warm-up, then constant or cosine to 0 at
    ``total_steps`` (checked by :func:`adamw_with_warmup`)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "cosine":
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
    check_schedule(schedule, total_steps or 0)
    trainable = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
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
