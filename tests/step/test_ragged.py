"""Groups of different sizes through the update: advantages over each group's own members, every loss aggregation
against its written formula over the real completions only, padding rows never passed through the model, micro-
batches and mini-batches (some empty) as the whole batch."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlft import GRPOLoss, PolicyUpdater, Rollouts, TorchBackend
from lit_rlft.core.advantages import group_advantages
from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2
from lit_rlft.step.passes import sequence_logprobs
from tests.conftest import TINY_SMALL
from tests.step.test_update import _batch

SIZES = [3, 1, 2, 3]  # real completions of the four groups, padded to 3


def ragged_batch() -> Rollouts:
    """``_batch()``'s 4 groups of 3 cut to 3, 1, 2 and 3 completions, with hand-made rewards."""
    full = _batch()
    rows = torch.tensor([[0, 1, 2], [3, -1, -1], [6, 7, -1], [9, 10, 11]])
    out = full.regroup(rows, torch.arange(4))
    out.rewards = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.0, 0.0]])
    out.correct = out.rewards >= 1
    return out


def test_ragged_advantages_are_group_statistics_over_each_groups_members():
    batch = ragged_batch()
    eps = 1e-4
    adv = group_advantages(batch.rewards, "group", eps=eps, members=batch.members)
    s0 = math.sqrt(1 / 3)  # group 0: rewards 1, 0, 1: mean 2/3, unbiased std sqrt(((1/3)^2 * 2 + (2/3)^2) / 2)
    s2 = math.sqrt(0.5)  # group 2: rewards 0, 1
    s3 = math.sqrt(1 / 12)  # group 3: rewards 0.5, 0, 0: mean 1/6, deviations 1/3, -1/6, -1/6
    expected = torch.tensor([
        [(1 - 2 / 3) / (s0 + eps), (0 - 2 / 3) / (s0 + eps), (1 - 2 / 3) / (s0 + eps)],
        [0.0, 0.0, 0.0],  # one completion: no spread, no advantage; padding 0
        [-0.5 / (s2 + eps), 0.5 / (s2 + eps), 0.0],
        [(1 / 3) / (s3 + eps), -1 / 6 / (s3 + eps), -1 / 6 / (s3 + eps)],
    ])
    assert torch.allclose(adv, expected, atol=1e-6)
    none = group_advantages(batch.rewards, "none", members=batch.members)
    assert torch.allclose(none[2], torch.tensor([-0.5, 0.5, 0.0])) and float(none[1].abs().sum()) == 0.0
    # "batch": one std over the 9 real rewards of the batch, not the 12 slots
    real = batch.rewards[batch.members]
    batch_adv = group_advantages(batch.rewards, "batch", eps=eps, members=batch.members)
    assert torch.allclose(batch_adv[2, :2], torch.tensor([-0.5, 0.5]) / (real.std() + eps), atol=1e-6)


def test_rollouts_regroup_keeps_real_rows_and_pads_the_rest():
    batch = ragged_batch()
    assert batch.num_completions == 9 and batch.group_sizes.tolist() == SIZES
    assert batch.member_rows().tolist() == [0, 1, 2, 3, 6, 7, 9, 10, 11]
    pad = ~batch.members.reshape(-1)
    assert int(batch.completion_mask[pad].sum()) == 0 and int(batch.prompt_mask[pad].sum()) == 0
    full = _batch()
    assert torch.equal(batch.completion_tokens[7], full.completion_tokens[7])  # group 2, second completion
    assert torch.allclose(batch.success_rates, torch.tensor([2 / 3, 1.0, 0.5, 0.0]))
    picked = batch.select_groups([2, 0])
    assert picked.members.tolist() == [[True, True, False], [True, True, True]]
    assert batch.select_groups([0, 3]).members is None  # both full: no mask
    wide = Rollouts.concat([batch.select_groups([1]), full.select_groups([0])])
    assert wide.members.tolist() == [[True, False, False], [True, True, True]]


def test_join_gathers_each_prompts_completions_from_several_calls():
    full = _batch()
    first = full.regroup(torch.tensor([[0, 1], [3, 4], [6, 7]]), torch.arange(3))  # 3 prompts, 2 each
    second = full.regroup(torch.tensor([[8], [5]]), torch.tensor([2, 1]))  # prompts 2 and 1 get one more
    joined = Rollouts.join([first, second])
    assert joined.prompt_ids.tolist() == [0, 1, 2] and joined.group_sizes.tolist() == [2, 3, 3]
    assert torch.equal(joined.completion_tokens[3:6], full.completion_tokens[3:6])  # prompt 1: rows 3, 4 then 5
    assert torch.equal(joined.completion_tokens[6:9], full.completion_tokens[6:9])
    assert torch.equal(joined.rewards[1], full.rewards[1]) and float(joined.rewards[0, 2]) == 0.0


