"""One validation path, seeded: a validation depends on the weights and the seed only (not on what the process did
before it), and the Trainer's validation loop, FabricLoop and a plain call of the step give the same metrics."""

from __future__ import annotations

import lightning as L
import torch

from lit_rlft import build_step
from lit_rlft.lightning.fabric import FabricLoop
from tests.conftest import countdown_dm, tiny_config, tiny_module, tiny_trainer

PARITY = "tests.step.test_validation.parity_reward"


def parity_reward(completions: list[str], **columns) -> list[float]:
    """1 for a completion of even length: an untrained policy scores about half, so the metrics see the sampling."""
    return [float(len(c) % 2 == 0) for c in completions]


def _val_data():
    return countdown_dm(size=16, batch_size=4, val=True, val_batch_size=4)


def test_a_validation_depends_on_the_weights_and_the_seed_only():
    step = build_step(tiny_config(reward_funcs=[PARITY], eval_num_generations=2))
    data = _val_data()
    data.setup("fit")
    step.bind(data)
    first = step.validate(data.val_dataloader())
    assert 0 < first["val/accuracy"] < 1  # the parity reward sees the samples
    torch.rand(1000)  # what a warm start or any earlier work in the process does to torch's generator
    assert step.validate(data.val_dataloader()) == first
    step.rollout_step = 350  # the same weights evaluated after a run's last step: the same draws (paired)
    assert step.validate(data.val_dataloader()) == first
    other = build_step(tiny_config(reward_funcs=[PARITY], eval_num_generations=2, generation_seed=1))
    other.bind(data)
    assert other.validate(data.val_dataloader()) != first  # another generation seed samples otherwise
    step.close()
    other.close()


def test_the_trainer_fabric_and_the_step_validate_alike(tmp_path):
    step = build_step(tiny_config(reward_funcs=[PARITY], eval_num_generations=2))
    data = _val_data()
    data.setup("fit")
    step.bind(data)
    plain = step.validate(data.val_dataloader())
    step.close()

    module = tiny_module(reward_funcs=[PARITY], eval_num_generations=2)
    tiny_trainer(tmp_path).validate(module, datamodule=_val_data(), verbose=False)
    assert module.last_eval == plain

    loop = FabricLoop(L.Fabric(accelerator="cpu", devices=1), max_steps=1, progress_bar=False)
    loop.setup(tiny_config(reward_funcs=[PARITY], eval_num_generations=2), _val_data())
    assert loop.validate() == plain
    loop.step.close()
