"""A reasoning-gym task and its reward through one ``fit`` step with the tiny policy, the rewards scored in worker
processes: what the step trained on is what reasoning-gym's own scorer says of the completions it generated."""

from __future__ import annotations

import lightning as L
import pytest

pytest.importorskip("reasoning_gym")
import reasoning_gym  # noqa: E402

from lit_rlft.data import PromptDataModule, ReasoningGymTask  # noqa: E402
from lit_rlft.rewards import AnswerFormatReward, ReasoningGymReward, extract_answer  # noqa: E402
from tests.conftest import tiny_module, tiny_trainer  # noqa: E402

LADDER = [
    {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, "label": "easy"},
    {"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
     "label": "hard"},
]


class Keep(L.Callback):
    def __init__(self):
        self.rollouts = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rollouts.append(outputs["rollouts"])


def test_one_fit_step_scores_what_reasoning_gym_scores(tmp_path):
    train = ReasoningGymTask(tasks=LADDER, size=32, split="train", seed=3)
    val = ReasoningGymTask(tasks=LADDER, size=8, split="test", seed=3)
    dm = PromptDataModule(train=train, val=val, prompt_field="question", batch_size=4, seed=0)
    module = tiny_module(reward_funcs=[ReasoningGymReward("last_number"), AnswerFormatReward("last_number")],
                         reward_weights=[1.0, 0.5], reward_workers=2, max_completion_length=12,
                         temperature=1.0)
    keep = Keep()
    trainer = tiny_trainer(tmp_path, max_steps=1, callbacks=[keep], val_check_interval=1,
                           check_val_every_n_epoch=None, limit_val_batches=1)
    trainer.fit(module, datamodule=dm)

    (r,) = keep.rollouts
    rows = {i: rec.data for i, rec in enumerate(train.records())}
    g = r.rewards.shape[1]
    for b, pid in enumerate(r.prompt_ids.tolist()):
        entry = rows[pid]
        score = reasoning_gym.get_score_answer_fn(entry["task"])
        for j in range(g):
            text = r.completions[b * g + j]
            stated = extract_answer(text, "last_number")
            want = 0.0 if stated is None else float(score(stated, {**entry, "metadata": entry["metadata"]}))
            fmt = 0.0 if stated is None else 1.0
            assert r.reward_per_func["reasoning_gym"][b, j].item() == pytest.approx(want)
            assert r.reward_per_func["answer_format_last_number"][b, j].item() == fmt
            assert r.rewards[b, j].item() == pytest.approx(want + 0.5 * fmt)
    assert 0 < r.reward_per_func["answer_format_last_number"].mean() < 1  # some completions state a number
    metrics = trainer.callback_metrics
    assert {"val/accuracy/difficulty_easy", "val/accuracy/difficulty_hard"} <= set(metrics)
