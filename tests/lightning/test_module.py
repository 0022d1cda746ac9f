"""GRPOModule: one step changes every trainable parameter, LoRA trains adapters only, log-probs agree with
sampling, validation metrics, checkpoints keep the budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_rlft.models.loading import LoRAConfig
from lit_rlft.step.update import sequence_logprobs
from tests.conftest import countdown_dm, tiny_module, tiny_trainer


def _snapshot(module):
    return {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}


def _force_learning_signal(monkeypatch, module):
    """Random rewards so every group has non-zero variance and every parameter gets a gradient."""
    gen = torch.Generator().manual_seed(0)

    def fake(completions, columns):
        from lit_rlft.rewards.runner import RewardResult

        total = torch.randint(0, 2, (len(completions),), generator=gen).float()
        total[0::2] = 1 - total[1::2]  # guarantee both outcomes in every pair
        return RewardResult(total=total, per_func={"fake": total}, num_errors=0, num_timeouts=0, num_unscored=0)

    monkeypatch.setattr(module.grpo, "scorer", _Wrap(fake, module.grpo.scorer))


class _Wrap:
    def __init__(self, fn, runner):
        self.fn, self.totals = fn, runner.totals

    def __call__(self, completions, columns):
        return self.fn(completions, columns)


def test_one_step_changes_every_trainable_parameter(tmp_path, monkeypatch):
    module = tiny_module()
    module.configure_model()
    _force_learning_signal(monkeypatch, module)
    before = _snapshot(module)
    tiny_trainer(tmp_path, max_steps=1).fit(module, datamodule=countdown_dm())
    after = _snapshot(module)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert not unchanged, f"parameters not updated: {unchanged}"


def test_lora_trains_only_adapters(tmp_path, monkeypatch):
    module = tiny_module(lora=LoRAConfig(r=4, alpha=8))
    module.configure_model()
    _force_learning_signal(monkeypatch, module)
    all_before = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    trainable = {n for n, p in module.policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # lora_B starts at zero, so lora_A gets no gradient on the first step: after two steps both have moved.
    tiny_trainer(tmp_path, max_steps=2).fit(module, datamodule=countdown_dm())
    for n, p in module.policy.named_parameters():
        changed = not torch.equal(all_before[n], p.detach())
        assert changed == (n in trainable), n


def test_training_logprobs_match_sampling_logprobs():
    """The training forward (left padding, position ids) reproduces the engine's behaviour log-probs."""
    module = tiny_module(temperature=0.7, max_completion_length=6)
    module.configure_model()
    dm = countdown_dm()
    dm.setup("fit")
    dm.set_tokenizer(module.tokenizer)
    ids = np.arange(4)
    prompts = dm.prompt_tokens(ids)
    module.grpo.source.engine.return_logprobs = True
    out = module.grpo.source.engine.generate(prompts, 3, module.grpo.generation.sampling)
    from lit_rlft.core.types import Rollouts

    G = 3
    p_len = max(len(p) for p in prompts)
    p_tok = torch.zeros((4, p_len), dtype=torch.long)
    p_mask = torch.zeros((4, p_len), dtype=torch.long)
    for i, p in enumerate(prompts):
        p_tok[i, p_len - len(p):] = torch.tensor(p)
        p_mask[i, p_len - len(p):] = 1
    roll = Rollouts(
        prompt_ids=torch.as_tensor(ids), prompt_tokens=p_tok.repeat_interleave(G, 0),
        prompt_mask=p_mask.repeat_interleave(G, 0), completion_tokens=out.completion_ids,
        completion_mask=out.completion_mask, rewards=torch.zeros(4, G), correct=torch.zeros(4, G, dtype=torch.bool),
        birth_step=torch.zeros(4, dtype=torch.long), is_replay=torch.zeros(4, dtype=torch.bool),
        truncated=torch.zeros(12, dtype=torch.bool),
    )
    with torch.no_grad():
        lp, _ = sequence_logprobs(module.policy, roll, torch.arange(12), 0.7, "cpu")
    m = out.completion_mask.bool()
    assert torch.allclose(lp[m], out.logprobs[m], atol=1e-4)


def test_validation_reports_accuracy_by_difficulty(tmp_path):
    module = tiny_module(eval_num_generations=2)
    dm = countdown_dm(val=True)
    trainer = tiny_trainer(tmp_path)
    trainer.validate(module, datamodule=dm, verbose=False)
    keys = set(module.last_eval)
    assert "val/accuracy" in keys and "val/pass@2" in keys
    assert any(k.startswith("val/accuracy/difficulty_") for k in keys)
    assert module.grpo.budget.completions == 0  # evaluation is not charged to the training budget


