"""FabricLoop on one process (in pytest; two processes are in tests/distributed): a step built from a GRPOConfig, no
LightningModule; the same training as the Trainer, validation through synced metrics, metrics in the Fabric logger,
a checkpoint that resumes exactly, and clear errors for what it cannot drive."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.fabric.loggers import TensorBoardLogger

from lit_rlft import DPSCallback, ReplayCallback, build_step
from lit_rlft.lightning.fabric import FabricLoop
from tests.callbacks.test_selection_callbacks import StepSeededCoins
from tests.conftest import countdown_dm, tiny_config, tiny_module, tiny_trainer


def _step():
    step = build_step(tiny_config(learning_rate=1e-3), models=False)
    step.scorer = StepSeededCoins()
    return step


def _fabric(tmp_path):
    fabric = L.Fabric(accelerator="cpu", devices=1, loggers=TensorBoardLogger(str(tmp_path), name="tb"))
    fabric.launch()
    return fabric


def _params(policy):
    return {n: p.detach().clone() for n, p in policy.named_parameters()}


def test_fabric_loop_trains_like_the_trainer(tmp_path):
    L.seed_everything(0, verbose=False)
    module = tiny_module(learning_rate=1e-3)
    module.grpo.scorer = StepSeededCoins()
    tiny_trainer(tmp_path / "t", max_steps=4, callbacks=[DPSCallback(), ReplayCallback(delta=0.5, capacity=8)]).fit(
        module, datamodule=countdown_dm(size=48, batch_size=4))
    loop = FabricLoop(_fabric(tmp_path / "f"), max_steps=4,
                      callbacks=[DPSCallback(), ReplayCallback(delta=0.5, capacity=8)])
    step = loop.fit(_step(), countdown_dm(size=48, batch_size=4))
    assert step.rollout_step == module.grpo.rollout_step == 4
    assert step.budget.completions == module.grpo.budget.completions
    a, b = _params(module.policy), _params(step.policy)
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_fabric_loop_validates_logs_and_resumes_exactly(tmp_path):
    from lit_rlft.records import read_scalars

    def fit(out, steps, ckpt=None, save_at=None):
        callbacks = [DPSCallback(), ReplayCallback(delta=0.5, capacity=8)]
        loop = FabricLoop(_fabric(out), max_steps=steps, callbacks=callbacks, val_every_n_steps=2,
                          checkpoint_dir=str(out), checkpoint_every_n_steps=save_at)
        return loop.fit(_step(), countdown_dm(size=48, batch_size=4, val=True), ckpt_path=ckpt), callbacks

    full, full_cbs = fit(tmp_path / "full", 6)
    assert full.last_validation["val/n/accuracy"] == 16 and "val/accuracy" in full.last_validation
    loop_tags = read_scalars(tmp_path / "full" / "tb")
    assert [s for s, _ in loop_tags["reward"]] == list(range(6))  # logged at the rollout step
    assert "val/accuracy" in loop_tags and "replay/replayed_groups" in loop_tags and "dps/accuracy" in loop_tags
    fit(tmp_path / "first", 3, save_at=3)
    resumed, resumed_cbs = fit(tmp_path / "resumed", 6, ckpt=str(tmp_path / "first" / "step=3.ckpt"))
    assert resumed.rollout_step == 6 and resumed.budget.completions == full.budget.completions
    a, b = _params(full.policy), _params(resumed.policy)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert (resumed_cbs[0].strategy.mu_prior == full_cbs[0].strategy.mu_prior).all()
    assert resumed_cbs[1].buffer.prompt_ids() == full_cbs[1].buffer.prompt_ids()


def test_fabric_loop_rejects_bad_max_steps_lightning_only_callbacks_and_modules(tmp_path):
    from lightning.pytorch.callbacks import LearningRateMonitor

    with pytest.raises(ValueError, match="max_steps"):
        FabricLoop(_fabric(tmp_path), max_steps=0)
    with pytest.raises(TypeError, match="callback LearningRateMonitor has no setup_step, before_first_step, "
                                        "after_step"):
        FabricLoop(_fabric(tmp_path), max_steps=1, callbacks=[LearningRateMonitor()])
    with pytest.raises(TypeError, match=r"takes a GRPOConfig or a GRPOStep, got GRPOModule \(for a GRPOModule, pass "
                                        r"module.config\)"):
        FabricLoop(_fabric(tmp_path), max_steps=1).fit(tiny_module(), countdown_dm())
