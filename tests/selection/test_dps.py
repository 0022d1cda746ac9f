"""DPS: the paper's reference numbers, hand-derived updates, the vectorised update against a per-prompt loop."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from lit_rlft.selection import (
    PRIORS,
    DPSSelector,
    PredictionTracker,
    SelectionStrategy,
    cold_start_belief,
    prior_matrix,
    state_of,
)

UNSOLVED_RATE, PARTIAL_RATE, SOLVED_RATE = 0.0, 0.5, 1.0


def _single(decay: float = 0.7) -> DPSSelector:
    return DPSSelector(num_prompts=1, decay=decay)


# --------------------------------------------------------------------------------------- reference numbers
@pytest.mark.parametrize(
    ("rate", "expected"),
    [(PARTIAL_RATE, [0.3, 0.4, 0.3]), (UNSOLVED_RATE, [0.4, 0.3, 0.3]), (SOLVED_RATE, [0.3, 0.3, 0.4])],
)
def test_one_observation_matches_reference(rate: float, expected: list[float]) -> None:
    # lambda = 0.7, alpha_0 = ones, mu_post_prev = [1/3]*3, Phi_bar(ones) = 1/3 everywhere.
    # xi[y, i] ∝ 1/3 * 1/3 for every i -> xi[y, :] = [1/3, 1/3, 1/3] (sums to 1), other rows 0.
    # alpha = 0.7 * 1 + 0.3 * 1 + xi: every column is ones with 4/3 in row y, column sum 10/3.
    # mu_post = e_y, so mu_prior = column y of Phi_bar = (ones with 4/3 at y) / (10/3): 0.3 / 0.4 at y / 0.3.
    dps = _single()
    dps.observe(np.array([0]), np.array([rate]), step=0)
    np.testing.assert_allclose(dps.mu_prior[0], expected, rtol=0, atol=1e-12)


def test_five_partial_observations_give_0_64() -> None:
    # Column 1 (from partial) of alpha after each step; its rows 0 and 2 stay 0.7 * 1 + 0.3 = 1 forever.
    # From step 2 on mu_post_prev = e_1, so xi = 1 at (1, 1) whatever Phi_bar is: a = 0.7 * a + 0.3 + 1.
    #   step 1: a = 4/3
    #   step 2: a = 0.7 * 4/3 + 1.3          = 67/30
    #   step 3: a = 0.7 * 67/30 + 1.3        = 859/300
    #   step 4: a = 0.7 * 859/300 + 1.3      = 9913/3000
    #   step 5: a = 0.7 * 9913/3000 + 1.3    = 108391/30000
    # mu_prior(partial) = a / (a + 2) = 108391 / 168391 = 0.64368642... (the paper's 0.64)
    dps = _single()
    for step in range(5):
        dps.observe(np.array([0]), np.array([PARTIAL_RATE]), step=step)
    assert dps.mu_prior[0, 1] == pytest.approx(108391 / 168391, abs=1e-12)
    assert round(dps.mu_prior[0, 1], 2) == 0.64
    np.testing.assert_allclose(dps.mu_prior[0], np.array([30000, 108391, 30000]) / 168391, atol=1e-12)


def test_not_sampled_prompt_drifts_towards_uniform() -> None:
    # Step 0, observed partial (as above): every column of alpha is [1, 4/3, 1]; mu_prior = [0.3, 0.4, 0.3].
    # Step 1, not sampled: mu_post = mu_prior; alpha = 0.7 * alpha + 0.3: every column [1, 37/30, 1], sum 97/30,
    #   identical columns, so mu_prior = [30, 37, 30] / 97 = [0.30928, 0.38144, 0.30928].
    # Step 2, not sampled: 0.7 * 37/30 + 0.3 = 349/300: mu_prior = [300, 349, 300] / 949.
    dps = _single()
    dps.observe(np.array([0]), np.array([PARTIAL_RATE]), step=0)
    empty = np.array([], dtype=np.int64)
    dps.observe(empty, np.array([]), step=1)
    np.testing.assert_allclose(dps.mu_post[0], [0.3, 0.4, 0.3], atol=1e-12)
    np.testing.assert_allclose(dps.mu_prior[0], np.array([30, 37, 30]) / 97, atol=1e-12)
    dps.observe(empty, np.array([]), step=2)
    np.testing.assert_allclose(dps.mu_prior[0], np.array([300, 349, 300]) / 949, atol=1e-12)
    assert dps.last_state[0] == 1 and dps.seen[0]


def test_soft_counts_use_the_pre_update_transition_estimate() -> None:
    # lambda = 0.5, alpha_0 = ones. Columns of alpha written [row 0, row 1, row 2].
    # Step 0, observed unsolved: every column [4/3, 1, 1]; mu_post = e_0.
    # Step 1, observed partial: xi = 1 at (1, 0); decay x -> x/2 + 1/2 then add xi:
    #   col 0 = [7/6, 2, 1], cols 1, 2 = [7/6, 1, 1]; mu_post = e_1; mu_prior = [7, 6, 6] / 19.
    # Step 2, not sampled: mu_post = [7, 6, 6] / 19; decay: col 0 = [13/12, 3/2, 1] (sum 43/12),
    #   cols 1, 2 = [13/12, 1, 1] (sum 37/12). mu_prior = 7/19 * col0/(43/12) + 12/19 * col1/(37/12)
    #   = [91*37 + 156*43, 126*37 + 144*43, 84*37 + 144*43] / (43*37*19) = [10075, 10854, 9300] / 30229.
    # Step 3, observed solved: xi[2, i] ∝ mu_post_prev[i] * Phi_bar(alpha after step 2)[2, i]
    #   ∝ [7/19 * 12/43, 6/19 * 12/37, 6/19 * 12/37] ∝ [7*37, 6*43, 6*43] = [259, 258, 258] -> / 775.
    #   (With the decayed alpha instead, Phi_bar[2, :] = [24/79, 24/73, 24/73] and xi ∝ [7*73, 6*79, 6*79].)
    #   decay: 13/12 -> 25/24, 3/2 -> 5/4, 1 -> 1; col 2 = [25/24, 1, 1 + 258/775]; mu_post = e_2;
    #   mu_prior = col 2 / sum = [25*775, 24*775, 1033*24] / 62767 = [19375, 18600, 24792] / 62767.
    dps = _single(decay=0.5)
    empty = np.array([], dtype=np.int64)
    dps.observe(np.array([0]), np.array([UNSOLVED_RATE]), step=0)
    dps.observe(np.array([0]), np.array([PARTIAL_RATE]), step=1)
    np.testing.assert_allclose(dps.alpha[0], [[7 / 6] * 3, [2, 1, 1], [1, 1, 1]], atol=1e-12)
    np.testing.assert_allclose(dps.mu_prior[0], np.array([7, 6, 6]) / 19, atol=1e-12)
    dps.observe(empty, np.array([]), step=2)
    np.testing.assert_allclose(dps.mu_prior[0], np.array([10075, 10854, 9300]) / 30229, atol=1e-12)
    dps.observe(np.array([0]), np.array([SOLVED_RATE]), step=3)
    np.testing.assert_allclose(dps.alpha[0, 2], 1 + np.array([259, 258, 258]) / 775, atol=1e-12)
    np.testing.assert_allclose(dps.mu_prior[0], np.array([19375, 18600, 24792]) / 62767, atol=1e-12)


# ------------------------------------------------------------------------- vectorised vs per-prompt loop
def _reference_dps(num_prompts: int, decay: float, alpha_0: np.ndarray, steps: list[tuple[np.ndarray, np.ndarray]]):
    """The reference implementation's shape: a Python dict per prompt, loops over prompts and matrix entries."""
    a0 = alpha_0.tolist()
    beliefs = {
        q: {"alpha": [row[:] for row in a0], "mu_post": [1 / 3] * 3, "mu_prior": [1 / 3] * 3}
        for q in range(num_prompts)
    }
    for ids, rates in steps:
        observed = {int(q): (0 if r == 0 else 2 if r == 1 else 1) for q, r in zip(ids, rates)}
        for q, b in beliefs.items():
            alpha = b["alpha"]
            if q in observed:
                y = observed[q]
                colsum = [sum(alpha[j][i] for j in range(3)) for i in range(3)]
                xi = [[0.0] * 3 for _ in range(3)]
                for i in range(3):
                    xi[y][i] = b["mu_post"][i] * alpha[y][i] / colsum[i]
                total = sum(xi[y])
                for i in range(3):
                    xi[y][i] /= total
                b["mu_post"] = [1.0 if j == y else 0.0 for j in range(3)]
            else:
                xi = [[0.0] * 3 for _ in range(3)]
                b["mu_post"] = list(b["mu_prior"])
            for j in range(3):
                for i in range(3):
                    alpha[j][i] = decay * alpha[j][i] + (1 - decay) * a0[j][i] + xi[j][i]
            colsum = [sum(alpha[j][i] for j in range(3)) for i in range(3)]
            pred = [sum(alpha[j][i] / colsum[i] * b["mu_post"][i] for i in range(3)) for j in range(3)]
            b["mu_prior"] = [v / sum(pred) for v in pred]
    return beliefs


