"""trtspec bench: the statistics on hand-made timings (fast), and a small real sweep against a real Triton
(CPU, reference engine: the session's demo-pair deployment, tests/conftest.py) whose results.json is checked
field by field, and whose Prometheus counters are checked against the responses."""

from __future__ import annotations

import csv
import json
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.bench import (
    BenchSettings,
    CrossCheck,
    builtin_prompts,
    chat,
    load_prompts,
    parse_kinds,
    parse_prometheus,
    plan_cells,
)
from trtspec.bench import stats as st
from trtspec.bench.metrics import default_metrics_url, expected_counts, value
from trtspec.bench.prompts import KINDS, PromptError
from trtspec.bench.runner import BASELINE, ENSEMBLE, Cell, RequestRecord
from trtspec.cli import cli
from trtspec.spec.metrics import SpecStats

# ---------------------------------------------------------------------------------------------- statistics


def test_percentile_interpolates_linearly():
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted: 1 2 3 4
    assert st.percentile(xs, 0) == 1.0
    assert st.percentile(xs, 100) == 4.0
    assert st.percentile(xs, 50) == pytest.approx(2.5)
    assert st.percentile(xs, 90) == pytest.approx(3.7)  # pos 2.7 -> 3 + 0.7
    assert st.percentile(xs, 99) == pytest.approx(3.97)
    assert st.percentile([7.0], 99) == 7.0
    assert st.percentile([], 50) is None
    with pytest.raises(ValueError):
        st.percentile(xs, 101)


def test_percentile_matches_numpy_on_random_data():
    import numpy as np

    rng = np.random.default_rng(0)
    xs = rng.exponential(size=37).tolist()
    for q in (0, 10, 50, 90, 99, 100):
        assert st.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_describe():
    d = st.describe(range(1, 101))
    assert d["n"] == 100 and d["mean"] == pytest.approx(50.5)
    assert d["p50"] == pytest.approx(50.5) and d["p90"] == pytest.approx(90.1) and d["p99"] == pytest.approx(99.01)
    assert d["min"] == 1 and d["max"] == 100
    empty = st.describe([])
    assert empty["n"] == 0 and all(empty[k] is None for k in st.STAT_KEYS if k != "n")


def test_itl_spreads_a_chunk_gap_over_its_tokens():
    # first chunk (2 tokens) at 1.0; 3 tokens at 1.6; an empty response at 1.7 (ignored); 1 token at 2.0
    times = [1.0, 1.6, 1.7, 2.0]
    counts = [2, 3, 0, 1]
    per_token, per_chunk = st.inter_token_latencies(times, counts)
    assert per_chunk == pytest.approx([0.6, 0.4])
    assert per_token == pytest.approx([0.2, 0.2, 0.2, 0.4])
    # the per-token ITLs of a request add up to last-token time minus first-token time
    assert sum(per_token) == pytest.approx(2.0 - 1.0)
    # the tokens that came with the first one get no ITL (they are covered by TTFT)
    assert len(per_token) == sum(counts) - counts[0]


def test_itl_edge_cases():
    assert st.inter_token_latencies([], []) == ([], [])
    assert st.inter_token_latencies([0.5], [4]) == ([], [])
    assert st.inter_token_latencies([0.1, 0.5], [0, 1]) == ([], [])  # leading empty response
    with pytest.raises(ValueError):
        st.inter_token_latencies([1.0], [1, 2])


def test_speedup():
    assert st.speedup(30.0, 20.0) == pytest.approx(1.5)
    assert st.speedup(None, 1.0) is None and st.speedup(1.0, 0) is None


def test_crossover_found_with_interpolation():
    c = st.crossover({1: 1.8, 4: 1.3, 16: 0.9, 64: 0.6})
    assert c["status"] == "crossover"
    assert c["concurrency"] == 16 and c["last_paying"] == 4
    assert c["estimate"] == pytest.approx(4 + (1.3 - 1.0) / (1.3 - 0.9) * 12)
    assert c["paying"] == [1, 4]
    assert "above concurrency 4" in c["summary"]


def test_crossover_uses_the_tail_that_never_pays_again():
    # pays at 1, not at 2 (noise), pays at 4, stops at 8: the crossover is 8, not 2
    c = st.crossover({1: 1.5, 2: 0.95, 4: 1.2, 8: 0.8})
    assert c["status"] == "crossover" and c["concurrency"] == 8 and c["last_paying"] == 4


def test_crossover_none_never_unknown():
    none = st.crossover({1: 2.0, 4: 1.5})
    assert none["status"] == "none" and none["concurrency"] is None
    assert "none in the measured range" in none["summary"]
    assert st.crossover({1: 0.9, 4: 1.2})["status"] == "none"  # pays at the highest level measured
    assert st.crossover({1: 0.9, 4: 0.7})["status"] == "never"
    assert st.crossover({1: None})["status"] == "unknown"
    assert st.crossover({})["status"] == "unknown"
    assert st.crossover({1: 1.0})["status"] == "never"  # exactly 1 does not pay


# ---------------------------------------------------------------------------------------------- prompts


