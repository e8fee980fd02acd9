"""The pure parts of the loop benchmark (trtspec.bench.loop and its parts): no server, no model, no timing."""

from __future__ import annotations

import math

import pytest

from trtspec.spec import speculative as spec
from trtspec.bench import loop_derive, loop_report, loop_server, loop_settings, loop_stats
from trtspec.spec.metrics import SpecStats


# ------------------------------------------------------------------ alpha solver


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("alpha", [0.0, 0.05, 0.2, 0.4, 0.5, 0.73, 0.9, 0.99])
def test_alpha_round_trips_through_the_formula(alpha, k):
    tau = spec.tokens_per_call(alpha, k)
    assert tau == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))
    assert spec.solve_alpha(tau, k) == pytest.approx(alpha, abs=1e-9)


def test_tokens_per_call_edges():
    assert spec.tokens_per_call(0.0, 3) == 1.0
    assert spec.tokens_per_call(1.0, 3) == 4.0
    assert spec.tokens_per_call(0.5, 0) == 1.0
    assert spec.tokens_per_call(0.5, 2) == pytest.approx(1.75)


def test_solve_alpha_clamps_and_k0():
    assert spec.solve_alpha(1.0, 3) == 0.0
    assert spec.solve_alpha(0.7, 3) == 0.0  # fewer than one token per call cannot happen; clamp
    assert spec.solve_alpha(4.0, 3) == 1.0
    assert spec.solve_alpha(5.0, 3) == 1.0
    assert spec.solve_alpha(1.5, 0) is None


def test_solve_alpha_known_value():
    # k = 1: tau = 1 + alpha
    assert spec.solve_alpha(1.37, 1) == pytest.approx(0.37)
    # k = 2: tau = 1 + a + a^2 = 1.75 -> a = 0.5
    assert spec.solve_alpha(1.75, 2) == pytest.approx(0.5)


# ------------------------------------------------------------------ the bound S


def test_bound_matches_formula():
    for alpha, k, c in [(0.4, 3, 0.26), (0.0, 3, 0.25), (0.9, 8, 0.05), (0.35, 1, 1.0)]:
        expected = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
        assert spec.speedup_bound(alpha, k, c) == pytest.approx(expected)


def test_bound_limits():
    assert spec.speedup_bound(1.0, 3, 0.0) == pytest.approx(4.0)
    assert spec.speedup_bound(0.0, 3, 0.0) == pytest.approx(1.0)  # free draft, never accepted: break-even
    assert spec.speedup_bound(0.0, 3, 0.25) == pytest.approx(1 / 1.75)
    # the demo pair's regime: alpha 0.4, c about a quarter, k 3 -> S near 1
    assert 0.85 < spec.speedup_bound(0.4, 3, 0.26) < 1.0


def test_bound_with_solved_alpha_is_tokens_per_call_over_cost():
    k, c, tau = 3, 0.25, 1.6
    a = spec.solve_alpha(tau, k)
    assert spec.speedup_bound(a, k, c) == pytest.approx(tau / (k * c + 1))


# ------------------------------------------------------------------ stats deltas


def _entry(name, infer_count, infer_ns, *, inp=(0, 0), out=(0, 0), queue=(0, 0), success=None, execs=None):
    success = success if success is not None else (infer_count, infer_ns + inp[1] + out[1] + queue[1])
    return {
        "name": name,
        "version": "1",
        "last_inference": 1700000000000,
        "inference_count": infer_count,
        "execution_count": execs if execs is not None else infer_count,
        "inference_stats": {
            "success": {"count": success[0], "ns": success[1]},
            "fail": {"count": 0, "ns": 0},
            "queue": {"count": queue[0], "ns": queue[1]},
            "compute_input": {"count": inp[0], "ns": inp[1]},
            "compute_infer": {"count": infer_count, "ns": infer_ns},
            "compute_output": {"count": out[0], "ns": out[1]},
            "cache_hit": {"count": 0, "ns": 0},
            "cache_miss": {"count": 0, "ns": 0},
        },
        "batch_stats": [],
    }


BEFORE = {
    "model_stats": [
        _entry("tensorrt_llm", 10, 500_000_000, inp=(10, 1_000_000), out=(10, 2_000_000)),
        _entry("tensorrt_llm_draft", 4, 80_000_000, inp=(4, 400_000), out=(4, 600_000)),
        _entry("preprocessing", 2, 3_000_000),
    ]
}
AFTER = {
    "model_stats": [
        _entry("tensorrt_llm", 60, 3_500_000_000, inp=(60, 6_000_000), out=(60, 12_000_000)),
        _entry("tensorrt_llm_draft", 54, 1_080_000_000, inp=(54, 5_400_000), out=(54, 8_100_000)),
        _entry("preprocessing", 3, 4_500_000),
        _entry("postprocessing", 1, 700_000),  # new since BEFORE: counts from zero
    ]
}


