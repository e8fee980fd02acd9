"""What the goodput controller (trtspec.spec.controller) knows about a deployment, shared by every loop process of it
(trtspec.spec.load.SharedEstimates): acceptance per position per source, a target step's cost by requests in flight and
by the tokens in it, a draft call's cost per drafted and per caught-up token by the requests in it, and the counts
of calls in progress that tell a call which others it ran with."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np

from trtspec.spec.drafters import ESTIMATE_KEYS

MAX_POSITIONS = 64  # SpeculativeConfig.max_k's bound
MAX_LOAD = 256  # requests in flight (or in one draft call), as a cost-table key (more count as this many)
MAX_STEP_TOKENS = 8192  # tokens in one target step, as a cost-table key (TensorRT-LLM's default max_num_tokens)


def _layout() -> dict[str, tuple[int, ...]]:
    s, p, k, n = len(ESTIMATE_KEYS), MAX_POSITIONS, MAX_POSITIONS + 1, MAX_LOAD + 1
    return {
        "reached": (s, p),  # drafts from source s whose position i was verified (every earlier one accepted)
        "accepted": (s, p),  # ... and whose position i was accepted (both decayed: recent drafts weigh more)
        "verify_s": (k, n),  # seconds of a target call verifying k draft tokens at n in flight (k = 0: a plain step)
        "verify_n": (k, n),  # how many calls that mean holds
        # plain calls by n in flight, fitted as seconds = a + b * steps (a: what a call costs beyond its steps, the
        # engine request's round trip; b: a step's): weighted sums of 1, x, x*x, y, x*y (x steps, y seconds)
        "plain_fit": (n, 5),
        "plain_fit_n": (n,),
        # a draft-model call's seconds with n requests in the call, fitted as a * k drafted + c * m caught up (the
        # tokens it prefills first, beyond the usual 2): weighted sums of k*k, k*m, m*m, k*s, m*s
        "draft_fit": (n, 5),
        "draft_fit_n": (n,),
        # batched, a draft-model call's seconds as a * (k drafted + m caught up weighted as the target's steps weigh
        # tokens near there): weighted sums of u*u and u*y, u = k + w * m, and how many calls
        "draft_units": (n, 2),
        "draft_units_n": (n,),
        # the target's own drafter (EAGLE-3): seconds a call adds per position the head missed (its catch-up: the
        # call recomputes them and the head extends over them), by requests in flight, and how many calls
        "head_catchup_s": (n,),
        "head_catchup_n": (n,),
        # ... and a request's first call's seconds per prompt token, [0] asking the head for no draft, [1] for one:
        # their difference is what the head's extension over a prompt costs (the target computes its states anyway)
        "head_prefill_s": (2,),
        "head_prefill_n": (2,),
        # seconds an iteration spends outside its engine calls (the loop's own work, the answer's way to the client
        # and back), by requests in flight: a drafting iteration pays it for its tokens, a plain run once for many
        "overhead_s": (n,),
        "overhead_n": (n,),
        "step_s": (MAX_STEP_TOKENS + 1,),  # seconds of a target step by the tokens in it (calls at 2+ in flight)
        "step_n": (MAX_STEP_TOKENS + 1,),
        "stepping": (1,),  # tokens in target calls now
        "costs_version": (1,),  # changes with every cost sample (what Estimates.memo keeps is valid until then)
        "clock": (1,),  # the deployment's time: every call's seconds shared by the requests in flight
        "drafting": (2,),  # requests in draft-model calls now, and the tokens those calls catch up on
        "last_drafted": (s,),  # the clock when source s last drafted, or its acceptance was learnt otherwise
        "last_chosen": (s,),  # the clock when a request last chose to draft from source s (a probe is not a choice)
        "arrivals": (3,),  # requests as they arrive (decayed sums): prompt tokens, tokens they may generate, count
        "probe_backoff": (s,),  # the probe interval's multiple for source s (0: 1): doubles as its probes fail
        # a batched deployment's probe of source s is a wave of requests drafting together: places left in it
        "probe_wave": (s,),
    }


ESTIMATES_LAYOUT = _layout()
ESTIMATES_SIZE = sum(int(np.prod(shape)) for shape in ESTIMATES_LAYOUT.values())


class Estimates:
    """What the controller knows about the deployment: acceptance per position per source, and measured costs.

    Views into one float64 buffer, so that trtspec.spec.load.SharedEstimates can put it in shared memory for every
    loop process of a server; here, by default, a private buffer. `locked()` guards read-modify-write updates."""

    def __init__(self, buffer: np.ndarray | None = None):
        self.buffer = np.zeros(ESTIMATES_SIZE) if buffer is None else buffer
        offset = 0
        for name, shape in ESTIMATES_LAYOUT.items():
            size = int(np.prod(shape))
            setattr(self, name, self.buffer[offset : offset + size].reshape(shape))
            offset += size

    def locked(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def memo(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """`compute()`, kept until the measured costs change (`costs_version`): every request of a step prices the
        same costs, and pricing them is most of a decision's time."""
        version = float(self.costs_version[0])
        if getattr(self, "_memo_version", None) != version:
            self._memo, self._memo_version = {}, version
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @contextlib.contextmanager
    def draft_call(self, missed: int = 0) -> Iterator[list[int]]:
        """Counts a draft-model call, which catches up on `missed` tokens, for its duration; yields [requests, tokens
        caught up]: the most that were in draft-model calls at once during it (its own included), the batch the
        draft engine could run and the prefill that batch carried."""
        extra = max(0, missed - 2)
        with self.locked():
            self.drafting += (1, extra)
            batch = [int(x) for x in self.drafting]
        try:
            yield batch
        finally:
            with self.locked():
                batch[:] = [max(a, int(b)) for a, b in zip(batch, self.drafting)]
                self.drafting -= (1, extra)


    @contextlib.contextmanager
    def target_call(self, tokens: int) -> Iterator[list[int]]:
        """Counts a target call's `tokens` for its duration; yields a list whose one item becomes the most tokens
        that were in target calls at once during it (its own included): what the step it ran in held."""
        with self.locked():
            self.stepping[0] += tokens
            held = [int(self.stepping[0])]
        try:
            yield held
        finally:
            with self.locked():
                held[0] = max(held[0], int(self.stepping[0]))
                self.stepping[0] -= tokens


def mean_update(means: np.ndarray, counts: np.ndarray, index: tuple, value: float | np.ndarray,
                smoothing: float) -> None:
    """A running mean that becomes an exponential one after 1/smoothing samples (tracks load and context); `value`
    a number, or a vector of them where `index` names a row (a fit's weighted sums)."""
    counts[index] += 1
    weight = max(1.0 / counts[index], smoothing)
    means[index] += weight * (value - means[index])


def nonzero(shared: np.ndarray, low: int = 0, high: int | None = None) -> np.ndarray:
    """np.flatnonzero of a copy: another loop process may update the shared estimates while they are read, and
    numpy's nonzero fails when the count changes under it. `low`..`high` (inclusive): the indices to look at
    (the steps by their tokens hold 8,193: a decision reads a few dozen near its load)."""
    return low + np.flatnonzero(np.array(shared[low : None if high is None else high + 1]))


def load_key(in_flight: int) -> int:
    return int(min(max(in_flight, 1), MAX_LOAD))
