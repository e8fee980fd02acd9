"""The controller against GPU cost structures (trtspec simulate): the loop's own planner, N requests in flight.

The matrix below is the never-slower bar on a GPU: in every cell the controller is at least 0.98x target-only and
0.95x the best fixed k in hindsight. It runs the planner the loop runs (trtspec.spec.planner), in seconds, no server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.bench.costs import GpuCosts, Shape
from trtspec.bench.simulate import run_matrix, simulate
from trtspec.bench.workload import PROFILES, Policy, constant
from trtspec.config import AdaptivePolicy
from trtspec.spec.controller import GoodputController
from trtspec.spec.drafters import ESTIMATE_KEYS
from trtspec.spec.estimates import Estimates

H100 = GpuCosts("h100", Shape.known("llama-3.1-8b"), Shape.known("llama-3.2-1b"))

# (concurrency, profile) -> (the least vs target-only, the least vs the best fixed k); the bars
BARS = (0.98, 0.95)
CONCURRENCY = (1, 4, 16, 64, 256)


@pytest.fixture(scope="module")
def matrix():
    profiles = ("strong", "medium", "weak", "drop")
    # at 256 in flight every fixed k loses to target-only (k = 1 least): fewer of them there keeps this a minute
    return (run_matrix(H100, CONCURRENCY[:-1], profiles, (1, 2, 3), 4, requests=48, max_tokens=96)
            + run_matrix(H100, CONCURRENCY[-1:], profiles, (1,), 4, requests=48, max_tokens=96))


def test_the_controller_holds_on_a_gpus_cost_structure_in_every_cell(matrix):
    cells = matrix
    misses = []
    for cell in cells:
        vs_base, vs_best = cell.ratios("controller, k <= 4")
        if vs_base < BARS[0] or vs_best < BARS[1]:
            misses.append(f"c={cell.concurrency} {cell.profile}: {vs_base:.2f}x target-only, {vs_best:.2f}x the best "
                          f"fixed k ({cell.best_fixed()[0]})")
    assert not misses, "\n".join(misses)


def test_drafting_pays_where_a_fixed_k_does_and_stops_where_none_does(matrix):
    # the cells are not trivially met by never drafting: where a fixed k beats target-only by far, the controller
    # drafts and gains most of it; at 256 in flight, where every fixed k loses, it does not draft
    cells = matrix
    by = {(c.concurrency, c.profile): c for c in cells}
    strong16 = by[("16", PROFILES["strong"].name)]
    assert strong16.best_fixed()[1] / strong16.baseline > 1.3
    assert strong16.ratios("controller, k <= 4")[0] > 1.25
    busy = by[("256", PROFILES["strong"].name)]
    assert busy.best_fixed()[0] == "target-only"
    ctl = busy.results["controller, k <= 4"]
    assert ctl.drafted / ctl.iterations < 0.1


def test_a_draft_call_is_priced_as_shared_by_the_batch_drafting_together():
    ctl = GoodputController(Estimates(), AdaptivePolicy())
    for _ in range(10):
        ctl.record(1, None, 0, 0, 0.0070)
        ctl.record(8, None, 0, 0, 0.0071)  # a memory-bound step: 8 rows cost what 1 does
        ctl.record(1, "model", 2, 1, 0.0072, draft_s=0.0034)  # one request drafting alone: a whole draft call
    alone, shared = ctl.draft_cost("model", 2, 1), ctl.draft_cost("model", 2, 8)
    assert alone == pytest.approx(0.0034)
    # at 8 in flight the draft engine runs the 8 requests' calls as one: each pays an eighth (scaled as the
    # target's step is from 1 to 8 in flight)
    assert shared == pytest.approx(0.0034 * 0.0071 / 0.0070 / 8)


def test_a_draft_calls_catch_up_is_told_apart_from_its_drafting():
    ctl = GoodputController(Estimates(), AdaptivePolicy())
    rng = np.random.default_rng(0)
    ctl.record(1, None, 0, 0, 0.007)
    for _ in range(40):
        k, missed = int(rng.integers(1, 5)), int(rng.choice([0, 0, 100, 300]))
        ctl.record(1, "model", k, 0, 0.007, draft_s=0.0017 * k + 5e-6 * max(0, missed - 2), missed=missed)
    a, c = ctl.draft_rates(1)
    assert a == pytest.approx(0.0017, rel=1e-3) and c == pytest.approx(5e-6, rel=1e-3)


def test_probes_cost_a_bounded_share_of_the_deployments_time_at_any_load():
    # acceptance that never pays: whatever drafting the controller does is its probes'. They cost the deployment at
    # most a few percent of its time at any load, and at 256 in flight they do not come with (nearly) every step,
    # as probes counted in the deployment's iterations did
    never = PROFILES["weak"].__class__("never", 0.02)
    for n in (4, 256):
        r = simulate(H100, Policy.parse("controller:4"), constant(n), never, requests=max(32, 2 * n), max_tokens=64)
        base = simulate(H100, Policy.parse("target-only"), constant(n), never, requests=max(32, 2 * n), max_tokens=64)
        assert r.tokens_per_s / base.tokens_per_s > 0.97, n
    assert r.drafted / r.iterations < 0.01, (r.drafted, r.iterations)


def test_simulate_command_prints_the_matrix_and_writes_json(tmp_path):
    from trtspec.cli import cli

    out = tmp_path / "sim.json"
    result = CliRunner().invoke(cli, ["simulate", "--concurrency", "1,2", "--profiles", "strong", "--fixed-k", "1,2",
                                      "--requests", "12", "--max-tokens", "32", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "h100: 3.35 TB/s" in result.output and "controller" in result.output
    import json

    data = json.loads(out.read_text())
    assert [c["concurrency"] for c in data["cells"]] == ["1", "2"]
    assert set(data["cells"][0]["policies"]) == {"target-only", "k=1", "k=2", "controller, k <= 4"}


def test_simulate_refuses_an_unknown_gpu_by_name():
    from trtspec.cli import cli

    result = CliRunner().invoke(cli, ["simulate", "--costs", "gpu:h900"])
    assert result.exit_code != 0 and "unknown GPU 'h900'" in result.output and "h100" in result.output


def _bench_engine_json(path, step_ms, verify, batch):
    """What `trtspec bench-engine --json` writes (trtspec/commands/bench_engine.py), for one dtype."""
    import json

    run = {"requested_dtype": "float32", "dtype": "float32", "threads": 1, "context": 64, "weight_bytes": 1,
           "bandwidth_gbs": 1.0, "limit_ms": step_ms / 1.5, "step_ms": step_ms, "device": "cpu", "sweep_ms": None,
           "verify_ms": {str(n): step_ms * r for n, r in verify.items()},
           "batch_ms": {str(m): step_ms * r for m, r in batch.items()}, "ratios": {}}
    path.write_text(json.dumps({"checkpoint": "demo:target", "device": "cpu", "results": [run]}))
    return path


def test_simulate_runs_on_costs_measured_by_bench_engine(tmp_path):
    from trtspec.cli import cli

    # the demo pair on a 2-core CPU, as docs/benchmarks/engine.md records them: a row costs nearly what a step does
    target = _bench_engine_json(tmp_path / "target.json", 55.0, {2: 1.1, 4: 1.25, 8: 1.8}, {4: 1.6, 8: 2.0, 16: 3.2})
    draft = _bench_engine_json(tmp_path / "draft.json", 9.0, {2: 1.1, 4: 1.3, 8: 1.9}, {4: 1.7, 8: 2.3, 16: 3.5})
    out = tmp_path / "cpu.json"
    result = CliRunner().invoke(cli, ["simulate", "--costs", str(target), "--draft-costs", str(draft), "--concurrency",
                                      "1,8", "--profiles", "medium", "--fixed-k", "1,2", "--requests", "16",
                                      "--max-tokens", "64", "--prompt", "48", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "measured: cpu float32 (target.json) + cpu float32 (draft.json)" in result.output
    assert "step 55.0 ms" in result.output
    import json

    cells = json.loads(out.read_text())["cells"]
    assert [c["concurrency"] for c in cells] == ["1", "8"]
    # a CPU's step grows with every row: target-only is the best fixed policy at 8 in flight, k = 1 at 1
    assert cells[0]["best_fixed"] == "k=1" and cells[1]["best_fixed"] == "target-only"
    missing = CliRunner().invoke(cli, ["simulate", "--costs", str(target), "--concurrency", "1"])
    assert missing.exit_code != 0 and "needs --draft-costs" in missing.output


def test_a_draft_engine_that_does_not_batch_is_priced_alone():
    # a CPU's reference engine: its draft calls overlap the target's steps on other cores instead of batching, so a
    # request pays its whole draft call at any load (repository.loop_settings resolves this from the device)
    ctl = GoodputController(Estimates(), AdaptivePolicy(batched_steps=False))
    for _ in range(10):
        ctl.record(1, None, 0, 0, 0.040)
        ctl.record(8, None, 0, 0, 0.120)
        ctl.record(1, "model", 2, 1, 0.048, draft_s=0.020)
    assert ctl.draft_cost("model", 2, 8) == pytest.approx(0.020)


def test_the_deployment_resolves_whether_its_draft_calls_batch_from_its_device():
    from trtspec.config import parse_config
    from trtspec.repository import loop_settings

    def resolved(**over):
        cfg = parse_config({"name": "x", "engine": "reference", "target": {"checkpoint": "demo:target"},
                            "draft": {"checkpoint": "demo:draft"}, **over})
        return loop_settings(cfg, baseline=False, uses_model=True, engine_input_names={}) \
            .speculative.adaptive.batched_steps

    assert resolved(device="cpu") is False and resolved(device="cuda") is True
    assert resolved(device="cuda", speculative={"adaptive": {"batched_steps": False}}) is False


class _Flat:
    """Steps that cost the same whatever their rows and tokens: the overlap alone shows."""

    name = "flat"

    def __init__(self, target_s: float, draft_s: float):
        self.t, self.d = target_s, draft_s

    def target_step(self, rows, tokens, context):
        return self.t

    def draft_step(self, rows, tokens, context):
        return self.d

    def head_step(self, rows):
        return 0.0

    def assumptions(self):
        return []


def test_overlapped_engines_time_one_request_as_its_calls_add_up():
    from trtspec.bench.overlapped import simulate_overlapped
    from trtspec.bench.workload import Acceptance

    always = Acceptance("always", 1.0, decay=1.0)
    costs = _Flat(0.010, 0.003)
    base = simulate_overlapped(costs, Policy.parse("target-only"), constant(1), always, requests=4, max_tokens=40,
                               prompt=16, call_s=0.002, stream=True)
    # a token a plain call, each its round trip and one step
    assert base.seconds == pytest.approx(base.tokens * 0.012)
    runs = simulate_overlapped(costs, Policy.parse("target-only"), constant(1), always, requests=4, max_tokens=40,
                               prompt=16, call_s=0.002)
    assert base.seconds - 2 * base.tokens * 0.002 < runs.seconds < base.seconds - base.tokens * 0.001  # runs of 16
    k2 = simulate_overlapped(costs, Policy.parse("2"), constant(1), always, requests=4, max_tokens=40, prompt=16,
                             call_s=0.002, stream=True)
    # every draft accepted: 3 tokens an iteration, for a draft call of 2 steps and a verify, each with its round trip
    assert k2.accepted == k2.draft_tokens and k2.k_counts[2] > 40
    per_iteration = [0.002 + 0.010 + (0.002 + k * 0.003 if k else 0.0) for k in range(3)]
    assert k2.seconds == pytest.approx(sum(n * s for n, s in zip(k2.k_counts, per_iteration)))


def test_overlapped_target_gathers_the_requests_it_answered_before_its_next_step():
    from trtspec.bench.overlapped import simulate_overlapped

    costs = _Flat(0.010, 0.003)
    r = simulate_overlapped(costs, Policy.parse("target-only"), constant(4), PROFILES["weak"], requests=4,
                            max_tokens=40, prompt=16, call_s=0.002, seed=3, stream=True)
    rng = np.random.default_rng(3)  # the lengths the simulator draws for its 4 requests
    lengths = [int(rng.integers(20, 61)) + 0 * int(rng.integers(1 << 62)) for _ in range(4)]
    assert r.tokens == sum(lengths) and len(set(lengths)) > 1
    # the 4 come back a round trip after each step and step together until each ends: a token a round trip and a
    # step for the longest (and one more: the first to arrive starts alone), where split into two batches they
    # would take twice as long; and after each of the 3 others' last step a wait of up to a quarter of a step, for
    # a return that does not come (the engine cannot tell a request that ended from one on its way back)
    together = (max(lengths) + 1) * 0.012
    assert together <= r.seconds <= together + 3 * 0.25 * 0.010 + 1e-9


def test_the_simulated_engines_wait_for_answered_requests_by_the_reference_engines_rule():
    """An engine of `--engines overlapped` waits for the requests its last step answered as the reference engine's
    scheduler does (trtspec.regather): where they come back within a quarter of a step, a drafting request after
    its draft call included, and not where they are away longer. Before, the simulated target never waited for a
    drafting request, and predicted fixed k at 4 in flight 12-24% above the deployment (docs/benchmarks/controller.md)."""
    from trtspec.bench.overlapped import _Engine, _Work

    def engine_after_a_step(delays):
        eng = _Engine(lambda rows, tokens: 0.040, max_batch=8)
        eng.delays.extend(delays)
        stays, leaves = _Work(object(), 2, 1), _Work(object(), 1, 2)
        eng.waiting += [stays, leaves]
        assert eng.start(0.0) == pytest.approx((0.040, 2, 3))
        eng.busy, eng.running = False, [stays]
        return eng, leaves, eng.hold(0.040, [leaves])

    # back within 5 ms of a 40 ms step: the next step waits for it, up to a quarter of the step
    eng, leaves, until = engine_after_a_step([0.005] * 3)
    assert until == pytest.approx(0.040 + 0.010)
    assert eng.start(0.041) is None
    assert eng.arrived(_Work(leaves.request, 1, 2), 0.045) is None and list(eng.delays)[-1] == pytest.approx(0.005)
    assert eng.start(0.045) == pytest.approx((0.085, 2, 3))  # it came back: the step starts with both
    # away for 15 ms (a draft call first): not waited for
    eng, _, until = engine_after_a_step([0.015] * 3)
    assert until is None and eng.start(0.040) == pytest.approx((0.080, 1, 1))
    # nothing left to step when it decides: the wait starts with the first arrival, as the scheduler's does
    eng = _Engine(lambda rows, tokens: 0.040, max_batch=8)
    first, second = _Work(object(), 1, 2), _Work(object(), 1, 2)
    eng.waiting += [first, second]
    eng.start(0.0)
    eng.busy, eng.running = False, []
    assert eng.hold(0.040, [first, second]) is None
    # (the first return measured: back in 4 ms, so the wait is 2 x 4 + 1 ms)
    assert eng.arrived(_Work(first.request, 1, 2), 0.044) == pytest.approx(0.044 + 0.009)
    assert eng.start(0.045) is None
    eng.arrived(_Work(second.request, 1, 2), 0.046)
    assert eng.start(0.046) == pytest.approx((0.086, 2, 4))


def test_the_simulator_fed_this_cpus_engine_costs_predicts_the_deployments_ratios():
    """Calibration: `trtspec bench-engine` of the demo pair and a `trtspec bench` of the deployment through Triton,
    on one CPU (docs/benchmarks/data/calibration-cpu, docs/benchmarks/controller.md). The simulator with the engines
    overlapping, fed those engine costs and the acceptance by position the bench measured, predicts the
    deployment's ratios to target-only within 10% for fixed k = 1, 2, 4 and the controller at 1 / 4 / 8 in flight
    (worst 9%; before the simulated engines waited for drafting requests as the reference engine does, fixed k at
    4 and 8 in flight read up to 16% high)."""
    import json
    from pathlib import Path

    from trtspec.bench.costs import EngineCurve, MeasuredCosts
    from trtspec.bench.workload import Acceptance

    data = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "data" / "calibration-cpu"
    bench = json.loads((data / "bench.json").read_text())["cells"]
    tps = {(c["concurrency"], c["num_draft_tokens"], c["endpoint"], c["draft_length_policy"]): c["output_tokens_per_s"]
           for c in bench}
    k4 = next(c for c in bench if c["num_draft_tokens"] == 4 and c["draft_length_policy"] == "fixed")
    rates = [p["rate"] for p in k4["per_position"]]
    conditional = [rates[0]] + [min(b / a, 1.0) for a, b in zip(rates, rates[1:])]
    costs = MeasuredCosts(EngineCurve.from_bench_engine(data / "bench-engine-target.json"),
                          EngineCurve.from_bench_engine(data / "bench-engine-draft.json"))
    # plain calls are runs, as the deployment streams them; the loop's own time per call as fitted at 1 in flight
    cells = run_matrix(costs, (1, 4, 8), [Acceptance.measured(",".join(f"{a:.3f}" for a in conditional))], (1, 2, 4), 4,
                       overlapped=dict(call_s=0.001), requests=48, max_tokens=32, prompt=20)
    misses = []
    for cell in cells:
        c = int(cell.concurrency)
        base = tps[(c, 0, "baseline", None)]
        for policy, key in (("k=1", (c, 1, "ensemble", "fixed")), ("k=2", (c, 2, "ensemble", "fixed")),
                            ("k=4", (c, 4, "ensemble", "fixed")),
                            ("controller, k <= 4", (c, 4, "ensemble", "adaptive"))):
            measured, predicted = tps[key] / base, cell.ratios(policy)[0]
            if abs(predicted / measured - 1) > 0.10:
                misses.append(f"c={c} {policy}: predicted {predicted:.2f}x, measured {measured:.2f}x")
    assert not misses, "\n".join(misses)


def _drafting_deployment(acceptance: float) -> Estimates:
    """Estimates of a deployment at 8 in flight on a batched (GPU) engine, drafting k = 1 from the draft model:
    plain steps of 10 ms, a verify of 8 rows of 2 tokens 10.5 ms, a draft call 2 ms for the 8 (plus 50 us a
    token it catches up on), `acceptance` at the first position."""
    est = Estimates()
    ctl = GoodputController(est, AdaptivePolicy())
    rng = np.random.default_rng(0)
    for i in range(200):
        ctl.record(4, None, 0, 0, 0.0098, step_tokens=4)
        ctl.record(8, None, 0, 0, 0.0100, step_tokens=8)
        missed = 256 if i % 10 == 0 else 2
        ctl.record(8, "model", 1, int(rng.random() < acceptance), 0.0105, draft_s=0.002 + 50e-6 * (missed - 2),
                   missed=missed, draft_batch=8, step_tokens=16)
    return est


def test_a_request_with_a_prompt_to_catch_up_joins_a_deployment_that_drafts():
    # The draft engine's call runs for the others whether or not a new request is in it: the request weighs what it
    # adds to that call (its row and its prompt's catch-up), not a share of the call. A request that stayed out
    # would wait for the others' draft calls all the same, and steps would mix drafting and plain requests.
    est = _drafting_deployment(0.5)  # a gain of about 1% with the catch-up, 13% without
    old, new = GoodputController(est, AdaptivePolicy()), GoodputController(est, AdaptivePolicy())
    assert old.choose(8, {"model": 1}, missed=2, may_probe=False, remaining=100).k == 1
    assert new.choose(8, {"model": 1}, missed=256, may_probe=False, remaining=100).k == 1
    # where the deployment has not drafted for a while, the same small gain does not start it (the margin)
    est.clock[0] += 10.0
    assert new.choose(8, {"model": 1}, missed=256, may_probe=False, remaining=100).k == 0


def test_a_prompts_catch_up_is_priced_as_the_steps_grow_with_tokens_not_at_a_probes_rate():
    # A memory-bound device: a step costs 10 ms up to 128 tokens, then 40 us a token more; the draft model's steps
    # cost a fifth of the target's at any tokens. Probes catch up on a few tokens, free there; a prompt's catch-up
    # of 254 costs what 126 tokens past the flat part do. One rate a caught-up token cannot price both: a catch-up
    # is priced as the target's steps grow over as many tokens, scaled to the draft model's step.
    def step(tokens):
        return 0.010 + 40e-6 * max(0, tokens - 128)

    def draft_call(k, batch, caught_up):  # k draft steps, the first carrying the batch's catch-up
        return 0.2 * (step(batch + caught_up) + (k - 1) * step(batch))

    ctl = GoodputController(Estimates(), AdaptivePolicy())
    rng = np.random.default_rng(0)
    for i in range(300):
        tokens = int(rng.choice([8, 16, 24, 300, 600]))  # plain steps, some carrying a new prompt's chunk
        ctl.record(8, None, 0, 0, step(tokens), step_tokens=tokens)
        k, missed = int(rng.integers(1, 4)), int(rng.choice([2, 2, 20, 40, 256]))
        ctl.record(8, "model", k, 0, step(8 * (1 + k)), draft_s=draft_call(k, 8, missed - 2), missed=missed,
                   draft_batch=8, step_tokens=8 * (1 + k))
    assert ctl.batched()
    a, _ = ctl.draft_rates(8)
    assert a == pytest.approx(0.2 * step(8), rel=0.05)  # a draft step of 8 rows
    for missed, rel in ((20, None), (256, 0.2), (600, 0.1)):
        truth = 0.2 * (step(8 + missed - 2) - step(8))
        priced = ctl.draft_costs(1, 8, missed=missed)[1] - ctl.draft_costs(1, 8)[1]
        # a line through every call's catch-up prices 20 tokens at 74 us (free here) and 600 at 2.5 ms (3.8)
        assert priced < 2e-5 if rel is None else priced == pytest.approx(truth, rel=rel), (missed, priced, truth)


def test_a_draft_fit_whose_calls_cannot_tell_drafting_from_catch_up_is_not_extrapolated():
    # Probes after a pause all draft one token and catch up on a whole prompt (m = 257..285): a line through them
    # extrapolates to m = 0 far below any call measured (0.56 ms a drafted token where a draft step costs 1.66 on
    # the first-principles H100), and a deployment drafting on that price drafts at acceptance 0.25 where it loses
    # (measured: c = 32, weak, 0.972x target-only). Such calls say what drafting and catching up cost together.
    ctl = GoodputController(Estimates(), AdaptivePolicy())
    ctl.record(1, None, 0, 0, 0.0072)
    for m in (257, 285, 269, 271, 263):
        ctl.record(1, "model", 1, 0, 0.0072, draft_s=0.00185 + 5e-6 * (m - 257), missed=m + 2)
    a, _ = ctl.draft_rates(1)
    assert a >= 0.00166


def test_a_cold_deployment_prices_a_prompts_catch_up_by_the_steps_its_prompts_ran_in():
    # A cold deployment of 16 requests: nothing drafts, so no verify shows a step longer than a plain one, and the
    # draft model's catch-up of each prompt was priced at the rate a probe's short catch-up measured (37.7 us a
    # token where a prompt's costs ~5): seed 3 stayed at k = 0 for most of the run, 0.79x the best fixed k. A
    # batched deployment's first calls are steps carrying the prompts, measured by their tokens as any step.
    from trtspec.bench.costs import GridCosts

    costs = GridCosts.from_file(Path(__file__).parent.parent / "docs/benchmarks/data/gpu-h100/steps.json")
    run = {name: simulate(costs, Policy.parse(name), constant(16), PROFILES["strong"], requests=48, max_tokens=96,
                          seed=3) for name in ("2", "controller:4")}
    assert run["controller:4"].tokens_per_s / run["2"].tokens_per_s >= 0.95


def test_warmup_and_seeds_pool_runs_and_leave_the_cold_start_out():
    cold = run_matrix(H100, (16,), ("strong",), (2,), 4, requests=32, max_tokens=48, seeds=2)[0]
    warm = run_matrix(H100, (16,), ("strong",), (2,), 4, requests=32, max_tokens=48, seeds=2, warmup=1)[0]
    one = run_matrix(H100, (16,), ("strong",), (2,), 4, requests=32, max_tokens=48, seed=1)[0]
    assert len(cold.seeds) == 2 and cold.results["k=2"].tokens == sum(r["k=2"].tokens for r in cold.seeds)
    assert cold.seeds[1]["controller, k <= 4"].tokens_per_s == one.results["controller, k <= 4"].tokens_per_s
    # a fixed k has nothing to learn: the same speed warm or cold; the controller learns in its first wave
    assert warm.results["k=2"].tokens_per_s == pytest.approx(cold.results["k=2"].tokens_per_s, rel=0.05)
    assert warm.ratios("controller, k <= 4")[1] > cold.ratios("controller, k <= 4")[1]


def _cold_batched_deployment() -> Estimates:
    """A batched deployment of 32 requests that has not drafted yet but for probes: plain steps of 9 ms; three
    probes' draft calls, one request each, told apart as 1.97 ms a drafted token and 3.7 us a caught-up one."""
    est = Estimates()
    ctl = GoodputController(est, AdaptivePolicy())
    for _ in range(5):
        ctl.record(32, None, 0, 0, 0.009)
    for k, missed in ((1, 260), (1, 2), (2, 2)):
        ctl.record(32, "model", k, k, 0.0092, draft_s=0.00197 * k + 3.7e-6 * (missed - 2), missed=missed)
    est.clock[0] += 10.0  # long since: a probe is due
    return est


