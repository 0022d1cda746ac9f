"""The loss variants of issue 18 by hand: GSPO, delta, CISPO, SAPO, VESPO, LUSPO, bnpo, truncation, the off-policy
and high-entropy masks, the entropy bonus; each with replayed rows and engine log-probs where TRL has no
counterpart; micro-batch weights; refused combinations. ``grad`` means d loss / d logprobs; the arithmetic is in
the comments."""

import math

import pytest
import torch

from lit_rlft.core import loss_masks
from lit_rlft.core.entropy_control import AdaptiveEntropyCoef
from lit_rlft.core.loss_masks import entropy_threshold, off_policy_sequence_mask
from lit_rlft.core.losses import LOSS_TYPES, GRPOLoss


def _run(loss_fn, logp, *args, **kwargs):
    """Loss output and d loss / d logp for a leaf copy of ``logp``."""
    logp = logp.clone().requires_grad_(True)
    out = loss_fn(logp, *args, **kwargs)
    (grad,) = torch.autograd.grad(out.loss, logp)
    return out, grad


def _log(x):
    return torch.log(torch.tensor(x, dtype=torch.float32))


def _close(actual, expected):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# GSPO (importance_sampling_level="sequence"), loss_type grpo, eps 0.2; a padded third column of garbage
#   seq 0, A = +1: token ratios [1.1025, 1.0] -> mean log-ratio ln(1.1025) / 2 = ln 1.05 -> s = 1.05 (not clipped)
#   seq 1, A = -1: token ratios [0.9025, 1.0] -> s = 0.95 (not clipped)
#   each token carries -s A: seq 0 [-1.05, -1.05], seq 1 [0.95, 0.95]; grpo: (-1.05 + 0.95) / 2 = -0.05
#   d(-s A)/d logp_t = -s A / |o| = -s A / 2, then / 2 sequences and summed over the 2 tokens of the sequence mean:
#   grad seq 0 = -1.05 / 2 / 2 = -0.2625 per token, seq 1 = +0.95 / 4 = 0.2375
#   (a *sum* of log-ratios would give s = 1.1025 and 0.9025: loss -0.1; token ratios would clip 1.1025 at... no:
#   token level gives (-(1.1025 + 1) / 2 + (0.9025 + 1) / 2) / 2 = -0.05 too, but gradients [-0.2756, -0.25] etc.)
# ---------------------------------------------------------------------------------------------------------------
GSPO_OLD = torch.full((2, 3), -1.0)
GSPO_LOGP = GSPO_OLD + _log([[1.1025, 1.0, 5.0], [0.9025, 1.0, 0.1]])
GSPO_ADV = torch.tensor([1.0, -1.0])
GSPO_MASK = torch.tensor([[1, 1, 0], [1, 1, 0]])


def test_gspo_sequence_ratio_is_the_geometric_mean_of_token_ratios():
    loss_fn = GRPOLoss(loss_type="grpo", importance_sampling_level="sequence")
    out, grad = _run(loss_fn, GSPO_LOGP, GSPO_OLD, GSPO_ADV, GSPO_MASK)
    _close(out.loss, -0.05)
    _close(grad, [[-0.2625, -0.2625, 0.0], [0.2375, 0.2375, 0.0]])
    # clip metrics count sequences at sequence level: none clipped
    assert out.metrics["clip_ratio/region_mean"] == 0.0
    # token level: same value here, different gradient (each token its own ratio): seq 0 [-1.1025, -1] / 4
    out, grad = _run(GRPOLoss(loss_type="grpo"), GSPO_LOGP, GSPO_OLD, GSPO_ADV, GSPO_MASK)
    _close(grad[0, :2], [-1.1025 / 4, -0.25])


def test_gspo_clip_counts_sequences():
    # eps 0.04: s = 1.05 > 1.04 with A > 0 -> clipped high (1 of 2 sequences); s = 0.95 < 0.96 with A < 0 -> low
    out, grad = _run(GRPOLoss(loss_type="grpo", importance_sampling_level="sequence", epsilon=0.04), GSPO_LOGP,
                     GSPO_OLD, GSPO_ADV, GSPO_MASK)
    assert out.metrics["clip_ratio/high_mean"] == 0.5 and out.metrics["clip_ratio/low_mean"] == 0.5
    _close(out.loss, (-1.04 + 0.96) / 2)  # both clipped: no gradient
    _close(grad, torch.zeros(2, 3))


