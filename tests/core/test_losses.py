"""GRPOLoss tests. Log-probs are built from chosen probabilities / ratios so that every expected value can be
worked out by hand; the arithmetic is in the comments. ``grad`` always means d loss / d logprobs."""

import math

import pytest
import torch

from lit_rlft.core.losses import (
    AGGREGATIONS,
    LOSS_TYPES,
    GRPOLoss,
    constant_length_sum,
    k3_kl,
    sequence_mean,
    token_mean,
)

IS = "sampling/importance_sampling_ratio"


def _run(loss_fn, logp, *args, **kwargs):
    """Loss output and d loss / d logp for a leaf copy of ``logp``."""
    logp = logp.clone().requires_grad_(True)
    out = loss_fn(logp, *args, **kwargs)
    (grad,) = torch.autograd.grad(out.loss, logp)
    return out, grad


def _log(x):
    return torch.log(torch.tensor(x, dtype=torch.float32))


# ---------------------------------------------------------------------------------------------------------------
# Loss types on one 2x3 example
#   old logp = -1 everywhere; ratios rho = pi/pi_old: seq 0 [1.0, 1.1, 0.9], seq 1 [1.0, 1.1, <padding>]
#   A = [2, -1]; mask [[1, 1, 1], [1, 1, 0]]; eps = 0.2 so no ratio is clipped.
#   per-token loss -rho * A:  seq 0 [-2.0, -2.2, -1.8] (sum -6.0),  seq 1 [1.0, 1.1] (sum 2.1)
#   and d(-rho A)/d logp = -rho A, so each token's gradient is its per-token loss times its aggregation weight.
# ---------------------------------------------------------------------------------------------------------------
OLD = torch.full((2, 3), -1.0)
LOGP = OLD + _log([[1.0, 1.1, 0.9], [1.0, 1.1, 3.0]])
ADV = torch.tensor([2.0, -1.0])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
PER_TOKEN = torch.tensor([[-2.0, -2.2, -1.8], [1.0, 1.1, 0.0]])


@pytest.mark.parametrize(
    ("loss_type", "expected", "weights"),
    [
        # grpo: sequence means -6/3 = -2 and 2.1/2 = 1.05, batch mean (-2 + 1.05) / 2 = -0.475;
        #       weights 1 / (3 tokens * 2 seqs) = 1/6 and 1 / (2 tokens * 2 seqs) = 1/4
        ("grpo", -0.475, torch.tensor([[1 / 6] * 3, [1 / 4] * 3])),
        # dapo: (-6 + 2.1) / 5 tokens = -0.78; every token weighs 1/5
        ("dapo", -0.78, torch.full((2, 3), 1 / 5)),
        # dr_grpo, max_completion_length 4: -3.9 / (2 seqs * 4) = -0.4875; every token weighs 1/8
        ("dr_grpo", -0.4875, torch.full((2, 3), 1 / 8)),
    ],
)
def test_each_loss_type_value_and_gradient(loss_type, expected, weights):
    loss_fn = GRPOLoss(loss_type=loss_type, max_completion_length=4)
    out, grad = _run(loss_fn, LOGP, OLD, ADV, MASK)
    torch.testing.assert_close(out.loss, torch.tensor(expected))
    torch.testing.assert_close(grad, PER_TOKEN * weights)  # padded token: per-token 0, gradient 0
    assert out.metrics["clip_ratio/region_mean"] == 0.0


def test_aggregation_registry_and_dr_grpo_needs_length():
    reduce = {name: LOSS_TYPES[name].aggregation for name in ("grpo", "dapo", "dr_grpo")}
    assert {k: AGGREGATIONS[v].reduce for k, v in reduce.items()} == {
        "grpo": sequence_mean, "dapo": token_mean, "dr_grpo": constant_length_sum}
    with pytest.raises(ValueError, match="max_completion_length"):
        constant_length_sum(PER_TOKEN, MASK, None)
    # the length may be missing at construction (the module fills it in); the call needs it
    loss_fn = GRPOLoss(loss_type="dr_grpo")
    with pytest.raises(ValueError, match="max_completion_length"):
        loss_fn(LOGP, OLD, ADV, MASK)
    # a sequence without real tokens counts as 0 in "grpo": (mean(1, 3) + 0) / 2 = 1.0
    per_token = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    torch.testing.assert_close(sequence_mean(per_token, torch.tensor([[1, 1], [0, 0]])), torch.tensor(1.0))


