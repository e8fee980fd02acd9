"""`trtspec simulate --engines overlapped`: the loop's planner against two engines that run at the same time.

The lock-step simulator (trtspec.bench.simulate) runs a draft call and then a target step, as one GPU does. A CPU
deployment of the reference engine runs its two engines on separate cores: each engine steps its own in-flight
batch (trtspec.reference_engine.batching) while the other steps, and a request's draft call overlaps other
requests' target steps.
Here each engine is a server on its own clock: a request submitted while a step runs joins the next one, a draft
call of k tokens is k draft steps (the first also prefilling what the draft model has not seen), a verify call one
target step of 1 + k tokens, a plain run of n tokens n steps. Every engine call also costs `call_s` of the loop's
own (a Triton round trip and its Python) before it reaches the engine. After a step an engine waits for as many
calls as it answered, by the reference engine's rule (trtspec.regather: where the answered requests typically come
back within a quarter of a step, their return delays measured as the engine measures them). A drafting request
comes back to the target after its draft call: where that is short beside a target step, the target waits for it
too.

Each request's planner is told the wall time of its own calls, as the loop measures them.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from trtspec.bench.costs import Costs
from trtspec.bench.workload import Acceptance, CellResult, Policy, Schedule, SyntheticRequest
from trtspec.config import AdaptivePolicy, SpeculativeConfig
from trtspec.regather import WINDOW, regather_wait
from trtspec.spec.estimates import Estimates
from trtspec.spec.planner import Planner, RequestPolicy

# the loop's own time per engine call (its Triton round trip and Python), as fitted to this project's CPU deployment
# (docs/benchmarks/controller.md, calibration: 0.5-1 ms fit its cells at 1 in flight, 2 ms reads one 11% off)
CALL_S = 0.001


@dataclass
class _Work:
    """A request's call inside an engine: `steps` steps to go, `tokens` in its next step (then 1 each)."""

    request: "_Live"
    steps: int
    tokens: int


@dataclass
class _Live:
    r: SyntheticRequest
    plan: object = None
    draft: list[int] = field(default_factory=list)
    started: float = 0.0  # when the current call was sent
    draft_s: float | None = None
    step_tokens: int = 0
    draft_batch: int = 1
    first: bool = True


class _Engine:
    """One engine's in-flight batch: steps run back to back while there is work; new work joins the next step."""

    def __init__(self, step: Callable[[int, int], float], max_batch: int):
        self.step, self.max_batch = step, max_batch
        self.waiting: list[_Work] = []
        self.running: list[_Work] = []
        self.busy = False
        self.hold_until = 0.0  # gathering the requests it answered before the next step
        self.hold_pending = False  # answered ones to wait for, with nothing to step: decided at the first arrival
        self.returning = 0  # calls answered since the last step started that have not been made up by arrivals
        self.answered: dict[int, float] = {}  # requests answered, by when, until they come back
        self.delays: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.last_step_s = 0.0

    def arrived(self, work: _Work, now: float) -> float | None:
        """A call reaches the engine: any arrival makes up for one answered (as BatchScheduler.submit counts), and a
        request's return measures how soon answered requests come back. Returns the end of a wait that starts now
        (the engine had nothing to step when its last step ended), else None."""
        self.waiting.append(work)
        self.returning = max(0, self.returning - 1)
        answered_at = self.answered.pop(id(work.request), None)
        if answered_at is not None:
            self.delays.append(now - answered_at)
        if not self.hold_pending:
            return None
        self.hold_pending = False
        return self._regather(now)

    def hold(self, now: float, answered: list[_Work]) -> float | None:
        """After a step that answered `answered`: until when the next step waits for them to come back, or None
        (no wait, or one decided at the first arrival). BatchScheduler._regather's rule, which it applies once the
        engine has a request to step."""
        for w in answered:
            self.answered[id(w.request)] = now
        self.returning += len(answered)
        if not self.running and not self.waiting:
            self.hold_pending = True
            return None
        return self._regather(now)

    def _regather(self, now: float) -> float | None:
        """The wait decided now, with a request to step: its end, or None (nothing is waited for)."""
        wait = regather_wait(self.delays, self.last_step_s) if self.returning else None
        if wait is None:
            self.returning = 0
            return None
        self.hold_until = now + wait
        return self.hold_until

    def start(self, now: float, waited: bool = False) -> tuple[float, int, int] | None:
        """Starts a step if there is work and nothing to wait for (`waited`: the wait is over): (its end, rows,
        tokens)."""
        gathering = self.returning and len(self.running) + len(self.waiting) < self.max_batch
        if self.busy or not waited and now < self.hold_until and gathering:
            return None
        room = self.max_batch - len(self.running)
        self.running += self.waiting[:room]
        self.waiting = self.waiting[room:]
        if not self.running:
            return None
        self.busy, self.returning, self.hold_pending = True, 0, False
        rows, tokens = len(self.running), sum(w.tokens for w in self.running)
        self.last_step_s = self.step(rows, tokens)
        return now + self.last_step_s, rows, tokens


