"""Shared data for the DOTS tests: a hand-checked attention example and a synthetic labelled pool."""

from __future__ import annotations

import math

import torch

LN2, LN3 = math.log(2.0), math.log(3.0)


def hand_example() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """2 queries, 3 references, D = 4 (identity adapters scale scores by sqrt(4) = 2).

    q1 = (2, 0, 0, 0), q2 = (0, 2, 0, 0); r1 = (ln 3, 0, 0, 0), r2 = (0, ln 2, 0, 0), r3 = 0; d = (1, 0, 0.5).
    Scores s = <r, q> / 2:
      q1: (2 ln3 / 2, 0, 0) = (ln 3, 0, 0) -> softmax = (3, 1, 1) / 5 = (0.6, 0.2, 0.2)
          d_hat = 0.6 * 1 + 0.2 * 0 + 0.2 * 0.5 = 0.7
      q2: (0, 2 ln2 / 2, 0) = (0, ln 2, 0) -> softmax = (1, 2, 1) / 4 = (0.25, 0.5, 0.25)
          d_hat = 0.25 * 1 + 0.5 * 0 + 0.25 * 0.5 = 0.375
    """
    q = torch.tensor([[2.0, 0, 0, 0], [0, 2.0, 0, 0]])  # [Q=2, D=4]
    r = torch.tensor([[LN3, 0, 0, 0], [0, LN2, 0, 0], [0, 0, 0, 0]])  # [K=3, D=4]
    d = torch.tensor([1.0, 0.0, 0.5])  # [K]
    return q, r, d


def synthetic_pool(s: int = 300, dim: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random embeddings [S, D] and difficulty = sigmoid(2.5 * z . w) with a unit vector w: [S] in (0, 1)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(s, dim, generator=g)
    w = torch.randn(dim, generator=g)
    return z, torch.sigmoid(2.5 * z @ (w / w.norm()))