@pytest.mark.parametrize("prior", ["uniform", "local"])
def test_vectorised_update_matches_per_prompt_loop(prior: str) -> None:
    S, T, decay = 50, 20, 0.6
    data_rng = np.random.default_rng(123)
    steps = []
    for _ in range(T):
        ids = data_rng.choice(S, size=int(data_rng.integers(0, 12)), replace=False)
        rates = data_rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=ids.size)
        steps.append((ids, rates))
    dps = DPSSelector(S, decay=decay, prior=prior)
    for t, (ids, rates) in enumerate(steps):
        dps.observe(ids, rates, step=t)
    ref = _reference_dps(S, decay, prior_matrix(prior), steps)
    np.testing.assert_allclose(dps.alpha, [ref[q]["alpha"] for q in range(S)], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dps.mu_post, [ref[q]["mu_post"] for q in range(S)], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dps.mu_prior, [ref[q]["mu_prior"] for q in range(S)], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------- selection
def test_select_takes_top_b_in_descending_order() -> None:
    dps = DPSSelector(6)
    dps.mu_prior[:, 1] = [0.1, 0.9, 0.5, 0.7, 0.2, 0.6]
    ids = dps.select(3, step=0, rng=np.random.default_rng(0))
    assert ids.dtype == np.int64
    assert ids.tolist() == [1, 3, 5]


def test_ties_broken_at_random_by_the_callers_rng() -> None:
    # 10 unseen prompts score 1/3 each: the batch is rng.choice over the tie, nothing else.
    dps = DPSSelector(10)
    ids = dps.select(3, step=0, rng=np.random.default_rng(7))
    assert ids.tolist() == np.random.default_rng(7).choice(np.arange(10), size=3, replace=False).tolist()
    # prompt 4 is clearly best, then a tie of 3 prompts (0, 1, 2) at 0.5 for the two remaining places
    dps.mu_prior[:, 1] = [0.5, 0.5, 0.5, 0.1, 0.9, 0.1, 0.1, 0.1, 0.1, 0.1]
    picks = np.zeros(10, dtype=int)
    rng = np.random.default_rng(0)
    for _ in range(600):
        ids = dps.select(3, step=0, rng=rng)
        assert ids[0] == 4 and len(set(ids.tolist())) == 3
        picks[ids] += 1
    assert picks[4] == 600 and picks[3] == 0 and picks[5:].sum() == 0
    assert all(340 < picks[q] < 460 for q in (0, 1, 2))  # 2/3 of 600 = 400 each


def test_select_whole_pool_and_batch_validation() -> None:
    dps = DPSSelector(4)
    assert sorted(dps.select(4, 0, np.random.default_rng(0)).tolist()) == [0, 1, 2, 3]
    for bad in (0, 5):
        with pytest.raises(ValueError, match="batch_size"):
            dps.select(bad, 0, np.random.default_rng(0))


def test_entropy_bonus_prefers_uncertain_prompts() -> None:
    # prompt 0: mu = [0.05, 0.55, 0.4], H = -(0.05 ln 0.05 + 0.55 ln 0.55 + 0.4 ln 0.4)
    #           = 0.1497866 + 0.3288103 + 0.3665163 = 0.8451132
    # prompt 1: mu = [0, 0.6, 0.4],     H = -(0.6 ln 0.6 + 0.4 ln 0.4) = 0.3064954 + 0.3665163 = 0.6730117
    # w = 0: 0.55 < 0.6, prompt 1 wins; w = 1: 1.3951132 > 1.2730117, prompt 0 wins.
    dps = DPSSelector(2, entropy_bonus=0.0)
    dps.mu_prior[:] = [[0.05, 0.55, 0.4], [0.0, 0.6, 0.4]]
    assert dps.select(1, 0, np.random.default_rng(0)).tolist() == [1]
    dps.entropy_bonus = 1.0
    np.testing.assert_allclose(dps.scores(), [1.3951132, 1.2730117], atol=1e-6)
    assert dps.select(1, 0, np.random.default_rng(0)).tolist() == [0]


# ------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("decay", [0.0, -0.1, 1.5, float("nan")])
def test_decay_validation(decay: float) -> None:
    with pytest.raises(ValueError, match="decay"):
        DPSSelector(3, decay=decay)


def test_unknown_prior_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="uniform, progress, stability, local"):
        DPSSelector(3, prior="optimistic")
    with pytest.raises(ValueError, match="prior"):
        DPSSelector(3, prior=np.zeros((3, 3)))
    custom = DPSSelector(3, prior=np.full((3, 3), 2.0))
    assert custom.alpha.shape == (3, 3, 3) and np.all(custom.alpha == 2.0)


