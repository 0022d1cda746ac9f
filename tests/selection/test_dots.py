"""Tests of DOTS' selector (``lit_rlft.selection.dots``): validation, the selection flow, online fit, state, and
the re-exports of its building blocks (tested in ``test_difficulty``, ``test_difficulty_training``, ``test_gumbel``)."""

from __future__ import annotations

import copy
import importlib
import io
import math

import numpy as np
import pytest
import torch

import lit_rlft.selection.dots as dots
from lit_rlft.selection.base import SelectionStrategy
from lit_rlft.selection.dots import (
    AttentionDifficultyPredictor,
    DOTSSelector,
    evaluate_predictor,
    predict_from_reference,
)
from tests.selection.dots_helpers import hand_example, synthetic_pool


def small_selector(emb: torch.Tensor, **kw) -> DOTSSelector:
    """A selector with small adapters so the tests run in milliseconds."""
    predictor = kw.pop("predictor", None)
    if predictor is None:
        torch.manual_seed(kw.get("seed", 0))
        predictor = AttentionDifficultyPredictor(emb.shape[1], hidden_dim=32, proj_dim=16)
    kw.setdefault("reference_size", 32)
    kw.setdefault("online_steps_per_update", 3)
    return DOTSSelector(emb, predictor=predictor, **kw)


def run_steps(sel: DOTSSelector, difficulty: torch.Tensor, rng: np.random.Generator, steps, batch: int = 8):
    """The callback's loop: reference every mu steps, select, observe true success rates. Returns the batches."""
    out = []
    for t in steps:
        if sel.needs_reference(t):
            ref = sel.reference_ids(rng)
            sel.set_reference(ref, 1.0 - difficulty[ref].numpy())
        ids = sel.select(batch, t, rng)
        sel.observe(ids, 1.0 - difficulty[ids].numpy(), t)
        out.append(ids)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Re-exports
# ---------------------------------------------------------------------------------------------------------------
def test_building_blocks_are_reexported_from_dots():
    names = {
        "CALIBRATIONS", "EPS", "AttentionDifficultyPredictor", "Calibration", "CalibrationNet", "DOTSSelector",
        "DifficultyAdapter", "apply_linear_calibration", "difficulty_logits", "episodic_bce_loss",
        "evaluate_predictor", "fit_adapters", "fit_linear_calibration", "load_predictor", "pearson", "platt_calibrate",
        "predict_from_reference", "sample_without_replacement", "save_predictor",
    }  # fmt: skip
    assert set(dots.__all__) == names
    for module_name in ("difficulty", "difficulty_training", "gumbel"):
        module = importlib.import_module(f"lit_rlft.selection.{module_name}")
        for name in module.__all__:
            assert getattr(dots, name) is getattr(module, name)


# ---------------------------------------------------------------------------------------------------------------
# Selector: validation and flow
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"tau": 0.0}, "tau"),
        ({"update_every": 0}, "update_every"),
        ({"update_every": 1.5}, "update_every"),
        ({"reference_size": 0}, "reference_size"),
        ({"reference_size": 11}, "reference_size"),
        ({"alpha": 1.5}, "alpha"),
        ({"calibration": "isotonic"}, "calibration"),
        ({"temperature_attn": -1.0}, "temperature_attn"),
        ({"online_lr": 0.0}, "online_lr"),
        ({"online_steps_per_update": -1}, "online_steps_per_update"),
    ],
)
def test_selector_validation_names_the_option(kwargs, option):
    with pytest.raises(ValueError, match=option):
        DOTSSelector(torch.randn(10, 4), **{"reference_size": 2, **kwargs})


def test_selector_rejects_mismatched_predictor():
    with pytest.raises(ValueError, match="predictor"):
        DOTSSelector(torch.randn(10, 4), reference_size=2, predictor=AttentionDifficultyPredictor(8, identity=True))


def test_needs_reference_schedule():
    sel = small_selector(torch.randn(40, 4), reference_size=4, update_every=3)
    assert isinstance(sel, SelectionStrategy)
    assert sel.needs_reference(1)  # no labels yet
    sel.set_reference(np.arange(4), np.full(4, 0.5))
    assert [sel.needs_reference(t) for t in range(7)] == [True, False, False, True, False, False, True]


def test_predict_requires_a_reference():
    sel = small_selector(torch.randn(40, 4), reference_size=4)
    with pytest.raises(RuntimeError, match="set_reference"):
        sel.predict()