def test_a_cold_batched_deployments_probe_is_a_wave_of_requests_drafting_together():
    # One request's probe pays the draft engine's steps for one or two acceptance samples, against a prior worth
    # prior_drafts drafts: a cold deployment of 32 requests at acceptance 0.5 drafted nothing in a run where k = 1
    # gained 10%. Batched, the requests that plan before the probe's draft call is answered probe with it: the fewest
    # whose own costs (each one's catch-up of 258 tokens, 0.95 ms) are WAVE_SHARED times the draft step they share,
    # and no more than the drafts that make the estimate informed (three are seen; 2 * prior_drafts inform it).
    from trtspec.spec.controller import WAVE_SHARED

    est = _cold_batched_deployment()
    requests = [GoodputController(est, AdaptivePolicy()) for _ in range(16)]
    choices = [ctl.choose(32, {"model": 4}, missed=260) for ctl in requests]
    needed = 2 * AdaptivePolicy().prior_drafts - est.reached[ESTIMATE_KEYS.index("model"), 0]
    wave = int(min(np.ceil(WAVE_SHARED * 0.00197 / (258 * 3.7e-6)), np.ceil(needed)))
    assert wave == 6
    assert [c.probe for c in choices] == [True] * wave + [False] * (16 - wave)
    assert all(c.k == 1 for c in choices[:wave])
    # the wave's draft call answered, it is closed: a request planning after it does not probe
    requests[0].record(32, "model", 1, 1, 0.0093, draft_s=0.004, missed=260, draft_batch=wave)
    assert not GoodputController(est, AdaptivePolicy()).choose(32, {"model": 4}, missed=260).probe


