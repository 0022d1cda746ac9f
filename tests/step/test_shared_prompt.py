"""Shared-prompt passes (``model.optim.shared_prompt``): each group's prompt computed once per micro-batch, its
completions attending to it. Against the per-row pass: the same log-probs and entropies, and for every loss type and
aggregation, micro-batched by rows and by tokens, with KL, replayed groups, groups of different sizes, multi-turn
observations, gradient checkpointing and LoRA, the same loss and gradient of every parameter.

Tolerance: 1e-5 relative (per tensor), against rounding: the grouped forward sums attention over other key sets and
reduces in other shapes than the per-row one (measured: 5e-7 on a log-prob, 1.1e-6 relative on a gradient; float32,
CPU). The 2-rank versions (DDP; FSDP2 with checkpointing) are in tests/distributed/test_multiprocess.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from lit_rlft.core.losses import GRPOLoss
from lit_rlft.core.types import Rollouts
from lit_rlft.models.loading import LoRAConfig
from lit_rlft.step.config import OptimConfig
from lit_rlft.step.passes import group_segments, sequence_logprobs
from lit_rlft.step.update import PolicyUpdater
from tests.step.test_batching import _assert_same, _grads, _policy, _rollouts

RTOL = 1e-5


def test_log_probs_and_entropies_equal_the_per_row_pass_in_any_row_order():
    policy, roll = _policy().eval(), _rollouts(B=4, G=3)
    m = roll.completion_mask.bool()
    for rows in (torch.arange(12), torch.tensor([4, 0, 11, 3, 5, 1, 9]), torch.tensor([7])):
        with torch.no_grad():
            per_row, ent = sequence_logprobs(policy, roll, rows, 0.8, "cpu", with_entropy=True)
            grouped, ent_g = sequence_logprobs(policy, roll, rows, 0.8, "cpu", with_entropy=True, grouped=True)
        mr = m[rows]
        torch.testing.assert_close(grouped[mr], per_row[mr], rtol=RTOL, atol=1e-6)
        torch.testing.assert_close(ent_g[mr], ent[mr], rtol=RTOL, atol=1e-6)
        assert (grouped[~mr] == 0).all()


def test_each_group_s_prompt_is_computed_once_and_logits_only_where_completions_are_predicted():
    policy, roll = _policy().eval(), _rollouts(B=2, G=3)
    inputs: list[torch.Tensor] = []
    heads: list[tuple[int, ...]] = []
    h1 = policy.get_input_embeddings().register_forward_pre_hook(lambda m, a: inputs.append(a[0]))
    h2 = policy.get_output_embeddings().register_forward_hook(lambda m, a, out: heads.append(tuple(out.shape)))
    rows = torch.arange(3)  # one group: one segment, one bin
    with torch.no_grad():
        sequence_logprobs(policy, roll, rows, 1.0, "cpu", grouped=True)
    h1.remove()
    h2.remove()
    p = int(roll.prompt_mask[0].sum())
    lengths = roll.completion_mask[rows].sum(1)
    assert tuple(inputs[0].shape) == (1, p + int(lengths.sum()))  # the prompt once: p + sum l_i positions
    assert heads == [(1, int(lengths.sum()), policy.get_output_embeddings().weight.shape[0])]
    (prompt, comps), = group_segments(roll, rows)
    assert len(prompt) == p and [k for k, _ in comps] == [0, 1, 2]
    other = roll.prompt_tokens.clone()
    other[1, -1] += 1  # row 1's prompt differs from its group's: a segment of its own
    roll.prompt_tokens = other
    assert [[k for k, _ in comps] for _, comps in group_segments(roll, rows)] == [[0, 2], [1]]


LOSSES = {
    "grpo": GRPOLoss(loss_type="grpo"),
    "dapo": GRPOLoss(loss_type="dapo"),
    "dr_grpo+kl": GRPOLoss(loss_type="dr_grpo", max_completion_length=12, beta=0.04),
    "bnpo": GRPOLoss(loss_type="bnpo"),
    "cispo": GRPOLoss(loss_type="cispo"),
    "sapo": GRPOLoss(loss_type="sapo"),
    "luspo": GRPOLoss(loss_type="luspo"),
    "vespo": GRPOLoss(loss_type="vespo"),
    "gspo": GRPOLoss(loss_type="grpo", importance_sampling_level="sequence"),
    "dapo+entropy": GRPOLoss(loss_type="dapo", entropy_coef=0.05, top_entropy_quantile=0.5),
}


@pytest.mark.parametrize("micro", ["rows", "tokens"])
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_the_update_equals_the_per_row_one_for_every_loss(name, micro):
    """Replayed groups among the fresh ones; two iterations of two mini-batches (so pi_old comes from its own pass and
    groups are cut across micro-batches); the KL's reference pass grouped too."""
    loss = LOSSES[name]
    roll = _rollouts(B=4, G=3, replay=True)
    split = {"micro_batch_size": 4} if micro == "rows" else {"micro_batch_tokens": 60}
    options = dict(num_iterations=2, num_mini_batches=2, **split)
    per_row = _grads(PolicyUpdater(loss, 1.0, **options, shared_prompt=False), roll, ref=loss.beta > 0)
    grouped = _grads(PolicyUpdater(loss, 1.0, shared_prompt=True, **options), roll, ref=loss.beta > 0)
    _assert_same(per_row, grouped, rtol=RTOL)


