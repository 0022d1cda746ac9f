"""Tests of DOTS: attention predictor, calibration, Gumbel-top-k sampling, the selector's flow, online fit, state."""

from __future__ import annotations

import copy
import io
import math

import numpy as np
import pytest
import torch

from lit_rlft.selection.base import SelectionStrategy
from lit_rlft.selection.dots import (
    AttentionDifficultyPredictor,
    CalibrationNet,
    DifficultyAdapter,
    DOTSSelector,
    apply_linear_calibration,
    difficulty_logits,
    evaluate_predictor,
    fit_adapters,
    fit_linear_calibration,
    load_predictor,
    pearson,
    platt_calibrate,
    predict_from_reference,
    sample_without_replacement,
    save_predictor,
)

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
# Selection weights and sampling
# ---------------------------------------------------------------------------------------------------------------
def test_difficulty_logits():
    # -|d - 0.5| / 0.1 at d = 0.5, 0.6, 0.0 -> 0, -1, -5
    out = difficulty_logits(torch.tensor([0.5, 0.6, 0.0]), alpha=0.5, tau=0.1)
    torch.testing.assert_close(out, torch.tensor([0.0, -1.0, -5.0]))


def test_sampler_distinct_and_respects_exclude():
    g = torch.Generator().manual_seed(0)
    exclude = torch.zeros(50, dtype=torch.bool)
    exclude[::2] = True
    for _ in range(20):
        out = sample_without_replacement(torch.zeros(50), 25, g, exclude)
        assert out.dtype == torch.long and out.unique().numel() == 25
        assert not exclude[out].any()


def test_sampler_never_fails_at_tiny_tau_and_prefers_closest():
    # tau = 1e-9 and every prediction far from alpha: log-weights ~ -1e8 .. -5e8, exp underflows to 0 everywhere
    d_hat = torch.tensor([0.9, 0.95, 0.6, 0.99, 0.7, 0.1, 0.65])
    logw = difficulty_logits(d_hat, alpha=0.5, tau=1e-9)
    assert torch.exp(logw).sum() == 0
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        out = sample_without_replacement(logw, 3, g)
        assert out.tolist() == [2, 6, 4]  # |d - 0.5| = 0.1, 0.15, 0.2 in that order
    out = sample_without_replacement(torch.full((6,), -1e9), 6, g)
    assert sorted(out.tolist()) == list(range(6))


def test_sampler_closest_with_overwhelming_probability_at_default_tau():
    # tau = 1e-3: neighbours 0.01 apart differ by 10 in log-weight, far beyond the Gumbel noise
    d_hat = torch.linspace(0.0, 1.0, 101)  # 0.00, 0.01, ..., 1.00
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        out = sample_without_replacement(difficulty_logits(d_hat), 3, g)
        assert set(out.tolist()) == {49, 50, 51}


def test_sampler_handles_nan_and_inf():
    logw = torch.tensor([float("nan"), -float("inf"), 0.0, -100.0])
    out = sample_without_replacement(logw, 4, torch.Generator().manual_seed(0))
    assert out[:2].tolist() == [2, 3] and sorted(out.tolist()) == [0, 1, 2, 3]


def test_sampler_deterministic_with_seeded_generator():
    logw = torch.randn(100)
    a = sample_without_replacement(logw, 10, torch.Generator().manual_seed(7))
    b = sample_without_replacement(logw, 10, torch.Generator().manual_seed(7))
    assert a.tolist() == b.tolist()


def test_sampler_frequencies_match_weights():
    # first draw of Gumbel-top-k ~ softmax(log-weights): P = (0.5, 0.3, 0.2)
    logw = torch.tensor([0.5, 0.3, 0.2]).log()
    g = torch.Generator().manual_seed(0)
    first = torch.tensor([int(sample_without_replacement(logw, 2, g)[0]) for _ in range(3000)])
    freq = torch.bincount(first, minlength=3).float() / 3000
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.03, rtol=0)


def test_sampler_errors_name_k():
    with pytest.raises(ValueError, match="k=4"):
        sample_without_replacement(torch.zeros(5), 4, exclude=torch.tensor([1, 1, 0, 0, 0], dtype=torch.bool))
    with pytest.raises(ValueError, match="k=-1"):
        sample_without_replacement(torch.zeros(5), -1)
    assert sample_without_replacement(torch.zeros(5), 0).numel() == 0


def test_pearson():
    assert pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert pearson([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    # x = (0, 1, 2), y = (0, 2, 1): centred (-1, 0, 1), (-1, 1, 0) -> 1 / (sqrt 2 * sqrt 2) = 0.5
    assert pearson([0.0, 1.0, 2.0], [0.0, 2.0, 1.0]) == pytest.approx(0.5)
    assert math.isnan(pearson([1.0, 1.0, 1.0], [0.0, 1.0, 2.0]))
    assert math.isnan(pearson([1.0], [2.0]))
    assert pearson([0.0, 1.0, float("nan"), 2.0], [0.0, 2.0, 5.0, 1.0]) == pytest.approx(0.5)


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


# ---------------------------------------------------------------------------------------------------------------
# Offline fitting and persistence
# ---------------------------------------------------------------------------------------------------------------
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