def test_once_acceptance_is_measured_a_probe_is_one_requests_again():
    # A large probe comes later (its cost is bounded as a share of the deployment's time), and a change in
    # acceptance would be seen later (the drop profile): once the estimate is informed, probes are one request's.
    est = _cold_batched_deployment()
    est.reached[ESTIMATE_KEYS.index("model"), 0] = 2 * AdaptivePolicy().prior_drafts
    requests = [GoodputController(est, AdaptivePolicy()) for _ in range(3)]
    assert [ctl.choose(32, {"model": 4}, missed=260).probe for ctl in requests] == [True, False, False]


def test_draft_rows_at_load_are_priced_by_the_steps_they_reach_not_a_line_to_compute_bound_ones():
    # An H100's target steps at 64 in flight (docs/benchmarks/data/gpu-h100/steps.json): 64 tokens 9.59 ms, 128
    # 10.48, 192 11.16, 320 13.80, 576 20.38; their cost a token rises as they turn compute-bound. The line through
    # every step up to twice the most rows priced (k <= 4: 640 tokens) priced one draft row a request at 1.5x its
    # cost and the plain step 6% under its own, and with the H100's measured costs in the simulator a cold
    # deployment of 64 requests at acceptance 0.75 stayed 0.94x the best fixed k (4 seeds).
    ctl = GoodputController(Estimates(), AdaptivePolicy())
    for tokens, ms in ((64, 9.59), (128, 10.48), (192, 11.16), (320, 13.80), (576, 20.38)):
        for _ in range(3):
            ctl.record(64, None, 0, 0, ms / 1000, step_tokens=tokens)
    steps = ctl.batch_steps(64, 4)
    assert steps[0] == pytest.approx(0.00959, rel=0.03)
    assert steps[1] - steps[0] == pytest.approx(0.00089, rel=0.2)
