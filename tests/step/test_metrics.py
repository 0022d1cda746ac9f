"""ValidationMetrics: hand-computed mean@k, pass@k and per-difficulty accuracy over several updates."""

from __future__ import annotations

import pytest
import torch

from lit_rlft.step.metrics import ValidationMetrics


def test_validation_metrics_by_hand():
    m = ValidationMetrics(k=2, buckets=[2, 3, 4])
    # prompt accuracies (mean of 2 samples): 1.0, 0.5, 0.0 | 0.5 ; pass@2: 1, 1, 0 | 1
    m.update(torch.tensor([[True, True], [True, False], [False, False]]), torch.tensor([[1.0, 1.0], [1.0, 0.0],
                                                                                       [0.0, 0.0]]), [2, 3, 3])
    m.update(torch.tensor([[False, True]]), torch.tensor([[0.0, 1.0]]), [2])
    out = m.compute()
    assert out["accuracy"] == pytest.approx(2.0 / 4)
    assert out["pass@2"] == pytest.approx(3 / 4)
    assert out["reward"] == pytest.approx(2.0 / 4)
    assert out["accuracy/difficulty_2"] == pytest.approx((1.0 + 0.5) / 2)
    assert out["accuracy/difficulty_3"] == pytest.approx((0.5 + 0.0) / 2)
    assert "accuracy/difficulty_4" not in out  # no prompt of that bucket: left out, not NaN
    assert out["n/accuracy"] == 4 and out["n/accuracy/difficulty_2"] == 2
    m.reset()
    assert m.compute() == {}
