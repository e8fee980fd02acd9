"""What a deployment's engine calls cost, read off its measured estimates (trtspec.spec.estimates.Estimates): a target
step by requests in flight, by draft rows and by the tokens in it; a draft-model call by the requests in it, per
drafted and per caught-up token. The goodput controller (trtspec.spec.controller) weighs these against acceptance."""

from __future__ import annotations

from typing import Any

import numpy as np

from trtspec.spec.drafters import SOURCES, source_of
from trtspec.spec.estimates import Estimates, load_key, nonzero

ALONE = 1  # the load at which a request's own call time is the whole step's


def _through_nearest_two(values: list[float], measured: list[int], k: int) -> float:
    """values[k] on the line through the two measured k nearest k (between or beyond them)."""
    k0, k1 = sorted(measured, key=lambda m: abs(m - k))[:2]
    return values[k0] + (values[k1] - values[k0]) * (k - k0) / (k1 - k0)


def _pooled(values: list[float], weights: list[float]) -> list[float]:
    """`values` made non-decreasing: adjacent ones out of order pooled into their weighted mean (isotonic regression)."""
    blocks: list[list[float]] = []  # [mean, weight, how many values]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks[-1]
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2]
    return [b[0] for b in blocks for _ in range(int(b[2]))]


def _slope(points: np.ndarray, values: np.ndarray) -> float:
    """The least-squares slope of `values` over `points` (at least two distinct), never below 0."""
    x = points - points.mean()
    return max(float(x @ values) / float(x @ x), 0.0)