# ---------------------------------------------------------------------------------------------------------------
# delta (two-sided clip), dapo over 2 one-token sequences, eps 0.2, delta 2
#   seq 0: r = 3, A = -1: -min(min(3, 2) * -1, clip(3) * -1) = -min(-2, -1.2) = 2, grad 0 (r capped at delta)
#          without delta: -min(-3, -1.2) = 3, grad -r A = 3
#   seq 1: r = 3, A = +1: -min(2, 1.2) = -1.2 with or without delta (clipped high), grad 0
#   dapo: with delta (2 - 1.2) / 2 = 0.4, grad [0, 0]; without (3 - 1.2) / 2 = 0.9, grad [1.5, 0]
# ---------------------------------------------------------------------------------------------------------------
def test_delta_caps_the_ratio_of_negative_advantages():
    logp, old, adv, mask = _log([[3.0], [3.0]]), torch.zeros(2, 1), torch.tensor([-1.0, 1.0]), torch.ones(2, 1)
    out, grad = _run(GRPOLoss(delta=2.0), logp, old, adv, mask)
    _close(out.loss, 0.4)
    _close(grad, [[0.0], [0.0]])
    out, grad = _run(GRPOLoss(), logp, old, adv, mask)
    _close(out.loss, 0.9)
    _close(grad, [[1.5], [0.0]])


# ---------------------------------------------------------------------------------------------------------------
# CISPO, epsilon_high = 1.2 is the cap of the weight itself; one sequence, A = 2, dapo over 2 tokens
#   pi_old = [0.4, 0.4], pi = [0.6, 0.2]: r = [1.5, 0.5], w = sg(min(r, 1.2)) = [1.2, 0.5]
#   loss per token -w A log pi = [-2.4 ln 0.6, -1.0 ln 0.2]; mean of the two
#   grad = -w A / 2 = [-1.2, -0.5]  (without the stop-gradient token 1 would get -A (r log pi + r) / 2 = 0.3047)
#   cispo_clip_ratio: token 0 (r > 1.2, A > 0): 1/2
# ---------------------------------------------------------------------------------------------------------------
def test_cispo_detaches_the_capped_weight():
    old, logp, adv, mask = _log([[0.4, 0.4]]), _log([[0.6, 0.2]]), torch.tensor([2.0]), torch.ones(1, 2)
    out, grad = _run(GRPOLoss(loss_type="cispo", epsilon_high=1.2), logp, old, adv, mask)
    _close(out.loss, (-2.4 * math.log(0.6) - 1.0 * math.log(0.2)) / 2)
    _close(grad, [[-1.2, -0.5]])
    _close(out.metrics["cispo_clip_ratio"], 0.5)


# ---------------------------------------------------------------------------------------------------------------
# SAPO, grpo aggregation of one-token sequences: l = -(4 / tau) sigmoid(tau (r - 1)) A
#   seq 0: r = 1, A = +1, tau 1:    l = -4 * 0.5 = -2,           grad -4 sigmoid'(0) r A = -1
#   seq 1: r = 1, A = -1, tau 1.05: l = (4 / 1.05) * 0.5 = 1.904762, grad +1
#   seq 2: r = 2, A = +1, tau 1:    l = -4 sigmoid(1) = -2.924234, grad -4 sigmoid(1)(1 - sigmoid(1)) * 2 = -1.572895
#   grpo: mean over 3 sequences; grads / 3
# ---------------------------------------------------------------------------------------------------------------
def test_sapo_soft_gate_by_hand():
    old, logp, adv = torch.zeros(3, 1), _log([[1.0], [1.0], [2.0]]), torch.tensor([1.0, -1.0, 1.0])
    out, grad = _run(GRPOLoss(loss_type="sapo"), logp, old, adv, torch.ones(3, 1))
    sig = 1 / (1 + math.exp(-1))
    _close(out.loss, (-2 + 2 / 1.05 - 4 * sig) / 3)
    _close(grad, [[-1 / 3], [1 / 3], [-4 * sig * (1 - sig) * 2 / 3]])


