"""Building and using the prompt pool: validation messages, columns, ids, subsets, fingerprints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lit_rlft.data.loading import DataValidationError, Record, load_records
from lit_rlft.data.pool import PromptPool, build_pool

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def _jsonl(tmp_path: Path, rows: list[dict], name: str = "train.jsonl") -> list[Record]:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return load_records(str(path))


def _recs(rows: list[dict]) -> list[Record]:
    return [Record(r, f"mem#{i}") for i, r in enumerate(rows)]


def test_build_basic_columns_and_ids() -> None:
    pool = build_pool(_recs([{"prompt": "a", "answer": 1, "level": 3}, {"prompt": "b", "answer": 2, "level": 5}]))
    assert pool.prompts == ["a", "b"]
    assert pool.columns == {"answer": [1, 2], "level": [3, 5]}
    assert pool.ids.dtype == np.int64 and pool.ids.tolist() == [0, 1]
    assert pool.origins == ["mem#0", "mem#1"]
    assert len(pool) == 2


def test_missing_field_message_names_file_line_and_available(tmp_path: Path) -> None:
    recs = _jsonl(tmp_path, [{"question": "q", "answer": "1"}, {"problem": "p", "solution": "s"}])
    path = tmp_path / "train.jsonl"
    with pytest.raises(DataValidationError) as err:
        build_pool(recs, prompt_field="question")
    msg = str(err.value)
    assert f"{path}:2: field 'question' is missing (available: problem, solution)" in msg
    assert f"{path}:2: field 'answer' is missing" in msg
    assert "2 problem(s)" in msg


def test_empty_and_wrong_type_prompts(tmp_path: Path) -> None:
    recs = _jsonl(tmp_path, [{"prompt": "  ", "answer": 1}, {"prompt": 5, "answer": 1}, {"prompt": "ok", "answer": 1}])
    path = tmp_path / "train.jsonl"
    with pytest.raises(DataValidationError) as err:
        build_pool(recs)
    msg = str(err.value)
    assert f"{path}:1: field 'prompt' is empty" in msg
    assert f"{path}:2: field 'prompt' must be a string, got int" in msg
    assert ":3:" not in msg


def test_problems_capped_at_20() -> None:
    with pytest.raises(DataValidationError) as err:
        build_pool(_recs([{"x": i} for i in range(30)]), answer_field=None)
    msg = str(err.value)
    assert "30 problem(s)" in msg and "and 10 more" in msg
    assert msg.count("field 'prompt' is missing") == 20


def test_answer_rename_and_none() -> None:
    rows = [{"problem": "p", "solution": "s", "answer": "a", "level": "Level 1"}]
    pool = build_pool(_recs(rows), prompt_field="problem", answer_field="solution")
    assert pool.columns == {"answer": ["s"], "level": ["Level 1"]}
    pool = build_pool(_recs(rows), prompt_field="problem", answer_field=None)
    assert pool.columns == {"solution": ["s"], "answer": ["a"], "level": ["Level 1"]}


def test_listed_columns_kept_and_missing_is_error() -> None:
    rows = [{"prompt": "p", "answer": 1, "nums": [1, 2], "target": 3, "extra": 0}]
    pool = build_pool(_recs(rows), columns=["nums", "target"])
    assert pool.columns == {"answer": [1], "nums": [[1, 2]], "target": [3]}
    with pytest.raises(DataValidationError, match=r"mem#0: field 'difficulty' is missing"):
        build_pool(_recs(rows), columns=["difficulty"])


def test_heterogeneous_rows_fill_none() -> None:
    pool = build_pool(_recs([{"prompt": "a", "x": 1}, {"prompt": "b", "y": 2}]), answer_field=None)
    assert pool.columns == {"x": [1, None], "y": [None, 2]}


def test_reserved_column_names() -> None:
    with pytest.raises(DataValidationError, match="reserved"):
        build_pool(_recs([{"prompt": "a", "prompts": "x"}]), answer_field=None)
    with pytest.raises(DataValidationError, match="reserved"):
        build_pool(_recs([{"prompt": "a", "completions": "x"}]), answer_field=None, columns=["completions"])


def test_reserved_column_name_in_the_data_names_the_first_row_holding_it(tmp_path: Path) -> None:
    recs = _jsonl(tmp_path, [{"prompt": "a"}, {"prompt": "b", "prompts": "x"}])
    with pytest.raises(DataValidationError) as err:
        build_pool(recs, answer_field=None)
    assert str(err.value).splitlines()[1] == (f"  - {tmp_path / 'train.jsonl'}:2: field 'prompts' is a reserved column "
                                              "name; pass columns=[...] without it or rename it")


def test_id_field_and_duplicates() -> None:
    pool = build_pool(_recs([{"prompt": "a", "uid": 10}, {"prompt": "b", "uid": 3}]), answer_field=None, id_field="uid")
    assert pool.ids.tolist() == [10, 3]
    assert pool.index_of([3, 10]).tolist() == [1, 0]
    with pytest.raises(DataValidationError, match=r"mem#1: field 'uid': duplicate id 7 \(first at mem#0\)"):
        build_pool(_recs([{"prompt": "a", "uid": 7}, {"prompt": "b", "uid": 7}]), answer_field=None, id_field="uid")
    with pytest.raises(DataValidationError, match=r"mem#0: field 'uid' must be an integer id"):
        build_pool(_recs([{"prompt": "a", "uid": "x/1.json"}]), answer_field=None, id_field="uid")


def test_template_formatting_and_missing_placeholder() -> None:
    rows = [{"question": "What is 2+2?", "answer": "4"}]
    pool = build_pool(_recs(rows), template="Question: {question}\nAnswer:")
    assert pool.prompts == ["Question: What is 2+2?\nAnswer:"]
    assert pool.columns == {"answer": ["4"], "question": ["What is 2+2?"]}
    with pytest.raises(DataValidationError, match=r"mem#0: template field 'problem' is missing \(available: question"):
        build_pool(_recs(rows), template="{problem}")
    with pytest.raises(DataValidationError, match="positional"):
        build_pool(_recs(rows), template="Q: {}")


def test_empty_records() -> None:
    with pytest.raises(DataValidationError, match="no records"):
        build_pool([])


def test_subset_rows_index_of_fingerprint() -> None:
    pool = build_pool(_recs([{"prompt": f"p{i}", "answer": i, "nums": [i, i]} for i in range(6)]))
    assert pool.index_of([5, 0]).tolist() == [5, 0]
    sub = pool.subset([4, 1, 3])
    assert sub.prompts == ["p4", "p1", "p3"] and sub.ids.tolist() == [4, 1, 3]
    assert sub.columns["answer"] == [4, 1, 3]
    assert sub.index_of(np.array([1, 3])).tolist() == [1, 2]
    assert sub.index_of(np.array([[4], [3]])).shape == (2, 1)
    with pytest.raises(KeyError):
        sub.index_of([0])
    with pytest.raises(KeyError):
        pool.index_of([6])
    with pytest.raises(IndexError):
        pool.rows([6])
    rows = sub.rows([2, 0])
    assert rows == {"answer": [3, 4], "nums": [[3, 3], [4, 4]], "prompts": ["p3", "p4"]}
    assert pool.fingerprint() == build_pool(_recs([{"prompt": f"p{i}", "answer": 0} for i in range(6)])).fingerprint()
    assert pool.fingerprint() != sub.fingerprint()
    assert len(pool.fingerprint()) == 16
    assert len(pool.subset([])) == 0


def test_pool_direct_construction_checks() -> None:
    pool = PromptPool(prompts=["a", "b"], columns={"x": [1, 2]})
    assert pool.ids.tolist() == [0, 1] and len(pool.origins) == 2
    with pytest.raises(ValueError, match="column 'x'"):
        PromptPool(prompts=["a", "b"], columns={"x": [1]})
    with pytest.raises(ValueError, match="unique"):
        PromptPool(prompts=["a", "b"], ids=np.array([3, 3]))


@pytest.mark.parametrize(
    ("folder", "kwargs", "size", "cols"),
    [
        ("gsm8k", {"prompt_field": "question"}, 7473, ["answer"]),
        (
            "math",
            {"prompt_field": "problem", "answer_field": "solution"},
            7500,
            ["answer", "level", "type", "unique_id"],
        ),
    ],
)
def test_real_data_pools(folder: str, kwargs: dict, size: int, cols: list[str]) -> None:
    path = SHARED_DATA / folder / "train.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not available")
    pool = build_pool(load_records(str(path)), **kwargs)
    assert len(pool) == size
    assert np.array_equal(pool.ids, np.arange(size))
    assert list(pool.columns) == cols
    assert all(isinstance(p, str) and p.strip() for p in pool.prompts)
    assert pool.origins[16] == f"{path}:17"
