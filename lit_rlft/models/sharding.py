"""FSDP2 for the policy (``torch.distributed.fsdp.fully_shard``), and a check on low-precision master weights.

``ModelParallelStrategy`` (Lightning's FSDP2 strategy, which also runs on CPU with gloo) hands ``configure_model`` a
device mesh; :func:`fully_shard_policy` shards each decoder layer and then the HF model around them. With peft the
adapters are added first and the *inner* HF model is the root: ``generate`` and the training forward both enter
through its ``forward``, where FSDP2 gathers the root's own parameters (embeddings, final norm, tied LM head).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


def hf_model(policy: nn.Module) -> nn.Module:
    """The ``transformers`` model inside a policy (itself, or the base model of a peft wrapper)."""
    get_base = getattr(policy, "get_base_model", None)
    return get_base() if callable(get_base) else policy


def fully_shard_policy(policy: nn.Module, mesh: Any, mp_policy: Any = None) -> None:
    """Shard ``policy`` in place with FSDP2 over ``mesh``: one unit per decoder layer, then the HF model.

    Decoder layers are the modules whose class is in the model's ``_no_split_modules`` (``Qwen2DecoderLayer``, ...).

    Raises:
        ValueError: the model names no decoder-layer class, or none is found.
    """
    from torch.distributed.fsdp import fully_shard

    model = hf_model(policy)
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(f"cannot shard {type(model).__name__} with FSDP2: no decoder layers of the classes "
                         f"{sorted(layer_classes) or '(none listed in _no_split_modules)'} found")
    kwargs = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def data_parallel_mesh(mesh: Any) -> Any:
    """The 1-D data-parallel mesh of a strategy's device mesh (FSDP2 shards over it); refuses tensor parallelism.

    Lightning's ``ModelParallelStrategy`` names its dimensions ``data_parallel`` and ``tensor_parallel``.
    """
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if "tensor_parallel" in names and mesh["tensor_parallel"].size() != 1:
        raise ValueError("ModelParallelStrategy: lit_rlft shards the policy with FSDP2 only; set tensor_parallel_size: "
                         "1 (and data_parallel_size to the number of devices)")
    return mesh["data_parallel"] if "data_parallel" in names else mesh



def is_sharded(policy: nn.Module | None) -> bool:
    """Whether ``policy`` was sharded with FSDP2."""
    if policy is None:
        return False
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return isinstance(hf_model(policy), FSDPModule)


@contextmanager
def fsdp_no_sync(policy: nn.Module) -> Iterator[None]:
    """Accumulate gradients locally in the backward passes inside (FSDP2 reduce-scatters on the next synced one)."""
    model = hf_model(policy)
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def low_precision_warning(policy: nn.Module, learning_rate: float) -> str | None:
    """A warning when AdamW would update bfloat16 / float16 weights in place (no float32 master copy).

    With 8 bits of mantissa, a weight of magnitude ``|w|`` moves only if the update exceeds about ``|w| / 256``:
    at GRPO's usual learning rates (1e-6) most updates round to nothing (one step of the 1.5B recipe in pure bf16
    changed 1.9% of the weights, against 100% in float32). ``trainer.precision: bf16-mixed`` with ``dtype:
    float32`` keeps float32 master weights and computes in bfloat16.
    """
    low = {p.dtype for p in policy.parameters() if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)}
    if not low:
        return None
    names = ", ".join(sorted(str(d).replace("torch.", "") for d in low))
    return (f"GRPOModule: the trainable weights are {names} and AdamW updates them in place (no float32 master "
            f"copy): at learning_rate={learning_rate:g} most updates round away. Use model.dtype: float32 with "
            "trainer.precision: bf16-mixed (float32 master weights, bfloat16 compute).")
