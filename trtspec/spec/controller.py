"""The goodput controller (draft_length_policy: adaptive): per iteration, the draft source and k, 0 included, with the
most expected tokens per second of the deployment, from acceptance and engine costs it measures online.

What it knows is trtspec.spec.estimates.Estimates, shared by every loop process of a deployment; `GoodputController` is
one request's view of them. The per-iteration decision that uses it is trtspec.spec.planner's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from trtspec.spec.drafters import ESTIMATE_KEYS, SOURCES, source_of
from trtspec.spec.estimates import MAX_POSITIONS, MAX_STEP_TOKENS, Estimates, load_key, nonzero

ALONE = 1  # the load at which a request's own call time is the whole step's
SHARED_MARGIN = 0.03  # the least gain, at a shared load, for which the deployment drafts
PROBE_SHARE = 0.05  # the most of the deployment's time a source's probes may cost it (their draft calls)
MAX_PROBE_BACKOFF = 4.0  # failed probes space the next ones out, up to this many times


def _mean_update(means: np.ndarray, counts: np.ndarray, index: tuple, value: float, smoothing: float) -> None:
    """A running mean that becomes an exponential one after 1/smoothing samples (tracks load and context)."""
    counts[index] += 1
    weight = max(1.0 / counts[index], smoothing)
    means[index] += weight * (value - means[index])


def _through_nearest_two(values: list[float], measured: list[int], k: int) -> float:
    """values[k] on the line through the two measured k nearest k (between or beyond them)."""
    k0, k1 = sorted(measured, key=lambda m: abs(m - k))[:2]
    return values[k0] + (values[k1] - values[k0]) * (k - k0) / (k1 - k0)


def _needs_draft_model(key: str) -> bool:
    """An estimate key's source drafts with an engine call (its cost is measured; prompt lookup's is none)."""
    return SOURCES[source_of(key)].needs_draft_model


@dataclass(frozen=True)
class Choice:
    source: str | None  # None: a plain target step
    k: int
    probe: bool = False


class GoodputController:
    """Chooses, per iteration of one request, the draft source and k in 0..cap maximising the deployment's
    expected tokens per second of engine time: (1 + expected accepted tokens) / (the request's share of a plain
    step at the current load + what the k draft rows add to that step + the draft-model call); a plain step
    (k = 0, one token per share) is always a candidate. At one in flight this is the request's own speed.

    Acceptance per position per source blends the deployment's estimate (shared by its loop processes) with the
    request's own drafts; the estimate starts pessimistic (acceptance 0 at the first position, each deeper
    position's prior the one before it), so a fresh deployment starts at k = 0. Costs are the loop's own engine
    calls, timed by k and requests in flight. After `probe_every` of the deployment's iterations (any request's)
    without drafting from a source, it is tried once (a probe), so acceptance or load that changes brings drafting
    back; each probe of the draft model that does not bring it back doubles the deployment's interval, up to
    8 * probe_every. Prompt lookup is probed alone only: its acceptance is learnt without drafting (`observe`)."""

    def __init__(self, estimates: Estimates, settings: Any):
        """`settings`: trtspec.config.AdaptivePolicy (probe_every, prior_drafts, request_weight, cost_smoothing,
        acceptance_decay)."""
        self.est, self.settings = estimates, settings
        s = len(ESTIMATE_KEYS)
        self.reached = np.zeros((s, MAX_POSITIONS))
        self.accepted = np.zeros((s, MAX_POSITIONS))

    # -------------------------------------------------------------- estimates

    def acceptance(self, source: str, positions: int, optimistic: bool = False, shared: bool = False) -> list[float]:
        """Conditional acceptance of positions 0..positions-1 (accepted given every earlier one was). `optimistic`
        adds one standard error, so a deeper position measured on a few unlucky drafts is tried again; a position
        with no acceptance seen gets no bonus (the pessimistic start). `shared`: the deployment's estimate alone,
        without this request's own drafts."""
        si = ESTIMATE_KEYS.index(source)
        st, prior, out = self.settings, 0.0, []
        shared_acc, shared_seen = self.est.accepted[si, :positions].tolist(), self.est.reached[si, :positions].tolist()
        own_acc, own_seen = self.accepted[si, :positions].tolist(), self.reached[si, :positions].tolist()
        if shared:  # the deployment's alone
            own_acc, own_seen = [0.0] * positions, [0.0] * positions
        for i in range(positions):
            # the pessimistic prior is a fresh deployment's: its weight fades as drafts reach the position
            weight = st.prior_drafts * min(1.0, st.prior_drafts / max(shared_seen[i], 1e-9))
            shared = (shared_acc[i] + weight * prior) / (shared_seen[i] + weight)
            a = (own_acc[i] + st.request_weight * shared) / (own_seen[i] + st.request_weight)
            prior = a
            if optimistic:
                a = min(1.0, a + (a * (1 - a) / (shared_seen[i] + own_seen[i] + 1)) ** 0.5)
            out.append(a)
        return out

    def expected_accepted(self, source: str, k: int, optimistic: bool = False) -> float:
        """Expected accepted tokens of a k-token draft: the sum over positions of the chance all up to it pass."""
        total, p = 0.0, 1.0
        for a in self.acceptance(source, k, optimistic):
            p *= a
            total += p
        return total

    @staticmethod
    def _nearest_load(counts: np.ndarray, n: int) -> int | None:
        """The load nearest n with any k measured (n itself first); None if there is none."""
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
        tokens = nonzero(self.est.step_n)
        n = load_key(load)
        near = tokens[(tokens >= max(1, n // 2)) & (tokens <= max(2 * n, n * (1 + kmax)))]
        if near.size < 2:
            return 0.0
        x, y = near - near.mean(), self.est.step_s[near]
        return max(float(x @ y) / float(x @ x), 0.0)

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
        tokens = nonzero(self.est.step_n)
        near = tokens[(tokens >= max(1, n // 2)) & (tokens <= 2 * n * (1 + kmax))]
        if near.size < 2 or near[-1] < n:
            return None
        y = self.est.step_s[near]
        x = near - near.mean()
        slope = max(float(x @ y) / float(x @ x), 0.0)
        at_mean = float(y.mean())
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
                x = close - close.mean()
                return max(float(x @ means[0, close]) / float(x @ x), 0.0)
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
        if det > 1e-6 * kk * mm:
            a, c = (ky * mm - my * km) / det, (kk * my - km * ky) / det
            if a > 0 and 0 <= c <= a:  # a prefill token never costs more than a drafted one
                return a, c
        return None, None

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
        """Seconds per token of the target's steps between `low` and `high` tokens: the least-squares slope of the
        steps measured from half of `low` to twice `high` tokens. Where none of them reaches halfway to `high`, the
        nearest step measured beyond joins them: a step's cost grows with its tokens no faster than where it is
        compute-bound, so that slope bounds the one in between. None: fewer than two steps measured."""
        tokens = nonzero(self.est.step_n)
        tokens = tokens[tokens >= max(1, low // 2)]
        near = tokens[tokens <= 2 * high]
        if near.size and near[-1] < (low + high) / 2:
            if tokens.size == near.size:
                return None  # nothing measured that far: a flat stretch would price a compute-bound one as free
            near = tokens[: near.size + 1]
        if near.size < 2:
            return None
        x, y = near - near.mean(), self.est.step_s[near]
        return max(float(x @ y) / float(x @ x), 0.0)

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
        if k == 0 or not _needs_draft_model(source):
            return 0.0  # prompt lookup runs in the loop's process: no engine step
        costs = self.draft_costs(k, load, missed)
        return None if costs is None else costs[k]

    # -------------------------------------------------------------- the decision

    def _step_costs(self, load: int, kmax: int) -> tuple[float, list[float]] | None:
        """(the plain step at `load`, what k = 0..kmax draft rows of every request add to it per request); None: no
        plain step measured yet."""
        verify = self.verify_costs(kmax, load)
        if verify is None:
            return None
        # Goodput is the deployment's tokens per second, not this request's. With n in flight a plain step is
        # shared by n requests: this request's share of it is step / n. Its draft rows lengthen the step every
        # request in it waits for (row_costs prices that), and its draft-model call is shared by the requests
        # drafting with it (draft_costs), as the draft engine batches them; alone, this is the request's latency.
        n = load_key(load)
        steps = self.batch_steps(load, kmax)
        if steps is not None:  # shared: the batch's step by its tokens, every request in it drafting k alike
            verify = [steps[0]] + [max(s, steps[0]) for s in steps[1:]]
            rows = [(s - steps[0]) / n for s in verify]
            if not self.batched():
                # Where a step is not a batched one (a CPU's: compute-bound), a draft row costs what one more request
                # adds to a plain step near this load: the line by tokens is fitted through call times that also
                # carry waits and the others' prefill, which read rows as cheaper.
                near = self.request_cost(n)
                rows = [max(r, k * near) for k, r in enumerate(rows)]
        else:
            rows = [max(v - verify[0], 0.0) for v in verify]
        return verify[0], rows

    def _best(self, load: int, candidates: Mapping[str, int], missed: int = 0,
              remaining: int | None = None) -> Choice | None:
        """The choice of most expected tokens per second, without probes (None: no plain step measured yet).
        `remaining`: the request's tokens still to come, over whose drafting iterations the draft model's catch-up
        is spread (once caught up, it stays caught up while the request drafts); None: none, the whole catch-up
        on this iteration."""
        kmax = max(candidates.values(), default=0)
        costs = self._step_costs(load, kmax)
        if costs is None:
            return None
        step, rows = costs
        n = load_key(load)
        share = step / n
        best, best_value = Choice(None, 0), 1.0 / max(share, 1e-9)
        for source, cap in candidates.items():
            if cap <= 0:
                continue
            draft, marginal, catchup = [0.0] * (kmax + 1), [0.0] * (kmax + 1), 0.0
            if _needs_draft_model(source):
                rates = self.draft_rates(load_key(load) if self.batched() else ALONE)
                if rates is None:
                    continue  # unmeasured: a probe measures it
                draft = self.draft_costs(kmax, load, rates=rates)
                marginal = self.marginal_draft_costs(kmax, load, rates) if n != ALONE and self.batched() else draft
                catchup = self.catchup_cost(max(0, missed - 2), load, rates)

            def values(acceptance: list[float], draft: list[float], catchup: float,
                       over: int | float | None = remaining) -> list[float]:
                """Expected tokens per second by k; the catch-up spread over the iterations of `over` tokens."""
                out, expected, p = [1.0 / max(share, 1e-9)], 0.0, 1.0
                for k, a in enumerate(acceptance, start=1):
                    p *= a
                    expected += p
                    iterations = max(1.0, (over or 0) / (1.0 + expected))
                    out.append((1.0 + expected) / max(share + rows[k] + draft[k] + catchup / iterations, 1e-9))
                return out

            if n == ALONE:
                own = values(self.acceptance(source, cap, optimistic=True), draft, catchup)
                k = int(np.argmax(own))
            else:
                # Shared, the requests draft alike: the draft engine's call runs as many steps as its longest draft,
                # so a request drafting more than the others lengthens it for all, and one drafting fewer does not
                # shorten it. The deployment's k at this load is chosen from its own estimate (every request finds
                # the same), and each request takes it, or a plain step where its own acceptance and catch-up say
                # so. Half the requests drafting costs the rest the draft engine's call too, so a
                # gain within the estimates' noise is not taken to start drafting: acceptance as estimated (not
                # optimistic; probes explore), and a margin.
                steady = self.steady_catchup() if self.batched() and _needs_draft_model(source) else None
                if steady is None:  # unbatched (a CPU's), each request's call is its own: its own catch-up
                    together = values(self.acceptance(source, cap, shared=True), draft, catchup)
                else:  # the deployment's: every request's prompt, over a request's life (the same for all)
                    together = values(self.acceptance(source, cap, shared=True), draft,
                                      self.catchup_cost(steady[0], load, rates), steady[1])
                k = int(np.argmax(together))
                # the margin is to start drafting; once a batching deployment drafts, it goes on while drafting pays
                # at all, so that the estimates' noise around the margin does not switch it on and off (unbatched, a
                # CPU's, each request's call is its own: the margin stays)
                drafting = self.batched() and self._drafting_now(source, step)
                margin = 0.0 if drafting else SHARED_MARGIN
                k = k if together[k] > (1 + margin) * together[0] else 0
                # Once the deployment drafts, a batched draft call runs for the others whether or not this request
                # is in it: the request weighs what it adds to that call (its row, its catch-up), not a share of it.
                # Otherwise a request that joined with a prompt to catch up on would stay out, waiting for the
                # others' calls all the same, and the steps would mix drafting and plain requests, the worst of both.
                own = values(self.acceptance(source, cap), marginal, catchup)
                k = k if own[k] > own[0] else 0
            if k and own[k] > best_value:
                best, best_value = Choice(source, k), own[k]
        return best

    def request_arrived(self, prompt: int, budget: int) -> None:
        """A request's first iteration: `prompt` tokens, at most `budget` to generate. Their means over the recent
        arrivals price what drafting costs the deployment in the steady state: the draft model prefills every
        request's prompt once, over its life."""
        est = self.est
        with est.locked():
            est.arrivals *= self.settings.acceptance_decay
            est.arrivals += (prompt, budget, 1.0)

    def steady_catchup(self) -> tuple[float, float] | None:
        """(tokens the draft model catches up on per request beyond the usual 2, tokens a request generates) over
        the recent arrivals; None before any."""
        prompt, budget, count = self.est.arrivals.tolist()
        return (max(prompt / count - 2, 0.0), budget / count) if count > 0 else None

    def _drafting_now(self, source: str, step: float) -> bool:
        """Whether the deployment drafted from `source` within its last two steps of `step` seconds (its clock
        runs in the deployment's seconds). A probe counts: where acceptance came back, the requests in its step
        take drafting up again without waiting to clear the margin (measured on acceptance that drops and
        recovers)."""
        est = self.est
        return float(est.clock[0] - est.last_drafted[ESTIMATE_KEYS.index(source)]) <= 2 * step

    def drafting_lately(self, load: int) -> bool:
        """Whether a request chose to draft from any source within the deployment's last `probe_every` plain steps
        at `load`. Where none did, drafting pays nowhere now: a request steps aside in whole plain runs, as many
        target calls as target-only makes, and a probe (the deployment's, in time) tells when that changes.
        Batched, always: a request in a long run would stay out of the others' drafting when it starts, and the
        steps would mix drafting and plain requests."""
        step = self.verify_cost(0, load)
        if step is None or self.batched():
            return True
        return float(self.est.clock[0] - self.est.last_chosen.max()) <= self.settings.probe_every * step

    def _chose(self, choice: Choice | None) -> Choice | None:
        """Marks a request's choice to draft (not a probe's) for drafting_lately."""
        if choice is not None and choice.source is not None and choice.k > 0:
            self.est.last_chosen[ESTIMATE_KEYS.index(choice.source)] = self.est.clock[0]
        return choice

    def _probe_due(self, source: str, load: int) -> bool:
        """A probe of `source` is due once the deployment has run, since the source last drafted (or was learnt),
        long enough that the probe costs it a bounded share of its time: its plain step `probe_every` times, and
        the probe's draft call PROBE_SHARE^-1 times, both times the source's backoff. In time, not in iterations:
        with many requests in flight, iterations come many to a step, and every request in the step waits for a
        probe's draft call."""
        si = ESTIMATE_KEYS.index(source)
        est = self.est
        step = self.verify_cost(0, load)
        if step is None:
            return False  # a plain step first: what a probe's time is measured against
        interval = self.settings.probe_every * step
        if _needs_draft_model(source):
            rates = self.draft_rates(1)
            if rates is not None:  # what the probe's draft call costs the deployment: drafting alone
                interval = max(interval, rates[0] * self._probe_len(source, MAX_POSITIONS) / PROBE_SHARE)
        return float(est.clock[0] - est.last_drafted[si]) >= interval * max(1.0, float(est.probe_backoff[si]))

    def next_draft_len(self, source: str, cap: int, load: int) -> int:
        """How many tokens to ask a drafter inside the target engine (EAGLE-3) to draft for the next call, which each
        call computes when asked: the k the next iteration would draft if drafting from it pays now, the k of its
        probe if one is due, else 0. So a k = 0 stretch costs what plain steps cost, and a call drafting k pays
        for k tokens of drafting, not for `cap` (the head's steps are sequential)."""
        if cap <= 0:
            return 0
        best = self._chose(self._best(load, {source: cap}))
        if best is not None and best.source == source:
            return best.k
        if self._probe_due(source, load):
            return self._probe_len(source, cap)
        return 0

    def _probe_len(self, source: str, cap: int) -> int:
        """A probe drafts through the positions believed good (acceptance >= 0.5) and one more."""
        good = [a >= 0.5 for a in self.acceptance(source, cap)]
        depth = good.index(False) if not all(good) else cap
        return max(1, min(cap, depth + 1))

    def choose(self, load: int, candidates: Mapping[str, int], missed: int = 0, may_probe: bool = True,
               remaining: int | None = None) -> Choice:
        """`candidates`: estimate key (drafters.estimate_key: the source, for prompt lookup with its match's level)
        -> the most tokens it may propose now (for prompt lookup: its match's length);
        `missed`: tokens the draft model would catch up on; `may_probe` false: no probe now (a request's first
        call, whose first token a probe of the draft model would delay by its prefill of the whole prompt: the
        next iteration, this request's or another's, probes instead); `remaining`: the request's tokens still to
        come (the catch-up is spread over them). Sources in asking order (the first wins a tie).
        Each candidate's value is its expected tokens per second, acceptance optimistic by its standard error."""
        best = self._chose(self._best(load, candidates, missed, remaining))
        if best is None:
            return Choice(None, 0)  # measure a plain step first
        # Probes are the deployment's, like the estimates they feed: one request's probe informs every request, so a
        # source is probed once the deployment has gone long enough without it (_probe_due), not every request.
        est = self.est
        if best.source is not None:
            est.probe_backoff[ESTIMATE_KEYS.index(best.source)] = 1.0
        for source, cap in candidates.items():
            si = ESTIMATE_KEYS.index(source)
            # prompt lookup's acceptance is learnt without drafting (observe), and what its rows cost is measured
            # alone (row_costs): with others in flight a probe of it would learn nothing and lengthen their step
            if not _needs_draft_model(source) and load_key(load) != ALONE:
                continue
            if may_probe and source != best.source and cap > 0 and self._probe_due(source, load):
                with est.locked():
                    est.last_drafted[si] = est.clock[0]
                    if _needs_draft_model(source):  # prompt lookup's probes cost a verify row, no engine step
                        est.probe_backoff[si] = min(2.0 * max(1.0, float(est.probe_backoff[si])), MAX_PROBE_BACKOFF)
                return Choice(source, self._probe_len(source, cap), probe=True)
        return best

    def record(
        self,
        load: int,
        source: str | None,
        proposed: int,
        accepted: int,
        verify_s: float | None,
        draft_s: float | None = None,
        missed: int = 0,
        steps: int = 1,
        draft_batch: int = 1,
        elapsed_s: float | None = None,
        step_tokens: int | None = None,
        draft_missed: int | None = None,
    ) -> None:
        """One iteration: `proposed` tokens from `source` (None: none), `accepted` of them; the verify call's seconds
        per step (None: not a clean sample, e.g. the request's first call with its prefill) and the draft-model
        call's; `steps`: the target's steps in the call (a plain run's tokens); `draft_batch`: the requests that
        were in draft-model calls together with it; `elapsed_s`: the iteration's seconds (its calls'; default:
        the verify's and the draft's), which advance the deployment's clock by this request's share; `step_tokens`: the tokens in the target's step; `draft_missed`: the tokens the
        draft call caught up on, for all the requests in it (None: its own only)."""
        n, est, st = load_key(load), self.est, self.settings
        with est.locked():
            if elapsed_s is None:
                elapsed_s = (verify_s or 0.0) * steps + (draft_s or 0.0)
            est.clock[0] += elapsed_s / n
            if source is not None and proposed:
                est.last_drafted[ESTIMATE_KEYS.index(source)] = est.clock[0]
            est.costs_version[0] += verify_s is not None or (draft_s is not None and source is not None)
            if verify_s is not None:
                _mean_update(est.verify_s, est.verify_n, (proposed, n), verify_s, st.cost_smoothing)
                # alone, the (k, load) curve is the step's own; a step past the table is not priced at its end
                if step_tokens and n != ALONE and step_tokens <= MAX_STEP_TOKENS:
                    _mean_update(est.step_s, est.step_n, (step_tokens,), verify_s, st.cost_smoothing)
            if source is None or not proposed:
                return
            si = ESTIMATE_KEYS.index(source)
            self._count(si, proposed, accepted)
            if draft_s is None or not _needs_draft_model(source):
                return
            b, m = load_key(draft_batch), float(max(0, missed - 2) if draft_missed is None else draft_missed)
            est.draft_fit_n[b] += 1
            w = max(1.0 / est.draft_fit_n[b], st.cost_smoothing)
            sample = np.array([proposed * proposed, proposed * m, m * m, proposed * draft_s, m * draft_s])
            est.draft_fit[b] += w * (sample - est.draft_fit[b])
            weight = self.token_weight(b, m) if self.batched() and b != ALONE else None
            if weight is not None:
                est.draft_units_n[b] += 1
                u = proposed + weight * m
                w = max(1.0 / est.draft_units_n[b], st.cost_smoothing)
                est.draft_units[b] += w * (np.array([u * u, u * draft_s]) - est.draft_units[b])

    def token_weight(self, rows: int, tokens: float) -> float | None:
        """What one of `tokens` more tokens adds to a step of `rows` one-token rows, as a share of that step: the
        slope of the target's steps measured between rows and rows + tokens over its step of `rows` tokens (a plain
        call's time there carries others' prefill); 0 tokens: 0; None: not measured there. The draft model runs on the same device, its steps grow with tokens alike."""
        if tokens <= 0:
            return 0.0
        slope, steps = self.step_slope(rows, rows + int(tokens)), self.batch_steps(rows, 0)
        return slope / steps[0] if slope is not None and steps else None

    def observe(self, scored: Iterable[tuple[str, int, int]]) -> None:
        """Proposals that were not drafted, (estimate key, proposed, accepted) each, scored against the tokens the
        target went on to produce: as much an acceptance sample as a verified draft (greedy: accepted is equality;
        sampling: the same comparison the target's sample makes), at no cost. A free source (prompt lookup) so
        learns from every iteration, drafted or not, and a request learns its own rate within a few tokens."""
        scored = [(ESTIMATE_KEYS.index(key), proposed, accepted) for key, proposed, accepted in scored if proposed > 0]
        if not scored:
            return
        with self.est.locked():  # once for them all: the deployment's estimates are shared between processes
            for si, proposed, accepted in scored:
                self.est.last_drafted[si] = self.est.clock[0]  # what a probe would have learnt, learnt for free
                self._count(si, proposed, accepted)

    def _count(self, si: int, proposed: int, accepted: int) -> None:
        """Positions reached and accepted, into the deployment's decayed estimate and the request's own."""
        est, st = self.est, self.settings
        reached = min(accepted + 1, proposed)
        est.reached[si] *= st.acceptance_decay
        est.accepted[si] *= st.acceptance_decay
        est.reached[si, :reached] += 1
        est.accepted[si, :accepted] += 1
        self.reached[si, :reached] += 1
        self.accepted[si, :accepted] += 1