def test_stats_delta_per_model_and_part():
    d = loop_stats.stats_delta(BEFORE, AFTER)
    assert set(d) == {"tensorrt_llm", "tensorrt_llm_draft", "preprocessing", "postprocessing"}
    t = d["tensorrt_llm"]
    assert t["compute_infer"] == {"count": 50, "ns": 3_000_000_000}
    assert t["compute_input"] == {"count": 50, "ns": 5_000_000}
    assert t["compute_output"] == {"count": 50, "ns": 10_000_000}
    assert t["execution_count"] == 50 and t["inference_count"] == 50
    assert d["tensorrt_llm_draft"]["compute_infer"] == {"count": 50, "ns": 1_000_000_000}
    assert d["postprocessing"]["compute_infer"] == {"count": 1, "ns": 700_000}
    # restricting to some models
    assert set(loop_stats.stats_delta(BEFORE, AFTER, ["tensorrt_llm", "missing"])) == {"tensorrt_llm"}


def test_stats_delta_sums_versions():
    two = {"model_stats": [_entry("m", 1, 100), dict(_entry("m", 2, 300), version="2")]}
    assert loop_stats.stats_delta({"model_stats": []}, two)["m"]["compute_infer"] == {"count": 3, "ns": 400}


def test_engine_time_and_overhead_per_iteration():
    d = loop_stats.stats_delta(BEFORE, AFTER)
    eng = loop_stats.engine_ns(d)
    # target: 3e9 + 5e6 + 10e6; draft: 1e9 + 5e6 + 7.5e6
    assert eng == 3_015_000_000 + 1_012_500_000
    assert loop_stats.engine_ns(d, ["tensorrt_llm"], ["compute_infer"]) == 3_000_000_000
    assert loop_stats.engine_calls(d, "tensorrt_llm_draft") == 50
    # client saw 4.1 s for 50 iterations: (4.1 - 4.0275) / 50 = 1.45 ms per iteration
    assert loop_stats.overhead_per_iteration(4.1, eng, 50) == pytest.approx(0.00145)
    assert loop_stats.overhead_per_iteration(4.1, eng, 0) is None


def test_add_deltas_accumulates_requests():
    d1 = loop_stats.stats_delta(BEFORE, AFTER)
    total = loop_stats.add_deltas({}, d1)
    total = loop_stats.add_deltas(total, d1)
    assert total["tensorrt_llm"]["compute_infer"] == {"count": 100, "ns": 6_000_000_000}
    assert loop_stats.engine_ns(total) == 2 * loop_stats.engine_ns(d1)


def test_summarize_server_on_hand_made_records():
    k = 3

    def rec(pid, kind, endpoint, wall, tokens, stats, target_ns, target_calls, draft_ns=0, draft_calls=0):
        delta = {
            "tensorrt_llm": _delta(target_calls, target_ns),
            "tensorrt_llm_draft": _delta(draft_calls, draft_ns),
        }
        return loop_server.LoopRecord(pid, kind, endpoint, wall, tokens, SpecStats.from_wire(stats), delta)

    toks = list(range(40))
    records = [
        rec("chat-0", "chat", "baseline", 4.0, toks, {"num_iterations": 40}, 3_800_000_000, 40),
        rec("chat-0", "chat", "speculative", 3.0, toks,
            {"num_iterations": 25, "total_draft_tokens": 75, "total_accepted_draft_tokens": 15,
             "accepted_per_position": [9, 4, 2], "proposed_per_position": [25, 25, 25]},
            2_400_000_000, 25, 500_000_000, 25),
        rec("grounded-0", "grounded", "baseline", 4.0, toks, {"num_iterations": 40}, 3_800_000_000, 40),
        rec("grounded-0", "grounded", "speculative", 2.0, toks[:-1] + [99],
            {"num_iterations": 20, "total_draft_tokens": 60, "total_accepted_draft_tokens": 20}, 1_800_000_000, 20, 100_000_000, 20),
    ]
    s = loop_server.summarize_server(records, ["chat", "grounded"], k)["per_kind"]
    chat = s["chat"]
    assert chat["identical"] == 1 and chat["compared"] == 1
    assert chat["speedup"] == pytest.approx(4.0 / 3.0)
    sp = chat["speculative"]
    assert sp["tokens_per_call"] == pytest.approx((15 + 25) / 25)
    assert spec.tokens_per_call(sp["alpha"], k) == pytest.approx(1.6)
    assert sp["acceptance_rate"] == pytest.approx(0.2)
    assert sp["acceptance_per_position"] == pytest.approx([0.36, 0.16, 0.08])
    assert sp["engine_s"] == pytest.approx(2.9)
    assert sp["overhead_per_iteration_s"] == pytest.approx((3.0 - 2.9) / 25)
    assert sp["draft_s_per_token"] == pytest.approx(0.5 / 75)
    assert chat["baseline"]["target_s_per_call"] == pytest.approx(0.095)
    assert chat["baseline"]["overhead_per_iteration_s"] == pytest.approx(0.2 / 40)
    assert s["grounded"]["identical"] == 0
    assert s["all"]["compared"] == 2 and s["all"]["identical"] == 1
    assert s["all"]["speculative"]["iterations"] == 45


