"""`trtspec bench --soak`: the figures from plain data (fast), and one short soak against real Triton (slow)."""

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.bench.prompts import Prompt
from trtspec.bench.runner import BASELINE, ENSEMBLE, BenchError, BenchSettings, Cell, RequestRecord
from trtspec.bench.soak import (
    BAD_REQUESTS,
    InjectedFault,
    RssSample,
    SoakRecord,
    SoakRun,
    SoakSettings,
    log_error_lines,
    summarize,
    table,
)
from trtspec.spec.metrics import AFTER_CANCEL_COUNTER, CANCELLED_COUNTER, EMITTED_COUNTER, REQUESTS_COUNTER

ROOT = Path(__file__).resolve().parents[1]

P = Prompt("p", "chat", "hi")


def rec(endpoint, index, *, start=0.0, times=(), tokens=(), error=None, left=False):
    cell = Cell(4, 3 if endpoint == ENSEMBLE else 0, endpoint)
    return RequestRecord(cell, index, False, P, start, list(times), list(tokens), error=error, left_early=left)


def counters(values):
    return {(name, (("model", model),)): v for (name, model), v in values.items()}


def make_run(rss_totals=(1000, 1300, 1050), ready=True, extra_records=()):
    bad = {b.name: b for b in BAD_REQUESTS}
    records = [
        SoakRecord("normal", rec(ENSEMBLE, 0, start=0, times=(1, 2), tokens=(3, 5))),  # e2e 2 s
        SoakRecord("normal", rec(BASELINE, 1, start=1, times=(2, 5), tokens=(1, 7))),  # e2e 4 s
        SoakRecord("disconnect", rec(ENSEMBLE, 2, start=0, times=(1,), tokens=(2,), left=True)),
        SoakRecord("disconnect", rec(BASELINE, 3, start=0, times=(1, 2), tokens=(1, 1))),  # ended before leaving
        SoakRecord("bad", rec(ENSEMBLE, 4, error="temperature must be a finite number >= 0, got nan"),
                   bad["temperature NaN"]),
        SoakRecord("bad", rec(BASELINE, 5, error="something else"), bad["top_p 2"]),  # not the named error
        *extra_records,
    ]
    before = counters({(REQUESTS_COUNTER, ENSEMBLE): 10, (CANCELLED_COUNTER, ENSEMBLE): 1, (AFTER_CANCEL_COUNTER, ENSEMBLE): 2,
                       (REQUESTS_COUNTER, BASELINE): 5, (EMITTED_COUNTER, BASELINE): 50})
    after = counters({(REQUESTS_COUNTER, ENSEMBLE): 12, (CANCELLED_COUNTER, ENSEMBLE): 2, (AFTER_CANCEL_COUNTER, ENSEMBLE): 5,
                      (REQUESTS_COUNTER, BASELINE): 7, (EMITTED_COUNTER, BASELINE): 60, (CANCELLED_COUNTER, BASELINE): 0})
    rss = [RssSample(t, total, {"a": total}) for t, total in zip((0.0, 5.0, 70.0), rss_totals)]
    return SoakRun(SoakSettings(1.0, streams=4), BenchSettings(), records, 10.0, before, after, rss, 10.0, ready,
                   ["E1123 bad thing"], k=3)


def test_summary_counts_add_up_and_checks_follow_the_figures():
    s = summarize(make_run())
    req = s["requests"]
    assert req == {"sent": 6, "completed": 3, "errored": 0, "left_early": 1, "injected_bad": 2, "bad_refused_by_name": 1,
                   "failed_by_faults": 0}
    assert req["completed"] + req["errored"] + req["left_early"] + req["injected_bad"] == req["sent"]
    assert s["unexpected_bad"] == [{"request": "top_p 2", "got": "something else"}]
    assert s["output_tokens"] == 8 + 8 + 2
    assert s["latency_s"]["e2e"]["p50"] == 2.0 and s["latency_s"]["e2e"]["max"] == 4.0
    assert s["latency_s"]["e2e"]["p95"] == pytest.approx(2 + 0.9 * 2)
    srv = s["server"]
    assert srv["counters"][ENSEMBLE][REQUESTS_COUNTER] == 2 and srv["counters"][BASELINE][EMITTED_COUNTER] == 10
    assert srv["cancelled"] == 1 and srv["tokens_after_cancel"] == 3
    assert srv["per_endpoint"][ENSEMBLE] == {"cancelled": 1, "tokens_after_cancel": 3, "per_cancel": 3.0, "one_iteration": 4}
    assert srv["per_endpoint"][BASELINE]["per_cancel"] is None
    rss = s["rss"]
    assert (rss["start_bytes"], rss["peak_bytes"], rss["end_of_load_bytes"], rss["end_bytes"]) == (1000, 1300, 1300, 1050)
    assert rss["end_vs_start"] == pytest.approx(0.05)
    assert s["checks"] == {"no_errors": True, "bad_requests_refused_by_name": False, "server_ready_after": True,
                           "tokens_after_cancel_within_one_iteration": True, "rss_end_within_10pct_of_start": True}
    assert s["log_errors"] == {"count": 1, "lines": ["E1123 bad thing"]}
    json.dumps(s, allow_nan=False)  # soak.json is plain JSON


