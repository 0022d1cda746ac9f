"""A study's figures against hand computations: one first-crossing rule for every arm (the baseline's own seeds
included), paired final differences with their t-interval, paired ratios with censoring, the differences at each
mark, the wasted share; the zero-spread count of a step; the evaluator's seeds and pooled groups."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_rlft.core.types import OutcomeRecord
from lit_rlft.study.callback import zero_spread_completions
from lit_rlft.study.evaluation import EvalSeeds, HeldOutEvaluator, pooled
from lit_rlft.study.stats import crossing
from lit_rlft.study.summary import summarise
from tests.conftest import countdown_dm, tiny_config


def run(strategy: str, seed: int, points: list[tuple[int, float]], wasted: int = 0) -> dict:
    """A made-up run record: ``points`` of (completions, accuracy); training seconds = completions / 10."""
    curve = [{"step": i, "completions": c, "wall_s": c / 10, "val/accuracy": a} for i, (c, a) in enumerate(points)]
    return {"run": f"{strategy}-seed{seed}", "strategy": strategy, "seed": seed, "status": "ok", "curve": curve,
            "budget": {"completions": points[-1][0], "by_purpose": {"train": points[-1][0]}},
            "step_log": [{"zero_spread_completions": wasted}]}


RUNS = [
    run("uniform", 0, [(0, 0.10), (100, 0.20), (200, 0.30)], wasted=150),
    run("uniform", 1, [(0, 0.10), (100, 0.30), (200, 0.40)], wasted=100),
    run("dps", 0, [(0, 0.10), (100, 0.40), (200, 0.50)], wasted=50),
    run("dps", 1, [(0, 0.10), (100, 0.20), (200, 0.45)], wasted=70),
]


def test_the_crossing_rule_is_one_function_checked_by_hand():
    xs, ys = [0, 100, 200], [0.10, 0.30, 0.40]
    assert crossing(xs, ys, 0.35) == pytest.approx(150.0)  # 100 + (0.35 - 0.30) / (0.40 - 0.30) * 100
    assert crossing(xs, ys, 0.05) == 0.0  # at or above the target from the start: no cost
    assert crossing(xs, ys, 0.45) is None  # never: censored
    assert crossing([0, 100, 200], [0.1, 0.4, 0.2], 0.3) == pytest.approx(200 / 3)  # the first crossing only


def test_costs_to_the_baselines_final_use_the_same_rule_for_the_baseline():
    s = summarise(RUNS, ["uniform", "dps"], marks=[100, 200])
    # target: uniform's final accuracy, the mean over its seeds: (0.30 + 0.40) / 2
    assert s["targets"]["accuracy"] == pytest.approx(0.35)
    uniform, dps = s["strategies"]["uniform"], s["strategies"]["dps"]
    # uniform's own seeds by the same rule: seed 0 never reaches 0.35 (final 0.30), seed 1 at 150 completions
    assert uniform["crossing"]["accuracy"]["completions"] == [None, pytest.approx(150.0)]
    assert uniform["reached"]["accuracy"] == 1
    # dps: seed 0 between (0, 0.10) and (100, 0.40): 0 + 0.25 / 0.30 * 100; seed 1: 100 + 0.15 / 0.25 * 100
    assert dps["crossing"]["accuracy"]["completions"] == [pytest.approx(250 / 3), pytest.approx(160.0)]
    assert dps["crossing"]["accuracy"]["wall_s"] == [pytest.approx(25 / 3), pytest.approx(16.0)]
    # paired ratios: seed 0's baseline never crossed (censored, said), seed 1: 160 / 150
    ratio = dps["vs_baseline"]["accuracy"]["completions"]
    assert ratio["status"] == "partial" and ratio["b_not_reached"] == 1 and ratio["n_used"] == 1
    assert ratio["ratio"] == pytest.approx(160 / 150) and ratio["per_seed"] == [None, pytest.approx(160 / 150)]


def test_paired_final_differences_and_marks_against_a_hand_computation():
    s = summarise(RUNS, ["uniform", "dps"], marks=[100, 200])
    d = s["strategies"]["dps"]["final_diff"]["accuracy"]
    # per seed: 0.50 - 0.30 = 0.20 and 0.45 - 0.40 = 0.05; mean 0.125, sd 0.075 * sqrt(2), t(0.975, 1) = 12.706
    half = 12.706 * (0.075 * math.sqrt(2)) / math.sqrt(2)
    assert d["mean"] == pytest.approx(0.125) and d["n"] == 2
    assert (d["low"], d["high"]) == (pytest.approx(0.125 - half), pytest.approx(0.125 + half))
    at = s["at_marks"]["strategies"]["dps"]
    assert [c["mean"] for c in at] == [pytest.approx((0.20 - 0.10) / 2), pytest.approx(0.125)]  # 0.20, -0.10 at 100
    # the wasted share: zero-spread completions over all completions, mean over seeds
    assert s["strategies"]["uniform"]["wasted_share"]["mean"] == pytest.approx((150 / 200 + 100 / 200) / 2)
    assert s["strategies"]["dps"]["wasted_share"]["mean"] == pytest.approx((50 / 200 + 70 / 200) / 2)


def test_zero_spread_completions_count_fresh_groups_without_reward_spread():
    rewards = torch.tensor([[1.0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    members = torch.tensor([[True] * 4, [True] * 4, [True] * 4, [True, True, False, False]])
    record = OutcomeRecord(prompt_ids=torch.arange(4), rewards=rewards, correct=rewards > 0,
                           is_replay=torch.tensor([False, False, True, False]), trained=torch.ones(4, dtype=torch.bool),
                           members=members)
    # group 0: all 1 (4 wasted); group 1: spread; group 2: replayed (not generated now); group 3: its 2 members agree
    assert zero_spread_completions(record) == (4 + 2, 4 + 4 + 2)


def test_pooled_groups_weight_each_difficulty_by_its_prompts():
    metrics = {"val/accuracy/difficulty_3": 0.5, "val/n/accuracy/difficulty_3": 30.0,
               "val/accuracy/difficulty_4": 0.2, "val/n/accuracy/difficulty_4": 10.0}
    out = pooled(metrics, {"learnable": [3, 4], "none": [9]})
    assert out == {"val/accuracy/learnable": pytest.approx((0.5 * 30 + 0.2 * 10) / 40),
                   "val/n/accuracy/learnable": 40.0}


def test_an_evaluation_does_not_depend_on_the_step_it_runs_at_and_leaves_training_random_state():
    from lit_rlft.step.builder import build_step

    step = build_step(tiny_config(reward_funcs=["tests.study.helpers.contains_one"]))
    data = countdown_dm(val=True)
    data.setup("fit")
    step.bind(data)
    evaluator = HeldOutEvaluator()
    torch.manual_seed(7)
    state = torch.get_rng_state()
    first = evaluator.measure(step)
    assert torch.equal(torch.get_rng_state(), state)  # the training's random stream is untouched
    step.rollout_step = 5
    assert evaluator.measure(step) == first  # the same draws at any step
    assert 0 < first["val/accuracy"] < 1
    other = HeldOutEvaluator(type(evaluator.settings)(seed=1)).measure(step)
    assert other != first  # another evaluation seed draws other samples
    seeds = EvalSeeds(3)
    assert seeds.engine_seed(0, 0) == EvalSeeds(3).engine_seed(9, 0)
    assert np.isfinite(first["val/pass@1"])


# -- when a study cannot discriminate ----------------------------------------------------------------------------
def _gains(uniform_finals: list[float]) -> list[dict]:
    """Made-up study: uniform starts at 0.10 on every seed and ends at ``uniform_finals``; dps always at 0.50."""
    return ([run("uniform", s, [(0, 0.10), (100, 0.10), (200, f)]) for s, f in enumerate(uniform_finals)]
            + [run("dps", s, [(0, 0.10), (100, 0.30), (200, 0.50)]) for s in range(len(uniform_finals))])


def test_a_study_whose_baseline_did_not_measurably_learn_says_so_first():
    from lit_rlft.study.report import discrimination_sentence, verdicts

    s = summarise(_gains([0.05, 0.20, 0.10]), ["uniform", "dps"])
    gain = s["strategies"]["uniform"]["gain"]["accuracy"]
    # gains -0.05, +0.10, 0.00: mean 1/60, sd sqrt(0.0116667 / 2) = 0.076376, t(0.975, 2) = 4.3027
    assert gain["mean"] == pytest.approx(1 / 60)
    assert gain["low"] == pytest.approx(1 / 60 - 4.302653 * 0.076376 / math.sqrt(3), abs=1e-4)
    assert s["discriminates"] is False
    sentence = discrimination_sentence(s)
    assert sentence.startswith("**This study cannot tell the arms apart**: uniform's held-out accuracy moved "
                               "+0.017 [-0.173, +0.206] from the start (95% t-interval over its 3 seeds)")
    lines = verdicts(s, ["uniform", "dps"])
    # dps is +0.383 ahead on every seed, yet not called ahead: the baseline did not learn
    assert "not a verdict, since uniform itself did not measurably learn" in lines[0]
    assert "beyond the spread" not in " ".join(lines)


def test_a_study_whose_baseline_learned_beyond_its_spread_gives_verdicts():
    from lit_rlft.study.report import discrimination_sentence, verdicts

    s = summarise(_gains([0.30, 0.35, 0.40]), ["uniform", "dps"])
    # gains 0.20, 0.25, 0.30: mean 0.25, sd 0.05 -> [0.25 -+ 4.3027 * 0.05 / sqrt(3)] = [0.126, 0.374]
    gain = s["strategies"]["uniform"]["gain"]["accuracy"]
    assert (gain["low"], gain["high"]) == (pytest.approx(0.1258, abs=1e-4), pytest.approx(0.3742, abs=1e-4))
    assert s["discriminates"] is True and discrimination_sentence(s) is None
    assert "beyond the spread" in verdicts(s, ["uniform", "dps"])[0]
    # one seed: no interval, no claim either way
    assert summarise(_gains([0.30]), ["uniform", "dps"])["discriminates"] is None