def _delta(calls, ns):
    z = {"count": 0, "ns": 0}
    return {
        "success": {"count": calls, "ns": ns},
        "queue": dict(z),
        "compute_input": dict(z),
        "compute_infer": {"count": calls, "ns": ns},
        "compute_output": dict(z),
        "execution_count": calls,
        "inference_count": calls,
    }


def test_derive_and_report_render_without_crashing():
    k = 3
    toks = list(range(10))
    recs = [
        loop_server.LoopRecord("chat-0", "chat", "baseline", 1.0, toks, SpecStats(num_iterations=10),
                         {"tensorrt_llm": _delta(10, 900_000_000)}),
        loop_server.LoopRecord("chat-0", "chat", "speculative", 0.9, toks,
                      SpecStats(num_iterations=6, total_draft_tokens=18, total_accepted_draft_tokens=4),
                         {"tensorrt_llm": _delta(6, 600_000_000), "tensorrt_llm_draft": _delta(6, 200_000_000)}),
    ]
    summary = loop_server.summarize_server(recs, ["chat"], k)
    results = {
        "command": "trtspec bench-loop --max-tokens 10",
        "machine": {"cpu_count": 2},
        "settings": {"k": k, "target": "demo:target", "draft": "demo:draft", "max_tokens": 10, "prompts_per_kind": 1,
                     "protocol": "http", "stream": False},
        "prompt_ids": ["chat-0"],
        "prompt_kinds": {"chat-0": "chat"},
        "server": {"summary": summary, "records": [r.__dict__ for r in recs],
                   "bls_exec": {"n": 10, "median_s": 0.0004, "mean_s": 0.0005, "p10_s": 0.0003, "echo_compute_s": 0.00005, "how": "test"}},
        "inprocess": {
            "cost": {"c_engine": 0.25, "c_model": 0.24, "engine_draft_s_per_token": 0.02, "engine_target_s_per_token": 0.08,
                     "model_draft_s_per_token": 0.018, "model_target_s_per_token": 0.075},
            "hf": {"hf_default_assistant_settings": {"num_assistant_tokens": 20}, "modes": {
                "target": {"per_prompt": [{"tokens": toks, "seconds": 1.0}]},
                "assisted": {"per_prompt": [{"tokens": toks, "seconds": 1.2}]},
            }},
            "prefill": {"mean_s": 0.05, "per_prompt_s": [0.05]},
            "verify": {"k": 3, "ratio": 1.1, "ctx64": {"median_s": 0.1, "all_s": [0.1], "computed_tokens": 4, "reused_tokens": 63},
                       "ctx1024": {"median_s": 0.11, "all_s": [0.11], "computed_tokens": 4, "reused_tokens": 1023}},
        },
    }
    loop_derive.derive(results, ["chat"], k)
    e = results["server"]["summary"]["per_kind"]["chat"]
    tau = (4 + 6) / 6
    alpha = spec.solve_alpha(tau, k)
    assert e["S"] == pytest.approx(spec.speedup_bound(alpha, k, 0.25))
    assert e["S"] == pytest.approx(tau / 1.75)
    assert e["efficiency"] == pytest.approx((1.0 / 0.9) / e["S"])
    assert e["hf_assisted_vs_target"] == pytest.approx(1 / 1.2)
    assert e["spec_vs_hf_assisted"] == pytest.approx((10 / 0.9) / (10 / 1.2))
    ov = results["server"]["overhead"]
    assert ov["speculative_per_iteration_s"] == pytest.approx((0.9 - 0.8) / 6)
    assert ov["limit_s"] == pytest.approx(3 * 0.0004) and ov["limit_round_trips"] == 3
    results["settings"]["draft_source"] = "ngram"  # no draft-model call per iteration: a tighter target
    loop_derive.derive(results, ["chat"], k)
    assert results["server"]["overhead"]["limit_s"] == pytest.approx(1.5 * 0.0004)
    assert "1.5 BLS round trips" in loop_report.render_report(results, ["chat"])
    assert results["inprocess"]["cost"]["c_server"] == pytest.approx((0.2 / 18) / 0.09)
    names = [c["check"] for c in results["checks"]]
    assert any("0.9 S" in n for n in names) and any("verify" in n for n in names)
    text = loop_report.render_report(results, ["chat"])
    assert "| chat |" in text and "Targets" in text and not math.isnan(e["S"])


def test_cli_defaults_are_the_settings_defaults():
    """`trtspec bench-loop`'s option defaults and LoopBenchArgs agree (one set of defaults)."""
    from trtspec.commands.bench_loop import command

    params = command.make_context("bench-loop", []).params
    defaults = {k: v for k, v in params.items() if k not in ("rerender", "kinds")}
    args = loop_settings.LoopBenchArgs()
    for name, value in defaults.items():
        assert getattr(args, name) == value, name
    assert (args.k, args.max_tokens, args.protocol, args.draft_source) == (3, 128, "http", "model")
    assert args.config.name == "demo.yaml"