def test_predict_none_calibration_matches_hand_example():
    q, r, d = hand_example()
    emb = torch.cat([r, q])  # ids 0..2 references, 3..4 queries
    sel = DOTSSelector(
        emb, reference_size=3, calibration="none", predictor=AttentionDifficultyPredictor(4, identity=True)
    )
    sel.set_reference(np.arange(3), 1.0 - d.numpy())
    # references get their own labels; the queries the hand-computed attention averages
    torch.testing.assert_close(sel.predict(), torch.tensor([1.0, 0.0, 0.5, 0.7, 0.375]))
    torch.testing.assert_close(sel.predict(np.array([4, 1])), torch.tensor([0.375, 0.0]))


@pytest.mark.parametrize("calibration", ["linear", "platt", "none"])
def test_predict_subset_matches_pool_and_is_clipped(calibration):
    emb, diff = synthetic_pool(200)
    sel = small_selector(emb, calibration=calibration)
    ref = sel.reference_ids(np.random.default_rng(0))
    sel.set_reference(ref, 1.0 - diff[ref].numpy())
    ids = np.array([5, ref[0], 17, 199])
    sub = sel.predict(ids)  # projections computed for the subset (cache empty)
    full = sel.predict()  # fills the cache
    assert full.shape == (200,) and full.dtype == torch.float32
    assert full.min() >= 0 and full.max() <= 1
    torch.testing.assert_close(sub, full[torch.from_numpy(ids)])
    torch.testing.assert_close(sel.predict(ids), sub)  # from the cache
    assert float(full[ref[0]]) == pytest.approx(float(diff[ref[0]]))
    standalone = predict_from_reference(sel.predictor, emb[[5, 17]], emb[ref], diff[ref], calibration)
    torch.testing.assert_close(standalone, full[[5, 17]])


def test_select_serves_mu_batches_per_draw_and_excludes_reference():
    emb, diff = synthetic_pool(120)
    sel = small_selector(emb, update_every=3, online_fit=False)
    rng = np.random.default_rng(0)
    ref = sel.reference_ids(rng)
    sel.set_reference(ref, 1.0 - diff[ref].numpy())
    state = copy.deepcopy(rng.bit_generator.state)
    b0 = sel.select(10, 0, rng)
    after_first = copy.deepcopy(rng.bit_generator.state)
    assert after_first != state  # the draw consumed the caller's rng once
    b1, b2 = sel.select(10, 1, rng), sel.select(10, 2, rng)
    assert rng.bit_generator.state == after_first  # served from the queue
    served = np.concatenate([b0, b1, b2])
    assert np.unique(served).size == 30 and not np.isin(served, ref).any()
    assert all(b.dtype == np.int64 and b.shape == (10,) for b in (b0, b1, b2))
    sel.select(10, 3, rng)  # queue empty: a new draw
    assert rng.bit_generator.state != after_first


def test_select_near_alpha_and_fresh_reference_resets_queue():
    # identity predictor, calibration none: prompt i's embedding is one-hot-ish so it sees mostly itself
    s = 40
    emb = torch.eye(s) * 20.0  # scores <z_i, z_j> / sqrt(40): self 400 / 6.3, others 0 -> attention ~ one-hot
    sel = DOTSSelector(
        emb,
        reference_size=s,
        calibration="none",
        exclude_reference=False,
        predictor=AttentionDifficultyPredictor(s, identity=True),
    )
    rates = np.linspace(0.0, 1.0, s)
    sel.set_reference(np.arange(s), rates)
    rng = np.random.default_rng(0)
    batch = sel.select(4, 0, rng)
    closest = np.argsort(np.abs(1.0 - rates - 0.5))[:4]
    assert set(batch.tolist()) == set(closest.tolist())
    sel.set_reference(np.arange(s), rates[::-1].copy())  # fresh labels: the queue is redrawn
    batch = sel.select(4, 1, rng)
    assert set(batch.tolist()) == set(closest.tolist())  # symmetric around 0.5, same set


def test_select_batch_larger_than_allowed_pool_names_batch_size():
    sel = small_selector(torch.randn(20, 4), reference_size=15)
    sel.set_reference(np.arange(15), np.full(15, 0.5))
    assert sel.select(5, 0, np.random.default_rng(0)).size == 5  # 5 allowed: draws 5 not 10
    with pytest.raises(ValueError, match="batch size"):
        sel.select(6, 0, np.random.default_rng(0))