# ---------------------------------------------------------------------------------------------------------------
# VESPO: phi(w) = exp(lambda + k ln w - lambda w), detached; l = -phi A log pi; dapo
#   seq 0, A = +1 (k 2, lambda 3): token log-ratios [ln 2, 0] -> w = 2: phi = exp(3 + 2 ln 2 - 6) = 4 e^-3
#   seq 1, A = -1 (k 3, lambda 2): log-ratios [ln 0.5, 0]  -> w = 0.5: phi = exp(2 + 3 ln 0.5 - 1) = e / 8
#   grad = -phi A / 4 tokens: seq 0 -4 e^-3 / 4 = -e^-3, seq 1 +e / 32
# ---------------------------------------------------------------------------------------------------------------
VESPO_OLD = _log([[0.25, 0.5], [0.5, 0.5]])
VESPO_LOGP = _log([[0.5, 0.5], [0.25, 0.5]])


def test_vespo_gamma_weight_by_hand():
    adv = torch.tensor([1.0, -1.0])
    out, grad = _run(GRPOLoss(loss_type="vespo"), VESPO_LOGP, VESPO_OLD, adv, torch.ones(2, 2))
    phi0, phi1 = 4 * math.exp(-3), math.e / 8
    _close(grad, [[-phi0 / 4] * 2, [phi1 / 4] * 2])
    _close(out.loss, (-phi0 * (2 * math.log(0.5)) + phi1 * (math.log(0.25) + math.log(0.5))) / 4)
    _close(out.metrics["vespo/phi_seq_mean"], (phi0 + phi1) / 2)


# ---------------------------------------------------------------------------------------------------------------
# LUSPO: clip surrogate (here r = 1) summed over each sequence, then mean over sequences
#   seq 0 (A = +1, 2 tokens): -1 - 1 = -2; seq 1 (A = -1, 1 token): +1 -> (-2 + 1) / 2 = -0.5; grad -A / 2
#   grpo instead: (-1 + 1) / 2 = 0
# ---------------------------------------------------------------------------------------------------------------
def test_luspo_sums_each_sequence():
    zeros, adv, mask = torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.tensor([[1, 1], [1, 0]])
    out, grad = _run(GRPOLoss(loss_type="luspo", importance_sampling_level="sequence"), zeros, zeros, adv, mask)
    _close(out.loss, -0.5)
    _close(grad, [[-0.5, -0.5], [0.5, 0.0]])
    _close(GRPOLoss(loss_type="grpo")(zeros, zeros, adv, mask).loss, 0.0)


