"""The speculative loop's per-iteration decision, one home: what to draft, from which source, how many tokens.

`Planner.plan` decides an iteration of one request before its engine calls: the user's caps and schedule, the
source and k (the goodput controller's choice, its probes, or the fixed k), what the target's own drafter
(EAGLE-3) drafts for the next call, and how many tokens a plain call asks for. `Planner.outcome` takes what
happened with the measured times: the controller's samples (which are clean), catching the draft model up, and
scoring the proposals that were not drafted. The loop (trtspec.spec.loop) runs the engine calls between the two; the
simulator (trtspec.bench.simulate) runs the same planner against cost models instead.

Sources that need no engine call (prompt lookup, the target's own drafter) are asked through `propose`, which the
caller supplies: the loop's drafters, or the simulator's synthetic ones. The draft model is called by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from trtspec.spec.drafters import SELECTIONS, SOURCES, Proposal, estimate_key
from trtspec.spec.metrics import SpecStats
from trtspec.spec.controller import PROBE_RUN, Choice, GoodputController
from trtspec.spec.engine_costs import ALONE
from trtspec.spec.estimates import Estimates, load_key
from trtspec.spec.speculative import PLAIN_RUN_MAX, draft_len_at_load, fixed_draft_len, plain_run

# why a plain call may be shorter than a whole run (Planner._may_draft_soon)
DRAFTING, PROBE_DUE = "drafting", "probe due"

# (source, running sequence, k) -> its proposal: the sources that need no engine call
Propose = Callable[[str, Sequence[int], int], Proposal]


@dataclass(frozen=True)
class RequestPolicy:
    """What of a request the planner decides by (the rest of the request is the loop's)."""

    max_tokens: int
    k: int  # the request's k (fixed), or the most the controller drafts (adaptive)
    adaptive: bool
    selection: str  # drafters.SELECTIONS key: the sources, in asking order
    # streamed where the engine cannot stream a run (or the loop checks each token): a token per target call
    stream: bool = False


@dataclass(frozen=True)
class Plan:
    """One iteration: draft `k` tokens from `source` (None: a plain call), then verify them in one target call."""

    source: str | None
    key: str | None  # the estimate key the controller learns the proposal's acceptance under
    k: int
    tokens: list[int] | None  # a source that needs no engine call: its proposal, cut to k
    probe: bool
    next_k: int  # the target's own drafter: tokens to draft for the next call (next_draft_len)
    plain: int  # tokens a call without a draft asks for (a plain run: the engine steps them)
    missed: int  # tokens of the sequence the draft model has not seen (it prefills them before drafting)
    lookup_only: bool  # the load cap let only prompt lookup draft
    capped: int  # k after the request's and the user's caps, before the controller's choice

    @property
    def calls_draft_model(self) -> bool:
        return self.source is not None and self.tokens is None


@dataclass
class Planner:
    """The decisions of one request. `sources`: the draft sources the deployment can serve the request with, in
    asking order (empty: the target-only endpoint); `in_target`: the deployment's "model" source is the target
    engine's own drafter, whose draft comes with each target answer."""

    spec: object  # trtspec.config.SpeculativeConfig
    estimates: Estimates
    policy: RequestPolicy
    sources: tuple[str, ...]
    in_target: bool = False
    stats: SpecStats = field(default_factory=SpecStats)

    def __post_init__(self) -> None:
        self.controller = GoodputController(self.estimates, self.spec.adaptive)
        self.failed: set[str] = set()
        self.generated = 0
        self.draft_seen = 0  # tokens of the sequence the draft model (or the target's own drafter) holds
        # plain calls in a row: a request that cannot draft has whole runs from the start (None)
        self.stretch: int | None = 0 if self.sources and self.policy.k else None
        # plain calls are runs (a streamed one streams from the engine), except a token per call where the policy
        # says so; where the target's own drafter is asked for nothing, it catches up on the run's positions when
        # next asked
        self.runs = not self.policy.stream
        self.unverified: list[tuple[str, int, list[int]]] = []  # free proposals not drafted: (key, len(seq), tokens)
        # a probe of the draft model that caught it up and was accepted: the next iteration drafts once more, a call
        # without catch-up (what drafting costs once it goes on; a call that catches up cannot tell its parts apart)
        self.follow_up: Plan | None = None
        self.announced = 0  # the target's own drafter: the k of a probe asked of it last call, verified this one
        self.probe_run = 0  # ... and how many such probes in a row this request has verified
        self.probe_hit = True  # ... and whether the last it verified had a draft accepted (true before any)
        self.drafted = False  # drafted by choice, or by a probe that was accepted

    @classmethod
    def sources_for(cls, selection: str, has_draft_model: bool, in_target: bool, disabled: bool) -> tuple[str, ...]:
        """The sources of `selection` a deployment can serve (a draft source needs a draft model or the target's own
        drafter); none on the target-only endpoint."""
        if disabled:
            return ()
        return tuple(s for s in SELECTIONS[selection] if has_draft_model or in_target or not SOURCES[s].needs_draft_model)

    def _free(self, source: str) -> bool:
        """A source whose proposal costs no engine call."""
        return not SOURCES[source].needs_draft_model or (self.in_target and source == "model")

    def call_tokens(self, seq: Sequence[int], draft: Sequence[int]) -> int:
        """The tokens this iteration's target call has the engine compute at once (Estimates.target_call counts them:
        the steps are measured by them): a token and the draft; on a batching engine, the first call's whole
        sequence, its prompt. (A CPU's steps are priced by load, and its calls' times were measured counting 1.)"""
        return (len(seq) if self._first_batched_call() else 1) + len(draft)

    def _first_batched_call(self) -> bool:
        """A request's first call on a batching engine: a step that carries its prompt."""
        return not self.stats.num_iterations and self.controller.batched()

    def plan(self, load: int, seq: Sequence[int], propose: Propose) -> Plan:
        """The iteration of a request whose running sequence is `seq`, with `load` requests in flight."""
        spec, pol = self.spec, self.policy
        remaining = pol.max_tokens - self.generated
        k = fixed_draft_len(pol.k if self.sources else 0, remaining)
        lookup_only = False
        if k and (spec.max_concurrency is not None or spec.draft_len_schedule):
            # the user's caps on top of the controller: drafting stops, or shortens, with the load
            k, lookup_only = draft_len_at_load(
                k, load, spec.max_concurrency, spec.draft_len_schedule, spec.ngram_above_max_concurrency
            )
            self.stats.load_paused_iterations += k == 0
        usable = [
            s for s in self.sources
            if k and s not in self.failed and not (lookup_only and SOURCES[s].needs_draft_model)
        ]
        missed = len(seq) - self.draft_seen
        source, key, n, tokens, probe = None, None, 0, None, False
        if pol.adaptive and not self.stats.num_iterations and not self.in_target:
            self.controller.request_arrived(len(seq), remaining)
        if pol.adaptive and usable:
            # sources that need no engine call propose first, at no cost: a proposal bounds their k
            free = {s: propose(s, seq, k) for s in usable if self._free(s)}
            keys = {s: estimate_key(s, free[s].match if s in free else 0) for s in usable}
            caps = {keys[s]: min(k, len(free[s].tokens)) if s in free else k for s in usable}
            choice = self.controller.choose(load, caps, missed, bool(self.stats.num_iterations), remaining,
                                            self._plain_run())
            follow, self.follow_up = self.follow_up, None
            if follow is not None and choice.source is None and caps.get(follow.key, 0) > 0:
                choice = Choice(follow.key, min(follow.k, caps[follow.key]), probe=True)
            announced, self.announced = self.announced, 0
            model = estimate_key("model")
            if announced and choice.source is None and caps.get(model, 0) > 0:
                choice = Choice(model, min(announced, caps[model]), probe=True)
            self.probe_run = self.probe_run + 1 if announced and choice.probe else 0
            probe = choice.probe
            if choice.source is not None:
                source = next(s for s in usable if keys[s] == choice.source)
                key, n = choice.source, choice.k
                tokens = free[source].tokens[:n] if source in free else None
            # what was proposed and not drafted is scored against what the target produces (outcome)
            self.unverified += [(keys[s], len(seq), p.tokens) for s, p in free.items() if s != source and p.tokens]
        else:
            for s in usable:  # fixed: the first source with a proposal wins
                if not self._free(s):
                    source, key, n = s, estimate_key(s), k  # the draft model: the caller calls it
                    break
                p = propose(s, seq, k)
                if p.tokens:
                    source, key, tokens = s, estimate_key(s, p.match), p.tokens[:k]
                    n = len(tokens)
                    break
        next_k = 0
        if self.in_target and k:
            # The target's own drafter (EAGLE-3) drafts for the next call as asked: the k the controller would
            # draft next. Through a k = 0 stretch it is asked for none, so the target does no head work; the first
            # call that asks again has the engine catch the head up on every position it missed.
            if pol.adaptive:
                behind = max(0, missed - (n + 1))  # what the head has not seen beyond what drafting extends it over
                first = not self.stats.num_iterations
                # a request's first call may probe the head where calls are not batched: its catch-up is the
                # head's extension over the prompt alone, priced as measured (batched, a step's many rows make
                # the first token wait for no probe)
                asked = self.controller.next_draft("model", k, load, behind, remaining,
                                                   may_probe=not first or not self.controller.batched(),
                                                   plain_run=self._plain_run(), first_call=first)
                if not asked.k and 0 < self.probe_run < PROBE_RUN and (self.probe_hit or load_key(load) == ALONE):
                    # the head is caught up: the probe goes on while its drafts are accepted (each call more
                    # costs the head's steps and the verify's rows, a third of a step on this project's CPU, that
                    # every request in the step waits for); alone, for all PROBE_RUN calls: the rows are the
                    # request's own, and one or two samples for a catch-up left a cold deployment's estimate at
                    # its pessimistic prior for many probes
                    asked = Choice("model", max(1, n), probe=True)
                next_k, self.announced = asked.k, asked.k if asked.probe else 0
            else:
                next_k = k
        plain = 1
        if self.runs and not next_k:
            stretch = None if self.stretch is None else self.stretch + 1
            why = DRAFTING  # the stretch doubles from one token
            if stretch is not None and pol.adaptive:
                why = self._may_draft_soon(load, usable, k, missed, remaining)
            if why is None:
                stretch = None  # the deployment drafts nowhere now: whole runs, target-only's calls, until a probe pays
            plain = plain_run(stretch, remaining)
            if why == PROBE_DUE:
                # the probe needs a later call, not a short one: every call more costs a round trip, and on a
                # deployment that does not batch its steps a step's wait for the request that leaves and comes back
                plain = plain_run(None, max(1, remaining // 2))
        return Plan(source, key, n, tokens, probe, next_k, plain, missed, lookup_only, k)

    def _plain_run(self) -> int:
        """The tokens a plain call takes where the request steps aside from drafting: a run (the most; a stretch
        starts shorter), or one where its plain calls are a token each."""
        return PLAIN_RUN_MAX if self.runs else 1

    def _may_draft_soon(self, load: int, usable: Sequence[str], k: int, missed: int, remaining: int) -> str | None:
        """Whether this request may draft within a plain run's tokens, and why: DRAFTING (doubling stretches from one
        token) where drafting was chosen lately or prompt lookup drafts a match at this load (the answer can make one
        mid-run, which a whole run steps past); PROBE_DUE where the deployment's probe of the draft model is due
        and this call may not take it (a request's first call: it takes it on a later one, which a request answered
        in one run never makes, so short answers, once the deployment stopped drafting, would never probe again);
        None: whole runs.

        Whose choices count: batched (a GPU's), the deployment's, as the steps mix drafting and plain requests;
        alone, the deployment's (its last request's choices are the best guess at its next's). Unbatched with
        others in flight (a CPU's), each request's call is its own, and so is its choice: a few requests drafting
        (their own acceptance, their draft model caught up) would otherwise cut every other request's runs into
        calls of a token or two, each a step's wait on this CPU (measured: EAGLE-3 at 4 and 8 in flight)."""
        ctl = self.controller
        own_choices = not ctl.batched() and load_key(load) != ALONE
        if self.drafted if own_choices else ctl.drafting_lately(load):
            return DRAFTING
        lookup = {estimate_key(s, SOURCES[s].match_levels): k for s in usable if not SOURCES[s].needs_draft_model}
        if lookup and ctl.would_draft(load, lookup, remaining, self._plain_run()):
            return DRAFTING
        head_missed, draft_missed = (missed, 0) if self.in_target else (0, missed)
        if any(ctl.probe_due(s, load, head_missed=head_missed, missed=draft_missed, in_target=self.in_target)
               for s in usable if SOURCES[s].needs_draft_model):
            return PROBE_DUE
        return None

    def _record_first_call(self, plan: Plan, load: int, verify_s: float, plain: int, prompt: int) -> None:
        """A request's first call, for what the head's extension over a prompt costs: its prefill and first step,
        a plain run's further steps taken off at the plain step's measured cost."""
        if plain > 1:
            runs = self.controller.plain_call(load)
            step = runs[1] if runs is not None else self.controller.plain_step(load)
            if step is None:
                return
            verify_s -= (plain - 1) * step
        self.controller.record_first_call(plan.next_k > 0, prompt, verify_s)

    def outcome(
        self,
        plan: Plan,
        load: int,
        draft: Sequence[int],
        new: Sequence[int],
        verify_s: float,
        draft_s: float | None,
        seq: Sequence[int],
        added: int,
        propose: Propose,
        draft_failed: bool = False,
        draft_batch: int = 1,
        step_tokens: int | None = None,
        draft_missed: int | None = None,
        overhead_s: float | None = None,
    ) -> int:
        """What iteration `plan` did: `draft` the tokens verified, `new` the target's answer as it came (before any
        cut for stops or max_tokens), the calls' seconds (`draft_s`: the draft model's call, None without one),
        `seq` the running sequence after the iteration, of which the last `added` tokens are its own;
        `draft_batch`: the requests that were in draft-model calls together with its own, `step_tokens` the
        tokens that were in target calls together with its own (None: unknown), `draft_missed` the tokens the
        draft calls together with its own caught up on (None: its own only); `overhead_s`: the request's last
        iteration's seconds outside its engine calls (None: not measured). Returns how many draft tokens were
        accepted."""
        if draft_failed:
            # a missing or failing drafter must not fail the request: it goes on without it
            self.failed.add(plan.source)
            self.stats.draft_fallbacks += 1
        used = plan.source if draft else None
        accepted = 0
        while accepted < min(len(draft), len(new)) and new[accepted] == draft[accepted]:
            accepted += 1
        plain = 1 if draft else plan.plain
        before = len(seq) - added
        self.generated += added
        self.stats.load_paused_iterations += bool(plan.lookup_only and plan.capped and not draft)
        clean = bool(self.stats.num_iterations)  # the request's first call carries its prompt's prefill
        if self.in_target:
            # a call's time includes the drafting it asks for: a clean sample of its k only where that
            # drafting goes with it (drafting k and asking k more, or a plain step in a stretch)
            clean = clean and ((plan.next_k == len(draft)) if used == "model" else
                               plan.next_k == 0 or (plan.next_k <= 1 and plan.missed <= 1))
        if used is not None and plan.tokens is not None:
            draft_s = 0.0  # a proposal that needed no engine call (the target's own drafter's came with its answer)
        # a batched deployment's first call is a step carrying the prompt: not a sample of a verify's cost, but of a
        # step's by the tokens in it, the long steps a prompt's catch-up is priced by (before any request drafts,
        # no other call shows them)
        prefill = self._first_batched_call() and not self.in_target and plain == 1
        # a plain run's cost per step: what a plain step costs where it is not a call of its own
        self.controller.record(load, plan.key if used else None, len(draft), accepted,
                               verify_s / plain if clean else None, draft_s if used else None, plan.missed, plain,
                               draft_batch, verify_s + (draft_s or 0.0),
                               step_tokens if (clean or prefill) and plain == 1 else None, draft_missed,
                               prefill_s=verify_s if prefill else None, overhead_s=overhead_s)
        if self.stretch is not None:  # a probe that failed does not end a stretch
            drafted = bool(draft) and bool(accepted or not plan.probe)
            self.stretch = 0 if drafted else self.stretch + 1
            self.drafted = self.drafted or drafted
        if self.in_target:
            if not self.stats.num_iterations and self.policy.adaptive:
                self._record_first_call(plan, load, verify_s, plain, before)
            if plan.probe and draft:
                self.probe_hit = accepted > 0
            behind = plan.missed - (len(draft) + 1)
            if plan.next_k and behind > 0 and self.stats.num_iterations:
                # what the catch-up added to the call: over a call that verified as many drafts without one
                usual = self.controller.clean_call_cost(len(draft), load)
                if usual is not None:
                    self.controller.record_head_catchup(load, behind, verify_s - usual)
            if plan.next_k:  # the target's own drafter caught up on the call's positions, and drafted from its end
                self.draft_seen = len(seq)
        elif used is not None and SOURCES[used].needs_draft_model:
            self.draft_seen = before + min(accepted, len(draft) - 1)
            if plan.probe and plan.calls_draft_model and plan.missed > 2 and accepted:
                self.follow_up = plan
        self.stats.record(len(draft), accepted, used)
        if self.policy.adaptive and plain > 1:
            # what prompt lookup would have proposed inside the run, scored as any lookup not drafted is
            for at in range(before + 1, len(seq)):
                for s in self.sources:
                    if not SOURCES[s].needs_draft_model and s not in self.failed:
                        p = propose(s, seq[:at], plan.capped)
                        if p.tokens:
                            self.unverified.append((estimate_key(s, p.match), at, p.tokens))
        outcomes = [(u, _scored(u, seq)) for u in self.unverified]
        self.controller.observe(o for _, o in outcomes if o is not None)
        self.unverified = [u for u, o in outcomes if o is None]
        return accepted


def _scored(proposal: tuple[str, int, list[int]], seq: Sequence[int]) -> tuple[str, int, int] | None:
    """A proposal that was not drafted, scored against what the target produced since (`seq`) once that decides it
    (a mismatch, or every position produced): (estimate key, proposed, accepted); None while undecided."""
    key, at, tokens = proposal
    produced = seq[at : at + len(tokens)]
    matched = next((i for i, (a, b) in enumerate(zip(tokens, produced)) if a != b), len(produced))
    if matched == len(produced) < len(tokens):
        return None  # still matching, not all produced yet
    return key, len(tokens), matched
