"""`trtspec simulate`: the loop's own decisions (trtspec.spec.planner) for N requests in flight, against a cost model.

Lock step, as an in-flight batcher runs: each step, the requests that start an iteration plan it; those drafting
with the draft model are batched in the draft engine (its step j runs the rows still drafting at j, the first
also prefilling what each has not seen), then one target step runs every request in flight: a verify row 1 + k
tokens, a plain row 1, a new request its prompt. A plain run of n tokens is n such steps. Each request's planner
is told the times its own calls took, exactly as the loop measures them, and every request shares one
`Estimates`, as a deployment's loop processes do. Acceptance is synthetic: position i of a draft is accepted with
the profile's conditional probability (given the ones before were), drawn per draft.

Requests arrive and leave: when one finishes, the next takes its place while the schedule's load says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from trtspec.bench.costs import Costs
from trtspec.bench.overlapped import simulate_overlapped
from trtspec.bench.workload import (PROFILES, Acceptance, CellResult, Policy, Schedule, SyntheticRequest, constant,
                                    ramp)
from trtspec.config import SpeculativeConfig
from trtspec.spec.estimates import Estimates
from trtspec.spec.planner import Planner, RequestPolicy

@dataclass
class _Call:
    plan: object
    draft: list[int]
    steps: int
    load: int
    draft_s: float | None = None
    verify_s: float = 0.0
    prefill: int = 0  # prompt tokens still to prefill (a new request's first call), max_num_tokens a step
    batch: int = 1  # requests in the draft engine's call together
    tokens: int = 0  # the most tokens in target calls at once during the call, counted as the loop counts them
    counted: int = 1  # this call's tokens as the loop counts them (Planner.call_tokens)
    catchup: int = 0  # tokens the draft engine's call caught up on, for every request in it



def simulate(
    costs: Costs,
    policy: Policy,
    schedule: Schedule,
    acceptance: Acceptance,
    *,
    spec: SpeculativeConfig | None = None,
    in_engine: bool = False,
    requests: int = 64,
    prompt: int = 256,
    max_tokens: int = 128,
    stream: bool = False,
    seed: int = 0,
    max_num_tokens: int = 8192,
    concurrency_label: str = "",
    warmup: int = 0,
) -> CellResult:
    """Runs `requests` requests through the planner under `policy` and returns what they produced in how long.
    `in_engine`: the drafter is the target engine's own (EAGLE-3): no draft-model calls; drafting k for the next
    call adds k head steps to the target's step. Each request's max_tokens is drawn from 0.5-1.5x `max_tokens`, so
    that requests do not all end (and new ones arrive) in the same step; `max_num_tokens`: the most tokens a target
    step holds (prompts are prefilled in chunks of what is left); `warmup`: requests run first and not counted (the
    deployment's estimates carry over): what a deployment that has run a while makes of the `requests` after them."""
    spec = spec or SpeculativeConfig.of(max(policy.k, 1), policy.k,
                                        draft_length_policy="adaptive" if policy.adaptive else "fixed")
    rng = np.random.default_rng(seed)
    estimates = Estimates()
    result = CellResult(policy.name, concurrency_label, acceptance.name)
    uncounted = CellResult(policy.name, concurrency_label, acceptance.name)
    total = requests + warmup
    started, finished = 0, 0
    active: list[SyntheticRequest] = []
    sources = ("model",) if policy.k else ()
    pol = RequestPolicy(max_tokens=max_tokens, k=policy.k, adaptive=policy.adaptive,
                        selection="model", stream=stream)

    def admit() -> None:
        nonlocal started
        want = schedule(max(finished - warmup, 0) / requests)
        while len(active) < want and started < total:
            n = int(rng.integers(max_tokens // 2, max_tokens * 3 // 2 + 1))
            planner = Planner(spec, estimates, dataclasses.replace(pol, max_tokens=n), sources,
                              in_target=in_engine and bool(sources))
            active.append(SyntheticRequest(planner, np.random.default_rng(rng.integers(1 << 62)), prompt, n))
            started += 1

    admit()
    while active:
        load = len(active)
        progress = max(finished - warmup, 0) / requests
        counted = result if finished >= warmup else uncounted
        _plan_iterations(active, load, progress, acceptance)
        draft_wall = _draft_engine_steps(active, costs)
        step = _target_step(active, costs, load, max_num_tokens)
        counted.seconds += draft_wall + step
        _answer_calls(active, step, acceptance, progress, counted)
        gone = [r for r in active if r.done]
        if gone:
            finished += len(gone)
            active = [r for r in active if not r.done]
            admit()
    return result


def _plan_iterations(active: list[SyntheticRequest], load: int, progress: float, acceptance: Acceptance) -> None:
    """The requests that start an iteration plan it: its draft, and the steps its target call takes."""
    for r in active:
        if r.call is not None:
            continue
        plan = r.planner.plan(load, r.seq, r.propose)
        draft = r.draft(plan.k, acceptance, progress) if plan.calls_draft_model else list(plan.tokens or [])
        remaining = r.max_tokens - (len(r.seq) - r.prompt)
        r.call = _Call(plan, draft, 1 if draft else min(plan.plain, remaining), load,
                       prefill=r.prompt if len(r.seq) == r.prompt else 0, counted=r.planner.call_tokens(r.seq, draft))


def _draft_engine_steps(active: list[SyntheticRequest], costs: Costs) -> float:
    """The draft engine: one step per draft position, over the rows still drafting there; its wall time."""
    drafting = [r for r in active
                if r.call.plan.calls_draft_model and r.call.verify_s == 0.0 and r.call.draft_s is None]
    draft_wall = 0.0
    if drafting:
        ks = [len(r.call.draft) for r in drafting]
        catchup = sum(max(r.call.plan.missed - 2, 0) for r in drafting)
        context = sum(len(r.seq) for r in drafting)
        elapsed = []
        for j in range(max(ks)):
            rows = sum(k > j for k in ks)
            draft_wall += costs.draft_step(rows, rows + (catchup if j == 0 else 0), context)
            elapsed.append(draft_wall)
        for r, k in zip(drafting, ks):
            r.call.draft_s = elapsed[k - 1] if k else 0.0
            r.call.batch, r.call.catchup = len(drafting), catchup
    return draft_wall


def _target_step(active: list[SyntheticRequest], costs: Costs, load: int, max_num_tokens: int) -> float:
    """The target: every request in flight, one step (prompts prefilled in chunks of what it has room for); its
    seconds."""
    tokens, head_k, prefilling = 0, 0, []
    for r in active:
        c = r.call
        if c.prefill:
            prefilling.append(c)
        else:
            tokens += 1 + (len(c.draft) if c.verify_s == 0.0 else 0)
        head_k = max(head_k, c.plan.next_k)
    budget = max(max_num_tokens - tokens, 0)  # prompts are prefilled in chunks, as TensorRT-LLM's scheduler does
    for c in prefilling:
        chunk = min(c.prefill, budget)
        c.prefill -= chunk
        budget -= chunk
        tokens += chunk
    context = sum(len(r.seq) for r in active)
    held = sum(r.call.counted for r in active)  # the loop knows no chunking, nor who is in a step
    for r in active:
        r.call.tokens = max(r.call.tokens, held)
    return costs.target_step(load, tokens, context) + head_k * costs.head_step(load)


def _answer_calls(active: list[SyntheticRequest], step: float, acceptance: Acceptance, progress: float,
                  result: CellResult) -> None:
    """The calls the step finished are answered: the planner's outcome, the next draft, whether the request ended."""
    for r in active:
        c = r.call
        c.verify_s += step
        c.steps -= 0 if c.prefill else 1
        if c.steps > 0:
            continue
        remaining = r.max_tokens - (len(r.seq) - r.prompt)
        new, accepted = r.answer(c.draft, c.plan.plain)
        added = new[:remaining]
        r.seq += added
        result.count(c.draft, accepted, len(added))
        r.planner.outcome(c.plan, c.load, c.draft, new, c.verify_s, c.draft_s, r.seq, len(added), r.propose,
                          draft_batch=c.batch, step_tokens=c.tokens,
                          draft_missed=c.catchup)
        r.next = r.draft(c.plan.next_k, acceptance, progress) if c.plan.next_k else []
        r.call = None
        r.done = len(r.seq) - r.prompt >= r.max_tokens


@dataclass
class Cell:
    """One concurrency and acceptance profile: target-only, each fixed k and the controller, side by side."""

    concurrency: str
    profile: str
    results: dict[str, CellResult]  # every seed's run pooled into one
    seeds: list[dict[str, CellResult]] = dataclasses.field(default_factory=list)  # each seed's, where several

    def seed_ratios(self, policy: str) -> list[tuple[float, float]]:
        """`policy`'s (vs target-only, vs the best fixed k) in each seed's run on its own."""
        return [Cell(self.concurrency, self.profile, r).ratios(policy) for r in self.seeds] or [self.ratios(policy)]

    @property
    def baseline(self) -> float:
        return self.results["target-only"].tokens_per_s

    def best_fixed(self) -> tuple[str, float]:
        fixed = {n: r.tokens_per_s for n, r in self.results.items() if not n.startswith("controller")}
        name = max(fixed, key=fixed.get)
        return name, fixed[name]

    def ratios(self, policy: str) -> tuple[float, float]:
        """(vs target-only, vs the best fixed k) of `policy`."""
        v = self.results[policy].tokens_per_s
        return v / self.baseline, v / self.best_fixed()[1]

    def to_dict(self) -> dict:
        best, _ = self.best_fixed()
        return {"concurrency": self.concurrency, "profile": self.profile, "best_fixed": best,
                "seeds": len(self.seeds) or 1,
                "controller_by_seed": [list(r) for r in self.seed_ratios(next(n for n in self.results
                                                                              if n.startswith("controller")))],
                "policies": {n: {**r.to_dict(), "vs_target_only": self.ratios(n)[0], "vs_best_fixed": self.ratios(n)[1]}
                             for n, r in self.results.items()}}


def run_matrix(
    costs: Costs,
    concurrencies: Sequence[int | str],
    profiles: Sequence[str | Acceptance],
    fixed_k: Sequence[int],
    controller_k: int,
    *,
    in_engine: bool = False,
    overlapped: dict | None = None,
    requests: int = 48,
    max_tokens: int = 96,
    prompt: int = 256,
    seed: int = 0,
    seeds: int = 1,
    warmup: int = 0,
    progress: Callable[[str], None] = lambda line: None,
) -> list[Cell]:
    """Every (concurrency, profile) cell: target-only, each fixed k and the controller (at most controller_k).
    A concurrency is a number of requests in flight, or "ramp:N" (1 -> N -> 1). Each cell runs at least
    `requests` requests, and twice its concurrency, so that requests arrive and leave throughout. A profile is a
    PROFILES name or an Acceptance. `overlapped`: run the engines overlapping (trtspec.bench.overlapped), with
    these keyword arguments of simulate_overlapped (call_s, stream, max_batch). `seeds`: runs of seeds seed,
    seed + 1, ... pooled into one longer run per policy (each seed's kept too: a learning controller's cells vary
    with the draws more than a fixed k's); `warmup`: waves of requests (the concurrency's each) run first and not
    counted, so that the cell is a deployment that has run a while (lock step only)."""

    policies = [Policy.parse("target-only"), *(Policy.parse(str(k)) for k in fixed_k if k),
                Policy.parse(f"controller:{controller_k}")]
    cells = []
    for conc in concurrencies:
        text = str(conc)
        if text.startswith("ramp:"):
            peak = int(text.split(":", 1)[1])
            schedule, n_requests, wave = ramp(peak), max(requests, 6 * peak), peak
        else:
            schedule, n_requests, wave = constant(int(text)), max(requests, 2 * int(text)), int(text)
        for profile in profiles:
            acceptance = profile if isinstance(profile, Acceptance) else PROFILES[profile]
            runs = []
            for s in range(seed, seed + seeds):
                results = {}
                for policy in policies:
                    common = dict(requests=n_requests, max_tokens=max_tokens, prompt=prompt, seed=s,
                                  concurrency_label=text)
                    if overlapped is not None:
                        results[policy.name] = simulate_overlapped(costs, policy, schedule, acceptance, **common,
                                                                   **overlapped)
                    else:
                        results[policy.name] = simulate(costs, policy, schedule, acceptance, in_engine=in_engine,
                                                        warmup=warmup * wave, **common)
                runs.append(results)
            pooled = {n: dataclasses.replace(r) for n, r in runs[0].items()}  # each seed's run kept as it was
            for results in runs[1:]:
                for n, r in results.items():
                    pooled[n].add(r)
            cell = Cell(text, acceptance.name, pooled, runs if seeds > 1 else [])
            cells.append(cell)
            ctl = next(n for n in pooled if n.startswith("controller"))
            vs_base, vs_best = cell.ratios(ctl)
            spread = ""
            if seeds > 1:
                by_seed = cell.seed_ratios(ctl)
                spread = (f" (seeds at worst {min(r[0] for r in by_seed):.2f}x, "
                          f"{min(r[1] for r in by_seed):.2f}x)")
            progress(f"c={text:>8} {cell.profile:28s} best fixed {cell.best_fixed()[0]:11s} "
                     f"controller {vs_base:.2f}x target-only, {vs_best:.2f}x the best fixed k{spread}")
    return cells
