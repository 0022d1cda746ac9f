"""ReasoningGymTask on real reasoning-gym data: the records, disjoint splits, the mix, errors before step 0."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("reasoning_gym")
import reasoning_gym  # noqa: E402

from lit_rlft.data import GymSpec, ReasoningGymTask  # noqa: E402
from lit_rlft.data.tasks import held_out  # noqa: E402
from lit_rlft.rewards import ReasoningGymReward  # noqa: E402

LADDER = [
    {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}, "label": "easy"},
    {"name": "chain_sum", "config": {"min_terms": 3, "max_terms": 4, "min_digits": 2, "max_digits": 3}, "label": "hard",
     "weight": 3.0},
]


def test_records_are_reasoning_gyms_own_entries():
    task = ReasoningGymTask(name="letter_counting", size=12, seed=5, split="all")
    records = task.records()
    assert len(records) == 12
    ds, _ = reasoning_gym.factory.DATASETS["letter_counting"]
    for r in records:
        d = r.data
        assert set(d) == {"question", "answer", "task", "difficulty", "metadata", "solution"}
        assert d["task"] == d["difficulty"] == "letter_counting"
        assert d["solution"] == f"<answer>{d['answer']}</answer>"
        entry = {"question": d["question"], "answer": d["answer"], "metadata": d["metadata"]}
        score = reasoning_gym.get_score_answer_fn("letter_counting")
        assert score(d["answer"], entry) == 1.0  # the gold answer is right by reasoning-gym's own rule
    assert records[0].origin == "generated:reasoning_gym/letter_counting#0"
    assert [r.data for r in ReasoningGymTask(name="letter_counting", size=12, seed=5, split="all").records()] == \
        [r.data for r in records]  # deterministic


def test_train_and_test_never_share_a_question_whatever_the_seeds():
    train = ReasoningGymTask(tasks=LADDER, size=300, split="train", seed=0).records()
    test = ReasoningGymTask(tasks=LADDER, size=100, split="test", seed=7).records()
    q_train = {(r.data["task"], r.data["question"]) for r in train}
    q_test = {(r.data["task"], r.data["question"]) for r in test}
    assert not q_train & q_test
    # the split is the fixed hash of (task, question), as every generated task's
    assert all(held_out(f"{t}|{q}", 0.2) for t, q in q_test)
    assert not any(held_out(f"{t}|{q}", 0.2) for t, q in q_train)


def test_a_mix_draws_its_tasks_by_weight_and_labels_them():
    records = ReasoningGymTask(tasks=LADDER, size=400, seed=1).records()
    counts = Counter(r.data["difficulty"] for r in records)
    assert set(counts) == {"easy", "hard"}
    assert 0.68 < counts["hard"] / 400 < 0.82  # weight 3 : 1
    hard = [r for r in records if r.data["difficulty"] == "hard"]
    assert all(3 <= r.data["metadata"]["num_terms"] <= 4 for r in hard)
    # a repeated name without labels is labelled by position; GymSpec and mappings both work
    specs = [GymSpec("chain_sum", {"max_terms": 2}), {"name": "chain_sum", "config": {"min_terms": 3}}]
    labels = {r.data["difficulty"] for r in ReasoningGymTask(tasks=specs, size=20).records()}
    assert labels == {"chain_sum_0", "chain_sum_1"}


def test_unique_keeps_each_question_once_and_says_when_the_space_is_too_small():
    one_digit = {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}
    records = ReasoningGymTask(tasks=[one_digit], size=100, unique=True).records()
    assert len({r.data["question"] for r in records}) == 100
    with pytest.raises(ValueError, match="instance space is too small.*chain_sum"):  # 200 questions, 80% train
        ReasoningGymTask(tasks=[one_digit], size=190, unique=True).records()


def test_the_answer_format_writes_the_solution_and_the_reward_reads_it():
    for fmt, head in (("marker", "#### "), ("last_line", "")):
        records = ReasoningGymTask(name="chain_sum", size=5, answer_format=fmt).records()
        assert all(r.data["solution"] == head + r.data["answer"] for r in records)
        cols = {k: [r.data[k] for r in records] for k in ("answer", "task", "metadata", "question")}
        assert ReasoningGymReward(fmt)([r.data["solution"] for r in records], **cols) == [1.0] * 5


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"name": "chain_summ"}, r"unknown reasoning-gym dataset 'chain_summ' \(did you mean chain_sum"),
    ({"name": "chain_sum", "config": {"min_term": 2}}, r"chain_sum has no config key\(s\) min_term \(its keys: min_terms"),
    ({"name": "chain_sum", "config": {"min_terms": 3, "max_terms": 2}}, "max_terms must be >= min_terms"),
    ({"name": "chain_sum", "config": {"seed": 3}}, "set seed and size on the task"),
    ({"tasks": [{"name": "chain_sum", "weight": float("nan")}]}, r"tasks\[0\]: weight must be a finite number"),
    ({"tasks": [{"name": "chain_sum", "difficulty": 2}]}, r"tasks\[0\]: unknown key\(s\) difficulty"),
    ({"tasks": [{"config": {}}]}, r"tasks\[0\]: 'name' is missing"),
    ({"tasks": []}, "tasks is empty"),
    ({}, "give either name"),
    ({"name": "chain_sum", "tasks": LADDER}, "not both"),
    ({"tasks": [LADDER[0], {**LADDER[1], "label": "easy"}]}, "share a label"),
    ({"name": "chain_sum", "answer_format": "boxed"}, "ReasoningGymTask.answer_format"),
])
def test_bad_settings_fail_when_built_naming_what_to_change(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReasoningGymTask(**kwargs)


def test_a_missing_extra_is_named(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_gym(name, *args, **kwargs):
        if name.startswith("reasoning_gym"):
            raise ModuleNotFoundError(f"No module named {name!r}", name="reasoning_gym")
        return real(name, *args, **kwargs)

    import sys

    for mod in [m for m in sys.modules if m.startswith("reasoning_gym")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", no_gym)
    with pytest.raises(ImportError, match=r"pip install 'lit_rlft\[gym\]'"):
        ReasoningGymTask(name="chain_sum")