def test_named_priors_are_positive_counts() -> None:
    for name, matrix in PRIORS.items():
        assert matrix.shape == (3, 3) and np.all(matrix > 0), name
    # "progress" favours moving up: from unsolved to partial, from partial to solved
    assert PRIORS["progress"][1, 0] > PRIORS["progress"][0, 0]
    assert PRIORS["progress"][2, 1] > PRIORS["progress"][1, 1]
    assert np.all(np.diag(PRIORS["stability"]) == 2)
    assert PRIORS["local"][2, 0] == PRIORS["local"][0, 2] == 1 and PRIORS["local"][1].tolist() == [2, 2, 2]


def test_observe_rejects_bad_input_and_repeated_steps() -> None:
    dps = DPSSelector(5)
    with pytest.raises(ValueError, match="unique"):
        dps.observe(np.array([1, 1]), np.array([0.5, 0.5]), step=0)
    with pytest.raises(ValueError, match=r"\[0, 4\]"):
        dps.observe(np.array([5]), np.array([0.5]), step=0)
    with pytest.raises(ValueError, match="success rates"):
        dps.observe(np.array([1]), np.array([1.5]), step=0)
    dps.observe(np.array([1]), np.array([0.5]), step=3)
    with pytest.raises(ValueError, match="strictly increasing"):
        dps.observe(np.array([1]), np.array([0.5]), step=3)


