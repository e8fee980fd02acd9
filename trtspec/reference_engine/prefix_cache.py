"""Prefix KV-cache reuse (TensorRT-LLM's enable_kv_cache_reuse): KV caches keyed by the tokens they hold,
shared as views, bounded in entries and bytes, with freed memory handed back to the OS."""

from __future__ import annotations

import copy
import ctypes
import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from trtspec.reference_engine.kv_cache import GrowingLayer


def _kv_tensors(cache: Any) -> list[torch.Tensor]:
    """Every key and value tensor a DynamicCache holds (transformers >= 4.56 keeps them per layer object)."""
    if hasattr(cache, "layers"):
        return [t for layer in cache.layers for t in (layer.keys, layer.values) if t is not None]
    return [*cache.key_cache, *cache.value_cache]


def cache_nbytes(cache: Any) -> int:
    return sum(t.nbytes for t in _kv_tensors(cache))


def share_prefix(cache: Any, n: int) -> Any:
    """A new DynamicCache holding the first `n` positions of `cache` as views of its tensors (no copy).

    Safe because neither then writes into the shared tensors: transformers' DynamicLayer concatenates into new
    ones and crop() slices; the engine's GrowingLayer (kv_cache) copies on its next write once shared."""
    shared = copy.copy(cache)
    if hasattr(cache, "layers"):
        shared.layers = [layer.share() if isinstance(layer, GrowingLayer) else copy.copy(layer) for layer in cache.layers]
    else:
        shared.key_cache, shared.value_cache = list(cache.key_cache), list(cache.value_cache)
    drop = shared.get_seq_length() - n
    if drop > 0:
        shared.crop(-drop)
    return shared


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_memory() -> None:
    """Hand freed heap pages back to the OS. glibc keeps freed KV tensors (each below its mmap threshold
    once that has adapted) in its arenas, so without this a burst's peak stays the process's size."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class _DeferredTrim:
    """Runs `action` (`release_memory`) once, `delay_s` after the first request since the last run. malloc_trim walks the
    whole heap (on a large fragmented heap, a sizeable part of a decode step: docs/benchmarks/engine.md), too slow for every eviction
    of a full cache; deferred, it runs at most once per `delay_s` and always within `delay_s` of the last
    eviction, also when no request follows (the end of a burst)."""

    def __init__(self, delay_s: float = 1.0, action: Callable[[], None] = release_memory) -> None:
        self.delay_s, self.action = delay_s, action
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def request(self) -> None:
        if _malloc_trim() is None:
            return
        with self._lock:
            if self._timer is None:
                self._timer = threading.Timer(self.delay_s, self._run)
                self._timer.daemon = True
                self._timer.start()

    def _run(self) -> None:
        with self._lock:
            self._timer = None
        self.action()  # ctypes releases the GIL: the engine's thread runs on meanwhile


_TRIM = _DeferredTrim()


@dataclass
class _Entry:
    tokens: list[int]
    committed: int
    cache: Any
    nbytes: int


class PrefixCache:
    """KV caches keyed by the tokens they hold; a call uses the one sharing the longest prefix.

    An entry remembers how many of its tokens were committed (the input of the call that made it;
    the draft tokens after them may be rejected). A cache whose committed tokens the new sequence
    continues is the request's own: it is taken out while in use and put back afterwards. A cache
    that only shares a shorter prefix (another request with the same chat template or system prompt)
    is lent as views of its tensors (`share_prefix`), so concurrent requests never crop each other's caches.

    The entries held (not those taken out by running requests) are bounded by `max_entries` and by
    `max_bytes` of key/value tensors; the least recently used (put or hit by `take`) go first, and the
    freed memory is handed back to the OS.
    """

    def __init__(self, max_entries: int = 16, max_bytes: int | None = None):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: "OrderedDict[int, _Entry]" = OrderedDict()
        self._next = 0

    def take(self, tokens: Sequence[int], limit: int | None = None) -> tuple[Any | None, int]:
        """The cache for `tokens` and how many of its positions they share. `limit`: the most positions the caller
        uses (a step computes at least its last token); an entry sharing more is no better than one sharing that
        many, and on a tie the sequence's own entry (one it continues, taken rather than lent) wins. Otherwise an
        earlier run of the same sequence (a repeated prompt, greedy), whose entry holds tokens still to come, would
        lend each step its prefix, and each step's own entry would be put beside it: a request's 48 steps filled
        16 entries and evicted every other prompt."""
        cap = len(tokens) if limit is None else limit
        best_key, best_len, best_usable, best_own = None, 0, 0, False
        for key, entry in self._entries.items():
            n = _common_prefix(entry.tokens, tokens)
            own, usable = n >= entry.committed, min(n, cap)
            if usable > best_usable or (usable == best_usable and usable > 0 and own and not best_own):
                best_key, best_len, best_usable, best_own = key, n, usable, own
        if best_key is None:
            return None, 0
        entry = self._entries[best_key]
        if best_own:
            del self._entries[best_key]
            self.nbytes -= entry.nbytes
            return entry.cache, best_len
        self._entries.move_to_end(best_key)
        return share_prefix(entry.cache, best_len), best_len

    def put(self, tokens: list[int], cache: Any, committed: int | None = None) -> None:
        size = cache_nbytes(cache)
        # an entry whose committed tokens this one extends offers nothing this one does not but the KV of drafts it
        # verified (TensorRT-LLM keeps one copy of a block, and none of a rejected draft): a repeated prompt replaces
        # its earlier run's entry instead of holding a second copy of it
        stale = [key for key, e in self._entries.items() if same_prefix(e.tokens, tokens, e.committed)]
        for key in stale:
            self.nbytes -= self._entries.pop(key).nbytes
        self._entries[self._next] = _Entry(tokens, len(tokens) if committed is None else committed, cache, size)
        self._next += 1
        self.nbytes += size
        evicted = bool(stale)
        while self._entries and (
            len(self._entries) > self.max_entries or (self.max_bytes is not None and self.nbytes > self.max_bytes)
        ):
            _, old = self._entries.popitem(last=False)
            self.nbytes -= old.nbytes
            evicted = True
        if evicted:
            _TRIM.request()

    def __len__(self) -> int:
        return len(self._entries)


def same_prefix(a: list[int], b: list[int], n: int) -> bool:
    """Whether `a` and `b` both hold `n` tokens (n > 0) and agree on them: token n - 1 first, where cached sequences
    that differ mostly do, before slices that copy both (a cache's put checks every entry this way)."""
    return 0 < n <= min(len(a), len(b)) and a[n - 1] == b[n - 1] and a[:n] == b[:n]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix. Slice comparisons run in C; a Python loop over every cached
    sequence would cost a fraction of a millisecond per call."""
    a, b = list(a), list(b)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
