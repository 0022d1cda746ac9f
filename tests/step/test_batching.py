"""Packed (padding-free) and trimmed passes equal the padded pass; token-budget micro-batches give the update of
row micro-batches; gradient checkpointing gives the gradients of the plain pass (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from lit_rlft.core.losses import GRPOLoss
from lit_rlft.core.types import Rollouts
from lit_rlft.models.loading import LoRAConfig, build_policy
from lit_rlft.models.tiny import TinyConfig
from lit_rlft.step.batching import padding_share, token_budget_micro_batches
from lit_rlft.step.passes import sequence_logprobs
from lit_rlft.step.update import PolicyUpdater, TorchBackend
from tests.conftest import TINY_SMALL

TINY2 = {**TINY_SMALL, "num_hidden_layers": 2}


def _rollouts(B: int = 4, G: int = 3, P: int = 9, L: int = 12, seed: int = 0, replay: bool = False) -> Rollouts:
    """Random rows with prompts of 2..P and completions of 1..L real tokens (left / right padding)."""
    g = torch.Generator().manual_seed(seed)
    N = B * G
    p_len = torch.randint(2, P + 1, (B,), generator=g).repeat_interleave(G)
    c_len = torch.randint(1, L + 1, (N,), generator=g)
    prompt = torch.randint(3, 90, (B, P), generator=g).repeat_interleave(G, 0)
    p_mask = (torch.arange(P)[None] >= (P - p_len)[:, None]).long()
    comp = torch.randint(3, 90, (N, L), generator=g)
    c_mask = (torch.arange(L)[None] < c_len[:, None]).long()
    rewards = torch.randint(0, 2, (B, G), generator=g).float()
    is_replay = torch.tensor([replay and b % 2 == 1 for b in range(B)])
    return Rollouts(
        prompt_ids=torch.arange(B), prompt_tokens=prompt * p_mask, prompt_mask=p_mask,
        completion_tokens=comp * c_mask, completion_mask=c_mask, rewards=rewards, correct=rewards >= 1,
        birth_step=torch.zeros(B, dtype=torch.long), is_replay=is_replay, truncated=c_len == L,
        behaviour_logprobs=-torch.rand(N, L, generator=g) - 1.0 if replay else None,
    )


def _policy(seed: int = 0, **kw):
    torch.manual_seed(seed)
    return build_policy("tiny", tiny=TinyConfig(**TINY2), **kw)[0]


def test_packed_and_trimmed_log_probs_equal_the_padded_pass():
    policy, roll = _policy().eval(), _rollouts()
    rows = torch.arange(12)
    with torch.no_grad():
        padded, ent = sequence_logprobs(policy, roll, rows, 0.8, "cpu", with_entropy=True)
        packed, ent_p = sequence_logprobs(policy, roll, rows, 0.8, "cpu", with_entropy=True, packed=True)
        trimmed, _ = sequence_logprobs(policy, roll, rows[:5], 0.8, "cpu", trim=True)
    m = roll.completion_mask.bool()
    torch.testing.assert_close(packed[m], padded[m], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent_p[m], ent[m], rtol=1e-5, atol=1e-6)
    assert (packed[~m] == 0).all()  # padding positions hold nothing
    torch.testing.assert_close(trimmed[m[:5]], padded[:5][m[:5]], rtol=1e-5, atol=1e-6)
    assert trimmed.shape == padded[:5].shape


@pytest.mark.parametrize("kw", [{}, {"lora": LoRAConfig(r=4, alpha=8), "gradient_checkpointing": True}],
                         ids=["full", "lora+checkpointing"])
def test_a_packed_pass_computes_logits_only_where_completion_tokens_are_predicted(kw):
    """The head sees ``[1, sum l_i, H]``: no logits for prompts or bin tails; values equal the padded pass."""
    policy, roll = _policy(**kw).train(), _rollouts()
    rows = torch.arange(12)
    shapes: list[tuple[int, ...]] = []
    handle = policy.get_output_embeddings().register_forward_hook(lambda m, a, out: shapes.append(tuple(out.shape)))
    packed, _ = sequence_logprobs(policy, roll, rows, 0.8, "cpu", packed=True)
    handle.remove()
    padded, _ = sequence_logprobs(policy, roll, rows, 0.8, "cpu")
    vocab = policy.get_output_embeddings().weight.shape[0]
    assert shapes == [(1, int(roll.completion_mask.sum()), vocab)]
    m = roll.completion_mask.bool()
    torch.testing.assert_close(packed[m], padded[m], rtol=1e-5, atol=1e-6)
    packed[m].sum().backward()  # the gathered hidden states carry the gradient back through the packed forward
    packed_grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}
    policy.zero_grad()
    sequence_logprobs(policy, roll, rows, 0.8, "cpu")[0][m].sum().backward()
    _assert_same({n: p.grad for n, p in policy.named_parameters() if p.requires_grad}, packed_grads, rtol=1e-5)


def _grads(updater: PolicyUpdater, roll: Rollouts, seed: int = 0, ref: bool = False, **policy_kw) -> dict:
    """The gradient of one update (captured before the optimizer step) of a fresh policy."""
    policy = _policy(seed, **policy_kw).train()
    captured: dict[str, torch.Tensor] = {}

    class Capture(torch.optim.SGD):
        def step(self, closure=None):
            captured.update({n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None})

    backend = TorchBackend(policy, Capture([p for p in policy.parameters() if p.requires_grad], lr=0.0))
    reference = _policy(seed + 1).eval() if ref else None

    def ref_logprobs(rollouts, rows):
        if reference is None:
            return None
        with torch.no_grad():
            return sequence_logprobs(reference, rollouts, rows, updater.temperature, "cpu", packed=updater.padding_free,
                                     trim=updater.micro_batch_tokens is not None)[0]

    updater.update(roll, torch.randn(roll.completion_tokens.shape[0], generator=torch.Generator().manual_seed(1)),
                   backend, ref_logprobs=ref_logprobs)
    return captured


def test_the_reference_pass_runs_once_per_row_however_many_iterations():
    """With num_iterations > 1 the frozen reference's log-probs are computed once per row (one pass over the
    micro-batches), and the update equals one whose reference log-probs come from a single whole-batch pass."""
    roll, loss = _rollouts(), GRPOLoss(loss_type="grpo", beta=0.04)
    reference = _policy(1).eval()
    calls: list[list[int]] = []

    def per_rows(rollouts, rows):
        calls.append(rows.tolist())
        with torch.no_grad():
            return sequence_logprobs(reference, rollouts, rows, 1.0, "cpu")[0]

    with torch.no_grad():
        whole = sequence_logprobs(reference, roll, torch.arange(12), 1.0, "cpu")[0]  # [12, L]
    results = []
    for ref in (per_rows, lambda rollouts, rows: whole[rows]):
        policy = _policy(0).train()
        backend = TorchBackend(policy, torch.optim.SGD(policy.parameters(), lr=0.1))
        PolicyUpdater(loss, 1.0, num_iterations=2, num_mini_batches=2, micro_batch_size=5).update(
            roll, torch.randn(12, generator=torch.Generator().manual_seed(1)), backend, ref_logprobs=ref)
        results.append({n: p.detach().clone() for n, p in policy.named_parameters()})
    assert sorted(r for c in calls for r in c) == list(range(12)) and len(calls) == 3  # 12 rows in micro-batches of 5
    _assert_same(results[1], results[0], rtol=1e-6)


def _assert_same(a: dict, b: dict, rtol: float) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=rtol, atol=rtol * a[name].abs().max().item(), msg=name)


@pytest.mark.parametrize("loss", [GRPOLoss(loss_type="dapo"), GRPOLoss(loss_type="grpo", beta=0.04),
                                  GRPOLoss(loss_type="dr_grpo", max_completion_length=12, beta=0.04)],
                         ids=["dapo", "grpo+kl", "dr_grpo+kl"])
def test_a_packed_update_equals_the_padded_one_with_replay_and_kl(loss):
    roll = _rollouts(replay=True)
    padded = _grads(PolicyUpdater(loss, 1.0, micro_batch_size=5), roll, ref=loss.beta > 0)
    packed = _grads(PolicyUpdater(loss, 1.0, micro_batch_size=5, padding_free=True), roll, ref=loss.beta > 0)
    _assert_same(padded, packed, rtol=1e-5)


@pytest.mark.parametrize("loss", [GRPOLoss(loss_type="dapo", entropy_coef=0.05),
                                  GRPOLoss(loss_type="grpo", entropy_coef=0.05, top_entropy_quantile=0.5),
                                  GRPOLoss(loss_type="dapo", top_entropy_quantile=0.5)],
                         ids=["dapo+bonus", "grpo+bonus+quantile", "dapo+quantile"])
def test_micro_batches_give_the_whole_batch_update_with_batch_wide_entropy_terms(loss):
    """The entropy bonus's token count and the top-entropy threshold are the mini-batch's, not each micro-batch's:
    the updater's own path (a per-micro-batch count or threshold fails this). Not bnpo: its per-micro-batch
    normalisation is its definition."""
    roll = _rollouts()
    whole = _grads(PolicyUpdater(loss, 1.0), roll)
    micro = _grads(PolicyUpdater(loss, 1.0, micro_batch_size=5), roll)
    _assert_same(whole, micro, rtol=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_token_budget_micro_batches_give_the_update_of_row_micro_batches(packed):
    roll, loss = _rollouts(B=5, replay=True), GRPOLoss(loss_type="dapo")
    rows = _grads(PolicyUpdater(loss, 1.0, micro_batch_size=4, padding_free=packed), roll)
    tokens = _grads(PolicyUpdater(loss, 1.0, micro_batch_tokens=40, padding_free=packed), roll)
    _assert_same(rows, tokens, rtol=1e-6)


def test_the_token_budget_partition_covers_every_row_once_within_the_budget():
    roll = _rollouts(B=6)
    p_len, c_len = roll.prompt_mask.sum(1), roll.completion_mask.sum(1)
    rows = torch.randperm(18, generator=torch.Generator().manual_seed(3))
    for packed in (False, True):
        micro = token_budget_micro_batches(rows, p_len[rows], c_len[rows], budget=50, packed=packed)
        assert sorted(torch.cat(micro).tolist()) == sorted(rows.tolist())
        for m in micro:
            size = int((p_len[m] + c_len[m]).sum()) if packed else len(m) * int(p_len[m].max() + c_len[m].max())
            assert size <= 50 or len(m) == 1
    packed_share = padding_share(roll, [torch.arange(18)], packed=True, trimmed=False)
    assert 0 <= packed_share < padding_share(roll, [torch.arange(18)], packed=False, trimmed=False) < 1


def test_rows_pack_first_fit_decreasing_into_bins_of_the_longest_row():
    from lit_rlft.step.batching import pack_rows

    #  lengths 9 5 4 4 3 2 -> bins of 9: [9], [5 4], [4 3 2]
    assert pack_rows([4, 9, 3, 5, 2, 4]) == [[1], [3, 0], [5, 2, 4]]


@pytest.mark.parametrize("lora", [None, LoRAConfig(r=4, alpha=8)], ids=["full", "lora"])
def test_gradient_checkpointing_gives_the_same_gradients(lora, monkeypatch):
    from transformers.models.qwen2 import modeling_qwen2

    calls = []
    forward = modeling_qwen2.Qwen2MLP.forward  # inside each decoder layer: a recomputed layer calls it again
    monkeypatch.setattr(modeling_qwen2.Qwen2MLP, "forward", lambda self, x: calls.append(1) or forward(self, x))
    roll, loss = _rollouts(), GRPOLoss(loss_type="dapo")
    plain = _grads(PolicyUpdater(loss, 1.0, micro_batch_size=6), roll, lora=lora)
    plain_calls, calls[:] = len(calls), []
    checkpointed = _grads(PolicyUpdater(loss, 1.0, micro_batch_size=6), roll, lora=lora, gradient_checkpointing=True)
    assert plain_calls == 2 * 2 and len(calls) == 2 * plain_calls  # 2 micro-batches x 2 layers, recomputed once
    _assert_same(plain, checkpointed, rtol=1e-6)
    if lora is not None:
        assert all("lora_" in name for name in plain)


def test_ranks_run_as_many_token_budget_micro_batches_as_the_rank_that_needs_most():
    """Under FSDP2 each forward is a collective: a rank whose rows fit in fewer micro-batches splits further."""
    from lit_rlft.runtime.distributed import split_to
    from tests.runtime.test_distributed import FakeRanks

    assert [m.tolist() for m in split_to([torch.arange(5), torch.arange(5, 7)], 4)] == [[0, 1], [2], [3, 4],
                                                                                              [5, 6]]
    roll = _rollouts(B=4)
    updater = PolicyUpdater(GRPOLoss(), 1.0, micro_batch_tokens=60)
    rows = torch.arange(12)
    mine = updater.micro_batches(roll, rows)
    other = {1: [len(mine) + 3]}  # rank 1's rows needed 3 more micro-batches
    split = updater.split(roll, [rows], FakeRanks(0, other, world_size=2))[0]
    assert len(split) == len(mine) + 3 and sorted(torch.cat(split).tolist()) == rows.tolist()
    same = updater.split(roll, [rows], FakeRanks(0, {1: [1]}, world_size=2))[0]  # this rank needs the most already
    assert [m.tolist() for m in same] == [m.tolist() for m in mine]