def step_slope(measured: np.ndarray, step_s: np.ndarray, low: int, high: int) -> float | None:
    """Seconds per token of steps between `low` and `high` tokens: the least-squares slope of the steps measured
    (`measured`: their token counts, ascending; `step_s`: seconds by tokens) from half of `low` to twice `high`
    tokens. Where none of them reaches halfway to `high`, the nearest step measured beyond joins them: a step's cost
    grows with its tokens no faster than where it is compute-bound, so that slope bounds the one in between. None:
    fewer than two steps measured."""
    tokens = measured[measured >= max(1, low // 2)]
    near = tokens[tokens <= 2 * high]
    if near.size and near[-1] < (low + high) / 2:
        if tokens.size == near.size:
            return None  # nothing measured that far: a flat stretch would price a compute-bound one as free
        near = tokens[: near.size + 1]
    if near.size < 2:
        return None
    return _slope(near, step_s[near])


def needs_draft_model(key: str) -> bool:
    """An estimate key's source drafts with an engine call (its cost is measured; prompt lookup's is none)."""
    return SOURCES[source_of(key)].needs_draft_model


class EngineCosts:
    """A request's view of the deployment's measured engine costs; every reading is kept until they change
    (Estimates.memo)."""

    def __init__(self, estimates: Estimates, settings: Any):
        """`settings`: trtspec.config.AdaptivePolicy (batched_steps, cost_smoothing among them)."""
        self.est, self.settings = estimates, settings

    @staticmethod
    def _nearest_load(counts: np.ndarray, n: int) -> int | None:
        """The load nearest n with any k measured (n itself first); None if there is none."""
        if counts[:, n].any():
            return n
        loads = nonzero(counts.any(axis=0))
        return None if loads.size == 0 else int(loads[np.argmin(np.abs(loads - n))])

    @classmethod
    def _curve(cls, means: np.ndarray, counts: np.ndarray, n: int, kmax: int, proportional: bool) -> list[float] | None:
        """Mean costs of k = 0..kmax at load n. Unmeasured: from the nearest measured load, and across k linearly
        between (or beyond) the two nearest measured k there (one measured k: the same cost, or in proportion to
        k); None when nothing is measured."""
        n = cls._nearest_load(counts, n)
        if n is None:
            return None
        col, measured = means[:, n].tolist(), counts[:, n].tolist()
        seen = [k for k, c in enumerate(measured) if c]
        out = []
        for k in range(kmax + 1):
            if measured[k]:
                out.append(col[k])
                continue
            if len(seen) > 1:
                out.append(max(_through_nearest_two(col, seen, k), 0.0))
            else:
                k0 = seen[0]
                out.append(col[k0] * k / k0 if proportional and k0 else col[k0])
        return out

    def _verify_curve(self, n: int, kmax: int) -> list[float] | None:
        """Seconds of a target call verifying k = 0..kmax drafts at load n, from what load n measured: None unless it
        measured a plain step and some k >= 1. A call with drafts is a different computation from a plain step (a
        multi-token segment, k + 1 logits rows) and can cost a fixed amount more whatever its k, so the k >= 1 part
        is its own line, through the two nearest measured k >= 1. Beside the only one: alone (where a call's time is
        exact and a try is cheap), flat, so that a longer draft is tried and measured, not assumed to cost k times
        the first row's extra; at a load shared with others, in proportion to k from the plain step."""
        means, counts = self.est.verify_s[:, n].tolist(), self.est.verify_n[:, n].tolist()
        drafted = [k for k in range(1, len(counts)) if counts[k]]
        if not counts[0] or not drafted:
            return None
        # Verifying fewer drafts never costs more. Each k's mean moves only while it is chosen, and on a machine whose
        # speed drifts an old mean can sit above a longer draft's fresh one and strand the controller on the k
        # around it. Out of order, the means are pooled, each weighed by its samples (the smoothing's window at most).
        window = 1.0 / getattr(self.settings, "cost_smoothing", 0.1)
        pooled = _pooled([means[k] for k in drafted], [min(counts[k], window) for k in drafted])
        for k, v in zip(drafted, pooled):
            means[k] = v
        out = [means[0]]
        for k in range(1, kmax + 1):
            if counts[k]:
                out.append(means[k])
                continue
            if len(drafted) > 1:
                out.append(_through_nearest_two(means, drafted, k))
            else:
                k0 = drafted[0]
                out.append(means[k0] if n == ALONE else means[0] + (means[k0] - means[0]) * k / k0)
        return [out[0]] + [max(c, out[0]) for c in out[1:]]

    def token_cost(self, load: int, kmax: int) -> float:
        return self.est.memo(('token_cost', load, kmax), lambda: self._token_cost(load, kmax))

    def _token_cost(self, load: int, kmax: int) -> float:
        """Seconds one more token adds to a target step at `load` in flight, where its draft rows would take it (from
        `load` to load * (1 + kmax) tokens): the slope of the steps measured by the tokens in them, through the
        measured steps between half the load's tokens and the most a drafting batch would hold (least squares).
        Memory-bound steps read draft rows as nearly free; compute-bound ones price each. 0 when unmeasured."""
        n = load_key(load)
        near = nonzero(self.est.step_n, max(1, n // 2), max(2 * n, n * (1 + kmax)))
        if near.size < 2:
            return 0.0
        return _slope(near, self.est.step_s[near])

    def batch_steps(self, load: int, kmax: int) -> list[float] | None:
        return self.est.memo(('batch_steps', load, kmax), lambda: self._batch_steps(load, kmax))

    def _batch_steps(self, load: int, kmax: int) -> list[float] | None:
        """Seconds of the target's step with every one of `load` requests in it verifying k = 0..kmax drafts (load *
        (1 + k) tokens), on the line through the steps measured by the tokens in them near there; None where fewer
        than two token counts were measured near, or alone (a step's own curve: verify_costs). This is what drafting
        together costs, and what not drafting would: with others drafting, a request's own plain call waits for
        their rows too, so its time says nothing of a step without them."""
        n = load_key(load)
        if n == ALONE:
            return None
        near = nonzero(self.est.step_n, max(1, n // 2), 2 * n * (1 + kmax))
        if near.size < 2 or near[-1] < n:
            return None
        # A GPU's steps cost more a token as they turn compute-bound: on an H100 at 64 in flight 128 tokens add
        # 0.89 ms to 64's, 576 add 10.8. The line through steps up to twice the most rows priced priced a draft
        # row of k = 1-2 at half again its cost; the steps up to the most rows priced price it, where they span
        # enough of the way for a slope (steps close together differ by their contexts more than by their tokens).
        within = near[near <= n * (1 + kmax)]
        if within.size >= 2 and within[-1] - within[0] >= n * kmax / 2:
            near = within
        y = self.est.step_s[near]
        slope, at_mean = _slope(near, y), float(y.mean())
        return [max(at_mean + slope * (n * (1 + k) - near.mean()), 1e-9) for k in range(kmax + 1)]

    def row_costs(self, kmax: int, load: int = ALONE) -> list[float]:
        """What k = 0..kmax draft rows add to a target step at `load`, from where that is observable. A request's own
        call time shows it only when the request is alone in flight: with others in the step, its k = 0 and k > 0
        calls wait for the same steps, whose length the others' rows set too, so their difference reads rows as
        nearly free. Alone, a call with drafts can cost a fixed amount more than a plain step and a few rows more
        little; in a batch every row costs at least what one more token adds to the steps, measured by the tokens
        in them (token_cost), and what one more request adds to a plain step between the lightest and heaviest
        measured loads; neither measured: nothing (flat: a probe measures it)."""
        per_row = self.request_cost()
        per_row = max(per_row, self.token_cost(load, kmax)) if load_key(load) != ALONE else per_row
        alone = self._verify_curve(ALONE, kmax)
        if alone is None:
            return [per_row * k for k in range(kmax + 1)]
        rows = [c - alone[0] for c in alone]
        return rows if load_key(load) == ALONE else [max(r, per_row * k) for k, r in enumerate(rows)]

    def request_cost(self, near: int | None = None) -> float:
        return self.est.memo(('request_cost', near), lambda: self._request_cost(near))

    def _request_cost(self, near: int | None = None) -> float:
        """Seconds one more request in flight adds to a plain step: between the lightest and heaviest measured
        loads, or `near` a load (the slope through the plain steps measured from half to twice it, where at least
        two were; else the former). 0: fewer than two loads measured."""
        means, plain = self.est.verify_s, nonzero(self.est.verify_n[0])
        if plain.size < 2:
            return 0.0
        if near is not None:
            close = plain[(plain >= max(1, near // 2)) & (plain <= 2 * near)]
            if close.size >= 2:
                return _slope(close, means[0, close])
        lo, hi = int(plain[0]), int(plain[-1])
        return max(float(means[0, hi] - means[0, lo]) / (hi - lo), 0.0)

    def batched(self) -> bool:
        """Whether the engines batch the requests in flight into steps that cost little more for more rows
        (settings.batched_steps; unset: true)."""
        return getattr(self.settings, "batched_steps", None) is not False

    def verify_costs(self, kmax: int, load: int) -> list[float] | None:
        return self.est.memo(('verify_costs', kmax, load), lambda: self._verify_costs(kmax, load))

    def _verify_costs(self, kmax: int, load: int) -> list[float] | None:
        """Seconds of a target call verifying k = 0..kmax drafts at `load` in flight: the plain step measured at the
        nearest load, plus what the draft rows add to a step (row_costs), or more where alone measured more."""
        means, counts, n = self.est.verify_s, self.est.verify_n, load_key(load)
        col = self._nearest_load(counts, n)
        if col is None:
            return None
        seen = nonzero(counts[:, col])
        rows = self.row_costs(max(kmax, int(seen[-1])), load)
        k0 = int(seen[0])
        base = max(float(means[k0, col]) - rows[k0], 0.0)
        out = [base + rows[k] for k in range(kmax + 1)]
        if col == ALONE:  # alone a call's own time is exact; shared, it is the others' too (their rows, prefill)
            own = self._verify_curve(col, kmax)
            if own is not None:
                out = [max(a, b) for a, b in zip(out, own)]
        return out

    def verify_cost(self, k: int, load: int) -> float | None:
        curve = self.verify_costs(k, load)
        return None if curve is None else curve[k]

    def _draft_fit(self, m: int) -> tuple[float | None, float | None]:
        """(a, c) fitted at batch m: seconds per drafted and per caught-up token; None where the calls measured
        there cannot tell them apart (a probe after a pause always catches up on about as much)."""
        kk, km, mm, ky, my = self.est.draft_fit[m].tolist()
        if mm <= 1e-12:
            return ky / kk, None  # no call caught up: every second is the drafting's
        det = kk * mm - km * km
        if det > 0.1 * kk * mm:
            a, c = (ky * mm - my * km) / det, (kk * my - km * ky) / det
            if a > 0 and 0 <= c <= a:  # a prefill token never costs more than a drafted one
                return a, c
        return None, None

    def plain_call(self, load: int) -> tuple[float, float] | None:
        return self.est.memo(('plain_call', load), lambda: self._plain_call(load))

    def _plain_call(self, load: int) -> tuple[float, float] | None:
        """(seconds a plain call costs beyond its steps, seconds a step) at the load nearest `load`, fitted over the
        plain calls of every length measured there; None where they cannot tell the two apart (calls of one length).
        A call of one token pays the engine request's round trip for one token, a run of 16 for 16."""
        loads = nonzero(self.est.plain_fit_n)
        if loads.size == 0:
            return None
        m = int(loads[np.argmin(np.abs(loads - load_key(load)))])
        s1, sx, sxx, sy, sxy = self.est.plain_fit[m].tolist()
        var = sxx / s1 - (sx / s1) ** 2
        if var < 0.5:  # (the steps of calls differ by less than a token or so)
            return None
        b = (sxy / s1 - sx / s1 * sy / s1) / var
        a = sy / s1 - b * sx / s1
        return (a, b) if a >= 0 and b > 0 else None

    def plain_step(self, load: int) -> float | None:
        return self.est.memo(('plain_step', load), lambda: self._plain_step(load))

    def _plain_step(self, load: int) -> float | None:
        """Seconds of a plain target step measured at the load nearest `load` (None: none measured)."""
        loads = nonzero(self.est.verify_n[0])
        if loads.size == 0:
            return None
        return float(self.est.verify_s[0, loads[np.argmin(np.abs(loads - load_key(load)))]])

    def _scaled(self, value: float, there: int, here: int) -> float:
        """A draft-model cost measured at batch `there` at batch `here`: as a plain target step scales between those
        loads (the draft model runs on the same kind of device, memory-bound or not alike)."""
        if here == there:
            return value
        a, b = self.plain_step(here), self.plain_step(there)
        return value * a / b if a and b else value

    def draft_rates(self, batch: int) -> tuple[float, float] | None:
        return self.est.memo(('draft_rates', batch), lambda: self._draft_rates(batch))

    def _draft_rates(self, batch: int) -> tuple[float, float] | None:
        """(seconds per drafted token, per caught-up token) of a draft-model call with `batch` requests in it, from
        the fit at the nearest measured batch; where that cannot tell drafting from catching up, the drafting rate
        of the nearest batch that can, and the rest of its calls' time caught up; None: no draft call measured."""
        fitted = nonzero(self.est.draft_fit_n)
        if fitted.size == 0:
            return None
        order = sorted(fitted.tolist(), key=lambda b: abs(b - batch))
        m = order[0]
        a, c = self._draft_fit(m)
        if a is None:
            ref = next((b for b in order if self._draft_fit(b)[0] is not None), None)
            kk, km, mm, ky, my = self.est.draft_fit[m].tolist()
            if ref is None:  # nothing separates them yet: all of it drafting (a probe goes on to a clean call)
                a, c = ky / kk, 0.0
            else:
                a = self._scaled(self._draft_fit(ref)[0], ref, m)
                c = min(max((my - a * km) / mm, 0.0), a)
        if c is None:
            known = next((self._draft_fit(b)[1] for b in order if self._draft_fit(b)[1] is not None), 0.0)
            c = known
        units = nonzero(self.est.draft_units_n)
        if self.batched() and units.size:  # batched, the drafting rate from calls whose catch-up is priced as a step's
            u = int(units[np.argmin(np.abs(units - batch))])
            uu, uy = self.est.draft_units[u].tolist()
            if uu > 0:
                return self._scaled(uy / uu, u, batch), self._scaled(c, m, batch)
        return self._scaled(a, m, batch), self._scaled(c, m, batch)

    def draft_costs(self, kmax: int, load: int, missed: int = 0,
                    rates: tuple[float, float] | None = None) -> list[float] | None:
        """A request's share of the draft-model call for k = 0..kmax, priced as every request in flight drafting
        together: the draft engine's call for all of them, divided among them. A choice made one request at a time
        would otherwise never see what the batch costs: while few requests draft, each pays a whole draft call,
        and none would start. Where the draft engine does not batch the calls (settings.batched_steps false),
        each request pays its whole call. `missed`: tokens the draft model has not seen yet (beyond the usual 2, it prefills
        them first), at what one more caught-up token adds to the call."""
        b = load_key(load) if self.batched() else ALONE
        rates = rates or self.draft_rates(b)
        if rates is None:
            return None
        catchup = self.catchup_cost(max(0, missed - 2), load, rates)  # the request's own prefill: not shared
        return [0.0] + [rates[0] * k / b + catchup for k in range(1, kmax + 1)]

    def catchup_cost(self, tokens: float, load: int, rates: tuple[float, float]) -> float:
        """Seconds a draft-model call at `load` adds to catch up on `tokens` more (beyond the usual 2): a prefill
        chunk in its first step. Batched, priced as the target's steps grow from `load` to load + tokens tokens (the
        slope of the steps measured there) times the draft model's step over the target's: the fitted per-token rate
        (rates[1]) comes mostly from probes' short catch-ups, and on a memory-bound device a prompt's prefill costs
        a fraction of that per token, which priced at the short rate kept a deployment whose requests arrive with
        prompts from drafting. Unbatched, or no steps measured there: the fitted rate."""
        if tokens <= 0:
            return 0.0
        n = load_key(load)
        weight = self.token_weight(n, tokens) if self.batched() and n != ALONE else None
        return rates[0] * weight * tokens if weight is not None else rates[1] * tokens

    def step_slope(self, low: int, high: int) -> float | None:
        return self.est.memo(('step_slope', low, high), lambda: self._step_slope(low, high))

    def _step_slope(self, low: int, high: int) -> float | None:
        return step_slope(nonzero(self.est.step_n, max(1, low // 2)), self.est.step_s, low, high)

    def marginal_draft_costs(self, kmax: int, load: int, rates: tuple[float, float]) -> list[float]:
        """What one more request drafting k = 0..kmax adds to a batched draft-model call of `load` requests: the
        call's time per position (rates[0]) times the share one more request adds to a step there, read off the
        target's plain steps (request_cost near the load over the plain step: both engines run on one device,
        memory-bound or not alike). At most the request's share of the call (draft_costs)."""
        n = load_key(load)
        step = self.plain_step(n)
        per_request = min(self.request_cost(n) / step, 1.0 / n) if step else 1.0 / n
        return [rates[0] * k * per_request for k in range(kmax + 1)]

    def draft_cost(self, source: str, k: int, load: int, missed: int = 0) -> float | None:
        if k == 0 or not needs_draft_model(source):
            return 0.0  # prompt lookup runs in the loop's process: no engine step
        costs = self.draft_costs(k, load, missed)
        return None if costs is None else costs[k]


    def token_weight(self, rows: int, tokens: float) -> float | None:
        """What one of `tokens` more tokens adds to a step of `rows` one-token rows, as a share of that step: the
        slope of the target's steps measured between rows and rows + tokens over its step of `rows` tokens (a plain
        call's time there carries others' prefill); 0 tokens: 0; None: not measured there. The draft model runs on the same device, its steps grow with tokens alike."""
        if tokens <= 0:
            return 0.0
        slope, steps = self.step_slope(rows, rows + int(tokens)), self.batch_steps(rows, 0)
        return slope / steps[0] if slope is not None and steps else None