# -------------------------------------------------------------------------------- cold start, diagnostics
def test_cold_start_belief_by_hand() -> None:
    # p = 0.5, G = 2: P(both wrong) = 0.25, P(both right) = 0.25, partial 0.5.
    # p = 0.1, G = 4: 0.9^4 = 0.6561, 0.1^4 = 0.0001, partial 0.3438.
    belief = cold_start_belief(np.array([0.5, 0.1, 0.0, 1.0]), group_size=2)
    np.testing.assert_allclose(belief[0], [0.25, 0.5, 0.25])
    np.testing.assert_allclose(belief[2:], [[1, 0, 0], [0, 0, 1]])
    np.testing.assert_allclose(cold_start_belief(np.array([0.1]), 4), [[0.6561, 0.3438, 0.0001]], atol=1e-12)
    with pytest.raises(ValueError, match="group_size"):
        cold_start_belief(np.array([0.5]), 0)


def test_init_belief_sets_only_unseen_prompts() -> None:
    dps = DPSSelector(4, decay=0.7)
    dps.observe(np.array([0]), np.array([0.5]), step=0)
    seen_prior = dps.mu_prior[0].copy()
    n = dps.init_belief(np.array([0, 2]), cold_start_belief(np.array([0.5, 0.5]), 2))
    assert n == 1
    np.testing.assert_allclose(dps.mu_prior[0], seen_prior)
    np.testing.assert_allclose(dps.mu_prior[2], [0.25, 0.5, 0.25])
    np.testing.assert_allclose(dps.mu_post[2], [0.25, 0.5, 0.25])
    # prompt 2 (0.5 partial) now outranks the seen one (0.4) and the uniform ones (1/3)
    assert dps.select(1, 1, np.random.default_rng(0)).tolist() == [2]
    assert dps.predict_states(np.array([0, 1, 2])).tolist() == [1, 0, 1]  # 1/3 ties go to unsolved
    np.testing.assert_allclose(dps.prob_partial(np.array([0, 2])), [0.4, 0.5])


