"""The policy's weights as a plain ``transformers`` state dict: what an inference engine (vLLM) loads.

:func:`hf_weights` yields ``(name, tensor)`` with the names of the HF checkpoint, whatever wraps the policy:

- peft LoRA: ``W + scaling * B @ A`` for every adapted layer (merged on the fly, the adapters themselves left
  untouched, no copy of the model), the adapter tensors left out, ``base_layer`` dropped from the names;
- FSDP2: every shard gathered (``full_tensor``), so every rank must iterate at the same time;
- tied embeddings: both names are given (vLLM's in-place reload leaves a tied output layer stale otherwise).
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import Tensor, nn

from lit_rlft.models.sharding import hf_model


def hf_weights(policy: nn.Module, merge_lora: bool = True) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` of every weight of the HF model inside ``policy``, LoRA merged (see the module docstring).

    Tensors are detached, whole, on the policy's device; merged LoRA weights are new tensors, the others are the
    parameters themselves (do not modify them). ``merge_lora=False``: the frozen base weights as they are (what an
    engine that applies the adapters itself loads).
    """
    model = hf_model(policy)
    state = model.state_dict()
    for key, value in state.items():
        if ".lora_" in key or key.endswith(".lora_magnitude_vector"):
            continue
        name = key.replace(".base_layer.", ".")
        tensor = whole(value).detach()
        if merge_lora and ".base_layer.weight" in key:
            tensor = tensor + _lora_delta(model, key[: -len(".base_layer.weight")], state).to(tensor.dtype)
        yield name, tensor


def hf_weight_shapes(policy: nn.Module) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of :func:`hf_weights` without gathering or merging anything."""
    out = {}
    for key, value in hf_model(policy).state_dict().items():
        if ".lora_" in key or key.endswith(".lora_magnitude_vector"):
            continue
        out[key.replace(".base_layer.", ".")] = tuple(value.shape)
    return out


def whole(t: Tensor) -> Tensor:
    """``t`` whole: an FSDP2 shard (DTensor) gathered from every rank (a collective), any other tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _lora_delta(model: nn.Module, prefix: str, state: dict[str, Tensor]) -> Tensor:
    """``sum over active adapters of scaling * B @ A`` ``[out, in]`` for the LoRA layer at ``prefix``."""
    layer = model.get_submodule(prefix)
    delta = None
    for adapter in getattr(layer, "active_adapters", ["default"]):
        a = whole(state[f"{prefix}.lora_A.{adapter}.weight"]).float()  # [r, in]
        b = whole(state[f"{prefix}.lora_B.{adapter}.weight"]).float()  # [out, r]
        part = (b @ a) * float(layer.scaling[adapter])  # [out, in]
        if getattr(layer, "fan_in_fan_out", False):
            part = part.T
        delta = part if delta is None else delta + part
    if delta is None:
        raise ValueError(f"{prefix}: a LoRA layer without an active adapter")
    return delta


def save_hf_checkpoint(policy: nn.Module, path: str, merge_lora: bool = True) -> None:
    """Write :func:`hf_weights` (safetensors) and the model's config and generation config to ``path``."""
    from pathlib import Path

    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model = hf_model(policy)
    weights = {name: t.to("cpu").contiguous().clone() for name, t in hf_weights(policy, merge_lora)}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(out)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(out)

