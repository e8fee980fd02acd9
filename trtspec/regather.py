"""When an in-flight batcher waits for the requests it answered to come back before its next step: the reference
engine's scheduler (trtspec.reference_engine.batching) and the engines `trtspec simulate --engines overlapped` models
(trtspec.bench.overlapped) both decide by this rule. Without torch, so that the simulator starts in a moment."""

from __future__ import annotations

import statistics
from typing import Collection

# answered requests are waited for where they typically come back within this share of a step, for that long at most
REGATHER_SHARE = 0.25
UNMEASURED_S = 0.005  # their delay assumed until returns are measured: a loop's Triton round trip and its code
WINDOW = 32  # return delays the typical one is the median of


def typical_delay(delays: Collection[float]) -> float:
    return statistics.median(delays) if delays else UNMEASURED_S


def regather_wait(delays: Collection[float], last_step_s: float, share: float = REGATHER_SHARE) -> float | None:
    """How long the next step waits for the requests the last one answered (`delays`: how soon answered requests
    came back lately), or None: it does not wait. A loop that comes straight back is waited for, up to twice its
    typical delay; one that is away for long beside a step (a draft engine's clients verify on the target first) is
    not, which would idle the engine for nothing."""
    delay = typical_delay(delays)
    if delay > share * last_step_s:
        return None
    return min(share * last_step_s, 2 * delay + 0.001)