def test_prediction_tracker_by_hand() -> None:
    # observed:  [1, 1, 1, 0, 2, 1, 0]
    # predicted: [1, 1, 0, 1, 2, 1, 0]
    # confusion[observed, predicted]: (1,1) x3, (1,0) x1, (0,1) x1, (2,2) x1, (0,0) x1
    # accuracy 5/7; partial precision = 3 / (3 + 1) = 0.75; recall = 3 / 4 = 0.75; F1 = 0.75
    tracker = PredictionTracker()
    tracker.update(np.array([1, 1, 0, 1]), np.array([1, 1, 1, 0]))
    tracker.update(np.array([2, 1, 0]), np.array([2, 1, 0]))
    assert tracker.confusion.tolist() == [[1, 1, 0], [1, 3, 0], [0, 0, 1]]
    assert tracker.accuracy == pytest.approx(5 / 7)
    assert tracker.precision == pytest.approx(0.75) and tracker.recall == pytest.approx(0.75)
    assert tracker.f1 == pytest.approx(0.75)
    # one more predicted partial that was solved: precision 3/5, recall 3/4, F1 = 2 * 0.6 * 0.75 / 1.35 = 2/3
    tracker.update(np.array([1]), np.array([2]))
    assert tracker.metrics() == pytest.approx(
        {"accuracy": 5 / 8, "partial_precision": 0.6, "partial_recall": 0.75, "partial_f1": 2 / 3}
    )
    tracker.reset()
    assert tracker.total == 0 and tracker.metrics() == {k: 0.0 for k in tracker.metrics()}


def test_tracker_with_selector_call_order() -> None:
    dps, tracker = DPSSelector(3, decay=0.7), PredictionTracker()
    ids, rates = np.array([0, 1]), np.array([0.5, 1.0])
    for step in range(2):
        tracker.update(dps.predict_states(ids), state_of(rates))
        dps.observe(ids, rates, step)
    # step 0: both predicted unsolved (1/3 ties); step 1: predicted partial (0.4) and solved (0.4): both right
    assert tracker.confusion.tolist() == [[0, 0, 0], [1, 1, 0], [1, 0, 1]]


# ------------------------------------------------------------------------------------------ state, resume
def _run(dps: DPSSelector, rng: np.random.Generator, steps: range, outcome_seed: int = 99) -> list[list[int]]:
    selected = []
    for t in steps:
        ids = dps.select(8, t, rng)
        rates = np.random.default_rng([outcome_seed, t]).choice([0.0, 0.5, 1.0], size=ids.size)
        dps.observe(ids, rates, t)
        selected.append(ids.tolist())
    return selected


def test_resume_selects_exactly_what_the_uninterrupted_run_selects() -> None:
    full = _run(DPSSelector(40, decay=0.5), np.random.default_rng(0), range(10))

    dps, rng = DPSSelector(40, decay=0.5), np.random.default_rng(0)
    first = _run(dps, rng, range(5))
    buffer = io.BytesIO()
    torch.save({"dps": dps.state_dict(), "rng": rng.bit_generator.state}, buffer)
    buffer.seek(0)
    ckpt = torch.load(buffer, weights_only=False)

    resumed, resumed_rng = DPSSelector(40, decay=0.5), np.random.default_rng(12345)
    resumed.load_state_dict(ckpt["dps"])
    resumed_rng.bit_generator.state = ckpt["rng"]
    assert first + _run(resumed, resumed_rng, range(5, 10)) == full
    assert resumed.last_step == 9 and resumed.num_updates == 10