# ---------------------------------------------------------------------------------------------------------------
# Clipping (eps = 0.2: bounds [0.8, 1.2]), four one-token sequences, dapo over 4 tokens
#   seq 0: rho 1.5, A +1: min(1.5, 1.2) = 1.2  -> clipped,   loss -1.2, grad 0
#   seq 1: rho 0.5, A -1: min(-0.5, -0.8) = -0.8 -> clipped, loss +0.8, grad 0
#   seq 2: rho 1.5, A -1: min(-1.5, -1.2) = -1.5 -> not clipped (pessimistic side), loss 1.5, grad -rho A / 4 = 0.375
#   seq 3: rho 0.5, A +1: min(0.5, 0.8) = 0.5 -> not clipped, loss -0.5, grad -0.5 / 4 = -0.125
#   loss (-1.2 + 0.8 + 1.5 - 0.5) / 4 = 0.15; clip_ratio low: seq 1 (1/4), high: seq 0 (1/4), region 1/2
# ---------------------------------------------------------------------------------------------------------------
def test_clipping_stops_the_gradient_only_on_the_clipped_side():
    old = torch.zeros(4, 1)
    logp = _log([[1.5], [0.5], [1.5], [0.5]])
    out, grad = _run(GRPOLoss(epsilon=0.2), logp, old, torch.tensor([1.0, -1.0, -1.0, 1.0]), torch.ones(4, 1))
    torch.testing.assert_close(out.loss, torch.tensor(0.15))
    torch.testing.assert_close(grad, torch.tensor([[0.0], [0.0], [0.375], [-0.125]]))
    assert out.metrics["clip_ratio/low_mean"] == 0.25
    assert out.metrics["clip_ratio/high_mean"] == 0.25
    assert out.metrics["clip_ratio/region_mean"] == 0.5


# ---------------------------------------------------------------------------------------------------------------
# Clip-higher: eps 0.2, eps_high 0.28 -> bounds [0.8, 1.28]; rho [1.25, 0.75], A [1, -1], dapo over 2 tokens
#   seq 0: 1.25 < 1.28 not clipped: loss -1.25, grad -1.25 / 2 = -0.625
#   seq 1: 0.75 < 0.8 and A < 0, clipped to 0.8: loss +0.8, grad 0
#   loss (-1.25 + 0.8) / 2 = -0.225
# Symmetric eps 0.2 clips seq 0 at 1.2 instead: (-1.2 + 0.8) / 2 = -0.2, both gradients 0
# ---------------------------------------------------------------------------------------------------------------
def test_epsilon_high_is_asymmetric():
    old, logp, adv, mask = torch.zeros(2, 1), _log([[1.25], [0.75]]), torch.tensor([1.0, -1.0]), torch.ones(2, 1)
    out, grad = _run(GRPOLoss(epsilon=0.2, epsilon_high=0.28), logp, old, adv, mask)
    torch.testing.assert_close(out.loss, torch.tensor(-0.225))
    torch.testing.assert_close(grad, torch.tensor([[-0.625], [0.0]]))
    out, grad = _run(GRPOLoss(epsilon=0.2), logp, old, adv, mask)
    torch.testing.assert_close(out.loss, torch.tensor(-0.2))
    torch.testing.assert_close(grad, torch.zeros(2, 1))
    assert GRPOLoss(epsilon=0.3).epsilon_high == 0.3


# ---------------------------------------------------------------------------------------------------------------
# KL: logp = 0, ref - logp = [ln 2, -ln 2]
#   k3 = exp(d) - d - 1: 2 - ln 2 - 1 = 0.3068528 and 0.5 + ln 2 - 1 = 0.1931472; their mean is exactly 0.25
#   d k3 / d logp = 1 - exp(d): 1 - 2 = -1 and 1 - 0.5 = 0.5
#   with A = 0 and beta = 0.1, dapo over 2 tokens: loss 0.1 * 0.25 = 0.025, grad 0.1 * [-1, 0.5] / 2
# ---------------------------------------------------------------------------------------------------------------
def test_k3_kl_value():
    ln2 = math.log(2.0)
    torch.testing.assert_close(
        k3_kl(torch.zeros(1, 2), torch.tensor([[ln2, -ln2]])), torch.tensor([[1 - ln2, ln2 - 0.5]])
    )
    assert k3_kl(torch.tensor([[-3.0]]), torch.tensor([[-3.0]])) == 0.0


