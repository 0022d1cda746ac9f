"""Chunked log-probs (``model.optim.logprob_chunk_tokens``): log-probs and entropies from the hidden states and the LM
head in chunks of positions. Against the full logits: the same log-probs and entropies in padded, packed and
shared-prompt passes, and for every loss type, micro-batched by rows and by tokens, with KL (the reference pass
chunked too), replayed groups, the entropy bonus and mask, gradient checkpointing and LoRA, the same gradient of
every parameter. No op of a chunked update at Qwen2's vocabulary makes a tensor of more than one chunk's logits.

Tolerance: 1e-5 relative (per tensor), against rounding: the head's product on a chunk's rows and the gradient of the
head summed chunk by chunk round differently from the whole product (float32, CPU: measured at 2.1e-7 relative at most on
a gradient over every loss type below).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from lit_rlft.core.logprobs import AUTO_CHUNK_LOGITS, chunked_logprobs, completion_logprobs, resolve_chunk_tokens
from lit_rlft.core.losses import GRPOLoss
from lit_rlft.models.loading import LoRAConfig
from lit_rlft.step.config import OptimConfig
from lit_rlft.step.passes import head_logprobs, sequence_logprobs
from lit_rlft.step.update import PolicyUpdater, TorchBackend, reference_logprobs
from tests.step.test_batching import _assert_same, _policy, _rollouts
from tests.step.test_shared_prompt import LOSSES

RTOL = 1e-5


# -- the maths: chunks of a linear head ------------------------------------------------------------------------------
def test_chunked_logprobs_equal_the_full_logits_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    head = nn.Linear(16, 50, bias=True)
    hidden = torch.randn(23, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (23,), generator=g)
    calls: list[int] = []
    handle = head.register_forward_hook(lambda m, a, out: calls.append(out.shape[0]))
    lp, ent = chunked_logprobs(hidden, head, targets, temperature=0.7, chunk_tokens=5, entropy_grad=True)
    handle.remove()
    assert calls == [5, 5, 5, 5, 3]  # the forward: one chunk of logits at a time
    (lp.sum() + 0.3 * ent.sum()).backward()
    chunked = {"hidden": hidden.grad.clone(), **{n: p.grad.clone() for n, p in head.named_parameters()}}
    hidden.grad = None
    head.zero_grad()
    full_lp, full_ent = completion_logprobs(head(hidden)[None], targets[None], 0.7, entropy_grad=True)
    torch.testing.assert_close(lp, full_lp[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent, full_ent[0], rtol=1e-6, atol=1e-6)
    (full_lp.sum() + 0.3 * full_ent.sum()).backward()
    full = {"hidden": hidden.grad, **{n: p.grad for n, p in head.named_parameters()}}
    _assert_same(full, chunked, rtol=1e-6)
    # by hand, one position: log softmax(W h + b)[t] / T
    z = (head.weight @ hidden[3] + head.bias) / 0.7
    assert lp[3].item() == pytest.approx((z[targets[3]] - torch.logsumexp(z, 0)).item(), rel=1e-6)


def test_the_backward_recomputes_each_chunk_and_keeps_no_logits():
    """Under autograd the forward keeps each chunk's hidden states, not its logits: the head runs once per chunk in
    the forward and once more per chunk in the backward."""
    head = nn.Linear(8, 30)
    hidden = torch.randn(10, 8, requires_grad=True)
    targets = torch.randint(0, 30, (10,))
    calls: list[int] = []
    handle = head.register_forward_hook(lambda m, a, out: calls.append(out.shape[0]))
    lp, _ = chunked_logprobs(hidden, head, targets, chunk_tokens=4, with_entropy=False)
    forward_calls = list(calls)
    lp.sum().backward()
    assert forward_calls == [4, 4, 2] and calls == [4, 4, 2, 2, 4, 4]  # the backward goes last chunk first
    with torch.no_grad():
        calls.clear()
        chunked_logprobs(hidden, head, targets, chunk_tokens=4)
    handle.remove()
    assert calls == [4, 4, 2]  # without autograd: no checkpoint, nothing recomputed


def test_without_entropy_nothing_is_returned_and_bad_input_is_named():
    head = nn.Linear(4, 6)
    lp, ent = chunked_logprobs(torch.randn(3, 4), head, torch.tensor([0, 5, 2]), chunk_tokens=2, with_entropy=False)
    assert ent is None and lp.shape == (3,)
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_logprobs(torch.randn(3, 4), head, torch.tensor([0, 5, 2]), chunk_tokens=0)
    with pytest.raises(ValueError, match="temperature"):  # before any chunk, with or without entropies
        chunked_logprobs(torch.randn(3, 4), head, torch.tensor([0, 5, 2]), temperature=0.0, with_entropy=False)
    with pytest.raises(ValueError, match=r"\[K, H\]"):
        chunked_logprobs(torch.randn(1, 3, 4), head, torch.tensor([0, 5, 2]))


def test_auto_chunks_hold_at_most_2_26_logits():
    assert resolve_chunk_tokens("auto", 151_936) == 441 == AUTO_CHUNK_LOGITS // 151_936
    assert resolve_chunk_tokens("auto", 49_152) == 1_365
    assert resolve_chunk_tokens(None, 151_936) is None and resolve_chunk_tokens(0, 10) is None
    assert resolve_chunk_tokens(64, 151_936) == 64


# -- the passes: padded, packed, shared-prompt -------------------------------------------------------------------------
@pytest.mark.parametrize("layout", [{}, {"trim": True}, {"packed": True}, {"grouped": True}],
                         ids=["padded", "trimmed", "packed", "shared-prompt"])
def test_each_pass_gives_the_full_logits_log_probs_entropies_and_gradients(layout, monkeypatch):
    policy, roll = _policy().train(), _rollouts()
    rows = torch.tensor([4, 0, 11, 3, 5, 1, 9, 2])
    m = roll.completion_mask[rows].bool()
    head, linear, head_rows = policy.get_output_embeddings(), nn.Linear.forward, []

    def counted(self, x):
        out = linear(self, x)
        if self is head:
            head_rows.append(out.shape[:-1].numel())
        return out

    monkeypatch.setattr(nn.Linear, "forward", counted)
    lp, ent = sequence_logprobs(policy, roll, rows, 0.8, "cpu", with_entropy=True, logprob_chunk_tokens=7, **layout)
    chunks, head_rows[:] = list(head_rows), []
    (lp[m].sum() + ent[m].sum()).backward()  # the entropy is a diagnostic here: no gradient
    assert sorted(head_rows) == sorted(chunks)  # the backward recomputes each chunk once
    head_rows[:] = []
    chunked = {n: p.grad.clone() for n, p in policy.named_parameters()}
    policy.zero_grad()
    full_lp, full_ent = sequence_logprobs(policy, roll, rows, 0.8, "cpu", with_entropy=True, **layout)
    monkeypatch.undo()
    # chunks of 7 over the full pass's positions (less the padded pass's last, which predicts nothing)
    assert len(head_rows) == 1 and max(chunks) == 7
    assert sum(chunks) == head_rows[0] - (len(rows) if not layout.get("packed") and not layout.get("grouped") else 0)
    torch.testing.assert_close(lp, full_lp, rtol=RTOL, atol=1e-6)  # padding positions too (0 where packed)
    torch.testing.assert_close(ent, full_ent, rtol=RTOL, atol=1e-6)
    full_lp[m].sum().backward()
    _assert_same({n: p.grad for n, p in policy.named_parameters()}, chunked, rtol=RTOL)


def test_a_pass_within_one_chunk_is_the_full_logits_pass_bit_for_bit():
    policy, roll = _policy().eval(), _rollouts()
    rows = torch.arange(12)
    with torch.no_grad():
        full = sequence_logprobs(policy, roll, rows, 1.0, "cpu", with_entropy=True)
        one_chunk = sequence_logprobs(policy, roll, rows, 1.0, "cpu", with_entropy=True, logprob_chunk_tokens=10_000)
        auto = sequence_logprobs(policy, roll, rows, 1.0, "cpu", with_entropy=True, logprob_chunk_tokens="auto")
    for other in (one_chunk, auto):  # the tiny vocabulary's auto chunk holds the whole pass
        assert torch.equal(other[0], full[0]) and torch.equal(other[1], full[1])


# -- the update: every loss, micro-batches, KL, replay, LoRA, checkpointing --------------------------------------------
def _update_grads(updater: PolicyUpdater, roll, ref: bool = False, **policy_kw) -> dict:
    """The gradient of one update of a fresh policy, the KL's reference log-probs from :func:`reference_logprobs`
    (so the reference pass is the updater's, chunked or not)."""
    policy = _policy(0, **policy_kw).train()
    captured: dict[str, torch.Tensor] = {}

    class Capture(torch.optim.SGD):
        def step(self, closure=None):
            captured.update({n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None})

    backend = TorchBackend(policy, Capture([p for p in policy.parameters() if p.requires_grad], lr=0.0))
    reference = _policy(1).eval() if ref else None
    updater.update(roll, torch.randn(roll.completion_tokens.shape[0], generator=torch.Generator().manual_seed(1)),
                   backend, ref_logprobs=reference_logprobs(updater, reference, policy, torch.device("cpu")))
    return captured


@pytest.mark.parametrize("micro", ["rows", "tokens"])
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_the_update_equals_the_full_logits_one_for_every_loss(name, micro):
    """Replayed groups among the fresh ones; two iterations of two mini-batches (pi_old from its own, chunked pass);
    the KL's reference pass chunked too; packed passes with token micro-batches."""
    loss = LOSSES[name]
    roll = _rollouts(B=4, G=3, replay=True)
    split = {"micro_batch_size": 4} if micro == "rows" else {"micro_batch_tokens": 60, "padding_free": True}
    options = dict(num_iterations=2, num_mini_batches=2, shared_prompt=False, **split)
    full = _update_grads(PolicyUpdater(loss, 1.0, **options, logprob_chunk_tokens=None), roll, ref=loss.beta > 0)
    chunked = _update_grads(PolicyUpdater(loss, 1.0, **options, logprob_chunk_tokens=5), roll, ref=loss.beta > 0)
    _assert_same(full, chunked, rtol=RTOL)


@pytest.mark.parametrize("kw", [{"gradient_checkpointing": True}, {"lora": LoRAConfig(r=4, alpha=8)},
                                {"lora": LoRAConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "lm_head"])}],
                         ids=["checkpointing", "lora", "lora-on-the-head"])
