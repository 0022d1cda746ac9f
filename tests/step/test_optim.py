"""Learning-rate schedule values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlft.step.config import OptimConfig
from lit_rlft.step.optim import adamw_with_warmup, warmup_factor


def test_linear_warmup_then_constant():
    # warm-up of 4 steps: (step + 1) / 4 -> 0.25, 0.5, 0.75, 1.0, then 1.0
    assert [warmup_factor(s, 4, "constant", None) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_after_warmup():
    # warm-up 2, total 12: at step 7, progress = (7 - 2) / 10 = 0.5 -> 0.5 * (1 + cos(pi / 2)) = 0.5
    assert warmup_factor(7, 2, "cosine", 12) == pytest.approx(0.5)
    assert warmup_factor(12, 2, "cosine", 12) == pytest.approx(0.0, abs=1e-12)
    assert warmup_factor(2, 2, "cosine", 12) == pytest.approx(1.0)
    assert warmup_factor(4, 2, "cosine", 12) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.2)))


def test_cosine_without_total_steps_names_the_option():
    with pytest.raises(ValueError, match="max_steps"):
        adamw_with_warmup([torch.nn.Parameter(torch.zeros(1))], 1e-3, (0.9, 0.99), 0.0, 5, "cosine", None)
    with pytest.raises(ValueError, match=r"^model.optim.lr_scheduler must be constant or cosine, got 'linear'$"):
        OptimConfig(lr_scheduler="linear")
    OptimConfig(lr_scheduler="cosine")  # the run's length is known only at fit time
