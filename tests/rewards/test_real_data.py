"""Rewards on real data: every gold solution must score 1 against its own answer, and 0 against another row's.

Data come from ``../shared/data`` relative to the repository (override with ``LIT_RLFT_DATA_DIR``).
"""

import json
import os
import time
from pathlib import Path

import pytest

from lit_rlft.rewards import gsm8k_gold, gsm8k_reward, math_answer_from_solution, math_reward

DATA_DIR = Path(os.environ.get("LIT_RLFT_DATA_DIR", Path(__file__).resolve().parents[3] / "shared" / "data"))


def load_jsonl(relative: str) -> list[dict]:
    """Rows of a JSONL file under DATA_DIR; skips the test when the file is absent."""
    path = DATA_DIR / relative
    if not path.is_file():
        pytest.skip(f"data file {path} not found (set LIT_RLFT_DATA_DIR to the folder holding {relative})")
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def test_math500_gold_solutions_score_one() -> None:
    rows = load_jsonl("math500/test.jsonl")
    start = time.perf_counter()
    scores = math_reward([r["solution"] for r in rows], answer=[r["answer"] for r in rows])
    failing = [r["unique_id"] for r, s in zip(rows, scores) if s != 1.0]
    rate = 1 - len(failing) / len(rows)
    print(
        f"MATH-500 gold solution vs own answer: {rate:.4f} ({len(rows) - len(failing)}/{len(rows)}) "
        f"in {time.perf_counter() - start:.1f} s; failing: {failing}"
    )
    assert failing == []


def test_math500_boxed_answer_of_solution_is_the_answer_field() -> None:
    rows = load_jsonl("math500/test.jsonl")
    same = sum(math_answer_from_solution(r["solution"]).replace(" ", "") == r["answer"].replace(" ", "") for r in rows)
    print(f"MATH-500 last boxed == answer field (as strings, spaces ignored): {same}/{len(rows)}")
    assert same / len(rows) > 0.9


def test_math500_shifted_answers_score_zero() -> None:
    rows = load_jsonl("math500/test.jsonl")
    answers = [r["answer"] for r in rows]
    shifted = answers[1:] + answers[:1]
    scores = math_reward([r["solution"] for r in rows], answer=shifted)
    pairs = [i for i in range(len(rows)) if answers[i].strip() != shifted[i].strip()]
    wrongly_one = [(rows[i]["unique_id"], answers[i], shifted[i]) for i in pairs if scores[i] != 0.0]
    rate = 1 - len(wrongly_one) / len(pairs)
    print(
        f"MATH-500 shifted answer scores 0: {rate:.4f} ({len(pairs) - len(wrongly_one)}/{len(pairs)}); "
        f"scored 1 (mathematically equal answers): {wrongly_one}"
    )
    assert rate >= 0.99


@pytest.mark.parametrize("split", ["test", "train"])
def test_gsm8k_gold_solutions_score_one_and_shifted_zero(split: str) -> None:
    rows = load_jsonl(f"gsm8k/{split}.jsonl")
    answers = [r["answer"] for r in rows]
    own = gsm8k_reward(answers, answer=answers)
    failing = [i for i, s in enumerate(own) if s != 1.0]
    print(f"GSM8K {split} gold solution vs own answer: {len(rows) - len(failing)}/{len(rows)}; failing rows {failing}")
    assert failing == []

    shifted = answers[1:] + answers[:1]
    scores = gsm8k_reward(answers, answer=shifted)
    pairs = [i for i in range(len(rows)) if gsm8k_gold(answers[i]) != gsm8k_gold(shifted[i])]
    wrongly_one = [i for i in pairs if scores[i] != 0.0]
    print(f"GSM8K {split} shifted answer (numbers differ) scores 0: {len(pairs) - len(wrongly_one)}/{len(pairs)}")
    assert wrongly_one == []
    assert all(gsm8k_reward([gsm8k_gold(a)], answer=[a]) == [1.0] for a in answers[:50])  # bare-number completions


@pytest.mark.parametrize("hostile", [r"\boxed{\prod_{k=1}^{10^{9}} k}", r"\boxed{(10^{99999})^{99999}}"])
def test_math500_batch_one_hostile_completion_changes_no_other_score(hostile: str) -> None:
    """The issue's case: 63 correct MATH-500 solutions and one hostile completion in one call scored 0 in total."""
    from lit_rlft.rewards import RewardRunner

    rows = load_jsonl("math500/test.jsonl")[:64]
    completions = [r["solution"] for r in rows[:63]] + [hostile]
    runner = RewardRunner(["lit_rlft.rewards.math_reward"], timeout_s=10.0, warn_interval_s=1e9)
    start = time.perf_counter()
    result = runner(completions, {"answer": [r["answer"] for r in rows]})
    elapsed = time.perf_counter() - start
    runner.close()
    assert result.total[:63].tolist() == [1.0] * 63
    assert result.total[63] == 0.0
    assert elapsed < 10.0 + 1.0  # the runner's bound, whatever the guards do


def test_gsm8k_batch_one_huge_number_changes_no_other_score() -> None:
    from lit_rlft.rewards import RewardRunner

    rows = load_jsonl("gsm8k/test.jsonl")[:16]
    completions = [r["answer"] for r in rows[:15]] + ["#### " + "9" * 5000]
    runner = RewardRunner(["lit_rlft.rewards.gsm8k_reward"], timeout_s=10.0)
    result = runner(completions, {"answer": [r["answer"] for r in rows]})
    runner.close()
    assert result.total.tolist() == [1.0] * 15 + [0.0]
    assert result.num_errors == 0
