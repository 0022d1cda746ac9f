"""PromptDataModule and BatchPlan: bad data fails before training, the plan validates what callbacks schedule,
and its state round-trips through a weights-only checkpoint."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from lit_rlft.data import BatchPlan, DataValidationError, PromptDataModule
from tests.conftest import countdown_dm, tiny_module, tiny_trainer


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
    assert module.grpo.rollout_step == 0 and module.grpo.budget.completions == 0


def test_plan_serves_scheduled_ids_once_then_uniform():
    plan = BatchPlan(num_prompts=10, batch_size=3, seed=0)
    plan.schedule([7, 2], by="test")
    assert plan.next_batch().tolist() == [7, 2] and plan.last_scheduled_by == "test"
    ids = plan.next_batch()
    assert len(ids) == 3 and plan.last_scheduled_by == "uniform"


@pytest.mark.parametrize("ids, match", [([], "empty"), ([3, 3], "duplicate"), ([10], "out of range")])
def test_plan_rejects_bad_schedules(ids, match):
    with pytest.raises(ValueError, match=match):
        BatchPlan(num_prompts=10, batch_size=3).schedule(ids, by="cb")


def test_datamodule_state_survives_a_weights_only_checkpoint():
    from lit_rlft.data.tasks import CountdownTask

    dm = PromptDataModule(train=CountdownTask(size=20), answer_field=None, batch_size=4)
    dm.setup("fit")
    dm.plan.next_batch()
    dm.plan.schedule([1, 2, 3], by="cb")
    buf = io.BytesIO()
    torch.save(dm.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    fresh = PromptDataModule(train=CountdownTask(size=20), answer_field=None, batch_size=4)
    fresh.load_state_dict(state)  # before setup: applied once the pool exists
    fresh.setup("fit")
    assert fresh.plan.next_batch().tolist() == [1, 2, 3] == dm.plan.next_batch().tolist()
    np.testing.assert_array_equal(fresh.plan.next_batch(), dm.plan.next_batch())  # same uniform order after


def test_empty_data_file_names_the_option_and_the_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("")
    dm = PromptDataModule(train=str(path), batch_size=1)
    with pytest.raises(DataValidationError) as exc:
        dm.setup("fit")
    assert str(exc.value) == f"data.train: data file '{path}' holds no records (it is empty, or only blank lines)"


def _long_prompts_dm(tmp_path, max_prompt_length: int = 12):
    """Four train rows: the 2nd (line 2) and the 4th (line 5, after a blank line) are too long."""
    path = tmp_path / "train.jsonl"
    rows = ['{"prompt": "1 2>3=", "answer": "1+2"}', '{"prompt": "' + "9 " * 20 + '>1=", "answer": "x"}',
            '{"prompt": "3 4>7=", "answer": "3+4"}', "", '{"prompt": "' + "8 " * 10 + '>2=", "answer": "y"}']
    path.write_text("\n".join(rows) + "\n")
    return path, PromptDataModule(train=str(path), batch_size=2, max_prompt_length=max_prompt_length)


def test_too_long_prompts_fail_when_the_pool_meets_the_tokenizer(tmp_path):
    from lit_rlft.models.tiny import char_tokenizer

    path, dm = _long_prompts_dm(tmp_path)
    dm.setup("fit")  # no tokenizer yet: nothing to measure
    with pytest.raises(DataValidationError) as exc:
        dm.set_tokenizer(char_tokenizer())  # what GRPOModule.setup does, before step 0
    assert str(exc.value) == ("2 of 4 train prompts are longer than data.max_prompt_length=12 tokens "
                              f"(first: {path}:2, id 1, 43 tokens; longest: 43): raise data.max_prompt_length or "
                              "remove them")


def test_too_long_prompts_fail_in_setup_when_the_tokenizer_came_first(tmp_path):
    from lit_rlft.models.tiny import char_tokenizer

    path, dm = _long_prompts_dm(tmp_path)
    dm.set_tokenizer(char_tokenizer())
    with pytest.raises(DataValidationError, match=rf"^2 of 4 train prompts .*\(first: {path}:2, id 1"):
        dm.setup("fit")


def test_too_long_prompts_stop_the_trainer_before_step_0(tmp_path):
    path, dm = _long_prompts_dm(tmp_path)
    module = tiny_module()
    with pytest.raises(DataValidationError, match=r"data.max_prompt_length=12"):
        tiny_trainer(tmp_path, max_steps=1).fit(module, datamodule=dm)
    assert module.grpo.rollout_step == 0 and module.grpo.budget.completions == 0


def test_prompts_within_the_limit_are_tokenised_once_at_setup(tmp_path):
    from lit_rlft.models.tiny import char_tokenizer

    path, dm = _long_prompts_dm(tmp_path, max_prompt_length=64)
    dm.setup("fit")
    calls = []
    tok = char_tokenizer()
    dm.set_tokenizer(lambda texts, **kw: calls.append(len(texts)) or tok(texts, **kw))
    assert calls == [4] and len(dm._token_cache) == 4  # one batch for the whole pool
    assert dm.prompt_tokens(np.array([2, 0])) == [tok("3 4>7=")["input_ids"], tok("1 2>3=")["input_ids"]]
    assert calls == [4]  # served from the cache


def test_a_mid_epoch_resume_continues_the_epoch_without_lightnings_warning(tmp_path):
    """The train loader's position is checkpointed: a run resumed at step 2 gets tokens 2, 3 (as the uninterrupted
    run did), and Lightning does not warn that the loader is not resumable."""
    import warnings

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint


    class Tokens(L.Callback):
        def __init__(self):
            self.seen = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.seen.append(int(batch))

    full = Tokens()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    tiny_trainer(tmp_path, max_steps=4, callbacks=[full, ckpt], enable_checkpointing=True).fit(
        tiny_module(), datamodule=countdown_dm(size=48, batch_size=4))
    resumed = Tokens()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny_trainer(tmp_path, max_steps=4, callbacks=[resumed]).fit(
            tiny_module(), datamodule=countdown_dm(size=48, batch_size=4),
            ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=2.ckpt"))
    assert full.seen == [0, 1, 2, 3] and resumed.seen == [2, 3]
    assert not [w for w in caught if "not resumable" in str(w.message)]