def test_kl_penalty_value_gradient_and_metric():
    ln2 = math.log(2.0)
    logp, ref, mask = torch.zeros(1, 2), torch.tensor([[ln2, -ln2]]), torch.ones(1, 2)
    out, grad = _run(GRPOLoss(beta=0.1), logp, logp, torch.zeros(1), mask, ref_logprobs=ref)
    torch.testing.assert_close(out.loss, torch.tensor(0.025))
    torch.testing.assert_close(grad, torch.tensor([[-0.05, 0.025]]))
    torch.testing.assert_close(out.metrics["kl"], torch.tensor(0.25))
    # with A = 1 the surrogate adds -rho A = -1 per token (mean -1): loss -1 + 0.025
    out, _ = _run(GRPOLoss(beta=0.1), logp, logp, torch.ones(1), mask, ref_logprobs=ref)
    torch.testing.assert_close(out.loss, torch.tensor(-0.975))
    # beta = 0 with a reference: logged, not added
    out, _ = _run(GRPOLoss(), logp, logp, torch.zeros(1), mask, ref_logprobs=ref)
    assert out.loss == 0.0
    torch.testing.assert_close(out.metrics["kl"], torch.tensor(0.25))
    # no reference: no "kl" key, and no importance-sampling keys on-policy
    out, _ = _run(GRPOLoss(), logp, logp, torch.zeros(1), mask)
    assert "kl" not in out.metrics and not any(k.startswith(IS) for k in out.metrics)


# ---------------------------------------------------------------------------------------------------------------
# Off-policy forms
# ---------------------------------------------------------------------------------------------------------------
def _random_batch(seed=0, n=4, length=5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, length, generator=g) * 3  # [N, L]
    logp = old + torch.randn(n, length, generator=g) * 0.3  # some ratios outside [0.8, 1.2]
    adv = torch.randn(n, generator=g)
    mask = torch.ones(n, length, dtype=torch.bool)
    mask[0, 3:] = False
    mask[2, 1:] = False
    return logp, old, adv, mask


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("form", ["geppo", "paper"])
def test_fresh_samples_are_ordinary_grpo_in_both_forms(form, loss_type):
    logp, old, adv, mask = _random_batch()
    kwargs = {"loss_type": loss_type, "max_completion_length": 8, "epsilon_high": 0.28}
    on_policy, grad_on = _run(GRPOLoss(**kwargs), logp, old, adv, mask)
    fresh, grad_fresh = _run(GRPOLoss(off_policy=form, **kwargs), logp, old, adv, mask, behaviour_logprobs=old)
    torch.testing.assert_close(fresh.loss, on_policy.loss)
    torch.testing.assert_close(grad_fresh, grad_on)
    for key in ("low_mean", "high_mean", "region_mean"):
        torch.testing.assert_close(fresh.metrics[f"clip_ratio/{key}"], on_policy.metrics[f"clip_ratio/{key}"])
    for key in ("min", "mean", "max"):
        assert fresh.metrics[f"{IS}/{key}"] == 1.0
    assert fresh.metrics[f"{IS}/capped_frac"] == 0.0


def test_geppo_factorisation_equals_the_reference_formula():
    # min(r_pi A, clip(r_pi, r_old (1 - eps), r_old (1 + eps_high)) A) with r_pi = pi/mu, r_old = pi_old/mu
    logp, old, adv, mask = _random_batch(seed=3)
    mu = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(4)) * 0.5
    out, grad = _run(GRPOLoss(epsilon_high=0.28, importance_cap=None), logp, old, adv, mask, behaviour_logprobs=mu)

    leaf = logp.clone().requires_grad_(True)
    r_pi, r_old, a = torch.exp(leaf - mu), torch.exp(old - mu), adv[:, None]
    clipped = torch.maximum(torch.minimum(r_pi, r_old * 1.28), r_old * 0.8)
    per_token = -torch.minimum(r_pi * a, clipped * a)
    expected = (per_token * mask).sum() / mask.sum()
    (expected_grad,) = torch.autograd.grad(expected, leaf)
    torch.testing.assert_close(out.loss, expected)
    torch.testing.assert_close(grad, expected_grad)


