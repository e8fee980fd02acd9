"""The speculative-decoding arithmetic, pure: sampling, verification, the fixed policy and load caps, stops, expected
speed-up.

No Triton, no torch: numpy only, so it is unit-tested on its own and imported unchanged by the
reference engine (verification) and by the loop (policy, stop handling). The adaptive policy: trtspec.spec.controller;
counters: trtspec.spec.metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
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


def fixed_draft_len(k: int, remaining: int) -> int:
    """The `fixed` policy: the requested k, never past remaining - 1 (the target adds one token)."""
    return max(0, min(k, remaining - 1))


# A plain call (no draft) of a request that is not streamed asks the target for several tokens: the engine then
# steps them itself, as a target-only request does, instead of one engine request per token (measured on the demo
# target: 10% more per token, the round trip between the engine and the loop). At most this many, so a client that
# leaves still costs at most one such call (the loop checks for cancellation between calls).
PLAIN_RUN_MAX = 16


def plain_run(stretch: int | None, remaining: int) -> int:
    """Tokens to ask of the `stretch`-th plain call in a row (1, 2, ...) of a request that is not streamed: doubling
    from 1, so a request that steps aside from drafting can take it up again within about as many tokens as it has
    stepped aside for; None: a request that cannot draft (whole runs from its first call)."""
    run = PLAIN_RUN_MAX if stretch is None else min(1 << (max(stretch, 1) - 1), PLAIN_RUN_MAX)
    return max(1, min(run, remaining))


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
