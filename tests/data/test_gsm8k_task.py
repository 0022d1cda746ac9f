"""GSM8KTask: the calculation steps of each gold solution as ``difficulty``, a reproducible subset by steps and size,
on the real GSM8K files."""

from __future__ import annotations

import json

import pytest

from lit_rlft.data import GSM8KTask, PromptDataModule
from lit_rlft.data.gsm8k import calculation_steps
from lit_rlft.data.loading import DataValidationError
from tests.conftest import SHARED_DATA

GSM8K = SHARED_DATA / "gsm8k"


def test_calculation_steps_count_the_annotations():
    assert calculation_steps("a <<1+2=3>>3, b <<3*4=12>>12\n#### 12") == 2
    assert calculation_steps("no annotation\n#### 5") == 1


def test_a_subset_by_steps_and_size_is_reproducible_and_in_file_order(tmp_path):
    rows = [{"question": f"q{i}", "answer": "<<1+1=2>>" * (1 + i % 4) + f"\n#### {i}"} for i in range(40)]
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    easy = GSM8KTask(str(path), max_steps=2).records()
    assert [r.data["difficulty"] for r in easy] == [1, 2] * 10  # i % 4 in (0, 1): 20 rows
    a, b = (GSM8KTask(str(path), max_steps=2, size=5, seed=3).records() for _ in range(2))
    assert [r.origin for r in a] == [r.origin for r in b] and len(a) == 5
    lines = [int(r.origin.rsplit(":", 1)[1]) for r in a]
    assert lines == sorted(lines)
    assert [r.origin for r in GSM8KTask(str(path), max_steps=2, size=5, seed=4).records()] != [r.origin for r in a]
    assert {r.data["difficulty"] for r in GSM8KTask(str(path), min_steps=3).records()} == {3, 4}
    with pytest.raises(DataValidationError, match="no problem with 9 to None"):
        GSM8KTask(str(path), min_steps=9).records()
    with pytest.raises(ValueError, match="min_steps <= max_steps"):
        GSM8KTask(str(path), min_steps=3, max_steps=2)


@pytest.mark.skipif(not GSM8K.exists(), reason="the shared GSM8K files are not here")
def test_the_real_test_split_by_steps_in_a_datamodule():
    task = GSM8KTask(str(GSM8K / "test.jsonl"), max_steps=2)
    records = task.records()
    assert len(records) == 440  # 18 + 65 without annotation or with one, 357 with two (counted in the file)
    dm = PromptDataModule(train=task, val=GSM8KTask(str(GSM8K / "test.jsonl"), max_steps=2, size=50, seed=1),
                          prompt_field="question", answer_field="answer")
    dm.setup("fit")
    columns = dm.reward_columns(dm.pool("val").ids, "val")
    assert len(columns["answer"]) == 50 and set(columns["difficulty"]) <= {1, 2}