def test_budget_counts_every_rollout_and_survives_checkpoint(tmp_path):
    module = tiny_module()
    trainer = tiny_trainer(tmp_path, max_steps=2)
    trainer.fit(module, datamodule=countdown_dm(batch_size=4))
    assert module.grpo.budget.prompts == 8 and module.grpo.budget.completions == 32
    assert module.grpo.budget.tokens > 0 and module.grpo.budget.generation_s > 0
    ckpt = {}
    module.on_save_checkpoint(ckpt)
    fresh = tiny_module()
    fresh.on_load_checkpoint(ckpt)
    assert fresh.grpo.budget.completions == 32 and fresh.grpo.rollout_step == 2


@pytest.mark.parametrize(
    "kwargs, option",
    [({"num_generations": 1}, "num_generations"), ({"reward_funcs": []}, "reward_funcs"),
     ({"num_iterations": 0}, "num_iterations"), ({"temperature": 0.0}, "temperature"),
     ({"loss_type": "dr_grpo", "epsilon": -1.0}, "epsilon"),
     ({"reward_weights": [1.0, 2.0]}, "reward_weights")],
)
def test_bad_configuration_names_the_option(kwargs, option):
    with pytest.raises(ValueError, match=option):
        tiny_module(**kwargs)


def test_several_iterations_and_mini_batches(tmp_path):
    """num_iterations x num_mini_batches optimizer steps per rollout step; max_steps counts optimizer steps."""
    module = tiny_module(num_iterations=2, num_mini_batches=2, micro_batch_size=3)
    trainer = tiny_trainer(tmp_path, max_steps=4)
    trainer.fit(module, datamodule=countdown_dm())
    assert trainer.global_step == 4 and module.grpo.rollout_step == 1


def test_lora_with_kl_uses_the_base_model_as_reference(tmp_path, monkeypatch):
    """beta > 0 with LoRA: no reference copy is made; the reference is the base with adapters disabled."""
    module = tiny_module(lora=LoRAConfig(r=4, alpha=8), beta=0.1)
    _force_learning_signal(monkeypatch, module)
    assert module.reference is None
    trainer = tiny_trainer(tmp_path, max_steps=2)
    trainer.fit(module, datamodule=countdown_dm())
    # lora_B starts at zero, so the first step's policy equals the reference: kl is exactly 0 there and > 0 after.
    assert float(trainer.callback_metrics["kl"]) > 0


def test_full_finetune_with_kl_keeps_a_frozen_reference_copy(tmp_path):
    module = tiny_module(beta=0.1)
    module.configure_model()
    assert module.reference is not None
    assert not any(p.requires_grad for p in module.reference.parameters())
    before = {n: p.detach().clone() for n, p in module.reference.named_parameters()}
    trainer = tiny_trainer(tmp_path, max_steps=1, enable_checkpointing=True)
    trainer.fit(module, datamodule=countdown_dm())
    assert all(torch.equal(before[n], p) for n, p in module.reference.named_parameters())  # frozen
    # The reference is rebuilt from the model path, not saved: no checkpoint carries a second copy of the weights.
    ckpt = torch.load(next(tmp_path.rglob("*.ckpt")), weights_only=True)
    assert ckpt["state_dict"] and not any(k.startswith("ref_model") for k in ckpt["state_dict"])


def test_bfloat16_master_weights_are_warned_about(tmp_path):
    """AdamW on bfloat16 weights loses GRPO-size updates: the module says so and names the fix."""
    module = tiny_module(dtype="bfloat16")
    with pytest.warns(UserWarning, match="bf16-mixed"):
        tiny_trainer(tmp_path, max_steps=1).fit(module, datamodule=countdown_dm())


def test_fsdp1_strategy_is_refused_with_the_fsdp2_alternative():
    from types import SimpleNamespace

    from lightning.pytorch.strategies import FSDPStrategy

    module = tiny_module()
    module._trainer = SimpleNamespace(strategy=FSDPStrategy())
    with pytest.raises(ValueError, match="ModelParallelStrategy"):
        module.configure_model()


