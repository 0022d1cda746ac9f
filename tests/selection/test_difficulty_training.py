"""Tests of DOTS' offline predictor training, evaluation and persistence
(``lit_rlft.selection.difficulty_training``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_rlft.selection.difficulty import AttentionDifficultyPredictor
from lit_rlft.selection.difficulty_training import evaluate_predictor, fit_adapters, load_predictor, save_predictor
from tests.selection.dots_helpers import synthetic_pool


def test_fit_adapters_lowers_loss_and_evaluate(tmp_path):
    emb, diff = synthetic_pool(200)
    torch.manual_seed(0)
    predictor = AttentionDifficultyPredictor(16, hidden_dim=32, proj_dim=16)
    losses = fit_adapters(predictor, emb, diff, steps=60, lr=3e-3, reference_size=64, batch_size=64, progress=False)
    assert len(losses) == 60 and np.mean(losses[-10:]) < np.mean(losses[:10])
    metrics = evaluate_predictor(predictor, emb, diff, reference_size=64, seed=0)
    assert set(metrics) == {"pearson", "mae"} and metrics["pearson"] > 0.8

    path = tmp_path / "dots" / "predictor.pt"
    save_predictor(path, predictor, {"embedding_model": "tiny", "pearson": metrics["pearson"]})
    loaded, meta = load_predictor(path, return_meta=True)
    assert meta["embedding_model"] == "tiny" and loaded.config() == predictor.config()
    q, r = emb[:5], emb[5:40]
    torch.testing.assert_close(loaded(q, r, diff[5:40]), predictor(q, r, diff[5:40]))
    assert list(tmp_path.joinpath("dots").iterdir()) == [path]  # no temp file left behind


def test_fit_adapters_refuses_identity_without_calibrator():
    emb, diff = synthetic_pool(20)
    with pytest.raises(ValueError, match="trainable"):
        fit_adapters(AttentionDifficultyPredictor(16, identity=True), emb, diff, steps=1, progress=False)
    losses = fit_adapters(
        AttentionDifficultyPredictor(16, identity=True), emb, diff, steps=2, progress=False, train_calibrator=True
    )
    assert len(losses) == 2
