"""The Trainer's progress bar counts rollout steps (several optimizer steps each) and shows no ``Epoch 0/-2``."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from lit_rlft.lightning.progress import RolloutRichProgressBar, RolloutTQDMProgressBar
from tests.conftest import countdown_dm, tiny_module


def test_the_bar_counts_rollout_steps_of_two_optimizer_steps(tmp_path):
    trainer = L.Trainer(accelerator="cpu", max_steps=8, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path),
                        callbacks=[TQDMProgressBar(refresh_rate=3)])
    trainer.fit(tiny_module(num_mini_batches=2), datamodule=countdown_dm(size=64, batch_size=4))
    bar = trainer.progress_bar_callback
    assert isinstance(bar, RolloutTQDMProgressBar) and bar.refresh_rate == 3  # the user's settings kept
    assert bar.train_progress_bar.total == 4  # 8 optimizer steps = 4 rollout steps (Lightning's own bar: 8)
    assert trainer.global_step == 8 and bar.train_progress_bar.n == 4


def test_rich_drops_the_minus_two_and_custom_bars_are_left_alone():
    from types import SimpleNamespace

    from lit_rlft.lightning.progress import rollout_progress_bar

    rich = rollout_progress_bar(RichProgressBar(), 2)
    assert isinstance(rich, RolloutRichProgressBar) and rich.optimizer_steps_per_batch == 2
    rich._trainer = SimpleNamespace(max_epochs=-1)  # bounded by max_steps: Lightning's bar writes "Epoch 0/-2"
    assert rich._get_train_description(0).strip() == "Epoch 0"
    rich._trainer = SimpleNamespace(max_epochs=3)
    assert rich._get_train_description(0).strip() == "Epoch 0/2"

    class Mine(TQDMProgressBar):
        pass

    assert rollout_progress_bar(Mine(), 2) is None
