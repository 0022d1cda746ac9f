"""PolicyUpdater outside Lightning: micro-batching does not change the gradient (dapo token mean, grpo sequence
mean), and TorchBackend drives a plain PyTorch update."""

from __future__ import annotations

import pytest
import torch

from lit_rlft import GRPOLoss, PolicyUpdater, Rollouts, TorchBackend
from lit_rlft.core.advantages import group_advantages
from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2
from tests.conftest import TINY_SMALL


def _batch(seed: int = 0) -> Rollouts:
    """4 groups of 3 completions with unequal lengths (so token and sequence means differ)."""
    gen = torch.Generator().manual_seed(seed)
    B, G, P, L = 4, 3, 5, 6
    comp = torch.randint(3, 60, (B * G, L), generator=gen)
    lengths = torch.tensor([6, 2, 4, 5, 1, 6, 3, 6, 2, 4, 6, 5])
    mask = (torch.arange(L)[None, :] < lengths[:, None]).long()
    rewards = torch.randint(0, 2, (B, G), generator=gen).float()
    return Rollouts(
        prompt_ids=torch.arange(B), prompt_tokens=torch.randint(3, 60, (B * G, P), generator=gen),
        prompt_mask=torch.ones(B * G, P, dtype=torch.long), completion_tokens=comp * mask, completion_mask=mask,
        rewards=rewards, correct=rewards > 0, birth_step=torch.zeros(B, dtype=torch.long),
        is_replay=torch.zeros(B, dtype=torch.bool), truncated=torch.zeros(B * G, dtype=torch.bool),
    )


def _grads(loss_type: str, micro: int | None) -> dict[str, torch.Tensor]:
    model = tiny_qwen2(char_tokenizer(), TinyConfig(**TINY_SMALL))
    updater = PolicyUpdater(GRPOLoss(loss_type=loss_type, max_completion_length=6), temperature=1.0,
                            micro_batch_size=micro, max_grad_norm=0.0)
    grads: dict[str, torch.Tensor] = {}

    class Capture(TorchBackend):
        def optimizer_step(self) -> None:
            grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    batch = _batch()
    backend = Capture(model, torch.optim.SGD(model.parameters(), lr=0.0))
    stats = updater.update(batch, group_advantages(batch.rewards).reshape(-1), backend).metrics
    assert "loss" in stats and "grad_norm" not in stats  # max_grad_norm=0: no clipping
    return grads


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_micro_batched_gradient_equals_the_whole_batch_gradient(loss_type):
    whole = _grads(loss_type, None)
    for micro in (5, 1):
        parts = _grads(loss_type, micro)
        for name, g in whole.items():
            assert torch.allclose(parts[name], g, rtol=1e-5, atol=1e-8), (loss_type, micro, name)


def test_torch_backend_steps_the_optimizer_and_reports_the_learning_rate():
    model = tiny_qwen2(char_tokenizer(), TinyConfig(**TINY_SMALL))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batch = _batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stats = PolicyUpdater(GRPOLoss(), temperature=1.0).update(
        batch, group_advantages(batch.rewards).reshape(-1), TorchBackend(model, opt)).metrics
    assert stats["learning_rate"] == 1e-3 and stats["grad_norm"] > 0
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def _adamw_step(model, updater, advantages, optimizer):
    return updater.update(_batch(), advantages, TorchBackend(model, optimizer)).metrics


@pytest.mark.parametrize("max_grad_norm", [1.0, 0.0])
def test_non_finite_gradient_skips_the_update_and_stops_after_a_streak(max_grad_norm):
    from lit_rlft.step.update import NonFiniteUpdateError

    model = tiny_qwen2(char_tokenizer(), TinyConfig(**TINY_SMALL))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    updater = PolicyUpdater(GRPOLoss(max_completion_length=6), temperature=1.0, max_grad_norm=max_grad_norm,
                            max_nonfinite_skips=2)
    good = group_advantages(_batch().rewards).reshape(-1)
    bad = good.clone()
    bad[0] = float("nan")  # one NaN advantage: a NaN loss and NaN gradients everywhere
    _adamw_step(model, updater, good, optimizer)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {n: {k: v.clone() for k, v in optimizer.state[p].items()} for n, p in model.named_parameters()}
    stats = _adamw_step(model, updater, bad, optimizer)
    assert stats["nonfinite_skips"] == 1.0 and updater.skips_in_a_row == 1
    for n, p in model.named_parameters():  # nothing reached the weights; AdamW's moments (and decay) untouched
        assert torch.equal(p, weights[n]), n
        for k, v in optimizer.state[p].items():
            assert torch.equal(v, state[n][k]), (n, k)
    assert _adamw_step(model, updater, good, optimizer)["nonfinite_skips"] == 0.0  # a finite step resets the streak
    assert updater.skips_in_a_row == 0 and all(torch.isfinite(p).all() for p in model.parameters())
    _adamw_step(model, updater, bad, optimizer)
    with pytest.raises(NonFiniteUpdateError, match="2 optimizer steps in a row.*max_nonfinite_skips"):
        _adamw_step(model, updater, bad, optimizer)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def _episode_batch() -> Rollouts:
    """:func:`_batch` with observation tokens inside some completions (multi-turn episodes): positions 1-2 of rows
    0, 3, 5 and 7 are an environment's, not the policy's."""
    batch = _batch()
    policy = batch.completion_mask.clone()
    for row in (0, 3, 5, 7):
        policy[row, 1:3] = 0
    batch.policy_mask = policy
    return batch


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_observation_tokens_are_context_not_loss(loss_type):
    """The updater's gradient is the loss over the policy's tokens alone (written by hand from the one-pass log-probs),
    micro-batched or packed alike; taking the observation tokens into the loss would give another gradient."""
    from lit_rlft.step.passes import sequence_logprobs

    batch = _episode_batch()
    adv = group_advantages(batch.rewards).reshape(-1)

    def updater_grads(**opts):
        model = tiny_qwen2(char_tokenizer(), TinyConfig(**TINY_SMALL))
        grads: dict[str, torch.Tensor] = {}

        class Capture(TorchBackend):
            def optimizer_step(self) -> None:
                grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

        PolicyUpdater(GRPOLoss(loss_type=loss_type, max_completion_length=6), temperature=1.0, max_grad_norm=0.0,
                      **opts).update(batch, adv, Capture(model, torch.optim.SGD(model.parameters(), lr=0.0)))
        return grads

    def by_hand(mask):
        model = tiny_qwen2(char_tokenizer(), TinyConfig(**TINY_SMALL))
        rows = torch.arange(batch.completion_tokens.shape[0])
        lp, _ = sequence_logprobs(model, batch, rows, 1.0, "cpu")
        GRPOLoss(loss_type=loss_type, max_completion_length=6)(lp, lp.detach(), adv, mask).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    expected, with_observations = by_hand(batch.policy_mask), by_hand(batch.completion_mask)
    assert any(not torch.allclose(expected[n], with_observations[n], rtol=1e-4, atol=1e-7) for n in expected)
    for opts in ({}, {"micro_batch_size": 5}, {"micro_batch_tokens": 24, "padding_free": True}):
        got = updater_grads(**opts)
        for name, g in expected.items():
            assert torch.allclose(got[name], g, rtol=1e-4, atol=1e-7), (loss_type, opts, name)
