"""The speculative-decoding algorithm, pure: acceptance arithmetic, draft-length policy, expected speed-up.

No Triton, no torch: numpy only, so it is unit-tested on its own and imported unchanged by the
reference engine (verification) and by the loop (policy, stop handling). Counters: trtspec.metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

# ---------------------------------------------------------------- sampling parameters


@dataclass(frozen=True)
class SamplingParams:
    """What turns logits into a distribution. temperature <= 0 or top_k == 1 means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0  # 1.0 (or 0, TensorRT-LLM's "unset"): no nucleus cut

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Row-wise sampling distribution after temperature, top-k and top-p (float64, rows sum to 1)."""
    x = np.asarray(logits, dtype=np.float64)
    squeeze = x.ndim == 1
    x = np.atleast_2d(x)
    if params.greedy:
        out = np.zeros_like(x)
        out[np.arange(len(x)), x.argmax(axis=-1)] = 1.0
        return out[0] if squeeze else out
    x = x / params.temperature
    if 0 < params.top_k < x.shape[-1]:
        kth = np.partition(x, -params.top_k, axis=-1)[:, -params.top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    x = x - x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    if 0.0 < params.top_p < 1.0:
        order = np.argsort(-p, axis=-1)
        sorted_p = np.take_along_axis(p, order, axis=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        keep_sorted = np.cumsum(sorted_p, axis=-1) - sorted_p < params.top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p[0] if squeeze else p


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    # inverse-CDF on float64 keeps this exact enough for the statistical tests
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))


# ---------------------------------------------------------------- verification


@dataclass(frozen=True)
class Verification:
    """The target's answer to one draft: the accepted prefix plus one token of the target's own."""

    num_accepted: int
    tokens: list[int]  # accepted draft tokens followed by the target's token (len = num_accepted + 1)


def verify_greedy(draft_tokens: Sequence[int], target_argmax: Sequence[int]) -> Verification:
    """Accept while each draft token equals the target's argmax at that position.

    target_argmax[i] is the target's choice after the sequence plus draft_tokens[:i], so it has
    len(draft_tokens) + 1 entries; the last one is the bonus token when everything is accepted.
    """
    if len(target_argmax) != len(draft_tokens) + 1:
        raise ValueError(f"need {len(draft_tokens) + 1} target tokens, got {len(target_argmax)}")
    n = 0
    while n < len(draft_tokens) and int(draft_tokens[n]) == int(target_argmax[n]):
        n += 1
    return Verification(n, [int(t) for t in draft_tokens[:n]] + [int(target_argmax[n])])


def verify_by_target_sample(
    draft_tokens: Sequence[int], target_probs: np.ndarray, rng: np.random.Generator
) -> Verification:
    """Token comparison under sampling (use_draft_logits=false): sample the target, accept on equality.

    Each emitted token is a sample of the target's distribution, so the output distribution is the
    target's exactly; only the acceptance rate is lower than with draft logits.
    """
    out: list[int] = []
    for i in range(len(draft_tokens) + 1):
        t = sample(target_probs[i], rng)
        out.append(t)
        if i == len(draft_tokens) or t != int(draft_tokens[i]):
            return Verification(i, out)
    raise AssertionError("unreachable")


def verify_rejection(
    draft_tokens: Sequence[int], draft_probs: np.ndarray, target_probs: np.ndarray, rng: np.random.Generator
) -> Verification:
    """Speculative sampling (Leviathan et al.; Chen et al.): preserves the target distribution exactly.

    Accept draft token x with probability min(1, p(x)/q(x)); on the first rejection emit a sample of
    normalize(max(0, p - q)); if all k are accepted, emit a bonus sample of p at position k.
    draft_probs: [k, V] (the draft's sampling distributions), target_probs: [k + 1, V].
    """
    k = len(draft_tokens)
    if draft_probs.shape[0] != k or target_probs.shape[0] != k + 1:
        raise ValueError(f"shapes: draft_probs {draft_probs.shape}, target_probs {target_probs.shape}, k={k}")
    out: list[int] = []
    for i, x in enumerate(int(t) for t in draft_tokens):
        p, q = target_probs[i, x], draft_probs[i, x]
        if q <= 0.0 or rng.random() * q >= p:  # reject with probability 1 - min(1, p/q)
            residual = np.maximum(target_probs[i] - draft_probs[i], 0.0)
            total = residual.sum()
            # total == 0 only when p == q, where rejection has probability 0; guard float noise anyway
            out.append(sample(residual / total if total > 0 else target_probs[i], rng))
            return Verification(i, out)
        out.append(x)
    out.append(sample(target_probs[k], rng))
    return Verification(k, out)


# ---------------------------------------------------------------- draft length policy


def scheduled_draft_len(schedule: Mapping[int, int] | None, batch_size: int, k: int) -> int:
    """k under a draft-length schedule (TensorRT-LLM's draft_len_schedule, e.g. {1: 4, 4: 2, 8: 0}: from each
    batch size in it upward, at most its draft length); k itself without one."""
    cap = k
    for size, length in sorted((schedule or {}).items()):
        if batch_size >= size:
            cap = length
    return min(k, cap)


def draft_len_at_load(
    k: int,
    batch_size: int,
    max_concurrency: int | None,
    schedule: Mapping[int, int] | None,
    ngram_above_max_concurrency: bool = False,
) -> tuple[int, bool]:
    """k with `batch_size` requests in flight, and whether only drafters that need no engine step (prompt
    lookup) may propose. Above max_concurrency drafting stops (TensorRT-LLM, vLLM), or, when asked, only the
    draft model steps aside; otherwise the schedule caps k."""
    lookup_only = max_concurrency is not None and batch_size > max_concurrency
    if lookup_only and not ngram_above_max_concurrency:
        return 0, False
    return scheduled_draft_len(schedule, batch_size, k), lookup_only


@dataclass
class DraftLengthPolicy:
    """Chooses k for the next iteration of one request.

    fixed: always the requested k. adaptive: grow by one after a fully accepted draft, shrink to
    accepted + 1 after a rejection; when the acceptance rate over the last `window` iterations falls
    below `pause_below`, stop drafting (k = 0: plain target steps) and every `probe_every` target steps
    try a short draft again, resuming when the probe is accepted.
    """

    requested_k: int
    adaptive: bool = False
    min_k: int = 1
    pause_below: float = 0.2
    window: int = 4
    probe_every: int = 8
    current_k: int = field(init=False)
    paused: bool = field(init=False, default=False)
    _steps_paused: int = field(init=False, default=0)
    _history: list[tuple[int, int]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.min_k = max(1, min(self.min_k, self.requested_k)) if self.requested_k > 0 else 0
        self.current_k = self.requested_k

    def next_k(self, remaining: int) -> int:
        """k for the next iteration; never proposes past remaining - 1 (the target adds one token)."""
        budget = max(0, remaining - 1)
        if self.requested_k <= 0 or budget == 0:
            return 0
        if not self.adaptive:
            return min(self.requested_k, budget)
        if self.paused:
            self._steps_paused += 1
            if self._steps_paused % self.probe_every != 0:
                return 0
            return min(self.min_k, budget)  # a probe
        return min(self.current_k, budget)

    def update(self, proposed: int, accepted: int) -> None:
        if not self.adaptive or proposed == 0:
            return
        self._history = (self._history + [(proposed, accepted)])[-self.window :]
        if self.paused:
            if accepted == proposed:  # the probe was accepted: acceptance recovered
                self.paused = False
                self._history = [(proposed, accepted)]
                self.current_k = max(self.min_k, min(self.requested_k, proposed + 1))
            return
        if accepted == proposed:
            self.current_k = min(self.requested_k, self.current_k + 1)
        else:
            self.current_k = max(self.min_k, accepted + 1)
        if len(self._history) >= self.window:
            rate = sum(a for _, a in self._history) / sum(p for p, _ in self._history)
            if rate < self.pause_below:
                self.paused = True
                self._steps_paused = 0


@dataclass
class PayoffGate:
    """Asks a draft source only while its drafts pay, measured in wall time (adaptive policy).

    An iteration that drafted from source s yields accepted + 1 tokens in its draft + verify time; a
    plain target step yields one token. When s's tokens per second over its last `window` iterations
    fall below the plain steps' rate, s is skipped, and tried again every `probe_every` iterations, so
    a source that starts paying again (the text starts repeating the prompt, the load drops) comes
    back. This is what keeps `hybrid` from paying for a weak draft model when prompt lookup finds
    nothing, and keeps speculation from slowing a request down where it does not pay. Acceptance
    alone cannot decide it: whether 30% acceptance pays depends on what a draft costs here.

    A source's first use is not measured (it carries the draft's prefill). When no plain step has
    been measured for `refresh_every` iterations, `wants_plain_step` asks for one to compare with.
    """

    window: int = 4
    probe_every: int = 8
    refresh_every: int = 32
    _runs: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    _plain: list[float] = field(default_factory=list)
    _skipped: dict[str, int] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)
    _since_plain: int = 0

    def plain_rate(self) -> float | None:
        return 1.0 / float(np.median(self._plain)) if self._plain else None

    def source_rate(self, source: str) -> float | None:
        runs = self._runs.get(source, [])
        if len(runs) < self.window:
            return None
        return sum(t for t, _ in runs) / max(sum(s for _, s in runs), 1e-9)

    def pays(self, source: str) -> bool | None:
        """None while either side is unmeasured."""
        rate, plain = self.source_rate(source), self.plain_rate()
        return None if rate is None or plain is None else rate >= plain

    def allows(self, source: str) -> bool:
        """Whether to ask `source` this iteration (call it only when the source would be asked)."""
        if self.pays(source) is not False:
            self._skipped[source] = 0
            return True
        n = self._skipped.get(source, 0) + 1
        self._skipped[source] = 0 if n >= self.probe_every else n
        return n >= self.probe_every  # a probe: measure it again

    def wants_plain_step(self) -> bool:
        measured = any(len(r) >= self.window for r in self._runs.values())
        return measured and (not self._plain or self._since_plain >= self.refresh_every)

    def record(self, source: str | None, tokens: int, seconds: float) -> None:
        """One iteration: `source` None for a plain target step (no draft), `tokens` the tokens it yielded."""
        if source is None:
            self._plain = (self._plain + [seconds])[-self.window :]
            self._since_plain = 0
            return
        self._since_plain += 1
        if source not in self._seen:
            self._seen.add(source)
            return
        self._runs[source] = (self._runs.get(source, []) + [(tokens, seconds)])[-self.window :]


# ---------------------------------------------------------------- stopping


def find_stop(tokens: Sequence[int], stop_sequences: Sequence[Sequence[int]], start: int = 0) -> int | None:
    """Length of `tokens` to keep if a stop sequence ends at or after position `start`, else None.

    The stop sequence itself is kept (TensorRT-LLM keeps stop words in output_ids).
    """
    best: int | None = None
    for seq in stop_sequences:
        n = len(seq)
        if n == 0:
            continue
        for end in range(max(start, n - 1), len(tokens)):
            if list(tokens[end - n + 1 : end + 1]) == list(seq):
                best = end + 1 if best is None else min(best, end + 1)
                break
    return best


def speedup_bound(alpha: float, k: int, cost_ratio: float) -> float:
    """Expected speedup S = (1 - a^(k+1)) / ((1 - a)(k c + 1)) for acceptance a, k drafts, draft cost c."""
    if alpha >= 1.0:
        return (k + 1) / (k * cost_ratio + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * cost_ratio + 1))


def tokens_per_call(alpha: float, k: int) -> float:
    """Expected tokens per target call with k drafts of i.i.d. acceptance alpha: sum_{i=0..k} alpha^i."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def solve_alpha(tau: float, k: int, tol: float = 1e-12) -> float | None:
    """The alpha in [0, 1] with tokens_per_call(alpha, k) == tau (bisection; the function is increasing).

    tau <= 1 gives 0, tau >= k + 1 gives 1; k == 0 gives None (no draft, alpha is not defined)."""
    if k <= 0:
        return None
    if tau <= 1.0:
        return 0.0
    if tau >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if tokens_per_call(mid, k) < tau:
            lo = mid
        else:
            hi = mid
        if hi - lo < tol:
            break
    return (lo + hi) / 2
