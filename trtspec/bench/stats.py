"""The statistics of `trtspec bench`, kept free of I/O so they can be tested on hand-made timings.

Conventions (also in docs/bench-results.md):

* Percentiles interpolate linearly between the two nearest ranks (numpy's default, "linear"):
  p-th percentile of sorted x[0..n-1] is x[i] + (x[i+1] - x[i]) * f with i + f = p/100 * (n - 1).
* Inter-token latency (ITL). A streamed response may carry several tokens (a speculative iteration accepts
  up to k+1 at once). Per *chunk*: the gap between one token-bearing chunk and the previous one. Per
  *token*: a chunk of n tokens arriving after a gap g contributes n values g/n, so the per-token ITLs of a
  request sum to (last token time - first token time) and their mean is what a reader of the stream sees
  on average per token. The tokens that arrive with the first token (in the first chunk) get no ITL: they
  are covered by the time to first token. Chunks without tokens (an empty final response) are ignored.
* Crossover: see ``crossover``.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

STAT_KEYS = ("n", "mean", "p50", "p90", "p99", "min", "max")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0 <= q <= 100), linear interpolation; None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    xs = sorted(float(v) for v in values)
    if not xs:
        return None
    pos = q / 100 * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def describe(values: Iterable[float]) -> dict[str, float | int | None]:
    """{n, mean, p50, p90, p99, min, max} of the values (None for every statistic when there is none)."""
    xs = [float(v) for v in values]
    if not xs:
        return {k: (0 if k == "n" else None) for k in STAT_KEYS}
    return {
        "n": len(xs),
        "mean": sum(xs) / len(xs),
        "p50": percentile(xs, 50),
        "p90": percentile(xs, 90),
        "p99": percentile(xs, 99),
        "min": min(xs),
        "max": max(xs),
    }


def inter_token_latencies(times: Sequence[float], counts: Sequence[int]) -> tuple[list[float], list[float]]:
    """(per-token ITLs, per-chunk ITLs) of one request from its chunks' arrival times and token counts."""
    if len(times) != len(counts):
        raise ValueError("times and counts must have the same length")
    per_token: list[float] = []
    per_chunk: list[float] = []
    previous: float | None = None
    for t, n in zip(times, counts):
        if n <= 0:
            continue
        if previous is not None:
            gap = t - previous
            per_chunk.append(gap)
            per_token.extend([gap / n] * n)
        previous = t
    return per_token, per_chunk


def speedup(value: float | None, reference: float | None) -> float | None:
    """value / reference, or None when either is missing or the reference is 0."""
    if value is None or reference is None or reference == 0:
        return None
    return value / reference


def crossover(best_speedup: Mapping[int, float | None], threshold: float = 1.0) -> dict:
    """Where speculation stops paying, from the best speedup measured at each concurrency.

    Speculation *pays* at a concurrency when its best speedup is > ``threshold``. The crossover is the
    lowest measured concurrency from which on it never pays again, provided it paid somewhere below it:
    ``concurrency`` is that level, ``estimate`` the concurrency where the speedup line between the last
    paying level and it crosses ``threshold`` (linear interpolation). ``status`` is one of

    * ``crossover``: found (the fields above are set);
    * ``none``: speculation pays at the highest measured concurrency (no crossover in the measured range);
    * ``never``: it pays at no measured concurrency;
    * ``unknown``: no speedup could be computed.
    """
    levels = sorted(c for c, s in best_speedup.items() if s is not None)
    pays = {c: best_speedup[c] > threshold for c in levels}  # type: ignore[operator]
    out = {"status": "unknown", "concurrency": None, "estimate": None, "last_paying": None,
           "paying": [c for c in levels if pays[c]], "threshold": threshold}
    if not levels:
        out["summary"] = "no speedup could be measured"
        return out
    if not any(pays.values()):
        out.update(status="never", summary="speculation pays at no measured concurrency")
        return out
    if pays[levels[-1]]:
        slower = [c for c in levels if not pays[c]]
        note = f" (it did not pay at {', '.join(map(str, slower))})" if slower else ""
        out.update(status="none", last_paying=levels[-1],
                   summary=f"none in the measured range: speculation pays up to concurrency {levels[-1]}{note}")
        return out
    i = len(levels) - 1  # the tail that does not pay starts at levels[i]
    while not pays[levels[i - 1]]:
        i -= 1
    last_paying, first_not = levels[i - 1], levels[i]
    s0, s1 = best_speedup[last_paying], best_speedup[first_not]
    estimate = float(first_not)
    if s0 is not None and s1 is not None and s0 != s1:
        estimate = last_paying + (s0 - threshold) / (s0 - s1) * (first_not - last_paying)
    out.update(
        status="crossover",
        concurrency=first_not,
        estimate=estimate,
        last_paying=last_paying,
        summary=(f"speculation stops paying above concurrency {last_paying} (slower from {first_not} on; "
                 f"interpolated crossover ~{estimate:.1f})"),
    )
    return out