def test_builtin_prompts_are_varied_and_templated():
    prompts = builtin_prompts()
    assert len(prompts) == 24
    kinds = [p.kind for p in prompts]
    assert {k: kinds.count(k) for k in KINDS} == {"chat": 8, "code": 8, "grounded": 8}
    assert kinds[:3] == ["chat", "code", "grounded"]  # interleaved: any prefix is varied
    assert len({p.text for p in prompts}) == 24 and len({p.id for p in prompts}) == 24
    for p in prompts:
        if p.kind in ("chat", "grounded"):
            assert p.text.startswith("<|im_start|>user\n") and p.text.endswith("<|im_end|>\n<|im_start|>assistant\n")
        else:
            assert "<|im_start|>" not in p.text
    assert chat("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert [p.kind for p in builtin_prompts(["code"])] == ["code"] * 8
    assert parse_kinds("all") == list(KINDS) and parse_kinds("code, chat") == ["code", "chat"]
    with pytest.raises(PromptError, match="unknown prompt kind"):
        parse_kinds("poetry")


def test_load_prompts_jsonl(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a", "kind": "chat"}\n\n# comment\n{"prompt": "b", "id": "x"}\n')
    ps = load_prompts(f)
    assert [(p.text, p.kind) for p in ps] == [("a", "chat"), ("b", "custom")]
    assert ps[1].id == "x"
    f.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(PromptError, match=r"p.jsonl:2"):
        load_prompts(f)
    f.write_text("not json\n")
    with pytest.raises(PromptError, match=r"p.jsonl:1: not valid JSON"):
        load_prompts(f)
    with pytest.raises(PromptError, match="cannot read"):
        load_prompts(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------------------------------------- cells, metrics


def test_plan_cells_always_runs_the_baseline():
    cells = plan_cells(BenchSettings(concurrency=[4, 1], draft_tokens=[4, 2]))
    assert [c.label for c in cells] == ["c=1 baseline", "c=1 k=2", "c=1 k=4", "c=4 baseline", "c=4 k=2", "c=4 k=4"]
    cells = plan_cells(BenchSettings(concurrency=[1], draft_tokens=[0, 2], k0_on_ensemble=True))
    assert [(c.endpoint, c.k, c.speculative) for c in cells] == [
        (BASELINE, 0, False), (ENSEMBLE, 0, False), (ENSEMBLE, 2, True)]


def test_plan_cells_adds_the_fixed_k_candidates():
    cells = plan_cells(BenchSettings(concurrency=[1, 4], draft_tokens=[6], draft_length_policy="adaptive",
                                     fixed_k=[0, 2, 6]))
    assert [c.label for c in cells] == ["c=1 baseline", "c=1 k=6", "c=1 k=2 fixed", "c=1 k=6 fixed",
                                        "c=4 baseline", "c=4 k=6", "c=4 k=2 fixed", "c=4 k=6 fixed"]
    # with the run's own policy fixed, a k already swept is not run twice
    cells = plan_cells(BenchSettings(concurrency=[1], draft_tokens=[2], draft_length_policy="fixed", fixed_k=[2, 3]))
    assert [c.label for c in cells] == ["c=1 baseline", "c=1 k=2", "c=1 k=3 fixed"]


def test_rounds_interleave_the_cells_of_a_concurrency_a_b_b_a():
    from trtspec.bench.runner import BenchError, measured_schedule

    s = BenchSettings(concurrency=[1, 4], draft_tokens=[2], k0_on_ensemble=True, requests_per_cell=8, rounds=3)
    cells = plan_cells(s)
    at1 = [c for c in cells if c.concurrency == 1]
    sched = [(c.label, list(r)) for c, r in measured_schedule(s, at1)]
    assert sched == [("c=1 baseline", [0, 1]), ("c=1 k=0 (ensemble)", [0, 1]), ("c=1 k=2", [0, 1]),
                     ("c=1 k=2", [2, 3, 4]), ("c=1 k=0 (ensemble)", [2, 3, 4]), ("c=1 baseline", [2, 3, 4]),
                     ("c=1 baseline", [5, 6, 7]), ("c=1 k=0 (ensemble)", [5, 6, 7]), ("c=1 k=2", [5, 6, 7])]
    # a round never has fewer requests than clients in flight: 8 requests at c=4 make 2 rounds, not 3
    at4 = [c for c in cells if c.concurrency == 4]
    assert [(c.label, list(r)) for c, r in measured_schedule(s, at4)][:4] == [
        ("c=4 baseline", [0, 1, 2, 3]), ("c=4 k=0 (ensemble)", [0, 1, 2, 3]), ("c=4 k=2", [0, 1, 2, 3]),
        ("c=4 k=2", [4, 5, 6, 7])]
    # one round is the plain sequence
    s.rounds = 1
    assert [(c.label, list(r)) for c, r in measured_schedule(s, at1)] == [(c.label, list(range(8))) for c in at1]
    s.rounds = 9
    with pytest.raises(BenchError, match="rounds must be between 1 and the requests per cell"):
        s.validate()


def test_each_cell_sends_its_own_policy():
    from trtspec.bench.runner import cell_policy

    s = BenchSettings(draft_length_policy="adaptive", fixed_k=[2])
    assert cell_policy(s, Cell(1, 4, ENSEMBLE)) == "adaptive"
    assert cell_policy(s, Cell(1, 2, ENSEMBLE, "fixed")) == "fixed"
    assert cell_policy(s, Cell(1, 0, BASELINE)) is None
    assert cell_policy(BenchSettings(), Cell(1, 4, ENSEMBLE)) is None  # the deployment's


def _cell(conc, k, tok_s, policy=None, endpoint=None):
    endpoint = endpoint or (BASELINE if k == 0 else ENSEMBLE)
    label = f"c={conc} baseline" if endpoint == BASELINE else f"c={conc} k={k}" + (" fixed" if policy == "fixed" else "")
    return {"label": label, "concurrency": conc, "num_draft_tokens": k, "endpoint": endpoint,
            "speculative": endpoint == ENSEMBLE and k > 0, "draft_length_policy": policy,
            "output_tokens_per_s": tok_s}


def test_best_fixed_k_in_hindsight():
    from trtspec.bench.report import _add_vs_best_fixed, best_fixed_k

    cells = [
        _cell(1, 0, 10.0), _cell(1, 6, 13.0, "adaptive"), _cell(1, 1, 11.0, "fixed"), _cell(1, 3, 12.0, "fixed"),
        _cell(1, 6, 12.0, "fixed"),
        _cell(8, 0, 30.0), _cell(8, 6, 27.0, "adaptive"), _cell(8, 1, 28.0, "fixed"), _cell(8, 3, 20.0, "fixed"),
        _cell(8, 0, 29.0, endpoint=ENSEMBLE),  # drafting off on the speculative endpoint: not a fixed-k candidate
        _cell(16, 0, 40.0), _cell(16, 6, 38.0, "adaptive"),  # no fixed k > 0 ran here: nothing to compare with
    ]
    best = best_fixed_k(cells)
    assert [(b["concurrency"], b["num_draft_tokens"], b["label"]) for b in best] == [
        (1, 3, "c=1 k=3 fixed"), (8, 0, "c=8 baseline")]
    assert best[0]["speedup"] == pytest.approx(1.2) and best[1]["speedup"] == pytest.approx(1.0)
    assert best[0]["tried"] == [0, 1, 3, 6] and best[1]["tried"] == [0, 1, 3]
    _add_vs_best_fixed(cells, best)
    ratio = {c["label"] + (c["draft_length_policy"] or ""): (c.get("vs_best_fixed") or {}).get("output_tokens_per_s")
             for c in cells}
    assert ratio["c=1 k=6adaptive"] == pytest.approx(13 / 12) and ratio["c=8 k=6adaptive"] == pytest.approx(0.9)
    assert ratio["c=1 k=1 fixedfixed"] == pytest.approx(11 / 12) and ratio["c=1 k=3 fixedfixed"] == pytest.approx(1.0)
    assert ratio["c=8 k=0"] == pytest.approx(29 / 30)
    assert ratio["c=1 baseline"] is None and ratio["c=16 k=6adaptive"] is None
    assert cells[1]["vs_best_fixed"]["best_num_draft_tokens"] == 3


def test_best_fixed_k_tie_goes_to_the_smaller_k():
    from trtspec.bench.report import best_fixed_k

    best = best_fixed_k([_cell(2, 0, 10.0), _cell(2, 2, 10.0, "fixed"), _cell(2, 1, 10.0, "fixed")])
    assert best[0]["num_draft_tokens"] == 0
    best = best_fixed_k([_cell(2, 0, 9.0), _cell(2, 2, 10.0, "fixed"), _cell(2, 1, 10.0, "fixed")])
    assert best[0]["num_draft_tokens"] == 1


def test_k_chosen_from_the_responses_draft_len_counts():
    from trtspec.bench.report import draft_len_counts, k_chosen

    recs = [_record(ENSEMBLE, 4, [1, 2], {}), _record(ENSEMBLE, 4, [1], {}), _record(ENSEMBLE, 4, [1], {})]
    recs[0].stats.draft_len_counts = [3, 0, 2]
    recs[1].stats.draft_len_counts = [1, 4]
    assert draft_len_counts(recs) == [4, 4, 2]  # the third response carried none
    k = k_chosen(draft_len_counts(recs))
    assert k == {"iterations": 10, "mean": (4 + 4) / 10, "k0_fraction": 0.4, "counts": [4, 4, 2]}
    assert draft_len_counts(recs[2:]) is None and k_chosen(None) is None and k_chosen([0, 0]) is None


def _synthetic_run(fixed_tok_s, adaptive_tok_s, counts=None):
    """A BenchRun with made-up timings: one request of 10 tokens per cell, wall time = 10 / tok_s."""
    from trtspec.bench.runner import BenchRun, CellRun

    settings = BenchSettings(concurrency=[1, 4], draft_tokens=[4], draft_length_policy="adaptive", fixed_k=[0, 2],
                             metrics_url="none")
    runs = []
    for cell in plan_cells(settings):
        tok_s = (adaptive_tok_s if cell.policy is None and cell.endpoint == ENSEMBLE else fixed_tok_s)[
            (cell.concurrency, cell.k)]
        rec = RequestRecord(cell, 0, False, builtin_prompts()[0], start=0.0)
        rec.chunk_times, rec.chunk_tokens = [10 / tok_s], [10]  # end = the last response
        if counts and cell.endpoint == ENSEMBLE and cell.policy is None:
            rec.stats.draft_len_counts = counts[cell.concurrency]
        runs.append(CellRun(cell, [rec], [], [(0.0, 10 / tok_s)]))
    check = {"status": "skipped", "url": None, "reason": "disabled", "models": {}}
    return BenchRun(settings, builtin_prompts()[:1], runs, 0.0, "2026-11-25T00:00:00+00:00", 1.0, check)


def test_results_table_and_summary_name_the_best_fixed_k(tmp_path):
    from rich.console import Console

    from trtspec.bench import build_results, summary_lines, table, write_results

    run = _synthetic_run({(1, 0): 10.0, (1, 2): 12.5, (4, 0): 20.0, (4, 2): 16.0},
                         {(1, 4): 12.0, (4, 4): 19.0}, counts={1: [1, 0, 2, 0, 7], 4: [9, 1]})
    res = build_results(run)
    assert res["settings"]["fixed_k"] == [0, 2]
    assert [(b["concurrency"], b["num_draft_tokens"]) for b in res["summary"]["best_fixed"]] == [(1, 2), (4, 0)]
    adaptive = {c["concurrency"]: c for c in res["cells"] if c["draft_length_policy"] == "adaptive"}
    assert adaptive[1]["vs_best_fixed"]["output_tokens_per_s"] == pytest.approx(12 / 12.5)
    assert adaptive[4]["vs_best_fixed"]["output_tokens_per_s"] == pytest.approx(19 / 20)
    assert adaptive[4]["speedup"]["output_tokens_per_s"] == pytest.approx(19 / 20)
    assert adaptive[1]["k_chosen"]["mean"] == pytest.approx((2 * 2 + 4 * 7) / 10)
    text = "\n".join(summary_lines(res))
    assert "Best fixed k" in text and "c=1: k=2, 1.25x" in text and "c=4: k=0 (baseline), 1.00x" in text
    assert "c=1 k=4: 0.96x" in text and "c=4 k=4: 0.95x" in text
    console = Console(width=140, record=True)
    console.print(table(res))
    rendered = console.export_text()
    assert "vs best" in rendered and "best" in rendered and "adapt" in rendered and "0.96x" in rendered
    written = write_results(run, tmp_path / "out", res)
    assert written["files"]["plot_k_chosen"] == "k_chosen.png" and (tmp_path / "out" / "k_chosen.png").stat().st_size
    # an older server: no draft_len_counts, no plot, nothing else changes
    old = write_results(_synthetic_run({(1, 0): 10.0, (1, 2): 12.5, (4, 0): 20.0, (4, 2): 16.0},
                                       {(1, 4): 12.0, (4, 4): 19.0}), tmp_path / "old")
    assert "plot_k_chosen" not in old["files"] and all(c["k_chosen"] is None for c in old["cells"])
    assert old["summary"]["best_fixed"] == res["summary"]["best_fixed"]


def test_metrics_url_defaults():
    assert default_metrics_url("localhost:8000") == "http://localhost:8002/metrics"
    assert default_metrics_url("http://gpu-box:9000") == "http://gpu-box:8002/metrics"
    assert BenchSettings(metrics_url="none").resolved_metrics_url is None
    assert BenchSettings(metrics_url="h:9").resolved_metrics_url == "http://h:9/metrics"


def test_parse_prometheus_text():
    text = """# HELP spec_decode_num_requests Requests
# TYPE spec_decode_num_requests counter
spec_decode_num_requests{model="ensemble"} 12
spec_decode_num_requests{model="baseline"} 3
spec_decode_num_accepted_tokens_per_pos{model="ensemble",position="1"} 7
nv_inference_count{model="x",version="1"} 4 1700000000
weird{label="a \\"quoted\\" value"} 1.5e3
"""
    s = parse_prometheus(text)
    assert value(s, "spec_decode_num_requests", model="ensemble") == 12
    assert value(s, "spec_decode_num_requests") == 15
    assert value(s, "spec_decode_num_accepted_tokens_per_pos", model="ensemble", position="1") == 7
    assert value(s, "nv_inference_count") == 4
    assert s[("weird", (("label", 'a "quoted" value'),))] == 1500.0


def _record(endpoint, k, tokens, stats, error=None):
    r = RequestRecord(Cell(1, k, endpoint), 0, False, builtin_prompts()[0], start=0.0)
    r.chunk_times, r.chunk_tokens, r.stats, r.error = [0.1] * len(tokens), list(tokens), SpecStats.from_wire(stats), error
    return r


def test_cross_check_compares_deltas_with_response_sums(monkeypatch):
    spec_stats = {"total_draft_tokens": 6, "total_accepted_draft_tokens": 4, "num_drafts": 3, "num_iterations": 4,
                  "draft_fallbacks": 0, "accepted_per_position": [3, 1], "proposed_per_position": [3, 3]}
    base_stats = {"total_draft_tokens": 0, "total_accepted_draft_tokens": 0, "num_drafts": 0, "num_iterations": 8,
                  "draft_fallbacks": 0, "accepted_per_position": [0], "proposed_per_position": [0]}
    reqs = [_record(ENSEMBLE, 2, [3, 3, 2], spec_stats), _record(BASELINE, 0, [1] * 8, base_stats),
            _record(ENSEMBLE, 2, [], {}, error="boom")]  # a failed request is counted by neither side
    exp = expected_counts(reqs)
    assert exp["ensemble"]["requests"] == 1 and exp["ensemble"]["output_tokens"] == 8
    assert exp["baseline"]["num_iterations"] == 8

    def page(spec_req, spec_acc):
        return parse_prometheus(f"""
spec_decode_num_requests{{model="ensemble"}} {spec_req}
spec_decode_num_draft_tokens{{model="ensemble"}} {10 + 6}
spec_decode_num_accepted_tokens{{model="ensemble"}} {spec_acc}
spec_decode_num_drafts{{model="ensemble"}} 13
spec_decode_num_iterations{{model="ensemble"}} 14
spec_decode_num_emitted_tokens{{model="ensemble"}} 18
spec_decode_num_fallbacks{{model="ensemble"}} 0
spec_decode_num_accepted_tokens_per_pos{{model="ensemble",position="0"}} 13
spec_decode_num_accepted_tokens_per_pos{{model="ensemble",position="1"}} 1
spec_decode_num_draft_tokens_per_pos{{model="ensemble",position="0"}} 13
spec_decode_num_draft_tokens_per_pos{{model="ensemble",position="1"}} 3
spec_decode_num_requests{{model="baseline"}} 1
spec_decode_num_draft_tokens{{model="baseline"}} 0
spec_decode_num_accepted_tokens{{model="baseline"}} 0
spec_decode_num_drafts{{model="baseline"}} 0
spec_decode_num_iterations{{model="baseline"}} 8
spec_decode_num_emitted_tokens{{model="baseline"}} 8
spec_decode_num_fallbacks{{model="baseline"}} 0
""")

    before = parse_prometheus("""
spec_decode_num_requests{model="ensemble"} 4
spec_decode_num_draft_tokens{model="ensemble"} 10
spec_decode_num_accepted_tokens{model="ensemble"} 5
spec_decode_num_drafts{model="ensemble"} 10
spec_decode_num_iterations{model="ensemble"} 10
spec_decode_num_emitted_tokens{model="ensemble"} 10
spec_decode_num_fallbacks{model="ensemble"} 0
spec_decode_num_accepted_tokens_per_pos{model="ensemble",position="0"} 10
spec_decode_num_draft_tokens_per_pos{model="ensemble",position="0"} 10
""")
    # the loop increments its counters one after the other after the final response: a scrape may see the
    # request counted but not yet its tokens; the check reads again until everything matches
    pages = iter([page(5, 7), page(5, 9)])
    monkeypatch.setattr("trtspec.bench.metrics.scrape", lambda url, timeout=5.0: next(pages))
    check = CrossCheck("http://x/metrics", before=before)
    res = check.finish(reqs, sleep=lambda s: None)
    assert res["status"] == "ok", res
    assert res["models"]["ensemble"]["spec_decode_num_accepted_tokens"] == {
        "expected": 4, "observed": 4, "ok": True, "primary": True}
    assert res["models"]["ensemble"]["spec_decode_num_accepted_tokens_per_pos"]["observed"] == [3, 1]
    assert res["medusa_tree_steps"] == []  # no Medusa engine counts its tree steps here
    from trtspec.bench.report import tree_line

    assert tree_line(res) is None
    assert tree_line({"medusa_tree_steps": [3, 0, 1]}).endswith("0: 75%, 2: 25% of 4")

    # one accepted token too many on the server side: a mismatch, reported as such
    monkeypatch.setattr("trtspec.bench.metrics.scrape", lambda url, timeout=5.0: page(5, 10))
    check = CrossCheck("http://x/metrics", before=before)
    res = check.finish(reqs, settle_s=0.5, sleep=lambda s: None)
    assert res["status"] == "mismatch"
    assert not res["models"]["ensemble"]["spec_decode_num_accepted_tokens"]["ok"]


def test_cross_check_unavailable():
    check = CrossCheck("http://127.0.0.1:1/metrics")
    check.start()
    res = check.finish([])
    assert res["status"] == "unavailable" and "cannot read metrics" in res["reason"]


def test_unreachable_server_is_a_clear_error():
    result = CliRunner().invoke(cli, ["bench", "--url", "127.0.0.1:1", "--requests", "1"])
    assert result.exit_code == 1
    assert "cannot reach Triton over HTTP at 127.0.0.1:1" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["bench", "--url", "127.0.0.1:1", "--protocol", "grpc"])
    assert result.exit_code == 1 and "cannot reach Triton over gRPC" in result.output
    result = CliRunner().invoke(cli, ["bench", "--concurrency", "0"])
    assert result.exit_code == 1 and "--concurrency: values must be >= 1" in result.output


def test_help_teaches():
    result = CliRunner().invoke(cli, ["bench", "--help"])
    assert result.exit_code == 0
    for word in ("--concurrency", "--draft-tokens", "baseline", "crossover", "results.json", "--config", "Examples"):
        assert word in result.output


# ---------------------------------------------------------------------------------------------- real Triton

# 4 tokens: a k=2 verify still delivers up to 3 tokens in one response, and what the sweep checks is the accounting
# (cells, rounds, warm-ups, statistics, counters), which does not grow with the length
MAX_TOKENS = 4
SWEEP = ["--concurrency", "1,2", "--draft-tokens", "0,2", "--k0-on-ensemble", "--fixed-k", "0,1", "--requests", "2",
         "--rounds", "2", "--warmup", "1", "--max-tokens", str(MAX_TOKENS), "--num-prompts", "2"]

STAT_FIELDS = set(st.STAT_KEYS)
TOP_FIELDS = {"schema_version", "tool", "trtspec_version", "started_at", "duration_s", "settings", "prompts", "cells",
              "summary", "metrics_check", "profile", "requests", "files"}
SETTINGS_FIELDS = {"url", "protocol", "metrics_url", "max_tokens", "concurrency", "draft_tokens", "draft_source",
                   "draft_length_policy", "deployment_draft_length_policy", "k0_on_ensemble", "stream", "fixed_k", "requests_per_cell", "warmup_per_cell", "rounds", "profile"}
CELL_FIELDS = {"label", "concurrency", "num_draft_tokens", "endpoint", "speculative", "num_requests", "num_ok",
               "num_errors", "num_warmup", "errors", "wall_s", "rounds", "output_tokens", "output_tokens_per_s",
               "requests_per_s", "ended_early", "output_tokens_per_request", "ttft_s", "itl_token_s", "itl_chunk_s",
               "tpot_s", "e2e_s", "tokens_per_s_per_user", "tokens_per_response", "client_overhead_s",
               "client_overhead_fraction", "acceptance", "speedup", "draft_length_policy", "k_chosen", "vs_best_fixed"}
CELL_STATS = {"output_tokens_per_request", "ttft_s", "itl_token_s", "itl_chunk_s", "tpot_s", "e2e_s",
              "tokens_per_s_per_user", "tokens_per_response", "client_overhead_s", "client_overhead_fraction"}
ACCEPTANCE_FIELDS = {"rate", "rate_per_request", "mean_acceptance_length", "tokens_per_target_call", "num_draft_tokens", "num_accepted_tokens",
                     "num_iterations", "num_drafts", "draft_fallbacks", "load_paused_iterations", "per_position", "by_source"}
SPEEDUP_FIELDS = {"output_tokens_per_s", "e2e_p50", "ttft_p50", "tokens_per_s_per_user_mean", "baseline_num_requests"}
REQUEST_FIELDS = {"cell", "concurrency", "num_draft_tokens", "endpoint", "index", "warmup", "prompt_id",
                  "prompt_kind", "start_s", "ttft_s", "e2e_s", "output_tokens", "ended_early", "num_responses",
                  "tokens_per_s", "tpot_s", "itl_token_mean_s", "client_overhead_s", "client_overhead_fraction",
                  "response_times_s", "response_tokens", "stats", "error"}
SUMMARY_FIELDS = {"num_cells", "num_requests", "num_warmup", "num_errors", "best", "best_fixed", "crossover",
                  "acceptance", "client_overhead_fraction"}
BEST_FIXED_FIELDS = {"concurrency", "num_draft_tokens", "label", "output_tokens_per_s", "speedup", "tried"}
CROSSOVER_FIELDS = {"status", "concurrency", "estimate", "last_paying", "paying", "threshold", "summary"}
CHECK_FIELDS = {"status", "url", "reason", "models", "medusa_tree_steps"}


def test_documented_fields_are_the_ones_checked():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "bench-results.md").read_text()
    for name in (TOP_FIELDS | SETTINGS_FIELDS | CELL_FIELDS | ACCEPTANCE_FIELDS | SPEEDUP_FIELDS | REQUEST_FIELDS
                 | SUMMARY_FIELDS | BEST_FIXED_FIELDS | CROSSOVER_FIELDS | CHECK_FIELDS | STAT_FIELDS):
        assert f"`{name}`" in doc or f'"{name}"' in doc, f"{name} is not documented in docs/bench-results.md"


@pytest.fixture(scope="module")
def server(demo_pair_server):
    """The session's demo-pair Triton (conftest.DEMO_PAIR_DEPLOYMENT: the reference engine on CPU, the trained demo
    draft, max_draft_len 8, fixed k): the bench needs a deployment, not one of its own. Counters are compared as
    deltas, by the bench's cross-check and here."""
    return demo_pair_server


@pytest.fixture(scope="module")
def sweep(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out") / "results"
    ep = server.endpoints
    result = CliRunner().invoke(cli, ["bench", "--url", ep.http_address, "--metrics-url", ep.metrics,
                                      "--output", str(out), *SWEEP])
    assert result.exit_code == 0, result.output
    return out, json.loads((out / "results.json").read_text()), result.output


def _check_stats(block, where):
    assert set(block) == STAT_FIELDS, where
    if block["n"]:
        assert block["min"] <= block["p50"] <= block["p90"] <= block["p99"] <= block["max"], where
        assert block["min"] <= block["mean"] <= block["max"], where
    else:
        assert all(block[k] is None for k in STAT_FIELDS - {"n"}), where


@pytest.mark.slow
def test_sweep_results_json(sweep):
    out, res, output = sweep
    assert set(res) >= TOP_FIELDS
    assert res["schema_version"] == 1 and res["tool"] == "trtspec bench"
    assert set(res["settings"]) == SETTINGS_FIELDS
    assert res["settings"]["concurrency"] == [1, 2] and res["settings"]["draft_tokens"] == [0, 2]
    assert res["prompts"]["count"] == 2

    assert res["settings"]["fixed_k"] == [0, 1]
    cells = {(c["concurrency"], c["num_draft_tokens"], c["endpoint"]): c for c in res["cells"]}
    assert set(cells) == {(c, k, e) for c in (1, 2)
                          for k, e in ((0, "baseline"), (0, "ensemble"), (2, "ensemble"), (1, "ensemble"))}
    for key, c in cells.items():
        assert set(c) == CELL_FIELDS, key
        for name in CELL_STATS:
            _check_stats(c[name], (key, name))
        # a warm-up each, and the two prompts once more through each endpoint (the baseline, the k it drafts most)
        primed = 2 if key[1:] in ((0, "baseline"), (2, "ensemble")) else 0
        assert c["num_requests"] == c["num_ok"] == 2 and c["num_errors"] == 0 and c["num_warmup"] == 1 + primed
        # --rounds 2: two rounds of one request at c=1; at c=2 a round of one would leave a client idle, so one
        assert c["rounds"] == (2 if key[0] == 1 else 1), key
        assert c["ttft_s"]["n"] == c["e2e_s"]["n"] == 2
        assert c["ttft_s"]["max"] <= c["e2e_s"]["max"]
        assert c["output_tokens"] <= 2 * MAX_TOKENS
        assert c["output_tokens_per_s"] > 0 and c["wall_s"] > 0
        assert all(0 <= r["client_overhead_s"] <= r["e2e_s"] for r in res["requests"] if r["cell"] == c["label"])
        if c["endpoint"] == "baseline":
            assert c["acceptance"] is None and c["speedup"] is None and c["vs_best_fixed"] is None
            assert c["draft_length_policy"] is None
            continue
        # the k=1 cell is the --fixed-k candidate; the others carry the deployment's policy
        assert c["draft_length_policy"] == ("fixed" if c["num_draft_tokens"] == 1 else None), key
        base = cells[(key[0], 0, "baseline")]
        assert c["speedup"]["output_tokens_per_s"] == pytest.approx(c["output_tokens_per_s"] / base["output_tokens_per_s"])
        assert set(c["speedup"]) == SPEEDUP_FIELDS and c["speedup"]["baseline_num_requests"] == 2
        acc = c["acceptance"]
        assert set(acc) == ACCEPTANCE_FIELDS
        if c["speculative"]:
            assert 0.0 <= acc["rate"] <= 1.0
            assert acc["num_draft_tokens"] > 0 and 0 <= acc["num_accepted_tokens"] <= acc["num_draft_tokens"]
            assert 1.0 <= acc["tokens_per_target_call"] <= 2 + 1
            assert acc["per_position"] and all(0 <= p["rate"] <= 1 for p in acc["per_position"])
            assert len(acc["per_position"]) <= 2
            # the cell's figures are the sums of its measured requests' own statistics (warm-ups left out)
            measured = SpecStats.total(SpecStats.from_wire(r["stats"]) for r in res["requests"]
                                       if r["cell"] == c["label"] and not r["warmup"])
            assert (acc["num_draft_tokens"], acc["num_accepted_tokens"], acc["num_iterations"]) == (
                measured.total_draft_tokens, measured.total_accepted_draft_tokens, measured.num_iterations), key
            assert acc["rate"] == pytest.approx(measured.total_accepted_draft_tokens / measured.total_draft_tokens)
        else:  # drafting off on the speculative endpoint
            assert acc["rate"] is None and acc["num_draft_tokens"] == 0 and acc["tokens_per_target_call"] == 1.0

    # the trained demo draft is accepted now and then on chat prompts, and a
    # step with accepted draft tokens delivers several tokens in one response
    drafting = [c for c in res["cells"] if c["speculative"]]
    assert sum(c["acceptance"]["num_accepted_tokens"] for c in drafting) > 0
    assert any(max(r["response_tokens"]) > 1 for r in res["requests"] if r["cell"] in {c["label"] for c in drafting})

    # best fixed k: the faster of the baseline and the fixed k=1 cell; every ensemble cell is measured against it
    for b in res["summary"]["best_fixed"]:
        assert set(b) == BEST_FIXED_FIELDS and b["tried"] == [0, 1]
        pair = [cells[(b["concurrency"], 0, "baseline")], cells[(b["concurrency"], 1, "ensemble")]]
        winner = max(pair, key=lambda c: (c["output_tokens_per_s"], -c["num_draft_tokens"]))
        assert (b["label"], b["output_tokens_per_s"]) == (winner["label"], winner["output_tokens_per_s"])
        for k in (0, 1, 2):
            c = cells[(b["concurrency"], k, "ensemble")]
            assert c["vs_best_fixed"] == {"best_num_draft_tokens": winner["num_draft_tokens"],
                                          "output_tokens_per_s": pytest.approx(c["output_tokens_per_s"]
                                                                               / winner["output_tokens_per_s"])}
    assert [b["concurrency"] for b in res["summary"]["best_fixed"]] == [1, 2]

    reqs = res["requests"]
    assert len(reqs) == 8 * 3 + 2 * 2 * 2 and sum(r["warmup"] for r in reqs) == 8 + 2 * 2 * 2
    for conc in (1, 2):  # no cell meets a prompt first: each went through both endpoints before any was measured
        measured = min(r["start_s"] for r in reqs if r["concurrency"] == conc and not r["warmup"])
        for endpoint in ("baseline", "ensemble"):
            sent = {r["prompt_id"] for r in reqs if r["concurrency"] == conc and r["endpoint"] == endpoint
                    and r["warmup"] and r["start_s"] < measured}
            assert sent == {p["prompt_id"] for p in reqs if not p["warmup"]}, (conc, endpoint)
    for r in reqs:
        assert set(r) == REQUEST_FIELDS
        assert r["error"] is None
        # tokens are counted from the ids: the sum over responses; max_tokens unless the request ended early
        assert r["output_tokens"] == sum(r["response_tokens"]) <= MAX_TOKENS
        assert r["ended_early"] == (r["output_tokens"] < MAX_TOKENS)
        assert r["num_responses"] == len(r["response_times_s"]) == len(r["response_tokens"])
        assert 0 < r["ttft_s"] <= r["e2e_s"]
        assert r["response_times_s"] == sorted(r["response_times_s"])
        if r["endpoint"] == "baseline" or r["num_draft_tokens"] == 0:
            # not drafting: one plain run (up to 16 tokens) that the engine streams, a token a response
            assert r["stats"]["total_draft_tokens"] == 0
            assert r["stats"]["num_iterations"] == 1 and set(r["response_tokens"]) <= {0, 1}, r

    summary = res["summary"]
    assert set(summary) == SUMMARY_FIELDS
    assert summary["num_requests"] == 16 and summary["num_warmup"] == 16 and summary["num_errors"] == 0
    for b in summary["best"]:  # the faster speculative cell (k=1 or k=2) at each concurrency
        spec = [cells[(b["concurrency"], k, "ensemble")] for k in (1, 2)]
        top = max(spec, key=lambda c: c["speedup"]["output_tokens_per_s"])
        assert (b["num_draft_tokens"], b["speedup"]) == (top["num_draft_tokens"], top["speedup"]["output_tokens_per_s"])
        assert b["pays"] == (b["speedup"] > 1.0)
    assert [b["concurrency"] for b in summary["best"]] == [1, 2]
    assert set(summary["crossover"]) == CROSSOVER_FIELDS
    assert summary["crossover"] == st.crossover({b["concurrency"]: b["speedup"] for b in summary["best"]})
    assert summary["acceptance"]["num_requests"] == 8

    # cross-check against Triton's Prometheus counters (warm-ups on both sides)
    check = res["metrics_check"]
    assert set(check) == CHECK_FIELDS
    assert check["status"] == "ok", check
    assert check["models"]["ensemble"]["spec_decode_num_requests"]["observed"] == 6 * 3 + 2 * 2
    assert check["models"]["baseline"]["spec_decode_num_requests"]["observed"] == 2 * 3 + 2 * 2

    # the other files, and the terminal
    assert set(res["files"]) >= {"json", "csv", "requests_csv", "plot_speedup", "plot_throughput", "plot_acceptance", "plot_latency"}
    for name in res["files"].values():
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and {"label", "speedup.output_tokens_per_s", "acceptance.rate", "ttft_s.p50"} <= set(rows[0])
    with open(out / "requests.csv") as f:
        assert len(list(csv.DictReader(f))) == 32
    for text in ("speedup", "Crossover", "Best fixed k", "vs best", "Prometheus cross-check", "OK", "Results"):
        assert text in output


@pytest.mark.slow
def test_k0_on_ensemble_serves_like_the_baseline(sweep):
    """num_draft_tokens=0 on the speculative endpoint is the baseline's computation: no draft token, the same target
    calls (plain runs that the engine streams), a token a response, and (greedy) the same tokens for the prompt."""
    _, res, _ = sweep
    primes = res["settings"]["warmup_per_cell"]  # warm-ups numbered from here sent every prompt once first
    reqs = [r for r in res["requests"] if r["num_draft_tokens"] == 0 and not (r["warmup"] and r["index"] >= primes)]
    by_prompt = {}
    for r in reqs:
        by_prompt.setdefault((r["concurrency"], r["prompt_id"], r["warmup"]), {})[r["endpoint"]] = r
    assert len(by_prompt) == 2 * 3
    for key, pair in by_prompt.items():
        base, ens = pair["baseline"], pair["ensemble"]
        assert ens["output_tokens"] == base["output_tokens"], key
        assert ens["stats"]["total_draft_tokens"] == ens["stats"]["num_drafts"] == 0, key
        assert ens["stats"]["num_iterations"] == base["stats"]["num_iterations"], key
        assert max(ens["response_tokens"]) == 1, key  # a token a response, as the baseline streams


@pytest.mark.slow
def test_no_stream_answers_whole_and_the_baseline_in_runs_of_engine_steps(server, sweep, tmp_path):
    """--no-stream: one response a request, no time to first token, the same greedy tokens as streamed; not
    drafting, the baseline takes whole runs of engine steps (fewer target calls than tokens), where streamed it
    takes one call per token (test_k0_on_ensemble_serves_like_the_baseline)."""
    ep = server.endpoints
    out = tmp_path / "whole"
    result = CliRunner().invoke(cli, ["bench", "--url", ep.http_address, "--metrics-url", ep.metrics, "--output",
                                      str(out), "--no-stream", "--concurrency", "1", "--draft-tokens", "0,2",
                                      "--requests", "2", "--warmup", "0", "--max-tokens", "12", "--num-prompts", "2"])
    assert result.exit_code == 0, result.output
    assert "not streamed" in result.output
    res = json.loads((out / "results.json").read_text())
    assert res["settings"]["stream"] is False and res["metrics_check"]["status"] == "ok"
    streamed = {(r["prompt_id"], r["endpoint"]): r for r in sweep[1]["requests"] if r["concurrency"] == 1}
    for r in res["requests"]:
        assert r["num_responses"] == 1 and r["ttft_s"] is None and r["error"] is None, r
        if r["endpoint"] == "baseline":
            assert r["stats"]["num_iterations"] < r["output_tokens"], r
            first = streamed[(r["prompt_id"], "baseline")]["output_tokens"]  # the sweep's MAX_TOKENS
            assert r["output_tokens"] >= first, (r, first)
    for cell in res["cells"]:
        assert cell["ttft_s"]["n"] == 0 and cell["itl_token_s"]["n"] == 0, cell


def _scrape(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return parse_prometheus(r.read().decode())


@pytest.mark.slow
def test_prometheus_counters_match_the_responses(server, sweep):
    """N known requests, sent here without the bench: the counter deltas equal the per-response counts."""
    import time

    from trtspec.client import Client

    ep = server.endpoints
    before = _scrape(ep.metrics)
    sent = [("ensemble", 2), ("ensemble", 1), ("baseline", None), ("ensemble", 0)]
    finals = {"ensemble": [], "baseline": []}
    for protocol, (model, k) in zip(("http", "grpc", "http", "grpc"), sent):
        address = ep.http_address if protocol == "http" else ep.grpc_address
        chunks = list(Client(address, protocol, model).stream(chat("Name three colours."), 6, num_draft_tokens=k))
        finals[model].append((chunks[-1].stats, sum(len(c.token_ids) for c in chunks)))
    expected = {
        loop: {
            "spec_decode_num_requests": len(rs),
            "spec_decode_num_draft_tokens": sum(s.total_draft_tokens for s, _ in rs),
            "spec_decode_num_accepted_tokens": sum(s.total_accepted_draft_tokens for s, _ in rs),
            "spec_decode_num_drafts": sum(s.num_drafts for s, _ in rs),
            "spec_decode_num_iterations": sum(s.num_iterations for s, _ in rs),
            "spec_decode_num_emitted_tokens": sum(n for _, n in rs),
        }
        for loop, rs in finals.items()
    }
    assert expected["ensemble"]["spec_decode_num_draft_tokens"] > 0
    deadline = time.monotonic() + 15  # the loop counts a request just after its final response
    while True:
        after = _scrape(ep.metrics)
        observed = {loop: {name: value(after, name, model=loop) - value(before, name, model=loop) for name in exp}
                    for loop, exp in expected.items()}
        if observed == expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert observed == expected


@pytest.mark.slow
def test_profile_writes_a_timeline_aligned_with_the_requests(server, sweep, tmp_path):
    ep = server.endpoints
    out = tmp_path / "prof"
    result = CliRunner().invoke(cli, [
        "bench", "--url", ep.http_address, "--metrics-url", "none", "--output", str(out), "--profile",
        "--profile-pid", str(server.pid), "--concurrency", "1", "--draft-tokens", "0", "--requests", "1",
        "--warmup", "0", "--max-tokens", "4", "--num-prompts", "1"])
    assert result.exit_code == 0, result.output
    res = json.loads((out / "results.json").read_text())
    prof = res["profile"]
    assert prof["kind"] in ("nvml", "process") and prof["num_samples"] > 0 and not prof["errors"]
    assert prof["summary"] is not None
    assert res["files"]["timeline_plot"] == "timeline.png" and (out / "timeline.png").stat().st_size > 0
    assert all((out / f).is_file() for f in prof["timeline_files"])
    assert "Profile" in result.output


def test_config_refuses_a_flavour_that_needs_an_engine_build(tmp_path):
    cfg = tmp_path / "engines.yaml"
    cfg.write_text("engine: tensorrt_llm\ntarget: {checkpoint: 'demo:target'}\ndraft: {checkpoint: 'demo:draft'}\n")
    result = CliRunner().invoke(cli, ["bench", "--config", str(cfg)])
    assert result.exit_code != 0 and "needs no engine build" in result.output


def test_config_accepts_the_flavours_that_need_no_engine_build():
    from trtspec.bench import BenchError
    from trtspec.bench.local import check_local
    from trtspec.config import load_config

    root = Path(__file__).resolve().parents[1] / "build_configs"
    for name in ("demo-llmapi.yaml", "demo.yaml"):
        cfg = load_config(root / name)
        assert check_local(cfg) is None, name
        built = cfg.model_copy(update={"engine": type(cfg.engine).tensorrt_llm})  # the same pair, engines to build
        with pytest.raises(BenchError, match="needs no engine build"):
            check_local(built)


def test_plot_legends_name_the_policy(tmp_path, monkeypatch):
    """"k=4" reads as a fixed k = 4; under adaptive the controller picks k up to 4 each iteration."""
    import matplotlib.figure

    from trtspec.bench import build_results
    from trtspec.bench.plots import plot_all, series_label

    legends: dict[str, list[str]] = {}

    def record(fig, path, *args, **kwargs):
        legends[Path(path).name] = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    res = build_results(_synthetic_run({(1, 0): 10.0, (1, 2): 12.5, (4, 0): 20.0, (4, 2): 16.0},
                                       {(1, 4): 12.0, (4, 4): 19.0}, counts={1: [1, 0, 2, 0, 7], 4: [9, 1]}))
    plot_all(res, tmp_path)
    assert set(legends["speedup.png"]) >= {"controller, k <= 4", "fixed k = 2", "baseline (target only)"}
    assert set(legends["throughput.png"]) >= {"controller, k <= 4", "fixed k = 2", "baseline (target only)"}
    assert "controller, k <= 4" in legends["k_chosen.png"]
    assert not any(label.startswith("k=") for labels in legends.values() for label in labels), legends
    # cells that left the policy to the deployment say so, rather than pass for a fixed k
    cell = {"endpoint": ENSEMBLE, "num_draft_tokens": 3, "draft_length_policy": None}
    assert series_label(cell, "adaptive") == "controller, k <= 3"
    assert series_label(cell) == "k = 3, the deployment's policy"


@pytest.mark.slow
def test_table_written_to_a_pipe_is_whole(server, tmp_path):
    """Off a terminal (a CI log, `| tee`, `> file`) rich would take 80 columns and cut the table's to "tok…"."""
    import os
    import subprocess
    import sys

    ep = server.endpoints
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TERM")}
    out = subprocess.run(
        [sys.executable, "-m", "trtspec.cli", "bench", "--url", ep.http_address, "--metrics-url", ep.metrics,
         "--output", str(tmp_path / "bench"), "--concurrency", "1",
         "--draft-tokens", "2", "--draft-length-policy", "adaptive", "--fixed-k", "1", "--requests", "1",
         "--warmup", "0", "--max-tokens", "4", "--num-prompts", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stdout
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:3] == ["c", "k", "n"])
    header = lines[at - 1] + "\n" + lines[at]  # two-line column names: "vs best / fixed k", "TTFT / p50", ...
    for name in ("tok/s", "speedup", "vs best", "fixed k", "TTFT", "ITL", "E2E", "accept", "call"):
        assert name in header, header
    assert "…" not in out.stdout, out.stdout
    # the deployment's own policy, read from its config, names the cells that send none (conftest: fixed)
    settings = json.loads((tmp_path / "bench" / "results.json").read_text())["settings"]
    assert settings["deployment_draft_length_policy"] == "fixed"