# A replayed batch, two sequences of two tokens, probabilities (mu, pi_old, pi_theta), eps 0.2, dapo over 4 tokens:
#   seq 0, A = +1
#     t0: (0.2, 0.4, 0.44):  r_old = 2,   rho = pi/pi_old = 1.1,  r_pi = pi/mu = 2.2
#         geppo: -2 * min(1.1, 1.1) = -2.2, grad -w rho A = -2.2   paper: -min(2.2, 1.2) = -1.2, clipped, grad 0
#     t1: (0.5, 0.25, 0.275): r_old = 0.5, rho = 1.1,              r_pi = 0.55
#         geppo: -0.5 * 1.1 = -0.55, grad -0.55                     paper: -min(0.55, 0.8) = -0.55, grad -0.55
#   seq 1, A = -1
#     t0: (0.2, 0.4, 0.3):   r_old = 2,   rho = 0.75,             r_pi = 1.5
#         geppo: -2 * min(-0.75, -0.8) = 1.6, clipped, grad 0       paper: -min(-1.5, -1.2) = 1.5, grad -r_pi A = 1.5
#     t1: (0.5, 0.5, 0.5):   everything 1: loss 1, grad 1 in both forms
#   geppo: (-2.2 - 0.55 + 1.6 + 1) / 4 = -0.0375, grad [[-2.2, -0.55], [0, 1]] / 4
#   paper: (-1.2 - 0.55 + 1.5 + 1) / 4 = 0.1875,  grad [[0, -0.55], [1.5, 1]] / 4
#   staleness r_old = [2, 0.5, 2, 1]: min 0.5, mean 5.5 / 4 = 1.375, max 2
REPLAY_MU = _log([[0.2, 0.5], [0.2, 0.5]])
REPLAY_OLD = _log([[0.4, 0.25], [0.4, 0.5]])
REPLAY_LOGP = _log([[0.44, 0.275], [0.3, 0.5]])
REPLAY_ADV = torch.tensor([1.0, -1.0])


@pytest.mark.parametrize(
    ("form", "expected", "expected_grad", "low", "high"),
    [
        # geppo's clip is on rho = pi/pi_old: seq 1 t0 (0.75 < 0.8, A < 0) is clipped low
        ("geppo", -0.0375, [[-0.55, -0.1375], [0.0, 0.25]], 0.25, 0.0),
        # paper's clip is on r_pi = pi/mu: seq 0 t0 (2.2 > 1.2, A > 0) is clipped high
        ("paper", 0.1875, [[0.0, -0.1375], [0.375, 0.25]], 0.0, 0.25),
    ],
)
def test_replayed_sample_hand_values(form, expected, expected_grad, low, high):
    loss_fn = GRPOLoss(epsilon=0.2, off_policy=form)
    out, grad = _run(loss_fn, REPLAY_LOGP, REPLAY_OLD, REPLAY_ADV, torch.ones(2, 2), behaviour_logprobs=REPLAY_MU)
    torch.testing.assert_close(out.loss, torch.tensor(expected))
    torch.testing.assert_close(grad, torch.tensor(expected_grad))
    torch.testing.assert_close(out.metrics["clip_ratio/low_mean"], torch.tensor(low))
    torch.testing.assert_close(out.metrics["clip_ratio/high_mean"], torch.tensor(high))
    torch.testing.assert_close(out.metrics["clip_ratio/region_mean"], torch.tensor(0.25))
    torch.testing.assert_close(out.metrics[f"{IS}/min"], torch.tensor(0.5))
    torch.testing.assert_close(out.metrics[f"{IS}/mean"], torch.tensor(1.375))
    torch.testing.assert_close(out.metrics[f"{IS}/max"], torch.tensor(2.0))
    assert out.metrics[f"{IS}/capped_frac"] == 0.0


