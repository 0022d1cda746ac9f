"""DOTS' selection weights and Gumbel-top-k sampling without replacement, in log space. Pure torch.

Notation: ``S`` items (prompts of the pool). A prompt with predicted difficulty ``d_hat`` is drawn with probability
``P(q) ~ exp(-|d_hat_q - alpha| / tau)``; working with the log-weights means a tiny ``tau`` never underflows.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["difficulty_logits", "sample_without_replacement"]


def difficulty_logits(d_hat: Tensor, alpha: float = 0.5, tau: float = 1e-3) -> Tensor:
    """Selection log-weights ``-|d_hat - alpha| / tau`` ``[S]`` (log of DOTS's unnormalised probabilities)."""
    return -(d_hat - alpha).abs() / tau


def sample_without_replacement(
    log_weights: Tensor,
    k: int,
    generator: torch.Generator | None = None,
    exclude: Tensor | None = None,
) -> Tensor:
    """Draw ``k`` distinct indices with probability proportional to ``exp(log_weights)``, sequentially without
    replacement, by Gumbel-top-k: ``argtopk(log_weights + Gumbel noise)``.

    Computed in float64 log space, so it never fails for tiny temperatures: with log-weights around ``-1e9``
    (``tau = 1e-9``) the noise is still resolved and the items with the largest log-weights (closest to alpha)
    win. ``-inf`` / NaN log-weights are allowed and rank last. The noise is drawn for all ``S`` items, so a seeded
    ``generator`` gives the same draw whatever the mask.

    Args:
        log_weights: ``[S]`` unnormalised log-probabilities.
        k: number of indices to draw.
        generator: source of the Gumbel noise (``torch.Generator``, CPU).
        exclude: optional ``[S]`` bool mask of indices that must not be drawn.

    Returns:
        ``[k]`` int64 indices in draw order (the first is the first sequential draw).

    Raises:
        ValueError: if ``k`` exceeds the number of allowed (non-excluded) items, or is negative.
    """
    lw = torch.as_tensor(log_weights).detach().reshape(-1).to("cpu", torch.float64)  # [S]
    n = lw.numel()
    allowed = torch.arange(n)
    if exclude is not None:
        mask = torch.as_tensor(exclude, dtype=torch.bool).reshape(-1).cpu()
        if mask.numel() != n:
            raise ValueError(f"`exclude` has {mask.numel()} entries but there are {n} log-weights")
        allowed = allowed[~mask]
    if int(k) != k or k < 0 or k > allowed.numel():
        raise ValueError(
            f"cannot draw k={k!r} distinct items (the batch size) from {allowed.numel()} allowed items "
            f"({n} in all, {n - allowed.numel()} excluded)"
        )
    u = torch.rand(n, generator=generator, dtype=torch.float64).clamp_min(torch.finfo(torch.float64).tiny)
    keys = torch.nan_to_num(lw, nan=-math.inf) - torch.log(-torch.log(u))  # [S] log w + Gumbel(0, 1)
    top = torch.topk(keys[allowed], int(k), sorted=True).indices  # [k] positions within `allowed`
    return allowed[top].to(torch.long)