def test_reference_model_keys_of_old_checkpoints_are_dropped():
    module = tiny_module()
    ckpt = {"state_dict": {"policy.x": torch.zeros(1), "ref_model.x": torch.zeros(1)}, "lit_rlft": {}}
    module.on_load_checkpoint(ckpt)
    assert list(ckpt["state_dict"]) == ["policy.x"]


def test_16_mixed_clips_and_reports_the_unscaled_gradient_norm(tmp_path, monkeypatch):
    """Under 16-mixed the gradients are multiplied by the GradScaler's scale (65536 at first) until optimizer.step;
    the norm that is clipped and logged must be the real one, as in 32-true (up to float16 compute)."""
    import lightning as L

    norms = {}
    for precision in ("32-true", "16-mixed"):
        L.seed_everything(0, verbose=False)
        module = tiny_module(max_grad_norm=1e9)
        module.configure_model()
        _force_learning_signal(monkeypatch, module)
        trainer = tiny_trainer(tmp_path / precision, max_steps=1, precision=precision)
        trainer.fit(module, datamodule=countdown_dm())
        norms[precision] = float(trainer.callback_metrics["grad_norm"])
    assert norms["32-true"] > 0
    assert norms["16-mixed"] == pytest.approx(norms["32-true"], rel=0.05)


class _NaNLoss:
    """The module's loss, made NaN at the listed rollout steps."""

    def __init__(self, loss_fn, module, bad_steps):
        self.loss_fn, self.module, self.bad_steps = loss_fn, module, set(bad_steps)

    def __getattr__(self, name):  # the loss's options and normalisation
        return getattr(self.loss_fn, name)

    def __call__(self, *args, **kwargs):
        out = self.loss_fn(*args, **kwargs)
        if self.module.grpo.rollout_step in self.bad_steps:
            out.loss = out.loss * float("nan")
        return out


def test_trainer_skips_a_nan_step_and_stops_after_a_streak(tmp_path, monkeypatch):
    from lit_rlft.step.update import NonFiniteUpdateError

    module = tiny_module(max_nonfinite_skips=2)
    module.configure_model()
    _force_learning_signal(monkeypatch, module)
    module.grpo.updater.loss_fn = _NaNLoss(module.grpo.updater.loss_fn, module, bad_steps=[1])
    with pytest.warns(UserWarning, match="step 1: 1 optimizer step.*non-finite.*1 in a row"):
        tiny_trainer(tmp_path, max_steps=3).fit(module, datamodule=countdown_dm())
    assert module.grpo.updater.skips_total == 1 and module.trainer.global_step == 3  # the skipped step still counts
    assert all(torch.isfinite(p).all() for p in module.policy.parameters())

    module = tiny_module(max_nonfinite_skips=2)
    module.configure_model()
    _force_learning_signal(monkeypatch, module)
    module.grpo.updater.loss_fn = _NaNLoss(module.grpo.updater.loss_fn, module, bad_steps=[1, 2, 3])
    with pytest.raises(NonFiniteUpdateError, match="2 optimizer steps in a row"):
        tiny_trainer(tmp_path, max_steps=5).fit(module, datamodule=countdown_dm())
    assert module.grpo.rollout_step == 2 and all(torch.isfinite(p).all() for p in module.policy.parameters())


def test_the_module_s_signature_is_the_config_s_fields():
    """GRPOModule's arguments (what LightningCLI reads as ``model.*``) are GRPOConfig's fields, in order, with the
    same defaults and types (a field with a default factory defaults to None there: the config fills it in), and the
    constructor hands each one over: a field added to one and not the other fails here."""
    import dataclasses
    import inspect

    from lit_rlft.lightning.module import GRPOModule
    from lit_rlft.step import GRPOConfig

    params = [p for p in inspect.signature(GRPOModule.__init__).parameters.values()
              if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    config = dataclasses.fields(GRPOConfig)
    assert [p.name for p in params] == [f.name for f in config]
    for p, f in zip(params, config):
        factory = f.default_factory is not dataclasses.MISSING
        assert p.default == (None if factory else f.default), p.name
        assert p.annotation.replace(" | None", "") == str(f.type).replace(" | None", ""), p.name
    module = GRPOModule(reward_funcs=["lit_rlft.rewards.countdown_reward"], success_threshold=0.5,
                        scale_rewards="batch", reward_timeout_s=3.0)
    assert (module.config.success_threshold, module.config.scale_rewards, module.config.reward_timeout_s) == \
        (0.5, "batch", 3.0)
