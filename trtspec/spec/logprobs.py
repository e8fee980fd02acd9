"""The target's most likely tokens at each emitted position (OpenAI's top_logprobs), reduced from the logits the
engine returns (TensorRT-LLM's generation_logits) so that every engine flavour serves them the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np


@dataclass
class TopLogProbs:
    """Per emitted token (rows), the N most likely token ids, most likely first, and their log-probabilities."""

    ids: np.ndarray  # [tokens, N] int32
    log_probs: np.ndarray  # [tokens, N] float32

    @classmethod
    def from_logits(cls, logits: np.ndarray, n: int, temperature: float | None = None) -> "TopLogProbs":
        """`logits`: [tokens, vocab], one row per emitted position. The distribution is the logits' softmax at the
        request's temperature (unset or 0: 1, as the engines sample); penalties and biases are not in it."""
        x = np.asarray(logits, dtype=np.float32).reshape(-1, np.shape(logits)[-1])
        if temperature:
            x = x / np.float32(temperature)
        m = x.max(axis=-1, keepdims=True)  # the engines' logits are finite, or -inf where a token is masked
        log_z = m.astype(np.float64) + np.log(np.exp(x - m).sum(axis=-1, keepdims=True, dtype=np.float64))
        n = min(n, x.shape[-1])
        part = np.argpartition(x, x.shape[-1] - n, axis=-1)[:, -n:]
        # most likely first; among equal logits the lower id first, as argmax (greedy) picks
        ids = np.empty_like(part)
        for r in range(len(part)):
            ids[r] = part[r][np.lexsort((part[r], -x[r, part[r]]))]
        lps = np.take_along_axis(x, ids, axis=-1).astype(np.float64) - log_z
        return cls(ids.astype(np.int32), lps.astype(np.float32))

    @classmethod
    def empty(cls, n: int) -> "TopLogProbs":
        return cls(np.zeros((0, n), np.int32), np.zeros((0, n), np.float32))

    @classmethod
    def concat(cls, parts: Iterable["TopLogProbs"]) -> "TopLogProbs | None":
        parts = list(parts)
        if not parts:
            return None
        return cls(np.concatenate([p.ids for p in parts]), np.concatenate([p.log_probs for p in parts]))

    def __len__(self) -> int:
        return len(self.ids)

    def head(self, count: int) -> "TopLogProbs":
        return TopLogProbs(self.ids[:count], self.log_probs[:count])

    def rows(self) -> list[list[tuple[int, float]]]:
        """[(token id, log-probability), ...] per emitted token."""
        return [[(int(i), float(lp)) for i, lp in zip(ids, lps)] for ids, lps in zip(self.ids, self.log_probs)]
