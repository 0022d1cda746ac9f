"""ReasoningGymReward: reasoning-gym's own score_answer on the stated answer, on real reasoning-gym entries."""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("reasoning_gym")
import reasoning_gym  # noqa: E402

from lit_rlft.rewards import ReasoningGymReward, RewardRunner  # noqa: E402

CASES = {
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "letter_counting": {},
    "number_sorting": {},
}


def entries(name, n=6):
    ds = reasoning_gym.create_dataset(name, seed=3, size=n, **CASES[name])
    return ds, [ds[i] for i in range(n)]


def columns(items):
    return {"answer": [e["answer"] for e in items], "task": [e["metadata"]["source_dataset"] for e in items],
            "metadata": [e["metadata"] for e in items], "question": [e["question"] for e in items]}


@pytest.mark.parametrize("name", list(CASES))
def test_scores_equal_reasoning_gyms_own(name):
    ds, items = entries(name)
    reward = ReasoningGymReward("answer_tags")
    stated = [e["answer"] for e in items] + ["wrong", "", "<", "9" * 5000]
    items2 = items + items[:4]
    completions = [f"Thinking... <answer>{a}</answer>" for a in stated]
    got = reward(completions, **columns(items2))
    expected = [ds.score_answer(a if len(a) <= 1000 and a else None, e) if a else 0.0 for a, e in zip(stated, items2)]
    expected = [0.0 if len(a) > 1000 else x for a, x in zip(stated, expected)]  # over max_answer_chars: 0
    assert got == pytest.approx(expected)
    assert got[: len(items)] == [1.0] * len(items)  # the gold answers are right


def test_answer_formats_and_malformed_completions():
    ds, items = entries("chain_sum", 3)
    cols = columns(items)
    gold = [e["answer"] for e in items]
    tags = ReasoningGymReward("answer_tags")
    assert tags([f"<answer>{g}" for g in gold], **cols) == [0.0] * 3            # unclosed: no answer
    assert tags([f"{g}" for g in gold], **cols) == [0.0] * 3                    # no tags
    assert tags(["", "", ""], **cols) == [0.0] * 3
    assert ReasoningGymReward("last_line")([f"so\n{g}\n" for g in gold], **cols) == [1.0] * 3
    assert ReasoningGymReward("marker")([f"x\n#### {g}" for g in gold], **cols) == [1.0] * 3
    assert ReasoningGymReward("last_number")([f"it is {g}." for g in gold], **cols) == [1.0] * 3
    # reasoning-gym's partial credit for a longer answer that contains the gold (below success 1.0)
    partial = tags([f"<answer>{gold[0]} apples</answer>"], **columns(items[:1]))[0]
    assert partial == pytest.approx(ds.score_answer(f"{gold[0]} apples", items[0])) and 0 < partial < 1


def test_a_mix_is_scored_task_by_task():
    _, a = entries("chain_sum", 2)
    _, b = entries("letter_counting", 2)
    items = a + b
    reward = ReasoningGymReward()
    assert reward([f"<answer>{e['answer']}</answer>" for e in items], **columns(items)) == [1.0] * 4
    # the chain sum's answer given for a letter count scores by the letter count's rule
    swapped = [f"<answer>{e['answer']}</answer>" for e in b + a]
    expect = [1.0 if x["answer"] == y["answer"] else 0.0 for x, y in zip(b + a, items)]
    assert reward(swapped, **columns(items)) == expect


def test_picklable_deterministic_and_runs_in_reward_workers():
    _, items = entries("chain_sum", 4)
    reward = ReasoningGymReward()
    clone = pickle.loads(pickle.dumps(reward))
    completions = [f"<answer>{e['answer']}</answer>" if i % 2 else "<answer>0</answer>" for i, e in enumerate(items)]
    cols = columns(items)
    assert clone(completions, **cols) == reward(completions, **cols)
    with RewardRunner([reward], timeout_s=10.0, num_workers=1) as runner:  # worker processes, bounded in time
        result = runner(completions, cols)
    assert result.total.tolist() == reward(completions, **cols)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="ReasoningGymReward.answer_format"):
        ReasoningGymReward("boxed")
    with pytest.raises(ValueError, match="max_answer_chars"):
        ReasoningGymReward(max_answer_chars=0)