def test_importance_cap_truncates_the_geppo_weight():
    # cap 1.5: w = min(r_old, 1.5) = [1.5, 0.5, 1.5, 1]
    #   per-token: -1.5 * 1.1 = -1.65, -0.55, -1.5 * (-0.8) = 1.2, 1  -> sum 0, loss 0
    #   grad [[-1.65, -0.55], [0 (clipped), 1]] / 4; 2 of 4 tokens capped; statistics stay uncapped (max 2)
    loss_fn = GRPOLoss(off_policy="geppo", importance_cap=1.5)
    out, grad = _run(loss_fn, REPLAY_LOGP, REPLAY_OLD, REPLAY_ADV, torch.ones(2, 2), behaviour_logprobs=REPLAY_MU)
    torch.testing.assert_close(out.loss, torch.tensor(0.0))
    torch.testing.assert_close(grad, torch.tensor([[-0.4125, -0.1375], [0.0, 0.25]]))
    assert out.metrics[f"{IS}/capped_frac"] == 0.5
    torch.testing.assert_close(out.metrics[f"{IS}/max"], torch.tensor(2.0))
    # the paper form has no cap: same as without it
    paper = GRPOLoss(off_policy="paper", importance_cap=1.5)
    out = paper(REPLAY_LOGP, REPLAY_OLD, REPLAY_ADV, torch.ones(2, 2), behaviour_logprobs=REPLAY_MU)
    torch.testing.assert_close(out.loss, torch.tensor(0.1875))
    assert out.metrics[f"{IS}/capped_frac"] == 0.0


# ---------------------------------------------------------------------------------------------------------------
# Padding: a third column of garbage (NaN, +-inf, huge) behind mask 0 changes nothing
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("form", [None, "geppo", "paper"])
def test_padded_tokens_with_extreme_values_do_not_leak(form, loss_type):
    def pad(t, value):
        return torch.cat([t, torch.full((2, 1), value)], dim=1)

    loss_fn = GRPOLoss(loss_type=loss_type, max_completion_length=3, beta=0.04, off_policy=form or "geppo")
    ref = REPLAY_OLD - 0.1
    mu = REPLAY_MU if form else None
    clean, clean_grad = _run(loss_fn, REPLAY_LOGP, REPLAY_OLD, REPLAY_ADV, torch.ones(2, 2), ref, mu)

    mask = pad(torch.ones(2, 2), 0.0)
    padded_mu = pad(REPLAY_MU, float("inf")) if form else None
    padded, padded_grad = _run(
        loss_fn,
        pad(REPLAY_LOGP, float("nan")),
        pad(REPLAY_OLD, float("-inf")),
        REPLAY_ADV,
        mask,
        pad(ref, -1e4),
        padded_mu,
    )
    torch.testing.assert_close(padded.loss, clean.loss)
    torch.testing.assert_close(padded_grad[:, :2], clean_grad)
    assert (padded_grad[:, 2] == 0).all()
    assert padded.metrics.keys() == clean.metrics.keys()
    for key, value in padded.metrics.items():
        assert torch.isfinite(value), key
        torch.testing.assert_close(value, clean.metrics[key])


def test_outputs_are_differentiable_loss_and_detached_metrics():
    logp, old, adv, mask = _random_batch()
    logp.requires_grad_(True)
    out = GRPOLoss(beta=0.1)(logp, old, adv, mask, ref_logprobs=old, behaviour_logprobs=old - 0.2)
    assert out.loss.dim() == 0 and out.loss.requires_grad
    assert all(v.dim() == 0 and not v.requires_grad for v in out.metrics.values())


