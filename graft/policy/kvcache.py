"""A KV cache for graft's sampler whose layers append in place.

transformers' ``DynamicCache`` appends a token by ``torch.cat`` of the whole cached history
with the new keys/values: at every decoding step each layer copies its entire cache
(measured: 25-32% of a rollout's CPU time for the default pair). The layers here keep keys and
values in a preallocated buffer [B, heads, capacity, head_dim] (grown by doubling if ever
needed) and write only the new positions; attention reads a view of the filled part. Rows
leaving the batch (finished samples) are dropped by indexing the buffers, as before.

Sliding-window layers report the same mask sizes as ``DynamicSlidingWindowLayer`` and return
the same window of states (the last ``window - 1`` cached positions plus the new ones), so the
attention sees exactly what it saw with the dynamic cache; the older positions simply stay in
the buffer unused.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


class _Buffers:
    """Keys/values of one layer in preallocated buffers, appended in place."""

    # Declarations only (no class values): ``capacity`` is set by the subclass, the buffers on the first append;
    # ``keys``/``values`` are the cache layer's, typed as in transformers' ``CacheLayerMixin``.
    capacity: int
    keys: torch.Tensor | None
    values: torch.Tensor | None
    _k: torch.Tensor
    _v: torch.Tensor
    _len: int

    def _append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> int:
        n = key_states.shape[-2]
        if getattr(self, "_k", None) is None:
            B, H, _, D = key_states.shape
            cap = max(self.capacity, n)
            self._k = key_states.new_empty((B, H, cap, D))
            self._v = value_states.new_empty((B, value_states.shape[1], cap, value_states.shape[-1]))
            self._len = 0
        if self._len + n > self._k.shape[2]:
            grow = max(self._k.shape[2], n)
            self._k = torch.cat([self._k, self._k.new_empty(self._k.shape[:2] + (grow,) + self._k.shape[3:])], dim=2)
            self._v = torch.cat([self._v, self._v.new_empty(self._v.shape[:2] + (grow,) + self._v.shape[3:])], dim=2)
        self._k[:, :, self._len : self._len + n] = key_states
        self._v[:, :, self._len : self._len + n] = value_states
        self._len += n
        return self._len

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if getattr(self, "_k", None) is not None:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[:, :, : self._len], self._v[:, :, : self._len]


class BufferedLayer(_Buffers, DynamicLayer):
    """``DynamicLayer`` semantics, in-place appends."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self._append(key_states, value_states)
        self.keys, self.values = self._k[:, :, :length], self._v[:, :, :length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return getattr(self, "_len", 0)


class BufferedSlidingLayer(_Buffers, DynamicSlidingWindowLayer):
    """``DynamicSlidingWindowLayer`` semantics (same mask sizes, same returned window), in-place appends."""

    def __init__(self, sliding_window: int, capacity: int) -> None:
        super().__init__(sliding_window=sliding_window)
        self.capacity = capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        before = self.cumulative_length
        self.cumulative_length += key_states.shape[-2]
        length = self._append(key_states, value_states)
        start = max(before - self.sliding_window + 1, 0)  # what DynamicSlidingWindowLayer still holds
        self.keys, self.values = self._k[:, :, start:length], self._v[:, :, start:length]
        return self.keys, self.values


def attention_span(cache: DynamicCache) -> float:
    """How many positions back every layer of ``cache`` attends: ``inf`` when all layers attend to every earlier
    position, else the narrowest sliding (or chunked) window; 0 when a layer is of another kind (a recurrent state
    would run over padding). A forward whose rows are at most this long sees the same keys whatever columns the
    padding takes."""
    span = float("inf")
    for layer in cache.layers:
        if type(layer) in (DynamicLayer, BufferedLayer):
            continue
        if not isinstance(layer, DynamicSlidingWindowLayer) or type(layer) not in (
            DynamicSlidingWindowLayer,
            BufferedSlidingLayer,
        ):
            return 0.0
        span = min(span, layer.sliding_window)
    return span


def buffered_cache(config, capacity: int):
    """A ``DynamicCache`` for ``config`` whose plain and sliding-window layers append in place
    (buffers of ``capacity`` positions: prompt + new tokens). Other layer kinds are kept as they are."""

    cache = DynamicCache(config=config)
    cache.layers = [
        BufferedSlidingLayer(layer.sliding_window, capacity)
        if type(layer) is DynamicSlidingWindowLayer
        else BufferedLayer(capacity)
        if type(layer) is DynamicLayer
        else layer
        for layer in cache.layers
    ]
    return cache