def test_state_dict_round_trip_and_validation() -> None:
    dps = DPSSelector(6, decay=0.7)
    dps.observe(np.array([1, 4]), np.array([0.0, 0.5]), 0)
    state = dps.state_dict()
    assert state["version"] == 1 and isinstance(state["alpha"], np.ndarray)
    other = DPSSelector(6, decay=0.7)
    other.load_state_dict(state)
    for key in ("alpha", "mu_post", "mu_prior", "seen", "last_state"):
        np.testing.assert_array_equal(getattr(other, key), getattr(dps, key))
    state["alpha"][:] = 0  # the state is a copy
    assert dps.alpha.min() > 0
    # optional keys may be missing
    minimal = {k: v for k, v in dps.state_dict().items() if k in ("alpha", "mu_post", "mu_prior")}
    DPSSelector(6, decay=0.7).load_state_dict(minimal)
    # another pool size: a clear error
    with pytest.raises(ValueError, match="pool of 6 prompts"):
        DPSSelector(7, decay=0.7).load_state_dict(dps.state_dict())
    without_size = {k: v for k, v in dps.state_dict().items() if k != "num_prompts"}
    with pytest.raises(ValueError, match="another pool"):
        DPSSelector(7, decay=0.7).load_state_dict(without_size)
    with pytest.warns(UserWarning, match="decay"):
        DPSSelector(6, decay=0.5).load_state_dict(dps.state_dict())


def test_is_a_selection_strategy() -> None:
    assert isinstance(DPSSelector(2), SelectionStrategy)


def test_candidate_ratio_ranks_a_fresh_candidate_set_of_an_epoch() -> None:
    """candidate_ratio 2, B = 3, pool 12: each step ranks 6 candidates from a shuffled epoch (2 steps = 1 epoch);
    the batch is the top-3 of the candidates by P(partial), never a prompt outside them."""
    dps = DPSSelector(12, decay=0.7, candidate_ratio=2, seed=0)
    dps.mu_prior[:, 1] = np.linspace(0.1, 0.9, 12)  # prompt 11 most likely partial, then 10, ...
    rng = np.random.default_rng(0)
    epoch = []
    for step in range(2):
        ids = dps.select(3, step, rng)
        cand = dps.last_candidates
        assert cand.size == 6 and set(ids) <= set(cand)
        assert sorted(ids.tolist()) == sorted(cand.tolist())[-3:]  # higher id = higher score here
        epoch += cand.tolist()
    assert sorted(epoch) == list(range(12))  # without replacement through the epoch
    whole = DPSSelector(12, candidate_ratio=4)  # 4 x 3 >= 12: the whole pool
    whole.mu_prior[:, 1] = np.linspace(0.1, 0.9, 12)
    assert sorted(whole.select(3, 0, rng).tolist()) == [9, 10, 11] and whole.last_candidates is None


def test_candidate_draws_resume_exactly() -> None:
    def run(dps, rng, steps):
        out = []
        for t in steps:
            ids = dps.select(4, t, rng)
            dps.observe(ids, np.random.default_rng(t).integers(0, 3, size=4) / 2, t)
            out.append(ids.tolist())
        return out

    full, rng = DPSSelector(40, candidate_ratio=3, seed=5), np.random.default_rng(1)
    expected = run(full, rng, range(6))
    first, rng1 = DPSSelector(40, candidate_ratio=3, seed=5), np.random.default_rng(1)
    run(first, rng1, range(3))
    resumed, rng2 = DPSSelector(40, candidate_ratio=3, seed=5), np.random.default_rng()
    resumed.load_state_dict(first.state_dict())
    rng2.bit_generator.state = rng1.bit_generator.state
    assert run(resumed, rng2, range(3, 6)) == expected[3:]
