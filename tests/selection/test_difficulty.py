"""Tests of DOTS' difficulty predictor (``lit_rlft.selection.difficulty``): attention, calibration, correlation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_rlft.selection.difficulty import (
    AttentionDifficultyPredictor,
    CalibrationNet,
    DifficultyAdapter,
    apply_linear_calibration,
    fit_linear_calibration,
    pearson,
    platt_calibrate,
)
from tests.selection.dots_helpers import LN3, hand_example


# ---------------------------------------------------------------------------------------------------------------
# Predictor
# ---------------------------------------------------------------------------------------------------------------
def test_identity_attention_by_hand():
    q, r, d = hand_example()
    pred = AttentionDifficultyPredictor(4, identity=True)
    a = pred.attention(q, r)  # [2, 3]
    torch.testing.assert_close(a, torch.tensor([[0.6, 0.2, 0.2], [0.25, 0.5, 0.25]]))
    torch.testing.assert_close(pred(q, r, d), torch.tensor([0.7, 0.375]))


def test_attention_temperature_by_hand():
    # temperature 0.5 doubles the scores: q1 -> (2 ln3, 0, 0) -> (9, 1, 1) / 11; d_hat = (9 + 0.5) / 11
    q, r, d = hand_example()
    pred = AttentionDifficultyPredictor(4, identity=True, temperature=0.5)
    torch.testing.assert_close(pred(q, r, d)[0], torch.tensor(9.5 / 11))


def test_adapters_shapes_and_scale():
    pred = AttentionDifficultyPredictor(12, hidden_dim=8, proj_dim=4)
    assert isinstance(pred.query_proj, DifficultyAdapter) and isinstance(pred.ref_proj, DifficultyAdapter)
    assert pred.query_proj(torch.randn(5, 12)).shape == (5, 4)
    assert pred.scale == 2.0  # sqrt(proj_dim = 4)
    a = pred.attention(torch.randn(5, 12), torch.randn(7, 12))
    assert a.shape == (5, 7)
    torch.testing.assert_close(a.sum(-1), torch.ones(5))
    assert AttentionDifficultyPredictor(12, identity=True).adapter_parameters() == []
    with pytest.raises(ValueError, match="temperature"):
        AttentionDifficultyPredictor(4, temperature=0.0)


# ---------------------------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------------------------
def test_platt_by_hand():
    # w=2, b=ln3 at d=0.5: logit(0.5) = 0 -> sigmoid(ln 3) = 3/4
    # w=0.5, b=0 at d=0.8: logit(0.8) = ln 4 -> sigmoid(ln 2) = 2/3
    # w=1, b=0 is the identity
    torch.testing.assert_close(platt_calibrate(torch.tensor([0.5]), 2.0, LN3), torch.tensor([0.75]))
    torch.testing.assert_close(platt_calibrate(torch.tensor([0.8]), 0.5, 0.0), torch.tensor([2 / 3]))
    x = torch.tensor([0.1, 0.3, 0.9])
    torch.testing.assert_close(platt_calibrate(x, 1.0, 0.0), x)
    # clamped at eps: exact 0 and 1 stay finite
    assert torch.isfinite(platt_calibrate(torch.tensor([0.0, 1.0]), 3.0, 0.0)).all()


def test_calibration_net_starts_as_identity():
    net = CalibrationNet()
    w, b = (x.detach() for x in net(torch.tensor([0.1, 0.9, 0.4])))
    assert float(w) == 1.0 and float(b) == 0.0
    pred = AttentionDifficultyPredictor(4, identity=True)
    x = torch.tensor([0.2, 0.7])
    torch.testing.assert_close(pred.calibrate(x, torch.tensor([0.3, 0.6])), x)


def test_linear_calibration_by_hand():
    # pred = (0.2, 0.4, 0.6), true = (0.1, 0.5, 0.6): means 0.4 and 0.4
    # cov = ((-0.2)(-0.3) + 0 + (0.2)(0.2)) / 3 = 0.10 / 3; var = (0.04 + 0 + 0.04) / 3 = 0.08 / 3
    # slope = 0.10 / 0.08 = 1.25; intercept = 0.4 - 1.25 * 0.4 = -0.1
    slope, intercept = fit_linear_calibration(torch.tensor([0.2, 0.4, 0.6]), torch.tensor([0.1, 0.5, 0.6]))
    assert slope == pytest.approx(1.25) and intercept == pytest.approx(-0.1)
    # applied and clipped: 1.25 * 0.05 - 0.1 = -0.0375 -> 0; 1.25 * 0.5 - 0.1 = 0.525; 1.25 * 0.95 - 0.1 > 1 -> 1
    out = apply_linear_calibration(torch.tensor([0.05, 0.5, 0.95]), slope, intercept)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.525, 1.0]))


def test_linear_calibration_degenerate_is_flat_at_the_mean():
    assert fit_linear_calibration(np.array([0.3, 0.3, 0.3]), np.array([0.0, 0.5, 1.0])) == (0.0, 0.5)
    assert fit_linear_calibration(np.array([0.3]), np.array([0.9])) == (0.0, 0.9)


# ---------------------------------------------------------------------------------------------------------------
# Correlation
# ---------------------------------------------------------------------------------------------------------------
def test_pearson():
    assert pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert pearson([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    # x = (0, 1, 2), y = (0, 2, 1): centred (-1, 0, 1), (-1, 1, 0) -> 1 / (sqrt 2 * sqrt 2) = 0.5
    assert pearson([0.0, 1.0, 2.0], [0.0, 2.0, 1.0]) == pytest.approx(0.5)
    assert math.isnan(pearson([1.0, 1.0, 1.0], [0.0, 1.0, 2.0]))
    assert math.isnan(pearson([1.0], [2.0]))
    assert pearson([0.0, 1.0, float("nan"), 2.0], [0.0, 2.0, 5.0, 1.0]) == pytest.approx(0.5)
