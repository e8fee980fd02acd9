"""The goodput controller (draft_length_policy: adaptive): per iteration, the draft source and k, 0 included, with the
most expected tokens per second of the deployment, from acceptance and engine costs it measures online.

What it knows is trtspec.spec.estimates.Estimates, shared by every loop process of a deployment; `GoodputController` is
one request's view of them. The per-iteration decision that uses it is trtspec.spec.planner's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from trtspec.spec.drafters import ESTIMATE_KEYS
from trtspec.spec.engine_costs import ALONE, EngineCosts, needs_draft_model
from trtspec.spec.estimates import MAX_POSITIONS, MAX_STEP_TOKENS, Estimates, load_key, mean_update

# a probe of the target's own drafter (EAGLE-3) verifies up to this many drafts in a row: its catch-up paid, each
# more costs only the head's steps and the verify's rows, and one sample per catch-up left the estimate at its
# prior for long
PROBE_RUN = 4
SHARED_MARGIN = 0.03  # the least gain, at a shared load, for which the deployment drafts
PROBE_SHARE = 0.05  # the most of the deployment's time a source's probes may cost it (their calls and rows)
WAVE_SHARED = 4.0  # a batched probe's requests: their own costs at least this many times the draft steps they share
MAX_PROBE_BACKOFF = 4.0  # failed probes space the next ones out, up to this many times


@dataclass(frozen=True)
class Choice:
    source: str | None  # None: a plain target step
    k: int
    probe: bool = False


class GoodputController(EngineCosts):
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
        super().__init__(estimates, settings)
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
                # Compute-bound, each request's rows add to the step what one request's rows add: a drafting call's
                # own extra time at this load prices them. On this project's CPU kernels 4 rows cost what one does
                # and a 5th adds a quarter of a step, a cliff that the line through the steps flattens.
                own = self._verify_curve(n, kmax)
                if own is not None:
                    extra = np.maximum.accumulate([max(c - own[0], 0.0) for c in own])
                    rows = [max(r, float(e)) for r, e in zip(rows, extra)]
        else:
            rows = [max(v - verify[0], 0.0) for v in verify]
        return verify[0], rows

    def _best(self, load: int, candidates: Mapping[str, int], missed: int = 0,
              remaining: int | None = None, head_missed: int = 0, plain_run: int = 1,
              head_first: bool = False) -> Choice | None:
        """The choice of most expected tokens per second, without probes (None: no plain step measured yet).
        `remaining`: the request's tokens still to come, over whose drafting iterations the draft model's catch-up
        is spread (once caught up, it stays caught up while the request drafts); None: none, the whole catch-up
        on this iteration. `head_missed`: the positions the target's own drafter would catch up on (`head_first`:
        a request's first call, the prompt's, whose target states the call computes anyway). `plain_run`: the
        tokens a plain call takes (a run), over which its iteration's own overhead is spread; a drafting iteration
        pays it for its tokens alone (on this project's CPU, 4-5 ms of loop against a 38 ms step)."""
        kmax = max(candidates.values(), default=0)
        costs = self._step_costs(load, kmax)
        if costs is None:
            return None
        step, rows = costs
        n = load_key(load)
        share = step / n
        over = self.iteration_overhead(load) / n  # while one request's loop works, the engine steps the others
        # A plain step's mean is over calls of every length, each paying its call's round trip once: where the
        # request's plain calls are runs, a step of a run costs less (unbatched, where calls' times price the steps)
        runs = self.plain_call(load) if plain_run > 1 and not self.batched() else None
        plain_step = step if runs is None else min(step, runs[1] + runs[0] / plain_run)
        plain = plain_step / n + over / max(1, plain_run)
        best, best_value = Choice(None, 0), 1.0 / max(plain, 1e-9)
        for source, cap in candidates.items():
            if cap <= 0:
                continue
            draft, marginal, catchup = [0.0] * (kmax + 1), [0.0] * (kmax + 1), 0.0
            if needs_draft_model(source):
                rates = self.draft_rates(load_key(load) if self.batched() else ALONE)
                if rates is None:
                    continue  # unmeasured: a probe measures it
                draft = self.draft_costs(kmax, load, rates=rates)
                marginal = self.marginal_draft_costs(kmax, load, rates) if n != ALONE and self.batched() else draft
                catchup = self.head_catchup_cost(head_missed, load, head_first) if head_missed else \
                    self.catchup_cost(max(0, missed - 2), load, rates)

            def values(acceptance: list[float], draft: list[float], catchup: float,
                       tokens: int | float | None = remaining, optimistic: list[float] | None = None) -> list[float]:
                """Expected tokens per second by k; the catch-up spread over the iterations of `tokens` tokens.
                `optimistic`: acceptance with its bonus, taken at each k's last position only, the one position
                that k adds: compounded over every position, the bonuses of deep positions (few drafts reach them,
                so they stay uncertain) priced a long draft far above what it yields."""
                out, expected, p = [1.0 / max(plain, 1e-9)], 0.0, 1.0
                for k, a in enumerate(acceptance, start=1):
                    tried = expected + p * (a if optimistic is None else optimistic[k - 1])
                    p *= a
                    expected += p
                    iterations = max(1.0, (tokens or 0) / (1.0 + tried))
                    out.append((1.0 + tried) / max(share + over + rows[k] + draft[k] + catchup / iterations, 1e-9))
                return out

            if n == ALONE:
                own = values(self.acceptance(source, cap), draft, catchup,
                             optimistic=self.acceptance(source, cap, optimistic=True))
                k = int(np.argmax(own))
            else:
                # Shared, the requests draft alike: the draft engine's call runs as many steps as its longest draft,
                # so a request drafting more than the others lengthens it for all, and one drafting fewer does not
                # shorten it. The deployment's k at this load is chosen from its own estimate (every request finds
                # the same), and each request takes it, or a plain step where its own acceptance and catch-up say
                # so. Half the requests drafting costs the rest the draft engine's call too, so a
                # gain within the estimates' noise is not taken to start drafting: acceptance as estimated (not
                # optimistic; probes explore), and a margin.
                steady = self.steady_catchup() if self.batched() and needs_draft_model(source) else None
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
        if self.batched():
            return True
        step = self.verify_cost(0, load)
        if step is None:
            return True
        return float(self.est.clock[0] - self.est.last_chosen.max()) <= self.settings.probe_every * step

    def would_draft(self, load: int, candidates: Mapping[str, int], remaining: int | None = None,
                    plain_run: int = 1) -> bool:
        """Whether drafting from one of `candidates` (as choose takes them) pays at `load` now; no probe, nothing
        marked."""
        best = self._best(load, candidates, remaining=remaining, plain_run=plain_run)
        return best is not None and best.source is not None

    def _chose(self, choice: Choice | None) -> Choice | None:
        """Marks a request's choice to draft (not a probe's) for drafting_lately."""
        if choice is not None and choice.source is not None and choice.k > 0:
            self.est.last_chosen[ESTIMATE_KEYS.index(choice.source)] = self.est.clock[0]
        return choice

    def probe_due(self, source: str, load: int, head_missed: int = 0, missed: int = 0, in_target: bool = False,
                  head_first: bool = False) -> bool:
        """A probe of `source` is due once the deployment has run, since the source last drafted (or was learnt),
        long enough that the probe costs it a bounded share of its time: its plain step `probe_every` times, and
        the probe's cost (its draft call or catch-up, and its verify rows) PROBE_SHARE^-1 times, both times the
        source's backoff. In time, not in iterations:
        with many requests in flight, iterations come many to a step, and every request in the step waits for a
        probe's draft call. The draft call catches the draft model up on the `missed` tokens first (a request that
        has not drafted: its whole sequence), and a probe of the target's own drafter (`in_target`) catches it up on
        `head_missed` positions: each costs that catch-up, bounded the same way, and so do the probe's verify rows."""
        return self._due_wave(source, load, head_missed, missed, in_target, head_first) > 0

    def _due_wave(self, source: str, load: int, head_missed: int = 0, missed: int = 0, in_target: bool = False,
                  head_first: bool = False) -> int:
        """The requests a probe of `source` due now takes (its wave, `_wave`); 0: none is due (probe_due)."""
        si = ESTIMATE_KEYS.index(source)
        est = self.est
        step = self.verify_cost(0, load)
        if step is None:
            return 0  # a plain step first: what a probe's time is measured against
        interval = self.settings.probe_every * step
        backoff = max(1.0, float(est.probe_backoff[si]))
        since = float(est.clock[0] - est.last_drafted[si])
        if since < interval * backoff:
            return 0  # not due on its plain steps alone: the probe's own cost can only make it later
        wave = 1 if in_target else self._wave(source, load, missed)
        shared, own = self._probe_cost(source, load, missed, head_missed, in_target, head_first, wave)
        return wave if since >= max(interval, (shared + own) / PROBE_SHARE) * backoff else 0

    def _probe_cost(self, source: str, load: int, missed: int = 0, head_missed: int = 0, in_target: bool = False,
                    head_first: bool = False, wave: int = 1) -> tuple[float, float]:
        """What a probe of `source` by `wave` requests costs the deployment: (its draft call's steps, which the
        requests probing together share; what the requests add: their verify rows and their catch-ups, which the
        draft engine prefills together, at the cost of that many tokens)."""
        k = self._probe_len(source, MAX_POSITIONS)
        costs = self._step_costs(load, k)
        # its verify rows, which lengthen the step every request in it waits for (on this project's CPU a row is a
        # quarter of a step), in each call it verifies: the target's own drafter's probe goes on for PROBE_RUN
        # calls, and there its rows' measured cost includes the head's steps
        own, shared = wave * (costs[1][k] if costs is not None else 0.0) * (PROBE_RUN if in_target else 1), 0.0
        if in_target:
            own += self.head_catchup_cost(head_missed, load, head_first)
        elif needs_draft_model(source):
            rates = self.draft_rates(1)
            if rates is not None:  # what the probe's draft call costs the deployment: drafting alone, caught up
                shared, own = rates[0] * k, own + self.catchup_cost(wave * max(0, missed - 2), load, rates)
        return shared, own

    def _wave(self, source: str, load: int, missed: int) -> int:
        """How many requests a probe of the draft model takes while the deployment's acceptance of it is a prior
        (fewer than 2 * prior_drafts drafts seen) where the draft engine batches their calls: the fewest whose own
        costs (rows, catch-ups) are WAVE_SHARED times the draft steps they share, at most half the requests in flight
        and the drafts that make the estimate informed; the probe is due as much later as it costs more. One
        request's probe pays the draft engine's steps for one or two acceptance samples against a prior worth
        prior_drafts: a cold deployment of 32 requests at acceptance 0.5, learning from one at a time, drafted
        nothing in a run where k = 1 gained 10% (on an H100's costs in the simulator). Once the estimate is
        informed, one request at a time: a large probe comes later, and a change in acceptance (the drop profile)
        was seen later."""
        n, si = load_key(load), ESTIMATE_KEYS.index(source)
        if (n == ALONE or not self.batched() or not needs_draft_model(source)
                or self.est.reached[si, 0] >= 2 * self.settings.prior_drafts):
            return 1
        shared, own = self._probe_cost(source, load, missed)
        if own <= 0.0 or shared <= 0.0:
            return 1  # unmeasured: one request's probe measures it
        # the wave is to outweigh the prior: beyond the drafts that make the estimate informed, it adds cost alone
        needed = int(np.ceil(2 * self.settings.prior_drafts - self.est.reached[si, 0]))
        low, high = 1, max(1, min(n // 2, needed))  # own costs grow with the wave: the fewest reaching the bar
        while low < high:
            mid = (low + high) // 2
            if self._probe_cost(source, load, missed, wave=mid)[1] >= WAVE_SHARED * shared:
                high = mid
            else:
                low = mid + 1
        return low

    def _join_wave(self, source: str) -> bool:
        """Whether this request takes a place in the probe wave of `source`: the requests that plan after it opened,
        until the first draft call is answered (they draft together)."""
        est, si = self.est, ESTIMATE_KEYS.index(source)
        with est.locked():
            places = float(est.probe_wave[si])
            if places < 1:
                return False
            est.probe_wave[si] = places - 1
            return True

    def next_draft_len(self, source: str, cap: int, load: int, missed: int = 0, remaining: int | None = None,
                       may_probe: bool = True, plain_run: int = 1) -> int:
        return self.next_draft(source, cap, load, missed, remaining, may_probe, plain_run).k

    def next_draft(self, source: str, cap: int, load: int, missed: int = 0, remaining: int | None = None,
                   may_probe: bool = True, plain_run: int = 1, first_call: bool = False) -> Choice:
        """How many tokens to ask a drafter inside the target engine (EAGLE-3) to draft for the next call, which each
        call computes when asked: the k the next iteration would draft if drafting from it pays now, the k of its
        probe if one is due, else 0. So a k = 0 stretch costs what plain steps cost, and a call drafting k pays
        for k tokens of drafting, not for `cap` (the head's steps are sequential). `missed`: the positions the head
        has not seen beyond those a drafting call extends it over (the drafts it verifies and the token after),
        which the call asking catches it up on (priced as measured, spread over `remaining` tokens);
        `may_probe` false: no probe now; `first_call`: a request's first call, whose catch-up is over its prompt
        (head_catchup_cost). Unbatched, a
        probe is the deployment's from the moment it is asked for (one request's, not every request's that asks in
        the meantime, each paying a catch-up); the asking request verifies its draft as a probe on its next call."""
        if cap <= 0:
            return Choice(None, 0)
        # Batched (a GPU's), the catch-up is a few more tokens in a step that holds many: not priced, as before
        missed = 0 if self.batched() else missed
        best = self._chose(self._best(load, {source: cap}, remaining=remaining, head_missed=missed,
                                      plain_run=plain_run, head_first=first_call))
        if best is not None and best.source == source:
            return best
        if may_probe and self.probe_due(source, load, head_missed=missed, in_target=True, head_first=first_call):
            if not self.batched():  # each probe pays its own catch-up: one at a time, spaced out as they fail
                self._mark_probe(source)  # (batched, probes are cheap and several together learn faster)
            return Choice(source, self._probe_len(source, cap), probe=True)
        return Choice(None, 0)

    def iteration_overhead(self, load: int) -> float:
        """An iteration's seconds outside its engine calls, at the load measured nearest; 0 until one is measured
        (the simulator's calls are its costs alone)."""
        n = self._nearest_load(self.est.overhead_n[None, :], load_key(load))
        return 0.0 if n is None else float(self.est.overhead_s[n])

    def record_head_catchup(self, load: int, missed: int, extra_s: float) -> None:
        """A call of the target's own drafter that caught it up on `missed` positions (beyond those a drafting call
        extends it over: what it verified and the token after) took `extra_s` more than a call verifying as many
        drafts without a catch-up."""
        if missed <= 0:
            return
        n = load_key(load)
        with self.est.locked():
            mean_update(self.est.head_catchup_s, self.est.head_catchup_n, (n,), max(0.0, extra_s) / missed,
                         self.settings.cost_smoothing)
            self.est.costs_version[0] += 1

    def record_first_call(self, asked: bool, prompt: int, seconds: float) -> None:
        """A request's first call of a deployment whose target engine drafts (EAGLE-3): `prompt` tokens prefilled and
        a step in `seconds`, the head `asked` for a draft (and so extended over the prompt) or not."""
        if prompt <= 0:
            return
        with self.est.locked():
            mean_update(self.est.head_prefill_s, self.est.head_prefill_n, (int(asked),), seconds / prompt,
                        self.settings.cost_smoothing)
            self.est.costs_version[0] += 1

    def head_catchup_cost(self, missed: int, load: int, first_call: bool = False) -> float:
        """Seconds the target's own drafter's catch-up on `missed` positions (beyond the usual) adds to a call, at
        the load measured nearest; 0 until one is measured (a probe measures it). On a request's first call
        (`first_call`) the positions are its prompt's, whose target states the call computes anyway: the head's
        extension alone, a request's first calls asking a draft against those asking none, per prompt token, once
        both are measured (on this project's CPU 0.6 ms a token, where a catch-up mid-request recomputes the
        target's states too: 5.7 ms a position)."""
        if missed <= 0:
            return 0.0
        if first_call and self.est.head_prefill_n.all():
            asked_none, asked = self.est.head_prefill_s.tolist()
            return max(asked - asked_none, 0.0) * missed
        n = self._nearest_load(self.est.head_catchup_n[None, :], load_key(load))
        return 0.0 if n is None else float(self.est.head_catchup_s[n]) * missed

    def clean_call_cost(self, k: int, load: int) -> float | None:
        """The measured seconds of a call verifying k drafts at `load` (None: none measured)."""
        n = load_key(load)
        return float(self.est.verify_s[k, n]) if self.est.verify_n[k, n] else None

    def _mark_probe(self, source: str, wave: int = 1) -> None:
        """A probe of `source` taken, by `wave` requests (this one and the next wave - 1 to plan): the next is due an
        interval from now, twice as far while they fail (drafting chosen resets it; prompt lookup's probes cost a
        verify row, no engine step, and are not spaced out)."""
        si = ESTIMATE_KEYS.index(source)
        with self.est.locked():
            self.est.last_drafted[si] = self.est.clock[0]
            self.est.probe_wave[si] = wave - 1
            if needs_draft_model(source):
                self.est.probe_backoff[si] = min(2.0 * max(1.0, float(self.est.probe_backoff[si])), MAX_PROBE_BACKOFF)

    def _probe_len(self, source: str, cap: int) -> int:
        """A probe drafts through the positions believed good (acceptance >= 0.5) and one more."""
        good = [a >= 0.5 for a in self.acceptance(source, cap)]
        depth = good.index(False) if not all(good) else cap
        return max(1, min(cap, depth + 1))

    def choose(self, load: int, candidates: Mapping[str, int], missed: int = 0, may_probe: bool = True,
               remaining: int | None = None, plain_run: int = 1) -> Choice:
        """`candidates`: estimate key (drafters.estimate_key: the source, for prompt lookup with its match's level)
        -> the most tokens it may propose now (for prompt lookup: its match's length);
        `missed`: tokens the draft model would catch up on; `may_probe` false: no probe now (a request's first
        call, whose first token a probe of the draft model would delay by its prefill of the whole prompt: the
        next iteration, this request's or another's, probes instead); `remaining`: the request's tokens still to
        come (the catch-up is spread over them); `plain_run`: the tokens a plain call takes. Sources in asking order
        (the first wins a tie).
        Each candidate's value is its expected tokens per second; alone, a draft's last position's acceptance is
        optimistic by its standard error."""
        best = self._chose(self._best(load, candidates, missed, remaining, plain_run=plain_run))
        if best is None:
            return Choice(None, 0)  # measure a plain step first
        # Probes are the deployment's, like the estimates they feed: one request's probe informs every request, so a
        # source is probed once the deployment has gone long enough without it (probe_due), not every request.
        est = self.est
        if best.source is not None:
            est.probe_backoff[ESTIMATE_KEYS.index(best.source)] = 1.0
        for source, cap in candidates.items():
            # prompt lookup's acceptance is learnt without drafting (observe), and what its rows cost is measured
            # alone (row_costs): with others in flight a probe of it would learn nothing and lengthen their step
            if not needs_draft_model(source) and load_key(load) != ALONE:
                continue
            if not (may_probe and source != best.source and cap > 0):
                continue
            if self._join_wave(source):
                return Choice(source, self._probe_len(source, cap), probe=True)
            wave = self._due_wave(source, load, missed=missed)
            if wave:
                self._mark_probe(source, wave)
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
        prefill_s: float | None = None,
        overhead_s: float | None = None,
    ) -> None:
        """One iteration: `proposed` tokens from `source` (None: none), `accepted` of them; the verify call's seconds
        per step (None: not a clean sample, e.g. the request's first call with its prefill) and the draft-model
        call's; `steps`: the target's steps in the call (a plain run's tokens); `draft_batch`: the requests that
        were in draft-model calls together with it; `elapsed_s`: the iteration's seconds (its calls'; default:
        the verify's and the draft's), which advance the deployment's clock by this request's share; `step_tokens`: the tokens in the target's step; `draft_missed`: the tokens the
        draft call caught up on, for all the requests in it (None: its own only); `prefill_s`: a request's first call's
        seconds, a step of `step_tokens` carrying its prompt (not a verify's sample); `overhead_s`: an iteration's
        seconds outside its engine calls."""
        n, est, st = load_key(load), self.est, self.settings
        with est.locked():
            if elapsed_s is None:
                elapsed_s = (verify_s or 0.0) * steps + (draft_s or 0.0)
            est.clock[0] += elapsed_s / n
            if source is not None and proposed:
                est.last_drafted[ESTIMATE_KEYS.index(source)] = est.clock[0]
            est.costs_version[0] += (verify_s is not None or prefill_s is not None
                                     or (draft_s is not None and source is not None))
            if verify_s is not None:
                mean_update(est.verify_s, est.verify_n, (proposed, n), verify_s, st.cost_smoothing)
                if not proposed:
                    y = verify_s * steps
                    sums = np.array([1.0, steps, steps * steps, y, steps * y])
                    mean_update(est.plain_fit, est.plain_fit_n, (n,), sums, st.cost_smoothing)
            if overhead_s is not None:
                mean_update(est.overhead_s, est.overhead_n, (n,), max(0.0, overhead_s), st.cost_smoothing)
            step_s = verify_s if verify_s is not None else prefill_s
            # alone, the (k, load) curve is the step's own; a step past the table is not priced at its end
            if step_s is not None and step_tokens and n != ALONE and step_tokens <= MAX_STEP_TOKENS:
                mean_update(est.step_s, est.step_n, (step_tokens,), step_s, st.cost_smoothing)
            if source is None or not proposed:
                return
            si = ESTIMATE_KEYS.index(source)
            self._count(si, proposed, accepted)
            if draft_s is None or not needs_draft_model(source):
                return
            est.probe_wave[si] = 0  # a draft call answered: a probe wave is the requests planning before it
            b, m = load_key(draft_batch), float(max(0, missed - 2) if draft_missed is None else draft_missed)
            sample = np.array([proposed * proposed, proposed * m, m * m, proposed * draft_s, m * draft_s])
            mean_update(est.draft_fit, est.draft_fit_n, (b,), sample, st.cost_smoothing)
            weight = self.token_weight(b, m) if self.batched() and b != ALONE else None
            if weight is not None:
                u = proposed + weight * m
                mean_update(est.draft_units, est.draft_units_n, (b,), np.array([u * u, u * draft_s]), st.cost_smoothing)

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