def _grads_and_rows(batch: Rollouts, loss_type: str, micro: int | None = None, mini: int = 1,
                    **options) -> tuple[dict[str, torch.Tensor], list[int], int]:
    torch.manual_seed(0)
    model = tiny_qwen2(char_tokenizer(), TinyConfig(**TINY_SMALL))
    updater = PolicyUpdater(GRPOLoss(loss_type=loss_type, max_completion_length=6), temperature=1.0,
                            micro_batch_size=micro, num_mini_batches=mini, max_grad_norm=0.0, **options)
    grads: dict[str, torch.Tensor] = {}
    seen: list[int] = []
    model.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw["input_ids"].shape[0]), with_kwargs=True)

    class Capture(TorchBackend):
        def optimizer_step(self) -> None:
            for n, p in model.named_parameters():
                if p.grad is not None:
                    grads[n] = grads.get(n, 0) + p.grad.clone()

    adv = group_advantages(batch.rewards, members=batch.members).reshape(-1)
    updater.update(batch, adv, Capture(model, torch.optim.SGD(model.parameters(), lr=0.0)))
    return grads, seen, updater.optimizer_steps


def _formula_grads(batch: Rollouts, loss_type: str) -> dict[str, torch.Tensor]:
    """The written formulas over the real completions only (one optimizer step: every ratio is 1, so each token's
    loss has the gradient of ``-A_i log pi(o_it)``): ``N`` real completions, ``T`` their tokens, ``L_max = 6``."""
    torch.manual_seed(0)
    model = tiny_qwen2(char_tokenizer(), TinyConfig(**TINY_SMALL))
    rows = batch.member_rows()
    adv = group_advantages(batch.rewards, members=batch.members).reshape(-1)[rows]  # [N]
    logp, _ = sequence_logprobs(model, batch, rows, 1.0, "cpu")  # [N, L]
    mask = batch.completion_mask[rows].float()
    per_seq_sum = (logp * mask).sum(1)  # [N]
    n, t = len(rows), mask.sum()
    objective = {
        "grpo": (adv * per_seq_sum / mask.sum(1)).sum() / n,  # mean over completions of each one's token mean
        "dapo": (adv * per_seq_sum).sum() / t,  # one token mean over the real tokens
        "bnpo": (adv * per_seq_sum).sum() / t,
        "dr_grpo": (adv * per_seq_sum).sum() / (n * 6),  # Dr. GRPO's constant: real completions x L_max
        "luspo": (adv * per_seq_sum).sum() / n,  # each completion's token sum, mean over completions
    }[loss_type]
    (-objective).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "bnpo", "dr_grpo", "luspo"])
def test_each_aggregation_over_ragged_groups_is_its_formula_over_the_real_completions(loss_type):
    batch = ragged_batch()
    expected = _formula_grads(batch, loss_type)
    got, seen, _ = _grads_and_rows(batch, loss_type, skip_zero_advantage=False)
    assert sum(seen) == 9  # the 3 padding rows never reach the model (nor, with the skip, group 1's one row)
    assert expected.keys() == got.keys()
    for name, g in expected.items():
        assert torch.allclose(got[name], g, rtol=1e-4, atol=1e-7), (loss_type, name)
    if loss_type != "bnpo":  # bnpo normalises each micro-batch by its own tokens, by definition
        parts, seen, _ = _grads_and_rows(batch, loss_type, micro=2, skip_zero_advantage=False)
        assert sorted(seen) == [1, 2, 2, 2, 2]
        for name, g in expected.items():
            assert torch.allclose(parts[name], g, rtol=1e-4, atol=1e-7), (loss_type, name)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_packed_passes_and_token_budget_micro_batches_train_the_real_rows_alike(loss_type):
    batch = ragged_batch()
    expected = _formula_grads(batch, loss_type)
    for options in (dict(padding_free=True), dict(micro_batch_tokens=24), dict(micro_batch_tokens=24,
                                                                              padding_free=True)):
        got, seen, _ = _grads_and_rows(batch, loss_type, **options)
        for name, g in expected.items():
            assert torch.allclose(got[name], g, rtol=1e-4, atol=1e-6), (loss_type, options, name)


def test_more_mini_batches_than_real_rows_make_dummy_passes_and_keep_the_step_count():
    narrow = _batch().regroup(torch.tensor([[0, -1], [3, 4]]), torch.arange(2))  # 3 real rows
    narrow.rewards = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    narrow.correct = narrow.rewards >= 1
    grads, seen, steps = _grads_and_rows(narrow, "grpo", mini=4, skip_zero_advantage=False)
    assert steps == 4 and seen == [3, 1, 1, 1, 1]  # pi_old over the 3 rows, 3 mini-batches of one row, a dummy
    assert all(torch.isfinite(g).all() for g in grads.values())