def test_the_update_equals_the_full_logits_one_with_checkpointing_lora_and_shared_prompts(kw):
    """With a KL term: a frozen copy's chunked pass, or (LoRA) the policy's own with its adapters disabled."""
    roll, loss, ref = _rollouts(), GRPOLoss(loss_type="dapo", beta=0.04), "lora" not in kw
    for shared in (False, True):
        options = dict(micro_batch_size=6, shared_prompt=shared)
        full = _update_grads(PolicyUpdater(loss, 1.0, logprob_chunk_tokens=None, **options), roll, ref, **kw)
        chunked = _update_grads(PolicyUpdater(loss, 1.0, logprob_chunk_tokens=6, **options), roll, ref, **kw)
        _assert_same(full, chunked, rtol=RTOL)
        if "lm_head" in str(kw.get("lora")):
            assert any("lm_head" in n for n in full)  # the LoRA head's own adapter trains, through the chunks


# -- memory: no chunk's worth more of logits at Qwen2's vocabulary ---------------------------------------------------
class LargestTensor(TorchDispatchMode):
    """The largest tensor (in elements) any op makes while active, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_an_update_at_qwen2_s_vocabulary_never_holds_more_than_a_chunk_of_logits():
    """Vocabulary 151,936, 4 rows of 96 completion tokens (384 positions), chunks of 32: the largest tensor of the
    chunked update (forward, loss, backward) is one chunk's logits, against 384 positions' worth in the full one."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab, hidden = 151_936, 16
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=hidden, tie_word_embeddings=True)
    roll = _rollouts(B=2, G=2, P=5, L=96)
    roll.completion_tokens[:] = torch.randint(3, vocab, roll.completion_tokens.shape) * roll.completion_mask
    roll.completion_mask[:] = 1
    positions = roll.completion_mask.numel()
    largest = {}
    for chunk in (None, 32):
        policy = Qwen2ForCausalLM(config).train()
        backend = TorchBackend(policy, torch.optim.SGD(policy.parameters(), lr=0.0))
        with LargestTensor() as seen:
            PolicyUpdater(GRPOLoss(loss_type="dapo"), 1.0, logprob_chunk_tokens=chunk, shared_prompt=False).update(
                roll, torch.randn(4), backend)
        largest[chunk] = seen.largest
    assert largest[None] >= positions * vocab  # the full pass: every position's logits at once
    assert largest[32] <= max(32 * vocab, vocab * hidden)  # one chunk's logits (or the embedding itself)


