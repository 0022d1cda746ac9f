"""GRPOStep stands on its own: the plain PyTorch loop of docs/design.md (no Trainer, no Fabric, no LightningModule)
trains what the Trainer trains and stops on its budget; the engine is set up once and pushed only when its weights
are stale; a stop requested through the context ends every driver."""

from __future__ import annotations

import re

import lightning as L
import pytest
import torch

from lit_rlft import GRPOModule, build_step
from lit_rlft.callbacks import DPSCallback, ReplayCallback, RolloutBudgetStop
from lit_rlft.callbacks.base import StepCallback
from lit_rlft.lightning.fabric import FabricLoop
from lit_rlft.rollout.engines.hf import HFEngine
from tests.callbacks.test_strategies import CoinRewards
from tests.conftest import REPO, countdown_dm, tiny_config, tiny_module, tiny_trainer

COIN = "tests.distributed.helpers.coin_reward"  # torch's generator, re-seeded per step: the same in every driver


class CountingEngine(HFEngine):
    """The HF engine, counting its set-ups and weight pushes."""

    setups = syncs = 0

    def setup(self, *args, **kwargs):
        type(self).setups += 1
        super().setup(*args, **kwargs)

    def sync_weights(self, model):
        type(self).syncs += 1
        super().sync_weights(model)


class Trained(StepCallback):
    """What each step trained: the global batch's prompt ids (fresh and replayed), in order."""

    def __init__(self):
        self.ids: list[list[int]] = []

    def after_step(self, ctx, output):
        self.ids.append(output.record.trained_batch().prompt_ids.tolist())


def _plain_block() -> str:
    block = re.search(r"<!-- doctest: plain\b.*?-->\n```\w*\n(.*?)```", (REPO / "docs" / "design.md").read_text(),
                      re.S).group(1)
    for needed in ('reward_funcs=["lit_rlft.rewards.countdown_reward"]', "RolloutBudgetStop(max_completions=160)]"):
        assert needed in block, f"docs/design.md's plain loop changed: {needed!r} is gone"
    return block


def test_the_plain_loop_of_the_design_notes_trains_what_the_trainer_trains_and_stops_on_its_budget(tmp_path, capsys):
    # The block as written, with coin-flip rewards (groups a mix of effective and degenerate ones) and a recorder.
    code = _plain_block().replace("lit_rlft.rewards.countdown_reward", COIN)
    code = code.replace("RolloutBudgetStop(max_completions=160)]", "RolloutBudgetStop(max_completions=160), trained]")
    plain = {"trained": Trained()}
    exec(compile(code, "docs/design.md", "exec"), plain)  # noqa: S102 - the documented loop itself
    step, stop_line = plain["step"], capsys.readouterr().out.strip().splitlines()[-1]
    assert not any(isinstance(v, (L.Trainer, L.Fabric, L.LightningModule)) for v in plain.values())
    assert stop_line == f"RolloutBudgetStop: {step.budget.completions} completions generated, max_completions=160"
    assert 160 <= step.budget.completions < 160 + 32  # stopped after the step that crossed the budget

    # The same run under the Trainer: max_steps far away, the budget stops it.
    from lit_rlft import CountdownTask, GenerationConfig, OptimConfig, PromptDataModule

    module = GRPOModule(model="tiny", reward_funcs=[COIN], optim=OptimConfig(learning_rate=1e-4),
                        generation=GenerationConfig(num_generations=4, max_completion_length=8))
    trained = Trained()
    data = PromptDataModule(train=CountdownTask(size=200, split="train"), answer_field=None, batch_size=8)
    tiny_trainer(tmp_path, max_steps=100, callbacks=[DPSCallback(), ReplayCallback(delta=0.5, capacity=16),
                                                     RolloutBudgetStop(max_completions=160), trained]).fit(
        module, datamodule=data)
    assert module.grpo.rollout_step == step.rollout_step and len(trained.ids) == step.rollout_step >= 4
    assert trained.ids == plain["trained"].ids
    assert plain["callbacks"][1].buffer.prompt_ids(), "nothing was stored for replay: the test would not see it"
    assert module.grpo.budget.state_dict() | {"generation_s": 0} == step.budget.state_dict() | {"generation_s": 0}
    for (name, a), (_, b) in zip(module.policy.named_parameters(), step.policy.named_parameters()):
        assert torch.equal(a, b), name


def _step(**kw):
    step = build_step(tiny_config(learning_rate=1e-3, **kw), models=False)
    step.scorer = CoinRewards(0.5)
    return step