# ---------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"epsilon": 0.0}, r"`epsilon` .*0\.0"),
        ({"epsilon_high": -0.1}, r"`epsilon_high`.*-0\.1"),
        ({"beta": -1.0}, r"`beta`.*-1\.0"),
        ({"importance_cap": 0.0}, r"`importance_cap`.*0\.0"),
        ({"loss_type": "ppo"}, r"`loss_type`.*'ppo'"),
        ({"off_policy": "vtrace"}, r"`off_policy`.*'vtrace'"),
        ({"max_completion_length": 0}, r"`max_completion_length`.*0"),
    ],
)
def test_invalid_options_are_named(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        GRPOLoss(**kwargs)


def test_invalid_call_arguments_are_named():
    logp, old, adv, mask = _random_batch()
    with pytest.raises(ValueError, match="ref_logprobs"):
        GRPOLoss(beta=0.1)(logp, old, adv, mask)
    with pytest.raises(ValueError, match="advantages"):
        GRPOLoss()(logp, old, adv[:2], mask)
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        GRPOLoss()(logp, old, adv, mask, behaviour_logprobs=old[:, :2])


# ---------------------------------------------------------------------------------------------------------------
# Engine/trainer mismatch correction of fresh rows (mu = the engine's sampling log-probs)
#   3 fresh sequences of 2 tokens at pi_theta = pi_old (rho = 1, no clipping), A = [1, 1, -1], dapo (6 tokens):
#   pi_old / mu per token: seq 0 [2, 0.5], seq 1 [4, 1], seq 2 [1, 1]
#   token_truncate, cap 3: weights [2, 0.5], [3, 1], [1, 1]; per-token -w * rho * A:
#       [-2, -0.5], [-3, -1], [1, 1] -> loss -4.5 / 6 = -0.75; 1 of 6 tokens capped
#   sequence_mask, cap 3: sequence ratios 2 * 0.5 = 1, 4 * 1 = 4 (> 3: masked), 1;
#       per-token [-1, -1], [0, 0], [1, 1] -> loss 0 / 6 = 0, grad of seq 1 = 0; 2 of 6 tokens masked
# ---------------------------------------------------------------------------------------------------------------
MM_OLD = _log([[0.4, 0.2], [0.4, 0.3], [0.5, 0.5]])
MM_MU = _log([[0.2, 0.4], [0.1, 0.3], [0.5, 0.5]])
MM_ADV = torch.tensor([1.0, 1.0, -1.0])
FRESH = torch.tensor([False, False, False])


@pytest.mark.parametrize(
    ("mode", "expected", "expected_grad", "corrected"),
    [
        ("token_truncate", -0.75, [[-2 / 6, -0.5 / 6], [-3 / 6, -1 / 6], [1 / 6, 1 / 6]], 1 / 6),
        ("sequence_mask", 0.0, [[-1 / 6, -1 / 6], [0.0, 0.0], [1 / 6, 1 / 6]], 2 / 6),
        (None, -2 / 6, [[-1 / 6, -1 / 6], [-1 / 6, -1 / 6], [1 / 6, 1 / 6]], 0.0),  # [-1, -1], [-1, -1], [1, 1]
    ],
)
def test_mismatch_correction_of_fresh_rows_by_hand(mode, expected, expected_grad, corrected):
    loss_fn = GRPOLoss(loss_type="dapo", mismatch_correction=mode, mismatch_cap=3.0)
    out, grad = _run(loss_fn, MM_OLD, MM_OLD, MM_ADV, torch.ones(3, 2), behaviour_logprobs=MM_MU,
                     replay_mask=FRESH)
    torch.testing.assert_close(out.loss, torch.tensor(expected))
    torch.testing.assert_close(grad, torch.tensor(expected_grad))
    torch.testing.assert_close(out.metrics["sampling/mismatch_corrected_frac"], torch.tensor(corrected))
    # |log pi_old - log mu|: log 2, log 2, log 4, 0, 0, 0 -> mean 4 log 2 / 6, max 2 log 2
    torch.testing.assert_close(out.metrics["sampling/sampling_logp_difference/mean"],
                               torch.tensor(4 * math.log(2) / 6))
    torch.testing.assert_close(out.metrics["sampling/sampling_logp_difference/max"], torch.tensor(2 * math.log(2)))
    assert f"{IS}/mean" not in out.metrics  # no replayed row


def test_replayed_rows_keep_the_off_policy_weight_next_to_corrected_fresh_rows():
    """Row 0 replayed (GePPO weight min(pi_old / mu, importance_cap 10) = 2 and 0.5), rows 1-2 fresh with
    token_truncate: the replayed row is weighted as it would be alone, whatever the mismatch cap."""
    loss_fn = GRPOLoss(loss_type="dapo", mismatch_correction="token_truncate", mismatch_cap=1.5)
    replayed = torch.tensor([True, False, False])
    out, grad = _run(loss_fn, MM_OLD, MM_OLD, MM_ADV, torch.ones(3, 2), behaviour_logprobs=MM_MU,
                     replay_mask=replayed)
    # row 0: [-2, -0.5] (importance cap 10 does not bite); row 1: [-1.5 (capped), -1]; row 2: [1, 1]
    torch.testing.assert_close(grad, torch.tensor([[-2 / 6, -0.5 / 6], [-1.5 / 6, -1 / 6], [1 / 6, 1 / 6]]))
    torch.testing.assert_close(out.metrics[f"{IS}/mean"], torch.tensor(1.25))  # replayed tokens only
    torch.testing.assert_close(out.metrics["sampling/mismatch_corrected_frac"], torch.tensor(0.25))
