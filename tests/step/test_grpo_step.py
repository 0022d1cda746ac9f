"""GRPOStep runs the same under the Trainer, Fabric and a plain PyTorch loop, and sets its engine up exactly once."""

from __future__ import annotations

import lightning as L
import torch

from lit_rlft.callbacks import DPSCallback, ReplayCallback
from lit_rlft.core.distributed import LocalCollective
from lit_rlft.lightning.fabric import FabricLoop
from lit_rlft.rollout.hf import HFEngine
from lit_rlft.step import TorchBackend
from lit_rlft.step.context import RolloutHook
from lit_rlft.step.optim import configure_adamw
from tests.callbacks.test_strategies import CoinRewards
from tests.conftest import countdown_dm, tiny_module, tiny_trainer


class CountingEngine(HFEngine):
    """The HF engine, counting its set-ups."""

    setups = 0

    def setup(self, *args, **kwargs):
        type(self).setups += 1
        super().setup(*args, **kwargs)


def _module(**kw):
    module = tiny_module(learning_rate=1e-3, **kw)
    module.grpo.rewards = CoinRewards(0.5)
    return module


def test_the_engine_is_set_up_once_under_the_trainer_and_once_under_fabric(tmp_path):
    CountingEngine.setups = 0
    module = _module(engine=CountingEngine())
    trainer = tiny_trainer(tmp_path, max_steps=2)
    dm = countdown_dm(size=48, batch_size=4, val=True)
    trainer.fit(module, datamodule=dm)
    trainer.validate(module, datamodule=dm, verbose=False)  # configure_model again: the same policy, no new set-up
    assert CountingEngine.setups == 1

    CountingEngine.setups = 0
    module = _module(engine=CountingEngine())
    loop = FabricLoop(L.Fabric(accelerator="cpu", devices=1), max_steps=2, progress_bar=False)
    loop.fit(module, countdown_dm(size=48, batch_size=4, val=True))
    loop.validate()
    assert CountingEngine.setups == 1


def _trainer_run(tmp_path):
    L.seed_everything(0, verbose=False)
    module = _module()
    tiny_trainer(tmp_path, max_steps=3, callbacks=[DPSCallback(), ReplayCallback(delta=0.5, capacity=8)]).fit(
        module, datamodule=countdown_dm(size=48, batch_size=4))
    return module


def _plain_torch_run():
    """The same run without Lightning: the step, a TorchBackend, and the callbacks' context-level hooks."""
    L.seed_everything(0, verbose=False)
    module = _module()  # used only to build the step and the policy the way the Trainer run does
    module.build_policy()
    step = module.grpo
    step.attach(module.policy)
    data = countdown_dm(size=48, batch_size=4)
    data.setup("fit")
    step.bind(data, LocalCollective())
    config = configure_adamw(module.policy, step.optim, total_steps=3)
    backend = TorchBackend(module.policy, config["optimizer"], config["lr_scheduler"]["scheduler"])
    callbacks = [DPSCallback(), ReplayCallback(delta=0.5, capacity=8)]
    for cb in callbacks:
        cb.setup_step(step)
    for cb in callbacks:
        cb.before_first_step(step)
    for _ in range(3):
        out = step.run(backend, hooks=[cb for cb in callbacks if isinstance(cb, RolloutHook)])
        for cb in callbacks:
            cb.after_step(step, out)
    step.close()
    return module


def test_a_plain_pytorch_loop_trains_what_the_trainer_trains(tmp_path):
    trainer_module, plain_module = _trainer_run(tmp_path), _plain_torch_run()
    assert plain_module.grpo.rollout_step == trainer_module.grpo.rollout_step == 3
    plain, trained = plain_module.grpo.budget.state_dict(), trainer_module.grpo.budget.state_dict()
    assert {**plain, "generation_s": 0} == {**trained, "generation_s": 0}  # everything but wall time
    for (name, a), (_, b) in zip(trainer_module.policy.named_parameters(), plain_module.policy.named_parameters()):
        assert torch.equal(a, b), name


def test_a_scorer_set_on_the_step_leaves_failure_reports_to_the_step():
    """The step prints every rank's reward failures (RewardFailureLog); a RewardRunner set later must not print its
    own rank-local warning as well."""
    from lit_rlft.rewards import RewardRunner, countdown_reward

    module = tiny_module()
    assert module.grpo.rewards.report is False  # the one built with the module
    runner = RewardRunner([countdown_reward])
    assert runner.report is True
    module.grpo.rewards = runner
    assert runner.report is False and module.grpo.rewards is runner
    runner.close()