# -- the option ------------------------------------------------------------------------------------------------------
def test_the_option_takes_a_positive_count_auto_or_null():
    assert OptimConfig().logprob_chunk_tokens == "auto"
    for ok in (None, 0, 1, 4096, "auto"):
        OptimConfig(logprob_chunk_tokens=ok)
    for bad in (-1, "yes", 1.5, True):
        with pytest.raises(ValueError, match="model.optim.logprob_chunk_tokens"):
            OptimConfig(logprob_chunk_tokens=bad)


def test_a_model_that_changes_its_head_s_output_is_refused_with_the_option_named():
    """Soft-capped or scaled logits (Gemma 2's, Cohere's) are not the head's output: the chunks cannot give them."""

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = nn.Embedding(20, 8), nn.Linear(8, 20)

        def get_output_embeddings(self) -> nn.Module:
            return self.head

        def forward(self, input_ids, **_):
            return SimpleNamespace(logits=self.head(self.embed(input_ids)) * 0.5)

    model = Scaled()
    ids = torch.randint(0, 20, (1, 6))
    with pytest.raises(RuntimeError, match="logprob_chunk_tokens.*soft-capping or scaling"):
        head_logprobs(model, lambda: model(ids), lambda h: h[0], ids[0], 1.0, 2, True, False)
    assert "forward" not in model.head.__dict__  # the head's own forward is back
    with pytest.raises(ValueError, match="no output embedding"):
        head_logprobs(nn.Linear(2, 2), lambda: None, lambda h: h, ids[0], 1.0, 2, True, False)