def simulate_overlapped(
    costs: Costs,
    policy: Policy,
    schedule: Schedule,
    acceptance: Acceptance,
    *,
    requests: int = 64,
    prompt: int = 256,
    max_tokens: int = 128,
    stream: bool = False,
    seed: int = 0,
    call_s: float = CALL_S,
    max_batch: int = 8,
    concurrency_label: str = "",
) -> CellResult:
    """As trtspec.bench.simulate.simulate, with the engines overlapping (the module's docstring). A plain call is a
    run, as the engine streams it; `stream`: a token a plain call instead (a request whose tokens the loop checks one
    by one: log-probabilities, a guide)."""
    spec = SpeculativeConfig.of(max(policy.k, 1), policy.k,
                                draft_length_policy="adaptive" if policy.adaptive else "fixed",
                                adaptive=AdaptivePolicy(batched_steps=False))
    pol = RequestPolicy(max_tokens=max_tokens, k=policy.k, adaptive=policy.adaptive,
                        selection="model", stream=stream)
    sources = ("model",) if policy.k else ()
    run = _OverlappedRun(costs, spec, pol, sources, schedule, acceptance, requests=requests, prompt=prompt,
                         max_tokens=max_tokens, seed=seed, call_s=call_s, max_batch=max_batch,
                         result=CellResult(policy.name, concurrency_label, acceptance.name))
    return run.run()


