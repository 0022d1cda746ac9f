"""hf_weights: the policy's weights as an HF state dict, LoRA merged on the fly (what vLLM loads)."""

from __future__ import annotations

import copy

import torch

from lit_rlft.models.export import hf_weight_shapes, hf_weights, save_hf_checkpoint
from lit_rlft.models.loading import LoRAConfig, apply_lora, load_model
from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2
from tests.conftest import TINY_SMALL


def _lora_policy():
    policy = apply_lora(tiny_qwen2(char_tokenizer(), TinyConfig(**TINY_SMALL)), LoRAConfig(r=4, alpha=8))
    with torch.no_grad():  # lora_B starts at 0: give the adapters a real effect
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return policy


def test_merged_lora_weights_equal_peft_merge_and_unload_and_leave_the_adapters_alone():
    policy = _lora_policy()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    merged = dict(hf_weights(policy))
    reference = copy.deepcopy(policy).merge_and_unload().state_dict()  # lm_head.weight included (tied)
    assert merged.keys() == reference.keys()
    for name, t in merged.items():
        assert torch.allclose(t, reference[name], atol=1e-6), name
    assert any(not torch.equal(merged[n], policy.get_base_model().state_dict()[n.replace("q_proj.", "q_proj.base_layer.")])
               for n in merged if "q_proj.weight" in n)  # the merge did something
    assert all(torch.equal(before[n], p) for n, p in policy.named_parameters())  # the policy is unchanged
    assert hf_weight_shapes(policy) == {n: tuple(t.shape) for n, t in merged.items()}


def test_saved_checkpoint_loads_back_as_the_merged_model(tmp_path):
    policy = _lora_policy()
    save_hf_checkpoint(policy, str(tmp_path))
    loaded = load_model(str(tmp_path))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-5)


def test_the_base_checkpoint_holds_the_frozen_base_without_the_adapters(tmp_path):
    """``merge_lora=False`` (what VLLMEngine's adapter sync loads): every base weight as it is, nothing merged."""
    from safetensors.torch import load_file

    policy = _lora_policy()
    save_hf_checkpoint(policy, str(tmp_path), merge_lora=False)
    saved = load_file(str(tmp_path / "model.safetensors"))
    base = copy.deepcopy(policy).unload().state_dict()  # the base model, adapters dropped unmerged
    assert saved.keys() == base.keys() and not any("lora_" in k for k in saved)
    assert all(torch.equal(saved[n], base[n]) for n in saved)
