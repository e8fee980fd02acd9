"""Drafters: who proposes the draft tokens the target verifies, behind one small interface.

A drafter proposes up to k tokens for a running sequence (an empty proposal means "take a plain target
step"). Drafters that need no engine run in the loop's own process (no Triton round trip); a draft model
is called through the loop's engine boundary. SOURCES is the one table of draft sources; SELECTIONS names
what a request or deployment may ask for (`draft_source`), each an order over SOURCES: the first
source with a proposal wins.

Adding a drafter: a class with `propose` here (or in its own module) plus one row in SOURCES.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np


@dataclass
class Proposal:
    tokens: list[int]
    logits: np.ndarray | None = None  # [1, len(tokens), vocab], for rejection sampling against the draft
    match: int = 0  # prompt lookup: how many tokens of the sequence's end the proposal's source matched


class Drafter(Protocol):
    def propose(self, seq: Sequence[int], k: int, want_logits: bool) -> Proposal: ...


class NgramDrafter:
    """Prompt lookup: what followed the most recent earlier occurrence of the sequence's last n tokens,
    trying n from n_max down to n_min. It reads the running sequence, so it learns from accepted output."""

    def __init__(self, n_max: int, n_min: int):
        self.n_max, self.n_min = n_max, n_min

    def propose(self, seq: Sequence[int], k: int, want_logits: bool = False) -> Proposal:
        tokens, n = ngram_match(seq, k, self.n_max, self.n_min)
        return Proposal(tokens, match=n)


def ngram_match(tokens: Sequence[int], k: int, n_max: int = 3, n_min: int = 1) -> tuple[list[int], int]:
    """k tokens copied from after the latest earlier match of the longest suffix n-gram, and that n; ([], 0)
    if none.

    Vectorized: it runs every iteration of the loop, and a Python scan of a 1,000-token sequence that finds
    no match costs about a millisecond, as much as an engine round trip; one comparison over the sequence finds
    the candidate ends, then each n checks only those."""
    L = len(tokens)
    if k <= 0 or L < 2:
        return [], 0
    seq = np.asarray(tokens, dtype=np.int64)
    # every n-gram match ends with the last token: find those ends once (positions before the last token, so
    # something follows each), then check the tokens before them for each n
    ends = np.flatnonzero(seq[: L - 1] == seq[L - 1])
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        hits = ends[ends >= n - 1]
        for j in range(1, n):
            hits = hits[seq[hits - j] == seq[L - 1 - j]]
        if hits.size:
            # what followed the match; where that runs into the sequence's end, the text repeats with the
            # match's period (a loop in the output goes on being a loop), so the proposal is still k long
            start = int(hits[-1]) + 1
            period = L - start
            return [int(seq[start + (j % period)]) for j in range(k)], n
    return [], 0


class EngineDrafter:
    """A draft model behind the engine boundary (`tensorrt_llm_draft`: TensorRT-LLM engine or reference engine)."""

    def __init__(self, draft: Callable[[Sequence[int], int, bool], Proposal]):
        self._draft = draft

    def propose(self, seq: Sequence[int], k: int, want_logits: bool) -> Proposal:
        return self._draft(seq, k, want_logits)


class TargetDrafter:
    """The target engine's own drafter (EAGLE-3 in the engine, as TensorRT-LLM's one-model path): each target
    answer carries the draft for the next call (`next_draft_ids`), so proposing costs no call."""

    def __init__(self) -> None:
        self.next: list[int] = []

    def propose(self, seq: Sequence[int], k: int, want_logits: bool = False) -> Proposal:
        return Proposal(self.next[:k])


def drafts_in_target(settings: Any) -> bool:
    """The deployment's "model" drafter lives in the target engine (speculative.method eagle3)."""
    return getattr(settings.speculative, "method", None) == "eagle3"


@dataclass(frozen=True)
class DraftSource:
    name: str
    doc: str
    needs_draft_model: bool
    # (loop settings, the request's draft-model call) -> a drafter for one request
    make: Callable[[Any, Callable[[Sequence[int], int, bool], Proposal]], Drafter]
    gives_logits: bool = False
    # the controller estimates its acceptance separately by its proposal's `match` (1 .. match_levels, longer
    # counted as the longest); 0: one estimate
    match_levels: int = 0


SOURCES: dict[str, DraftSource] = {
    "model": DraftSource(
        "model",
        "the deployment's drafter: the draft model, or the target engine's EAGLE-3 head",
        True,
        lambda settings, call: TargetDrafter() if drafts_in_target(settings) else EngineDrafter(call),
        gives_logits=True,
    ),
    "ngram": DraftSource(
        "ngram",
        "prompt lookup in the running sequence, in the loop's process",
        False,
        lambda settings, call: NgramDrafter(settings.speculative.ngram_max, settings.speculative.ngram_min),
        # measured on the demo target's answers to the built-in prompts: a 1-token match's first token is the
        # target's ~20% of the time, a 2-token match's ~55%, a 3-token match's 40-85%
        match_levels=3,
    ),
}


def estimate_key(source: str, match: int = 0) -> str:
    """The name the controller estimates a proposal's acceptance under: its source, and for a source with
    match levels, the level of its match (e.g. "ngram@2")."""
    levels = SOURCES[source].match_levels
    return f"{source}@{min(max(match, 1), levels)}" if levels else source


def source_of(key: str) -> str:
    """The draft source of an estimate key."""
    return key.split("@", 1)[0]


ESTIMATE_KEYS = tuple(estimate_key(name, m) for name, src in SOURCES.items()
                      for m in (range(1, src.match_levels + 1) if src.match_levels else (0,)))

SELECTIONS: dict[str, tuple[str, ...]] = {
    "model": ("model",),
    "ngram": ("ngram",),
    "hybrid": ("ngram", "model"),  # prompt lookup when it finds a match (free), else the draft model
}