def test_the_engine_is_set_up_once_and_pushed_only_when_its_weights_are_stale(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    # Trainer: one set-up; one push per rollout step (validation during fit and after it pushes nothing more).
    CountingEngine.setups = CountingEngine.syncs = 0
    module = tiny_module(learning_rate=1e-3, engine=CountingEngine())
    module.grpo.scorer = CoinRewards(0.5)
    trainer = tiny_trainer(tmp_path / "t", max_steps=4, val_check_interval=2, check_val_every_n_epoch=None,
                           enable_checkpointing=True, limit_val_batches=1,
                           callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)])
    dm = countdown_dm(size=48, batch_size=4, val=True)
    trainer.fit(module, datamodule=dm)
    trainer.validate(module, datamodule=dm, verbose=False)  # configure_model again: the same policy
    assert (CountingEngine.setups, CountingEngine.syncs) == (1, 4)

    # A Trainer resume: the restored weights are pushed once, then one push per step.
    CountingEngine.setups = CountingEngine.syncs = 0
    module = tiny_module(learning_rate=1e-3, engine=CountingEngine())
    module.grpo.scorer = CoinRewards(0.5)
    tiny_trainer(tmp_path / "r", max_steps=4).fit(module, datamodule=countdown_dm(size=48, batch_size=4),
                                                  ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=2.ckpt"))
    assert (CountingEngine.setups, CountingEngine.syncs) == (1, 1 + 2)

    # Fabric: the same, from a config; its resume pushes once (not once in load and again at the start).
    CountingEngine.setups = CountingEngine.syncs = 0
    loop = FabricLoop(L.Fabric(accelerator="cpu", devices=1), max_steps=4, progress_bar=False)
    loop.fit(_step(engine=CountingEngine()), countdown_dm(size=48, batch_size=4, val=True),
             ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=2.ckpt"))
    loop.validate()
    assert (CountingEngine.setups, CountingEngine.syncs) == (1, 1 + 2)


class StopAfter(StepCallback):
    """Requests a stop through the context after rollout step ``n``."""

    def __init__(self, n: int):
        self.n = n

    def after_step(self, ctx, output):
        if output.step == self.n:
            ctx.request_stop(f"asked after step {self.n}")


@pytest.mark.parametrize("driver", ["trainer", "fabric"])
def test_a_stop_requested_through_the_context_ends_either_driver(tmp_path, driver):
    if driver == "trainer":
        module = tiny_module(learning_rate=1e-3)
        tiny_trainer(tmp_path, max_steps=10, callbacks=[StopAfter(1)]).fit(module, datamodule=countdown_dm())
        step = module.grpo
    else:
        step = FabricLoop(L.Fabric(accelerator="cpu", devices=1), max_steps=10, callbacks=[StopAfter(1)],
                          progress_bar=False).fit(tiny_config(), countdown_dm())
    assert step.rollout_step == 2 and step.stop_requested == "asked after step 1"


class SaveAfter(StepCallback):
    """Asks the driver for a checkpoint through the context after rollout step ``n``."""

    def __init__(self, n: int, path: str):
        self.n, self.path, self.seen = n, path, None

    def after_step(self, ctx, output):
        if output.step == self.n:
            ctx.save_checkpoint(self.path)
            self.seen = ctx.rollout_step


@pytest.mark.parametrize("driver", ["trainer", "fabric"])
def test_a_checkpoint_asked_through_the_context_is_the_drivers_and_resumes(tmp_path, driver):
    path = str(tmp_path / "asked.ckpt")
    if driver == "trainer":
        module = tiny_module(learning_rate=1e-3)
        tiny_trainer(tmp_path, max_steps=3, callbacks=[SaveAfter(1, path)]).fit(module, datamodule=countdown_dm())
    else:
        FabricLoop(L.Fabric(accelerator="cpu", devices=1), max_steps=3, callbacks=[SaveAfter(1, path)],
                   progress_bar=False).fit(tiny_config(), countdown_dm())
    saved = torch.load(path, weights_only=False)
    assert saved["global_step"] == 2  # written at that moment, in the Trainer's layout, by either driver
    resumed = FabricLoop(L.Fabric(accelerator="cpu", devices=1), max_steps=3, progress_bar=False)
    assert resumed.fit(tiny_config(), countdown_dm(), ckpt_path=path).rollout_step == 3


def test_a_plain_loop_without_a_checkpoint_writer_refuses_a_checkpoint_naming_bind(tmp_path):
    step = _step()
    with pytest.raises(RuntimeError, match=r"cannot save .*asked\.ckpt: the driver bound no checkpoint writer "
                                           r"\(step\.bind\(\.\.\., saver=\.\.\.\)"):
        step.save_checkpoint(str(tmp_path / "asked.ckpt"))


def test_a_scorer_set_on_the_step_leaves_failure_reports_to_the_step():
    """The step prints every rank's reward failures (RewardFailureLog); a RewardRunner set later must not print its
    own rank-local warning as well."""
    from lit_rlft.rewards import RewardRunner, countdown_reward

    step = build_step(tiny_config(), models=False)
    assert step.scorer.report is False  # the one the builder made
    runner = RewardRunner([countdown_reward])
    assert runner.report is True
    step.scorer = runner
    assert runner.report is False and step.scorer is runner
    runner.close()
