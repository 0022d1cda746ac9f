"""PromptDataModule and BatchPlan: bad data fails before training, the plan validates what callbacks schedule,
and its state round-trips through a weights-only checkpoint."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from lit_rlft.data import BatchPlan, DataValidationError, PromptDataModule
from tests.conftest import tiny_module, tiny_trainer


def test_malformed_row_fails_before_training_with_file_line_and_field(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"question": "1 2>3=", "answer": "1+2"}\n{"question": "", "answer": "x"}\n'
                    '{"answer": "4"}\n')
    module = tiny_module()
    dm = PromptDataModule(train=str(path), prompt_field="question", batch_size=1)
    with pytest.raises(DataValidationError) as exc:
        tiny_trainer(tmp_path, max_steps=1).fit(module, datamodule=dm)
    msg = str(exc.value)
    assert f"{path}:2" in msg and f"{path}:3" in msg and "question" in msg
    assert module.rollout_step == 0 and module.budget.completions == 0


def test_plan_serves_scheduled_ids_once_then_uniform():
    plan = BatchPlan(num_prompts=10, batch_size=3, seed=0)
    plan.schedule([7, 2], source="test")
    assert plan.next_batch().tolist() == [7, 2] and plan.last_source == "test"
    ids = plan.next_batch()
    assert len(ids) == 3 and plan.last_source == "uniform"


@pytest.mark.parametrize("ids, match", [([], "empty"), ([3, 3], "duplicate"), ([10], "out of range")])
def test_plan_rejects_bad_schedules(ids, match):
    with pytest.raises(ValueError, match=match):
        BatchPlan(num_prompts=10, batch_size=3).schedule(ids, source="cb")


def test_datamodule_state_survives_a_weights_only_checkpoint():
    from lit_rlft.data.tasks import CountdownTask

    dm = PromptDataModule(train=CountdownTask(size=20), answer_field=None, batch_size=4)
    dm.setup("fit")
    dm.plan.next_batch()
    dm.plan.schedule([1, 2, 3], source="cb")
    buf = io.BytesIO()
    torch.save(dm.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    fresh = PromptDataModule(train=CountdownTask(size=20), answer_field=None, batch_size=4)
    fresh.load_state_dict(state)  # before setup: applied once the pool exists
    fresh.setup("fit")
    assert fresh.plan.next_batch().tolist() == [1, 2, 3] == dm.plan.next_batch().tolist()
    np.testing.assert_array_equal(fresh.plan.next_batch(), dm.plan.next_batch())  # same uniform order after