def test_checks_fail_on_errors_memory_growth_and_an_unready_server():
    broken = SoakRecord("normal", rec(ENSEMBLE, 9, error="connection reset"))
    s = summarize(make_run(rss_totals=(1000, 1500, 1200), ready=False, extra_records=[broken]))
    assert s["requests"]["errored"] == 1 and s["errors"] == ["connection reset"]
    assert not s["checks"]["no_errors"] and not s["checks"]["server_ready_after"]
    assert not s["checks"]["rss_end_within_10pct_of_start"]
    table(s)  # renders


def test_failures_are_attributed_to_the_fault_that_caused_them():
    # a fault at t=10 s, back at t=40 s; another at t=100 s that never came back
    faults = [InjectedFault("tensorrt_llm", 1, 10.0, not_ready_s=0.3, recovery_s=30.0),
              InjectedFault("preprocessing", 2, 100.0, not_ready_s=0.2)]
    extra = [  # (the time the client had its error last)
        SoakRecord("normal", rec(ENSEMBLE, 10, start=5, times=(9,), tokens=(1,), error="503 recovering"), None, 10.1),
        SoakRecord("normal", rec(BASELINE, 11, start=20, error="connection refused"), None, 20.0),  # during recovery
        SoakRecord("normal", rec(BASELINE, 12, start=60, error="something else"), None, 61.0),  # the soak's own
        SoakRecord("disconnect", rec(ENSEMBLE, 13, start=99, error="timed out"), None, 160.0),  # a hang, not clean
        # sent before the first fault's recovery ended, cut by the second: the second's (the last kill before it ended)
        SoakRecord("normal", rec(ENSEMBLE, 14, start=35, error="the server closed the stream"), None, 100.5),
    ]
    run = make_run(extra_records=extra)
    run.faults = faults
    s = summarize(run)
    first, second = s["faults"]
    assert (first["requests_failed"], first["failed_cleanly"], first["recovery_s"]) == (2, True, 30.0)
    assert first["in_flight_failed"] == 1  # the other was sent during the recovery
    assert (second["requests_failed"], second["failed_cleanly"], second["recovery_s"]) == (2, False, None)
    assert second["in_flight_failed"] == 2
    req = s["requests"]
    assert req["failed_by_faults"] == 4 and req["errored"] == 1 and s["errors"] == ["something else"]
    assert req["completed"] + req["errored"] + req["left_early"] + req["injected_bad"] + req["failed_by_faults"] == req["sent"]
    assert s["checks"]["every_fault_recovered"] is False and s["checks"]["fault_failures_clean"] is False
    table(s)  # renders the faults' rows


def test_log_error_lines_keep_glog_errors_and_traceback_tails():
    log = "\n".join([
        "I1123 04:50:00.1 1 server.cc:1] fine",
        "E1123 04:50:01.2 1 model.cc:2] failed to load",
        "W1123 04:50:02.3 1 x.cc:3] a warning",
        "Traceback (most recent call last):",
        '  File "m.py", line 1, in f',
        "ValueError: boom",
    ])
    assert log_error_lines(log) == ["E1123 04:50:01.2 1 model.cc:2] failed to load", "ValueError: boom"]


def test_settings_are_checked_and_json_cannot_carry_every_bad_value():
    with pytest.raises(BenchError, match="--soak-disconnect"):
        SoakSettings(1, disconnect_share=1.5).validate()
    with pytest.raises(BenchError, match="must not exceed 1"):
        SoakSettings(1, disconnect_share=0.6, bad_share=0.6).validate()
    http_only = {b.name for b in SoakSettings(1).bad_requests("http")}
    assert "temperature NaN" not in http_only and "top_p 2" in http_only
    assert any(isinstance(v, float) and math.isnan(v) for b in SoakSettings(1, grpc_url="h:1").bad_requests("http")
               for v in b.fields.values())