class _OverlappedRun:
    """One simulated cell: the two engines, the requests in flight, and the events on one clock (calls arriving at
    an engine, steps ending, a target's wait for the requests it answered ending)."""

    def __init__(self, costs: Costs, spec: SpeculativeConfig, pol: RequestPolicy, sources: tuple[str, ...],
                 schedule: Schedule, acceptance: Acceptance, *, requests: int, prompt: int, max_tokens: int,
                 seed: int, call_s: float, max_batch: int, result: CellResult) -> None:
        self.spec, self.pol, self.schedule, self.acceptance = spec, pol, schedule, acceptance
        self.requests, self.prompt, self.max_tokens, self.call_s = requests, prompt, max_tokens, call_s
        self.result = result
        self.rng = np.random.default_rng(seed)
        self.estimates = Estimates()
        self.sources = sources
        self.target = _Engine(lambda rows, tokens: costs.target_step(rows, tokens, 0), max_batch)
        self.drafter = _Engine(lambda rows, tokens: costs.draft_step(rows, tokens, 0), max_batch)
        self.events: list[tuple[float, int, str, object]] = []
        self.order = itertools.count()
        self.active: list[_Live] = []
        self.started = self.finished = 0
        self.now = 0.0

    def run(self) -> CellResult:
        self.admit()
        while self.events:
            self.now, _, kind, payload = heapq.heappop(self.events)
            if kind == "send":
                engine, work = payload
                hold = engine.arrived(work, self.now)
                if hold is not None:
                    self.at(hold, "hold", engine)
                self.kick(engine)
            elif kind == "hold":
                self.kick(payload, waited=True)
            else:
                self.step_ended(payload)
        return self.result

    def at(self, t: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self.events, (t, next(self.order), kind, payload))

    def kick(self, engine: _Engine, waited: bool = False) -> None:
        """Starts the engine's next step if it can, and schedules its end."""
        step = engine.start(self.now, waited)
        if step is not None:
            end, _, tokens = step
            for w in engine.running:
                if engine is self.target:
                    w.request.step_tokens = tokens
                else:
                    w.request.draft_batch = max(w.request.draft_batch, len(engine.running))
            self.at(end, "step", engine)

    def admit(self) -> None:
        """New requests, while the schedule's load at this progress wants more in flight."""
        want = self.schedule(self.finished / self.requests)
        while len(self.active) < want and self.started < self.requests:
            n = int(self.rng.integers(self.max_tokens // 2, self.max_tokens * 3 // 2 + 1))
            planner = Planner(self.spec, self.estimates, dataclasses.replace(self.pol, max_tokens=n), self.sources)
            live = _Live(SyntheticRequest(planner, np.random.default_rng(self.rng.integers(1 << 62)), self.prompt, n))
            self.active.append(live)
            self.started += 1
            self.begin(live)

    def begin(self, live: _Live) -> None:
        """An iteration: plan it, then send its first call (after the loop's own call_s)."""
        r = live.r
        progress = self.finished / self.requests
        live.plan = plan = r.planner.plan(len(self.active), r.seq, r.propose)
        live.draft = (r.draft(plan.k, self.acceptance, progress) if plan.calls_draft_model
                      else list(plan.tokens or []))
        live.started, live.draft_s, live.draft_batch = self.now, None, 1
        if plan.calls_draft_model and live.draft:
            work = _Work(live, len(live.draft), 1 + max(plan.missed - 2, 0))
            self.at(self.now + self.call_s, "send", (self.drafter, work))
        else:
            self.send_target(live)

    def send_target(self, live: _Live) -> None:
        plan, r = live.plan, live.r
        remaining = r.max_tokens - (len(r.seq) - r.prompt)
        steps = 1 if live.draft else min(plan.plain, remaining)
        tokens = (r.prompt if live.first else 1) + len(live.draft)
        self.at(self.now + self.call_s, "send", (self.target, _Work(live, steps, tokens)))

    def step_ended(self, engine: _Engine) -> None:
        """An engine's step ended: the calls it finished are answered, and the engine steps on."""
        engine.busy = False
        done = []
        for w in engine.running:
            w.steps -= 1
            w.tokens = 1
            if w.steps == 0:
                done.append(w)
        engine.running = [w for w in engine.running if w.steps]
        hold = engine.hold(self.now, done) if done else None
        for w in done:
            live = w.request
            if engine is self.drafter:
                live.draft_s = self.now - live.started
                self.send_target(live)
            else:
                self.answered(live)
        if hold is not None:  # after the answered ones' calls, which arrive at the same moment
            self.at(hold, "hold", engine)
        self.kick(engine)

    def answered(self, live: _Live) -> None:
        """The target answered the iteration's call: outcome, then the next iteration or the request's end."""
        r, plan = live.r, live.plan
        verify_s = self.now - live.started - (live.draft_s or 0.0)
        remaining = r.max_tokens - (len(r.seq) - r.prompt)
        new, accepted = r.answer(live.draft, min(plan.plain, remaining))
        added = new[:remaining]
        r.seq += added
        self.result.count(live.draft, accepted, len(added))
        r.planner.outcome(plan, len(self.active), live.draft, new, verify_s, live.draft_s, r.seq, len(added),
                          r.propose, draft_batch=live.draft_batch, step_tokens=live.step_tokens)
        live.first = False
        if len(r.seq) - r.prompt >= r.max_tokens:
            self.result.seconds = self.now  # the last request's end (a wait for returns after it is no one's time)
            for engine in (self.target, self.drafter):  # it never comes back, and its id may be a new request's
                engine.answered.pop(id(live), None)
            self.active.remove(live)
            self.finished += 1
            self.admit()
        else:
            self.begin(live)
