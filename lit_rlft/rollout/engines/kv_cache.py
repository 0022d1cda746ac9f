"""A dynamic KV cache that reserves room for the tokens still to come, so that a decode step writes its key and value
into place instead of copying the whole cache.

transformers' ``DynamicLayer`` grows by ``torch.cat`` every decode step: each step copies every layer's keys and
values (``O(L^2)`` bytes over ``L`` tokens). On this project's CPU the concatenation is about 40% of a tiny policy's
decoding time (``torch.profiler`` on 128 rows x 32 tokens: ``aten::cat`` 41%, the matmuls 19%;
``benchmarks/hf_generation.py`` prints the profile). A static cache avoids the copy but attends over its whole
length every step. :class:`ReservedLayer` keeps a buffer with room for ``reserve`` more tokens and hands attention a
view of the filled part: the same keys and values, no copy, no extra attention.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import DynamicCache, DynamicLayer

__all__ = ["ReservedCache", "ReservedLayer"]


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values ``[B, H, n, D]`` are views of buffers ``[B, H, n + room, D]``;
    an update that does not fit grows the buffer by ``reserve`` tokens (one copy)."""

    def __init__(self, reserve: int):
        super().__init__()
        self.reserve = reserve
        self._keys: Tensor | None = None  # [B, H, capacity, D]
        self._values: Tensor | None = None

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.get_seq_length()
        end = n + key_states.shape[-2]
        if self._keys is None or end > self._keys.shape[-2] or self._keys.shape[0] != key_states.shape[0]:
            self._keys = self._grown(self._keys, key_states, n, end)
            self._values = self._grown(self._values, value_states, n, end)
        self._keys[..., n:end, :] = key_states
        self._values[..., n:end, :] = value_states
        self.keys, self.values = self._keys[..., :end, :], self._values[..., :end, :]
        return self.keys, self.values

    def _grown(self, buffer: Tensor | None, new: Tensor, n: int, end: int) -> Tensor:
        """A buffer with room for ``end + reserve`` tokens holding the first ``n`` cached ones."""
        out = new.new_empty((*new.shape[:2], end + self.reserve, new.shape[-1]))
        if n:
            out[..., :n, :] = (self.keys if buffer is None or buffer.shape[0] != new.shape[0] else buffer)[..., :n, :]
        return out

    def batch_select_indices(self, indices: Tensor) -> None:
        if self.get_seq_length() > 0:
            n = self.get_seq_length()
            self._keys, self._values = self._keys[indices, ...], self._values[indices, ...]
            self.keys, self.values = self._keys[..., :n, :], self._values[..., :n, :]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.batch_select_indices(torch.arange(self.keys.shape[0], device=self.keys.device).repeat_interleave(repeats))

    def reset(self) -> None:
        self._keys = self._values = None
        super().reset()


class ReservedCache(DynamicCache):
    """A ``DynamicCache`` of :class:`ReservedLayer` (sliding-window layers stay as transformers builds them).

    Args:
        config: the model's config (its layer types).
        reserve: tokens of room each layer keeps ahead (the decode steps still to come).
    """

    def __init__(self, config: Any, reserve: int):
        super().__init__(config=config)
        self.layers = [ReservedLayer(reserve) if type(layer) is DynamicLayer else layer for layer in self.layers]