@pytest.mark.parametrize("kw", [{"gradient_checkpointing": True}, {"lora": LoRAConfig(r=4, alpha=8)},
                                {"lora": LoRAConfig(r=4, alpha=8), "gradient_checkpointing": True}],
                         ids=["checkpointing", "lora", "lora+checkpointing"])
def test_the_update_equals_the_per_row_one_with_checkpointing_and_lora(kw):
    roll, loss = _rollouts(), GRPOLoss(loss_type="dapo")
    per_row = _grads(PolicyUpdater(loss, 1.0, micro_batch_size=6, shared_prompt=False), roll, **kw)
    grouped = _grads(PolicyUpdater(loss, 1.0, micro_batch_size=6, shared_prompt=True), roll, **kw)
    _assert_same(per_row, grouped, rtol=RTOL)


def test_the_update_equals_the_per_row_one_with_groups_of_different_sizes_and_observations():
    """Groups of 3, 1, 2 and 3 real completions (padding rows never passed), and completions holding observation
    tokens (attended to, left out of the loss)."""
    from tests.step.test_ragged import ragged_batch

    roll = ragged_batch()
    G = roll.group_size
    for b in range(roll.num_groups):  # a GRPO batch: a group's rows share its prompt
        roll.prompt_tokens[b * G : (b + 1) * G] = roll.prompt_tokens[b * G]
    policy_mask = roll.completion_mask.clone()
    policy_mask[:, 2:4] = 0  # an observation inside every completion: context, not loss
    roll.policy_mask = policy_mask * roll.completion_mask
    loss = GRPOLoss(loss_type="dapo")
    per_row = _grads(PolicyUpdater(loss, 1.0, micro_batch_size=4, shared_prompt=False), roll)
    grouped = _grads(PolicyUpdater(loss, 1.0, micro_batch_size=4, shared_prompt=True), roll)
    _assert_same(per_row, grouped, rtol=RTOL)


def test_a_model_whose_attention_cannot_group_falls_back_with_one_warning(monkeypatch):
    loss = GRPOLoss(loss_type="dapo")
    policy = _policy().train()
    monkeypatch.setattr(policy.config, "_attn_implementation", "flash_attention_2")
    updater = PolicyUpdater(loss, 1.0, shared_prompt="auto")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert updater.grouped(policy) is False and updater.grouped(policy) is False
    assert [str(w.message) for w in caught if "shared_prompt" in str(w.message)] == [
        "model.optim.shared_prompt='auto': Qwen2ForCausalLM runs per-row passes: its attention implementation is "
        "'flash_attention_2', which takes no 4-D mask (shared-prompt passes need one of sdpa, eager, flex_attention)"]
    monkeypatch.setattr(policy.config, "_attn_implementation", "sdpa")
    assert PolicyUpdater(loss, 1.0, shared_prompt="auto").grouped(policy) is True
    assert PolicyUpdater(loss, 1.0).grouped(policy) is True  # auto by default
    assert PolicyUpdater(loss, 1.0, shared_prompt=False).grouped(policy) is False  # the per-row pass, bit for bit