def test_observe_diagnostics_and_bounded_buffer():
    emb, diff = synthetic_pool(100)
    sel = small_selector(emb, reference_size=8, online_fit=False, online_buffer_size=10)
    sel.observe(np.array([1, 2, 3]), np.array([0.0, 0.5, 1.0]), 0)  # no predictions yet
    assert math.isnan(sel.last_pearson) and np.isnan(sel.last_predictions).all()
    rng = np.random.default_rng(0)
    ref = sel.reference_ids(rng)
    sel.set_reference(ref, 1.0 - diff[ref].numpy())
    ids = sel.select(6, 0, rng)
    sel.observe(ids, np.full(6, 0.5), 0)  # observed side constant -> NaN, not an error
    assert math.isnan(sel.last_pearson)
    np.testing.assert_allclose(sel.last_predictions, sel.predict(ids).double().numpy(), atol=1e-6)
    sel.observe(ids, 1.0 - diff[ids].numpy(), 0)
    assert -1.0 <= sel.last_pearson <= 1.0
    assert len(sel._buffer) == 10 and list(sel._buffer)[-6:] == ids.tolist()  # newest last, oldest dropped
    assert sel._buffer[int(ids[0])] == pytest.approx(float(diff[ids[0]]))  # newest label replaced 0.5


def test_online_fit_improves_pearson():
    emb, diff = synthetic_pool(300, dim=16, seed=0)
    torch.manual_seed(0)
    predictor = AttentionDifficultyPredictor(16, hidden_dim=32, proj_dim=16)
    before = evaluate_predictor(predictor, emb, diff, reference_size=64, seed=1)["pearson"]
    sel = DOTSSelector(
        emb, reference_size=64, predictor=predictor, online_lr=3e-3, online_steps_per_update=15, tau=0.05
    )
    run_steps(sel, diff, np.random.default_rng(0), range(8), batch=16)
    after = evaluate_predictor(predictor, emb, diff, reference_size=64, seed=1)["pearson"]
    assert before < 0.5 and after > 0.85 and after > before + 0.3
    assert sel.last_pearson > 0.7 and math.isfinite(sel.last_fit_loss)


def test_platt_online_fit_trains_the_calibrator():
    emb, diff = synthetic_pool(100)
    sel = small_selector(emb, calibration="platt", online_lr=1e-2)
    run_steps(sel, diff, np.random.default_rng(0), range(2))
    w, b = (x.detach() for x in sel.predictor.calibrator(torch.tensor([0.2, 0.8])))
    assert (float(w), float(b)) != (1.0, 0.0)


def test_identity_predictor_without_trainable_parameters_skips_fit():
    emb, diff = synthetic_pool(60)
    sel = DOTSSelector(emb, reference_size=8, predictor=AttentionDifficultyPredictor(16, identity=True))
    assert sel.optimizer is None
    run_steps(sel, diff, np.random.default_rng(0), range(3), batch=4)
    assert math.isnan(sel.last_fit_loss)


@pytest.mark.parametrize("calibration", ["linear", "platt"])
def test_state_round_trip_gives_identical_selections(calibration):
    emb, diff = synthetic_pool(150)
    rng = np.random.default_rng(3)
    interrupted = small_selector(emb, calibration=calibration, update_every=2)
    run_steps(interrupted, diff, rng, range(3))  # stops mid-queue (step 2 drew a fresh queue of 2 batches)
    blob = io.BytesIO()
    torch.save(interrupted.state_dict(), blob)
    rng_state = copy.deepcopy(rng.bit_generator.state)
    expected = run_steps(interrupted, diff, rng, range(3, 8))

    torch.manual_seed(123)  # a different init: everything must come from the checkpoint
    resumed = small_selector(emb, calibration=calibration, update_every=2, seed=5)
    blob.seek(0)
    resumed.load_state_dict(torch.load(blob, weights_only=True))
    rng2 = np.random.default_rng(0)
    rng2.bit_generator.state = rng_state
    got = run_steps(resumed, diff, rng2, range(3, 8))
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    for (k, v), v2 in zip(interrupted.predictor.state_dict().items(), resumed.predictor.state_dict().values()):
        torch.testing.assert_close(v, v2, rtol=0, atol=0, msg=k)


def test_state_dict_is_a_copy():
    emb, diff = synthetic_pool(80)
    sel = small_selector(emb)
    run_steps(sel, diff, np.random.default_rng(0), range(1))
    state = sel.state_dict()
    before = {k: v.clone() for k, v in state["predictor"].items()}
    run_steps(sel, diff, np.random.default_rng(1), range(1, 3))
    for k, v in before.items():
        torch.testing.assert_close(state["predictor"][k], v, rtol=0, atol=0)


def test_load_state_refuses_other_pool():
    sel = small_selector(torch.randn(50, 4), reference_size=4)
    state = sel.state_dict()
    with pytest.raises(ValueError, match="pool"):
        small_selector(torch.randn(60, 4), reference_size=4).load_state_dict(state)