# ---------------------------------------------------------------------------------------------------------------
# mask_truncated_completions, dapo, r = 1: per-token -A; rows [A = 1, 3 tokens, truncated], [A = -1, 2 tokens]
#   masked: only row 1's 2 tokens count: (1 + 1) / 2 = 1, grad row 1 +1/2, row 0 0
#   not masked: (-3 + 2) / 5 = -0.2
# ---------------------------------------------------------------------------------------------------------------
def test_truncated_completions_leave_the_loss_and_its_token_count():
    zeros, adv, mask = torch.zeros(2, 3), torch.tensor([1.0, -1.0]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    truncated = torch.tensor([True, False])
    loss_fn = GRPOLoss(mask_truncated_completions=True)
    out, grad = _run(loss_fn, zeros, zeros, adv, mask, truncated=truncated)
    _close(out.loss, 1.0)
    _close(grad, [[0.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    assert loss_fn.micro_batch_weight(mask, truncated) == 2.0  # dapo weighs a micro-batch by its loss tokens
    _close(GRPOLoss()(zeros, zeros, adv, mask, truncated=truncated).loss, -0.2)
    with pytest.raises(ValueError, match="truncated"):
        loss_fn(zeros, zeros, adv, mask)


# ---------------------------------------------------------------------------------------------------------------
# Off-policy sequence mask, delta = 0.2: mean over tokens of (log mu - log pi_theta)
#   seq 0: A = -1, mean 0.3 > 0.2 -> dropped;  seq 1: A = -1, mean 0.1 -> kept;  seq 2: A = +1, mean 0.5 -> kept
# ---------------------------------------------------------------------------------------------------------------
def test_off_policy_sequence_mask_by_hand():
    logp = torch.zeros(3, 2)
    mu = torch.tensor([[0.4, 0.2], [0.1, 0.1], [0.5, 0.5]])
    adv = torch.tensor([[-1.0], [-1.0], [1.0]])
    keep = off_policy_sequence_mask(logp, mu, adv, torch.ones(3, 2, dtype=torch.bool), 0.2)
    assert keep.squeeze(1).tolist() == [False, True, True]
    # in the loss (dapo, r = 1 against pi_old = pi_theta, mu given as replayed behaviour with the paper form
    # would change r, so use the engine path without correction): seq 0's tokens give 0, the others -A;
    # (0 + 2 - 2) / 6 = 0 and the dropped row keeps counting in the 6 tokens
    loss_fn = GRPOLoss(off_policy_mask_threshold=0.2, mismatch_correction=None)
    out, grad = _run(loss_fn, logp, logp, adv.squeeze(1), torch.ones(3, 2), behaviour_logprobs=mu,
                     replay_mask=torch.zeros(3, dtype=torch.bool))
    _close(out.loss, 0.0)
    _close(grad, [[0.0, 0.0], [1 / 6, 1 / 6], [-1 / 6, -1 / 6]])
    _close(out.metrics["sampling/off_policy_masked_frac"], 1 / 3)


def test_off_policy_mask_of_replayed_rows_measures_the_drift_from_their_stored_mu():
    # pi_theta = pi_old (no drift within the update) but the stored mu is far: a replayed negative row is dropped;
    # the same row without behaviour log-probs (mu = pi_old) is kept
    logp, adv, mask = torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2)
    mu = torch.tensor([[0.5, 0.5]])
    loss_fn = GRPOLoss(off_policy_mask_threshold=0.2)
    out, grad = _run(loss_fn, logp, logp, adv, mask, behaviour_logprobs=mu)
    _close(out.loss, 0.0)
    _close(grad, torch.zeros(1, 2))
    out, _ = _run(loss_fn, logp, logp, adv, mask)
    _close(out.loss, 1.0)


# ---------------------------------------------------------------------------------------------------------------
# Top-entropy tokens: torch.quantile's linear interpolation over the loss tokens
#   entropies [1, 2, 3, 4, 5]: rho 0.5 -> quantile(0.5) = 3 (keep 3, 4, 5); rho 0.3 -> quantile(0.7):
#   rank 0.7 * 4 = 2.8 -> 3 + 0.8 * (4 - 3) = 3.8 (keep 4, 5); rho 1 keeps all (quantile(0) = 1); no tokens: inf
# ---------------------------------------------------------------------------------------------------------------
def test_entropy_threshold_by_hand(monkeypatch):
    h = torch.tensor([5.0, 1.0, 4.0, 2.0, 3.0])
    assert entropy_threshold(h, 0.5) == 3.0
    assert entropy_threshold(h, 0.3) == pytest.approx(3.8)
    assert entropy_threshold(h, 1.0) == 1.0
    assert entropy_threshold(torch.zeros(0), 0.2) == math.inf
    monkeypatch.setattr(loss_masks, "_QUANTILE_MAX", 2)  # the sort-based path for inputs torch.quantile refuses
    assert entropy_threshold(h, 0.3) == pytest.approx(3.8)
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        entropy_threshold(h, 1.5)


def test_high_entropy_tokens_and_the_entropy_bonus_by_hand():
    # one row of 5 tokens (+1 padding), r = 1, A = 1, dapo: per-token loss -1
    # rho 0.3 keeps the tokens with H >= 3.8 (H = 5 and 4): policy loss (-1 - 1) / 5 tokens = -0.4
    # bonus c = 0.1 on the kept tokens: mean H = 4.5 -> loss -0.4 - 0.45 = -0.85
    # d/dH: -c / 2 on the 2 kept tokens
    zeros, adv = torch.zeros(1, 6), torch.tensor([1.0])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    h = torch.tensor([[5.0, 1.0, 4.0, 2.0, 3.0, 99.0]], requires_grad=True)
    loss_fn = GRPOLoss(top_entropy_quantile=0.3, entropy_coef=0.1)
    out, grad = _run(loss_fn, zeros, zeros, adv, mask, entropy=h)
    _close(out.loss, -0.85)
    _close(out.metrics["policy_loss"], -0.4)
    _close(grad, [[-0.2, 0.0, -0.2, 0.0, 0.0, 0.0]])
    (grad_h,) = torch.autograd.grad(loss_fn(zeros, zeros, adv, mask, entropy=h).loss, h)
    _close(grad_h, [[-0.05, 0.0, -0.05, 0.0, 0.0, 0.0]])
    _close(out.metrics["entropy/high_entropy_token_frac"], 0.4)
    _close(out.entropy_stats, [9.0, 2.0])
    # a global threshold passed in wins over this call's own: tau = 2.5 keeps 5, 4, 3 -> (-3) / 5 - 0.1 * 4
    out, _ = _run(loss_fn, zeros, zeros, adv, mask, entropy=h, entropy_threshold=2.5)
    _close(out.loss, -0.6 - 0.4)


# ---------------------------------------------------------------------------------------------------------------
# Replay: every variant is ordinary TRL on fresh rows (mu = pi_old), in both off-policy forms
# ---------------------------------------------------------------------------------------------------------------
def _random(seed=0, n=5, length=6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, length, generator=g) * 2 - 0.05
    logp = old + torch.randn(n, length, generator=g) * 0.3
    mu = old + torch.randn(n, length, generator=g) * 0.4
    adv = torch.randn(n, generator=g)
    mask = (torch.arange(length)[None] < torch.tensor([6, 2, 4, 1, 5])[:, None]).long()
    entropy = torch.rand(n, length, generator=g) * 3
    return logp, old, mu, adv, mask, entropy


VARIANTS = [(lt, level) for lt in LOSS_TYPES for level in ("token", "sequence")
            if not (lt == "vespo" and level == "sequence")]


@pytest.mark.parametrize("form", ["geppo", "paper"])
@pytest.mark.parametrize(("loss_type", "level"), VARIANTS)
def test_fresh_rows_are_trl_in_both_off_policy_forms(loss_type, level, form):
    logp, old, _, adv, mask, entropy = _random()
    options = {"loss_type": loss_type, "importance_sampling_level": level, "max_completion_length": 6,
               "off_policy_mask_threshold": 0.05, "top_entropy_quantile": 0.7}
    on_policy, grad = _run(GRPOLoss(**options), logp, old, adv, mask, entropy=entropy)
    fresh, fresh_grad = _run(GRPOLoss(off_policy=form, **options), logp, old, adv, mask, entropy=entropy,
                             behaviour_logprobs=old)
    torch.testing.assert_close(fresh.loss, on_policy.loss)
    torch.testing.assert_close(fresh_grad, grad)


def test_replayed_rows_by_hand_for_the_new_surrogates():
    # one replayed row of one token: mu = 0.2, pi_old = 0.4, pi = 0.6 -> r = pi / pi_old = 1.5, r_old = 2,
    # pi / mu = 3; A = 1; dapo over 1 token
    mu, old, logp, adv, mask = _log([[0.2]]), _log([[0.4]]), _log([[0.6]]), torch.tensor([1.0]), torch.ones(1, 1)
    lp = math.log(0.6)
    sig = 1 / (1 + math.exp(-0.5))
    cases = [
        # cispo (cap 5), geppo: w = 2 times sg(min(1.5, 5)) -> -3 ln 0.6, grad -3;  paper: sg(min(3, 5)) -> same
        ({"loss_type": "cispo", "epsilon_high": 5.0}, -3 * lp, -3.0),
        ({"loss_type": "cispo", "epsilon_high": 5.0, "off_policy": "paper"}, -3 * lp, -3.0),
        # cispo cap 2: geppo -2 * min(1.5, 2) = -3 (the cap applies to pi / pi_old);  paper: -min(3, 2) = -2
        ({"loss_type": "cispo", "epsilon_high": 2.0}, -3 * lp, -3.0),
        ({"loss_type": "cispo", "epsilon_high": 2.0, "off_policy": "paper"}, -2 * lp, -2.0),
        # sapo, geppo: -2 * 4 sigmoid(0.5);  grad -2 * 4 sigmoid'(0.5) * 1.5
        ({"loss_type": "sapo"}, -8 * sig, -8 * sig * (1 - sig) * 1.5),
        # sapo, paper: -4 sigmoid(2) on pi / mu = 3; grad -4 sigmoid'(2) * 3
        ({"loss_type": "sapo", "off_policy": "paper"}, -4 / (1 + math.exp(-2)),
         -4 * math.exp(-2) / (1 + math.exp(-2)) ** 2 * 3),
        # GSPO with one token is token level: geppo -2 * min(1.5, 1.2) = -2.4, clipped, grad 0
        ({"importance_sampling_level": "sequence"}, -2.4, 0.0),
        # vespo folds w: log w = ln 1.5 + ln 2 = ln 3 = the paper form's ln(pi / mu); phi = exp(3 + 2 ln 3 - 9)
        ({"loss_type": "vespo"}, -9 * math.exp(-6) * lp, -9 * math.exp(-6)),
        ({"loss_type": "vespo", "off_policy": "paper"}, -9 * math.exp(-6) * lp, -9 * math.exp(-6)),
    ]
    for options, expected, expected_grad in cases:
        out, grad = _run(GRPOLoss(**options), logp, old, adv, mask, behaviour_logprobs=mu)
        _close(out.loss, expected)
        _close(grad, [[expected_grad]])


def test_vespo_geppo_without_cap_equals_the_paper_form():
    # sum_t log(pi / pi_old) + sum_t log(pi_old / mu) = sum_t log(pi / mu): the two forms agree when w is uncapped
    logp, old, mu, adv, mask, _ = _random(seed=4)
    geppo, geppo_grad = _run(GRPOLoss(loss_type="vespo", importance_cap=None), logp, old, adv, mask,
                             behaviour_logprobs=mu)
    paper, paper_grad = _run(GRPOLoss(loss_type="vespo", off_policy="paper"), logp, old, adv, mask,
                             behaviour_logprobs=mu)
    torch.testing.assert_close(geppo.loss, paper.loss)
    torch.testing.assert_close(geppo_grad, paper_grad)


def test_vespo_clamps_each_folded_log_weight_like_trl():
    # one replayed row, A = +1 (k 2, lambda 3), geppo without cap:
    #   token 0: r = 1, pi_old / mu = e^-25 -> its log-weight is clamped to ln 1e-8 = -18.4207 (TRL's clamp)
    #   token 1: r = e^10, pi_old / mu = 1
    #   ln w = 10 - 18.4207 = -8.4207 -> phi = exp(3 + 2 ln w - 3 w) = 9.78e-7 (unclamped: exp(-27) = 1.9e-12)
    old = torch.tensor([[-26.0, -11.0]])
    logp = torch.tensor([[-26.0, -1.0]])
    mu = torch.tensor([[-1.0, -11.0]])
    out = GRPOLoss(loss_type="vespo", importance_cap=None)(logp, old, torch.tensor([1.0]), torch.ones(1, 2),
                                                           behaviour_logprobs=mu)
    log_w = 10 + math.log(1e-8)
    torch.testing.assert_close(out.metrics["vespo/phi_seq_mean"],
                               torch.tensor(math.exp(3 + 2 * log_w - 3 * math.exp(log_w))), rtol=1e-4, atol=0)


def test_replayed_and_engine_rows_side_by_side_sapo():
    # grpo aggregation, r = 1 on both one-token rows (pi_theta = pi_old), sapo gate at r = 1: -(2 / tau) A
    #   row 0 replayed, geppo: pi_old / mu = 2 -> -2 * 2 = -4, grad -2 * (A = 1) = -2 (gate slope 1 at r = 1)
    #   row 1 fresh, engine token_truncate: pi_old / mu = 4 capped at 3; A = -1, tau 1.05:
    #       -3 * (2 / 1.05) * (-1) = 5.714286, grad 3
    #   mean over 2 rows: (-4 + 5.714286) / 2 = 0.857143, grads / 2
    old = _log([[0.4], [0.4]])
    mu = _log([[0.2], [0.1]])
    loss_fn = GRPOLoss(loss_type="sapo", mismatch_correction="token_truncate", mismatch_cap=3.0)
    out, grad = _run(loss_fn, old, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), behaviour_logprobs=mu,
                     replay_mask=torch.tensor([True, False]))
    _close(out.loss, (-4 + 6 / 1.05) / 2)
    _close(grad, [[-1.0], [1.5]])


# ---------------------------------------------------------------------------------------------------------------
# Micro-batch weights: sum over micro-batches of loss * w / sum(w) is the whole mini-batch's loss
# ---------------------------------------------------------------------------------------------------------------
def _split_loss(loss_fn, logp, old, adv, mask, entropy, truncated, parts, exact_bonus):
    """The updater's accumulation: micro-batch losses weighted by w / W; gradient w.r.t. logp and entropy."""
    logp = logp.clone().requires_grad_(True)
    entropy = entropy.clone().requires_grad_(True)
    rows = torch.arange(logp.shape[0]).split(parts)
    weights = [loss_fn.micro_batch_weight(mask[r], truncated[r]) for r in rows]
    total = max(sum(weights), 1.0)
    # the global pieces: entropy threshold over the whole mini-batch, global count of bonus tokens
    valid = loss_fn.token_mask(mask, truncated)
    tau = entropy_threshold(entropy[valid], loss_fn.top_entropy_quantile)
    bonus_tokens = float((valid & (entropy >= tau)).sum())
    loss = 0.0
    for r, w in zip(rows, weights):
        normalizer = bonus_tokens * w / total if exact_bonus else None
        out = loss_fn(logp[r], old[r], adv[r], mask[r], entropy=entropy[r], entropy_threshold=tau,
                      truncated=truncated[r], entropy_normalizer=normalizer)
        loss = loss + out.loss * w / total
    grads = torch.autograd.grad(loss, [logp, entropy], allow_unused=True)
    return loss, [torch.zeros_like(entropy) if g is None else g for g in grads]


@pytest.mark.parametrize("options", [{}, {"mask_truncated_completions": True, "top_entropy_quantile": 0.5},
                                     {"entropy_coef": 0.01, "mask_truncated_completions": True},
                                     {"entropy_coef": 0.01, "top_entropy_quantile": 0.4}])
@pytest.mark.parametrize(("loss_type", "level"), VARIANTS)
def test_micro_batch_weights_make_the_split_exact(loss_type, level, options):
    logp, old, _, adv, mask, entropy = _random(seed=2, n=7, length=6)
    mask = (torch.arange(6)[None] < torch.tensor([6, 2, 4, 1, 5, 0, 3])[:, None]).long()
    truncated = torch.tensor([True, False, False, True, False, False, False])
    loss_fn = GRPOLoss(loss_type=loss_type, importance_sampling_level=level, max_completion_length=6, **options)
    whole, whole_grads = _split_loss(loss_fn, logp, old, adv, mask, entropy, truncated, [7], exact_bonus=False)
    split, split_grads = _split_loss(loss_fn, logp, old, adv, mask, entropy, truncated, [3, 1, 3],
                                     exact_bonus=True)
    if loss_type == "bnpo":  # per-micro-batch normalisation by definition: the split is the mean of token means
        assert loss_fn.micro_batch_weight(mask) == 1.0
        return
    torch.testing.assert_close(split, whole)
    for g_split, g_whole in zip(split_grads, whole_grads):
        torch.testing.assert_close(g_split, g_whole)


def test_entropy_stats_add_up_over_micro_batches_and_ranks():
    # the adaptive controller's global mean: sums of (entropy over bonus tokens, count) over any split of the batch
    # (micro-batches of one rank or slices of two ranks alike) give the whole batch's mean
    logp, old, _, adv, mask, entropy = _random(seed=5, n=5)
    loss_fn = GRPOLoss(top_entropy_quantile=0.5, entropy_coef=0.01)
    valid = loss_fn.token_mask(mask)
    tau = entropy_threshold(entropy[valid], 0.5)
    whole = loss_fn(logp, old, adv, mask, entropy=entropy, entropy_threshold=tau).entropy_stats
    parts = [loss_fn(logp[r], old[r], adv[r], mask[r], entropy=entropy[r], entropy_threshold=tau).entropy_stats
             for r in torch.arange(5).split([2, 1, 2])]
    torch.testing.assert_close(sum(parts), whole)
    kept = valid & (entropy >= tau)
    torch.testing.assert_close(whole, torch.stack([entropy[kept].sum(), kept.sum().float()]))


# ---------------------------------------------------------------------------------------------------------------
# Adaptive entropy coefficient (Skywork-OR1), target 1.0, delta 0.1, bounds [0, 0.25], start 0.05
#   apply before any step: 0 (no measurement);  step H = 0.8 <= 1: c 0.15, applied 0.15;
#   H = 0.9: c 0.25 (0.25 cap), applied 0.25;  H = 1.2 > 1: c 0.15, applied 0 (entropy above target)
#   H = 2.0: c 0.05;  H = 3.0: c 0 (floor), applied 0
# ---------------------------------------------------------------------------------------------------------------
def test_adaptive_entropy_controller_by_hand_and_state_round_trip():
    ctl = AdaptiveEntropyCoef(0.05, adaptive=True, entropy_coef_max=0.25, entropy_coef_delta=0.1,
                              entropy_target=1.0)
    assert ctl.apply_coef() == 0.0 and ctl.enabled
    expected = [(0.8, 0.15, 0.15), (0.9, 0.25, 0.25), (1.2, 0.15, 0.0), (2.0, 0.05, 0.0), (3.0, 0.0, 0.0)]
    for h, coef, applied in expected:
        ctl.update(h)
        assert ctl.coef == pytest.approx(coef) and ctl.apply_coef() == pytest.approx(applied)
    restored = AdaptiveEntropyCoef(0.05, adaptive=True, entropy_target=1.0)
    restored.load_state_dict(ctl.state_dict())
    assert restored.coef == ctl.coef and restored.last_entropy == 3.0
    restored.load_state_dict({})  # older checkpoints without the keys keep the current values
    assert restored.last_entropy == 3.0
    constant = AdaptiveEntropyCoef(0.01)
    constant.update(0.0)
    assert constant.apply_coef() == 0.01 and not AdaptiveEntropyCoef(0.0).enabled
    assert AdaptiveEntropyCoef.from_loss(GRPOLoss(entropy_coef=0.3, use_adaptive_entropy=True)).adaptive


# ---------------------------------------------------------------------------------------------------------------
# Refused combinations and required arguments, each with a one-line error naming the option
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"loss_type": "cispo", "delta": 4.0}, r"`delta` bounds the clipped surrogate only"),
    ({"loss_type": "sapo", "delta": 4.0}, r"`delta`"),
    ({"delta": 1.0}, r"`delta` must be > 1"),
    ({"loss_type": "vespo", "importance_sampling_level": "sequence"}, r"importance_sampling_level='token'"),
    ({"importance_sampling_level": "tokens"}, r"`importance_sampling_level`"),
    ({"top_entropy_quantile": 1.5}, r"`top_entropy_quantile`"),
    ({"sapo_temperature_neg": 0.0}, r"`sapo_temperature_neg`"),
    ({"entropy_coef_min": 1.0, "entropy_coef_max": 0.5}, r"`entropy_coef_min`"),
    ({"off_policy_mask_threshold": 0.0}, r"`off_policy_mask_threshold`"),
])
def test_refused_options(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        GRPOLoss(**kwargs)


def test_call_time_requirements():
    logp, old, mu, adv, mask, entropy = _random()
    with pytest.raises(ValueError, match="`entropy`"):
        GRPOLoss(entropy_coef=0.1)(logp, old, adv, mask)
    with pytest.raises(ValueError, match="`entropy`"):
        GRPOLoss(top_entropy_quantile=0.2)(logp, old, adv, mask)
    with pytest.raises(ValueError, match="apply_coef"):
        GRPOLoss(use_adaptive_entropy=True)(logp, old, adv, mask, entropy=entropy)
    with pytest.raises(ValueError, match="mismatch_correction='token_truncate'"):
        GRPOLoss(loss_type="vespo")(logp, old, adv, mask, behaviour_logprobs=mu,
                                    replay_mask=torch.zeros(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="`entropy` must have the shape"):
        GRPOLoss(entropy_coef=0.1)(logp, old, adv, mask, entropy=entropy[:, :2])
    # vespo with replayed rows only, or token_truncate, is fine
    GRPOLoss(loss_type="vespo")(logp, old, adv, mask, behaviour_logprobs=mu)
    GRPOLoss(loss_type="vespo", mismatch_correction="token_truncate")(
        logp, old, adv, mask, behaviour_logprobs=mu, replay_mask=torch.zeros(5, dtype=torch.bool))


def test_defaults_add_no_metric_and_no_entropy_term():
    logp, old, _, adv, mask, entropy = _random()
    out = GRPOLoss()(logp, old, adv, mask)
    assert sorted(out.metrics) == ["clip_ratio/high_mean", "clip_ratio/low_mean", "clip_ratio/region_mean"]
    assert out.entropy_stats is None