def _family_policy(family: str) -> torch.nn.Module:
    """A tiny, seeded causal LM of one of the model families ``auto`` turns shared-prompt passes on for (or GPT-2's,
    which it does not)."""
    import transformers

    size = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                intermediate_size=128, max_position_embeddings=128)
    configs = {"llama": transformers.LlamaConfig(**size), "qwen3": transformers.Qwen3Config(**size, head_dim=32),
               "mistral": transformers.MistralConfig(**size),
               "gpt2": transformers.GPT2Config(vocab_size=96, n_embd=64, n_layer=2, n_head=2, n_positions=128)}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(configs[family], attn_implementation="sdpa")
    with torch.no_grad():  # weights large enough that a wrong position or mask shows in the log-probs
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    return model.eval()


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
def test_the_model_families_auto_turns_on_for_give_the_per_row_log_probs(family):
    """Llama (SmolLM2's architecture), Qwen3 and Mistral, like Qwen2 above: RoPE positions continue from the prompt in
    every completion and the block mask keeps completions apart. (GPT-2's learned positions are untested: auto leaves
    it per-row.)"""
    policy, roll = _family_policy(family), _rollouts(B=3, G=4)
    m = roll.completion_mask.bool()
    with torch.no_grad():
        per_row, _ = sequence_logprobs(policy, roll, torch.arange(12), 1.0, "cpu")
        grouped, _ = sequence_logprobs(policy, roll, torch.arange(12), 1.0, "cpu", grouped=True)
        shifted, _ = sequence_logprobs(policy, roll, torch.arange(12), 1.0, "cpu", packed=True)
    torch.testing.assert_close(grouped[m], per_row[m], rtol=RTOL, atol=1e-5)
    torch.testing.assert_close(shifted[m], per_row[m], rtol=RTOL, atol=1e-5)
    assert PolicyUpdater(GRPOLoss(), 1.0).grouped(policy) is True


