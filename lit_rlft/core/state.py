"""Checkpoint-safe state: numpy arrays wrapped as tensors, so that ``torch.load(weights_only=True)`` reads them.

Lightning loads checkpoints weights-only, which refuses numpy arrays; the selection cores keep numpy state.
:func:`encode_state` wraps every array on the way into a checkpoint and :func:`decode_state` unwraps it on the way out.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["decode_state", "encode_state"]

_TAG = "__ndarray__"


def encode_state(obj: Any) -> Any:
    """Replace every numpy array (and numpy scalar) in a nested state by a weights-only-loadable equivalent."""
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise TypeError("object arrays cannot be stored in a weights-only checkpoint")
        return {_TAG: torch.from_numpy(np.ascontiguousarray(obj).copy())}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: encode_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(encode_state(v) for v in obj)
    return obj


def decode_state(obj: Any) -> Any:
    """Inverse of :func:`encode_state`."""
    if isinstance(obj, dict):
        if set(obj) == {_TAG}:
            return obj[_TAG].numpy()
        return {k: decode_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(decode_state(v) for v in obj)
    return obj
