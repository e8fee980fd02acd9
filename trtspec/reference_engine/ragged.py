"""One forward pass over a ragged batch: the new tokens of many sequences packed into one row.

Every linear layer (most of the compute) runs once over all packed tokens; attention runs per sequence
against that sequence's own KV cache (a transformers DynamicCache, so prefix reuse keeps working; the engine's
layers grow in place: trtspec.reference_engine.kv_cache). This is the packed layout of transformers' continuous
batching without its paged cache: the paged cache would hold all sequences in one block pool and drop the
per-sequence caches the prefix cache hands around.

A segment's attention is the same call with the same shapes whether it runs alone or in a batch, so a
sequence's attention output does not depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

ATTENTION = "trtspec_ragged"


@dataclass
class Segment:
    """`tokens` of one sequence starting at position `start`; its KV cache already holds positions < start."""

    cache: Any  # transformers.DynamicCache
    tokens: list[int]
    start: int
    logit_rows: int = 0  # logits wanted for the last this-many tokens
    logits: torch.Tensor | None = field(default=None, repr=False)
    features: torch.Tensor | None = field(default=None, repr=False)  # EAGLE-3 capture-layer outputs of its rows
    capture: bool = False  # the in-engine EAGLE-3 head wants `features` of this segment's rows
    # A token tree (Medusa): row j's parent row (-1: none, it follows the cached prefix) and position; a row attends
    # to the cached prefix and its own ancestors only. None: the rows are consecutive (causal).
    parents: list[int] | None = None
    positions: list[int] | None = None
    want_hidden: bool = False  # keep the last hidden state of the logit rows (`hidden`): the Medusa heads read it
    hidden: torch.Tensor | None = field(default=None, repr=False)
    # Medusa: the tree this step may verify, sized and appended by the engine before the forward
    # (trtspec.reference_engine.tree_size.Proposal); None: not a Medusa step
    proposal: Any = field(default=None, repr=False)

    def ancestry(self, j: int) -> list[int]:
        """Row j's ancestors and itself, root side first (rows of this segment)."""
        chain = []
        while j >= 0:
            chain.append(j)
            j = self.parents[j] if self.parents is not None else j - 1
        return chain[::-1]


class RaggedBatch:
    """Per-step state the attention function reads (passed through the model's forward kwargs)."""

    # Segments of at most this many tokens attend one query row at a time when `row_invariant` (a verify's k + 1
    # rows); longer ones (prefill) in one call.
    ROW_INVARIANT_MAX = 16

    def __init__(self, segments: list[Segment], row_invariant: bool = False):
        """row_invariant: each query row of a short segment attends alone over the keys it sees, the same call
        a 1-token decode of that position makes, so its output is bitwise the decode's (one SDPA call with k + 1
        query rows reduces in another order: the engine's batch invariance, with compiled kernels)."""
        self.segments = segments
        self.row_invariant = row_invariant
        bounds, s = [], 0
        for seg in segments:
            bounds.append((s, s + len(seg.tokens)))
            s += len(seg.tokens)
        self.bounds = bounds
        self.total = s
        self._masks: dict[tuple[int, int], torch.Tensor | None] = {}

    def mask(self, i: int, kv: int, device: Any) -> torch.Tensor | None:
        """Segment i's causal mask over its `kv` keys (None where SDPA needs none), built once per step and key
        count (layers of one kind see the same shapes; building it per layer cost more than the attention)."""
        if (i, kv) not in self._masks:
            n = self.bounds[i][1] - self.bounds[i][0]
            seg = self.segments[i]
            if seg.parents is not None:
                self._masks[i, kv] = _tree_mask(seg, kv, device)
            else:
                self._masks[i, kv] = None if n == 1 or n == kv else _causal_mask(n, kv, device)
        return self._masks[i, kv]

    # Passed as the model's attention_mask: a 4D mask is used as given, so transformers builds none for the
    # packed row (each segment's mask is made in ragged_attention).
    NO_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)

    def inputs(self, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids [1, T], position_ids [1, T], indices of the rows whose logits are wanted)."""
        ids, pos, rows = [], [], []
        for seg, (s, e) in zip(self.segments, self.bounds):
            ids.extend(seg.tokens)
            pos.extend(seg.positions if seg.positions is not None else range(seg.start, seg.start + len(seg.tokens)))
            rows.extend(range(e - seg.logit_rows, e))
        t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        return t([ids]), t([pos]), t(rows)

    def kwargs(self) -> dict[str, Any]:
        """The model forward's arguments that route attention through ragged_attention with this batch."""
        return {"attention_mask": self.NO_MASK, "ragged": self}

    def split_logits(self, logits: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        i = 0
        for seg in self.segments:
            seg.logits = logits[i : i + seg.logit_rows]
            if seg.want_hidden and hidden is not None:
                seg.hidden = hidden[i : i + seg.logit_rows]
            i += seg.logit_rows


def _causal_mask(q: int, kv: int, device: Any) -> torch.Tensor:
    """Query i (the (kv - q + i)-th position) sees keys 0 .. kv - q + i: causal, aligned bottom-right."""
    return torch.ones(q, kv, dtype=torch.bool, device=device).tril(kv - q)[None, None]


def _tree_mask(seg: Segment, kv: int, device: Any) -> torch.Tensor:
    """A tree segment's mask: every row sees the cached prefix, its ancestors and itself."""
    n = len(seg.tokens)
    m = torch.zeros(n, kv, dtype=torch.bool)
    m[:, : kv - n] = True
    for j in range(n):
        m[j, [kv - n + a for a in seg.ancestry(j)]] = True
    return m.to(device)[None, None]


def ragged_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, ragged=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if ragged is None:  # a plain forward (no packed batch): ordinary SDPA attention with transformers' mask
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    alone = len(ragged.segments) == 1  # no slicing or concatenation: the whole packed row is the segment
    outs = []
    for i, (seg, (s, e)) in enumerate(zip(ragged.segments, ragged.bounds)):
        q, k, v = (query, key, value) if alone else (query[:, :, s:e], key[:, :, s:e], value[:, :, s:e])
        k, v = seg.cache.update(k, v, module.layer_idx)
        n, kv = e - s, k.shape[2]
        if ragged.row_invariant and seg.parents is not None and 1 < n <= ragged.ROW_INVARIANT_MAX:
            prefix = kv - n
            for j in range(n):  # the keys a decode of this node would see, in the same order: bitwise the decode
                idx = torch.tensor([*range(prefix), *(prefix + a for a in seg.ancestry(j))], device=k.device)
                out, _ = sdpa_attention_forward(module, q[:, :, j : j + 1], k[:, :, idx], v[:, :, idx], None,
                                                dropout=dropout, scaling=scaling, is_causal=False)
                outs.append(out)
            continue
        if ragged.row_invariant and 1 < n <= ragged.ROW_INVARIANT_MAX:
            for j in range(n):  # query j is position kv - n + j: it sees keys 0 .. kv - n + j
                seen = kv - n + j + 1
                out, _ = sdpa_attention_forward(module, q[:, :, j : j + 1], k[:, :, :seen], v[:, :, :seen], None,
                                                dropout=dropout, scaling=scaling, is_causal=False)
                outs.append(out)
            continue
        mask = ragged.mask(i, kv, query.device)
        out, _ = sdpa_attention_forward(module, q, k, v, mask, dropout=dropout, scaling=scaling,
                                        is_causal=n > 1 and mask is None)
        outs.append(out)
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)), None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, ragged_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)