def test_auto_leaves_an_unverified_family_per_row_and_true_runs_it():
    policy = _family_policy("gpt2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert PolicyUpdater(GRPOLoss(), 1.0, shared_prompt="auto").grouped(policy) is False
    assert any("proven exact" in str(w.message) and "'gpt2'" in str(w.message) for w in caught)
    assert PolicyUpdater(GRPOLoss(), 1.0, shared_prompt=True).grouped(policy) is True


def test_the_option_takes_true_false_or_auto():
    assert OptimConfig(shared_prompt="auto").shared_prompt == "auto"
    with pytest.raises(ValueError, match="model.optim.shared_prompt must be true, false or auto"):
        OptimConfig(shared_prompt="yes")


def _one_group(completion_length: int, width: int | None = None) -> Rollouts:
    """One group of 2 completions of ``completion_length`` tokens (padded to ``width``) after a 3-token prompt."""
    prompt = torch.tensor([[5, 6, 7]]).repeat(2, 1)
    width = width or completion_length
    return Rollouts(prompt_ids=torch.arange(1), prompt_tokens=prompt, prompt_mask=torch.ones_like(prompt),
                    completion_tokens=torch.full((2, width), 9),
                    completion_mask=(torch.arange(width) < completion_length).long().repeat(2, 1),
                    rewards=torch.zeros(1, 2),
                    correct=torch.zeros(1, 2, dtype=torch.bool), birth_step=torch.zeros(1, dtype=torch.long),
                    is_replay=torch.zeros(1, dtype=torch.bool), truncated=torch.zeros(2, dtype=torch.bool))


def test_auto_groups_where_the_grouped_pass_costs_fewer_flops():
    """h = 2, I = 4, one head of 2, one k/v head: c_lin = 2 (2*4 + 2*2*2 + 3*2*4) = 80 per position, c_att = 4*1*2 = 8
    per query-key pair. Completions of 1 token: per-row 2 x (4*80 + 4^2*8) = 896 against one segment of 5 tokens,
    5*80 + 5^2*8 = 600: it pays. Completions of 10: per-row 2 x (13*80 + 13^2*8) = 4,784 against 23*80 + 23^2*8 =
    6,072: it does not (the segment attends to itself whole, masked pairs included). Completions of 10 padded to 30:
    the padded per-row pass computes 2 x (33*80 + 33^2*8) = 22,704, so grouping pays; against the trimmed or packed
    per-row pass (4,784) it does not."""
    from types import SimpleNamespace

    from lit_rlft.step.passes import grouping_pays

    model = torch.nn.Linear(1, 1)
    model.config = SimpleNamespace(hidden_size=2, intermediate_size=4, num_attention_heads=1, num_key_value_heads=1,
                                   head_dim=2)
    assert grouping_pays(model, _one_group(1), torch.arange(2)) is True
    assert grouping_pays(model, _one_group(10), torch.arange(2)) is False
    assert grouping_pays(model, _one_group(10, width=30), torch.arange(2)) is True
    assert grouping_pays(model, _one_group(10, width=30), torch.arange(2), trim=True) is False
    assert grouping_pays(model, _one_group(10, width=30), torch.arange(2), packed=True) is False


def test_auto_runs_the_per_row_pass_bit_for_bit_where_grouping_does_not_pay():
    """Long completions in a large group: auto keeps the per-row pass (the same gradient, bit for bit, as
    ``shared_prompt: false``); ``true`` groups anyway (equal within the tolerance)."""
    from lit_rlft.step.passes import grouping_pays

    loss, roll = GRPOLoss(loss_type="dapo"), _rollouts(B=2, G=8, P=3, L=60)
    assert not grouping_pays(_policy(), roll, torch.arange(16))
    per_row = _grads(PolicyUpdater(loss, 1.0, shared_prompt=False), roll)
    auto = _grads(PolicyUpdater(loss, 1.0, shared_prompt="auto"), roll)
    forced = _grads(PolicyUpdater(loss, 1.0, shared_prompt=True), roll)
    assert all(torch.equal(per_row[n], auto[n]) for n in per_row)
    assert not all(torch.equal(per_row[n], forced[n]) for n in per_row)
    _assert_same(per_row, forced, rtol=RTOL)


def test_flex_attention_takes_the_mask_as_a_block_mask_and_gives_the_per_row_log_probs():
    """With ``attn_implementation="flex_attention"`` the grouped pass hands FlexAttention a ``BlockMask`` (its kernel
    skips the blocks no query attends in: the GPU path). FlexAttention has no backward on a CPU, so this checks the
    no-grad passes (reference, old policy) here; ``scripts/gpu_check.py`` (check 9) checks the gradients on a GPU.
    The first call compiles the kernel (about 10 s)."""
    from torch.nn.attention.flex_attention import BlockMask

    from lit_rlft.step import passes as batching

    policy, roll = _policy().eval(), _rollouts(B=3, G=3)
    rows, m = torch.arange(9), roll.completion_mask.bool()
    with torch.no_grad():
        per_row, ent = sequence_logprobs(policy, roll, rows, 0.8, "cpu", with_entropy=True)
        policy.set_attn_implementation("flex_attention")
        masks = []
        real = batching._block_mask
        batching._block_mask = lambda segment, part: masks.append(real(segment, part)) or masks[-1]
        try:
            flex, ent_f = sequence_logprobs(policy, roll, rows, 0.8, "cpu", with_entropy=True, grouped=True)
        finally:
            batching._block_mask = real
    assert len(masks) == 1 and isinstance(masks[0], BlockMask)
    torch.testing.assert_close(flex[m], per_row[m], rtol=RTOL, atol=1e-6)
    torch.testing.assert_close(ent_f[m], ent[m], rtol=RTOL, atol=1e-6)
    dense = batching._dense_block_mask(torch.tensor([[0, 0, 0, 0, -1]]), torch.tensor([[0, 1, 1, 2, -1]]))
    assert dense[0].long().tolist() == [[1, 0, 0, 0, 0],  # the prompt
                                        [1, 1, 0, 0, 0],  # completion 1: the prompt and itself
                                        [1, 1, 1, 0, 0],
                                        [1, 0, 0, 1, 0],  # completion 2: the prompt and itself, not completion 1
                                        [0, 0, 0, 0, 1]]  # the bin's tail: itself
