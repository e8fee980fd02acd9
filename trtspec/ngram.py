"""Prompt-lookup (n-gram) drafting: propose what followed the most recent earlier occurrence of the
sequence's last n tokens, trying n from n_max down to n_min. No weights, no cost worth counting."""

from __future__ import annotations

from typing import Sequence


def propose(tokens: Sequence[int], k: int, n_max: int = 3, n_min: int = 1) -> list[int]:
    """Up to k tokens copied from after the latest earlier match of the longest suffix n-gram; [] if none."""
    L = len(tokens)
    if k <= 0 or L < 2:
        return []
    seq = list(tokens)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        suffix = seq[L - n :]
        # most recent occurrence first; it must end before the suffix itself starts repeating at L
        for start in range(L - n - 1, -1, -1):
            if seq[start : start + n] == suffix:
                follow = seq[start + n : start + n + k]
                if follow:
                    return follow
    return []