def test_soak_cli_errors_are_named():
    from trtspec.cli import cli

    r = CliRunner().invoke(cli, ["bench", "--soak", "1", "--api", "openai"])
    assert r.exit_code != 0 and "--soak sends to Triton's endpoints" in r.output
    r = CliRunner().invoke(cli, ["bench", "--soak", "0"])
    assert r.exit_code != 0 and "--soak" in r.output
    r = CliRunner().invoke(cli, ["bench", "--soak", "1", "--fault-every", "60", "--url", "127.0.0.1:9"])
    assert r.exit_code != 0 and "--fault-every needs the deployment the bench starts itself" in r.output



GB = 1_000_000_000


@pytest.mark.parametrize("rss_totals,exit_code", [((3 * GB, 4.5 * GB, 3.6 * GB), 1), ((3 * GB, 3.9 * GB, 3.15 * GB), 0)],
                         ids=["rss-grew-20pct", "rss-back-within-5pct"])
def test_soak_exits_1_when_a_check_fails(tmp_path, monkeypatch, rss_totals, exit_code):
    """`trtspec bench --soak` is a pass/fail test: a failed check (here the memory one alone) exits 1, naming it
    with its figures, after soak.json is written; all checks passing exits 0."""
    import trtspec.bench.soak
    from trtspec.cli import cli

    run = make_run(rss_totals=rss_totals)
    run.records = [r for r in run.records if r.record.index != 5]  # the bad request not refused by name
    monkeypatch.setattr(trtspec.bench.soak, "run_soak", lambda *a, **kw: run)  # the load itself: the slow test's
    r = CliRunner().invoke(cli, ["bench", "--soak", "1", "--url", "127.0.0.1:9", "-o", str(tmp_path)])
    checks = json.loads((tmp_path / "soak.json").read_text())["checks"]
    assert [name for name, ok in checks.items() if ok is False] == (["rss_end_within_10pct_of_start"] if exit_code else [])
    assert r.exit_code == exit_code, r.output
    if exit_code:
        assert ("the soak failed 1 check: rss end within 10pct of start (RSS +20.0%: 3,000 MB after warm-up, 3,600 MB "
                "after the settle)") in r.output


@pytest.mark.slow
def test_short_soak_against_real_triton(tmp_path):
    """A short soak on the demo deployment: every request accounted for, bad ones refused by name, disconnects
    counted by the server, and the server still ready."""
    from trtspec.cli import cli

    import yaml

    # the demo deployment with two loop instances instead of eight: 4 streams need no more, and it starts sooner
    config = yaml.safe_load((ROOT / "build_configs" / "demo.yaml").read_text())
    config["triton"]["speculative_instance_count"] = 2
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "soak"
    args = ["bench", "--config", str(tmp_path / "demo.yaml"), "--soak", "0.2", "--soak-streams", "4",
            "--soak-disconnect", "0.3", "--soak-bad", "0.3", "--soak-settle", "2", "--max-tokens", "16", "-o", str(out)]
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    s = json.loads((out / "soak.json").read_text())
    req = s["requests"]
    assert req["sent"] >= 4
    assert req["completed"] + req["errored"] + req["left_early"] + req["injected_bad"] == req["sent"]
    assert req["errored"] == 0, s["errors"]
    assert req["bad_refused_by_name"] == req["injected_bad"], s["unexpected_bad"]
    # clients left early, and the server counted the streams it cancelled for them (a stream that ended before
    # its loop saw the client leave is not cancelled: at most one per client that left)
    assert req["left_early"] > 0 and 0 < s["server"]["cancelled"] <= req["left_early"]
    assert s["checks"]["tokens_after_cancel_within_one_iteration"] is True
    assert s["server_ready_after"] is True
    assert s["rss"]["num_samples"] >= 2 and s["rss"]["peak_bytes"] >= s["rss"]["start_bytes"] > 0
    assert s["checks"]["rss_end_within_10pct_of_start"] is True, {k: v for k, v in s["rss"].items() if k != "timeline"}
    assert "text_input not UTF-8" in s["settings"]["bad_requests"]  # gRPC carries what JSON cannot
