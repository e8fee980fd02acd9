"""The engine's KV cache: a transformers DynamicCache whose full-attention layers write each step's keys and values
in place into buffers with room to grow, instead of concatenating the whole cache into a new tensor every step.

torch.cat copies a sequence's whole cache per layer per step (at 1,024 tokens of the demo target, 46 MB a step,
read and written); here a step writes only its own positions and the buffer is reallocated once per GROW_TOKENS.
A layer's keys/values are views [..., :n, :] of its buffers, so everything that reads a DynamicCache (crop,
get_seq_length, the prefix cache) works unchanged.

Writing in place is safe only while no other cache views the buffer: `share` (the prefix cache lending a prefix
as views) marks both the lender and the borrower shared, and a shared layer's next update copies into a new
buffer of its own first (copy on write), so neither ever writes into positions the other reads.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# Room added past the needed length at each reallocation: bounds the unused bytes per sequence (at most this many
# tokens' worth, ~3 MB for the demo target in float32) and the reallocations (one per this many tokens decoded).
GROW_TOKENS = 64


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are views of preallocated buffers, written in place."""

    _kbuf: torch.Tensor | None = None
    _vbuf: torch.Tensor | None = None
    _owns: bool = False  # no other cache views the buffers: positions past keys' length may be written

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.get_seq_length()
        m = n + key_states.shape[-2]
        if not self._owns or self._kbuf is None or m > self._kbuf.shape[-2]:
            self._kbuf = self._grow(self._kbuf, key_states, n, m)
            self._vbuf = self._grow(self._vbuf, value_states, n, m)
            self._owns = True
        self._kbuf[..., n:m, :].copy_(key_states)
        self._vbuf[..., n:m, :].copy_(value_states)
        self.keys, self.values = self._kbuf[..., :m, :], self._vbuf[..., :m, :]
        return self.keys, self.values

    @staticmethod
    def _grow(old: torch.Tensor | None, new: torch.Tensor, n: int, m: int) -> torch.Tensor:
        """A new buffer for at least m + GROW_TOKENS positions holding old's first n."""
        buf = new.new_empty((*new.shape[:-2], m + GROW_TOKENS, new.shape[-1]))
        if n:
            buf[..., :n, :].copy_(old[..., :n, :])
        return buf

    def share(self) -> "GrowingLayer":
        """A copy viewing the same buffers; from now on neither writes into them (the next update copies)."""
        self._owns = False
        return copy.copy(self)


def new_cache(config: Any) -> DynamicCache:
    """An empty cache for a model with this config: its full-attention layers grow in place (sliding-window
    layers keep transformers' own kind, which drops old positions)."""
    cache = DynamicCache(config=config)
    if hasattr(cache, "layers"):
        cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
