"""Checkpoint-safe state: Lightning loads checkpoints with ``torch.load(weights_only=True)``, which refuses numpy
arrays. Strategy cores keep numpy state; these helpers wrap arrays as tensors on the way in and back out."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

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
