"""`trtspec bench --soak MINUTES`: a deployment under a steady, hostile-but-honest load for a set time.

N client threads (streams) send streamed requests back to back, alternating ``ensemble`` and ``baseline``,
through the bench's own request code (``runner.one_request``). A share of the clients leave after a response or
three (the HTTP connection closed, the gRPC stream cancelled), and a share of the requests carry a bad value that
must be refused with a named error. Around the load it reads the loop's Prometheus counters (requests, cancelled
requests, tokens generated after a cancellation), samples the RSS of the server's processes, and after the load it
keeps sampling for a settle period (memory returned after the burst), checks the server is still ready and
collects the error lines of the server's log.

With ``fault_every_s`` (``--fault-every``, on the deployment the bench starts itself), a ``FaultInjector`` also
SIGKILLs a random model process every N seconds, and the server's ``ModelWatchdog`` (trtspec.server.watchdog)
brings the deployment back; per fault the soak reports how long health took to say not-ready, the recovery time,
the requests that failed, and whether each of them failed cleanly (an error, not a timeout).

The figures are computed by ``summarize`` from plain data, so the arithmetic is testable without a server.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from trtspec.bench import stats as st
from trtspec.bench.metrics import MetricsError, Sample, scrape
from trtspec.bench.prompts import Prompt
from trtspec.contract import NUM_DRAFT_TOKENS
from trtspec.bench.runner import (
    BASELINE, ENSEMBLE, BenchError, BenchSettings, Cell, RequestRecord, check_deployment, one_request,
)
from trtspec.bench.rss import RssSample, RssSampler, rss_summary
from trtspec.spec.metrics import AFTER_CANCEL_COUNTER, CANCELLED_COUNTER, EMITTED_COUNTER, REQUESTS_COUNTER

SCHEMA = "trtspec-soak/1"
COUNTERS = (REQUESTS_COUNTER, EMITTED_COUNTER, CANCELLED_COUNTER, AFTER_CANCEL_COUNTER)
RSS_TOLERANCE = 0.10  # RSS after the settle period within 10% of RSS after warm-up


@dataclass(frozen=True)
class BadRequest:
    name: str
    fields: dict[str, Any]
    expect: str  # a substring of the named error the server must answer with
    grpc_only: bool = False  # a value JSON cannot carry to the endpoint (NaN, bytes that are not UTF-8)


BAD_REQUESTS = (
    BadRequest("temperature NaN", {"temperature": math.nan}, "temperature must be a finite number", grpc_only=True),
    BadRequest("temperature -1", {"temperature": -1.0}, "temperature must be a finite number >= 0"),
    BadRequest("top_p 2", {"top_p": 2.0}, "top_p must be in (0, 1]"),
    BadRequest("top_k -1", {"top_k": -1}, "top_k must be >= 0"),
    BadRequest("text_input not UTF-8", {"text_input": b"caf\xe9 au lait"}, "text_input is not valid UTF-8",
               grpc_only=True),
)


@dataclass
class SoakSettings:
    minutes: float
    streams: int = 16
    disconnect_share: float = 0.2
    bad_share: float = 0.05
    settle_s: float = 60.0  # keep sampling RSS this long after the load
    rss_interval_s: float = 2.0
    grpc_url: str | None = None  # where the bad requests JSON cannot carry go; None: only the others are sent
    server_pids: Sequence[int] = ()  # the server's processes (their descendants are found each sample)
    log_file: Path | None = None
    seed: int = 0
    fault_every_s: float | None = None  # kill a random model process this often (needs `server`)
    server: Any = None  # the LocalTritonServer the bench started (faults need to restart it)

    def validate(self) -> None:
        if not self.minutes > 0:
            raise BenchError(f"--soak: minutes must be > 0, got {self.minutes}")
        if self.streams < 1:
            raise BenchError(f"--soak-streams must be >= 1, got {self.streams}")
        for name, v in (("--soak-disconnect", self.disconnect_share), ("--soak-bad", self.bad_share)):
            if not 0 <= v <= 1:
                raise BenchError(f"{name} is a share of the requests, within [0, 1]; got {v}")
        if self.disconnect_share + self.bad_share > 1:
            raise BenchError("--soak-disconnect + --soak-bad must not exceed 1")
        if self.settle_s < 0:
            raise BenchError(f"--soak-settle must be >= 0 seconds, got {self.settle_s}")
        if self.fault_every_s is not None:
            if not self.fault_every_s > 0:
                raise BenchError(f"--fault-every must be > 0 seconds, got {self.fault_every_s}")
            if self.server is None or getattr(self.server, "pid", None) is None:
                raise BenchError("--fault-every needs the deployment the bench starts itself (--config CONFIG): "
                                 "it kills that server's model processes and lets its watchdog restart it")

    def bad_requests(self, protocol: str) -> list[BadRequest]:
        grpc = self.grpc_url is not None or protocol == "grpc"
        return [b for b in BAD_REQUESTS if grpc or not b.grpc_only]


@dataclass
class SoakRecord:
    kind: str  # normal | disconnect | bad
    record: RequestRecord
    bad: BadRequest | None = None
    finished: float = 0.0  # perf_counter when the client had its answer (or its error)


# ------------------------------------------------------------------------------------------------ faults

#: a request that failed this long after its fault's recovery is not the fault's doing
FAULT_GRACE_S = 2.0
#: how long a fault's recovery is awaited before the fault counts as not recovered
RECOVERY_BOUND_S = 300.0


@dataclass
class InjectedFault:
    model: str
    pid: int
    killed_at: float  # perf_counter
    not_ready_s: float | None = None  # until the watchdog said not-ready
    recovery_s: float | None = None  # until the deployment was ready again; None: it did not come back
    error: str | None = None


class FaultInjector:
    """Every ``every_s`` seconds: SIGKILL one process of a random watched model, then wait for the watchdog's
    recovery (kills wait while one is in progress)."""

    def __init__(self, watchdog: Any, every_s: float, seed: int = 0) -> None:
        self.watchdog, self.every_s = watchdog, every_s
        self.rng = random.Random(seed)
        self.faults: list[InjectedFault] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-faults")

    def start(self) -> "FaultInjector":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop injecting; returns once the fault in progress has recovered (or its bound passed)."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.inject()

    def inject(self) -> InjectedFault | None:
        watched = self.watchdog.watched
        if not watched:
            return None
        model = self.rng.choice(sorted(watched))
        pid = self.rng.choice(sorted(watched[model]))
        seen = len(self.watchdog.faults)
        fault = InjectedFault(model, pid, time.perf_counter())
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        self.faults.append(fault)
        deadline = fault.killed_at + RECOVERY_BOUND_S
        while time.perf_counter() < deadline:
            mine = self.watchdog.faults[seen:]
            if mine and fault.not_ready_s is None:
                fault.not_ready_s = mine[0].detected_at - fault.killed_at
            if mine and not self.watchdog.recovering:
                fault.error = mine[0].error
                if mine[0].recovered_at is not None:
                    fault.recovery_s = mine[0].recovered_at - fault.killed_at
                return fault
            time.sleep(0.05)
        fault.error = f"not recovered within {RECOVERY_BOUND_S:g} s"
        return fault


def _refused_by_name(r: SoakRecord) -> bool:
    return bool(r.bad and r.record.error and r.bad.expect in r.record.error)


def _clean_failure(error: str) -> bool:
    """An error the client was told about, not one it ran into by waiting (a timeout: the request hung)."""
    return "timed out" not in error.lower() and "timeout" not in error.lower()


def attribute_failures(faults: Sequence[InjectedFault], records: Sequence[SoakRecord],
                       t0: float) -> tuple[list[dict[str, Any]], set[int]]:
    """Per fault (times relative to the load's start): the requests it failed, and the indexes of those records
    (the other errors are the soak's own). A failed request is the fault's that was killed last before it ended,
    when it was sent before the deployment was back (+ FAULT_GRACE_S): in flight at the kill, or sent during the
    recovery (a client that retries at once meets the recovery; one that honours Retry-After does not)."""
    by_fault: list[list[tuple[SoakRecord, bool]]] = [[] for _ in faults]
    order = sorted(range(len(faults)), key=lambda i: faults[i].killed_at)
    for r in records:
        if not r.record.error or _refused_by_name(r):
            continue
        before = [i for i in order if faults[i].killed_at <= r.finished]
        if not before:
            continue
        f = faults[before[-1]]
        end = f.killed_at + (f.recovery_s if f.recovery_s is not None else RECOVERY_BOUND_S) + FAULT_GRACE_S
        if r.record.start <= end:
            by_fault[before[-1]].append((r, r.record.start <= f.killed_at))
    out: list[dict[str, Any]] = []
    for f, mine in zip(faults, by_fault):
        recs = [r.record for r, _ in mine]
        out.append({
            "model": f.model, "pid": f.pid, "killed_at_s": f.killed_at - t0, "not_ready_after_s": f.not_ready_s,
            "recovery_s": f.recovery_s, "requests_failed": len(recs),
            "in_flight_failed": sum(in_flight for _, in_flight in mine),
            "failed_cleanly": all(_clean_failure(r.error or "") for r in recs), "error": f.error,
            "errors": sorted({r.error for r in recs if r.error})[:5],
        })
    return out, {r.record.index for mine in by_fault for r, _ in mine}


# ------------------------------------------------------------------------------------------------ running


@dataclass
class SoakRun:
    settings: SoakSettings
    bench: BenchSettings
    records: list[SoakRecord]
    load_s: float  # from the first request to the last response
    counters_before: dict[Sample, float] | None
    counters_after: dict[Sample, float] | None
    rss: list[RssSample]
    load_end_t: float
    ready_after: bool
    log_errors: list[str] = field(default_factory=list)
    k: int = 0  # the speculative endpoint's draft length
    faults: list[InjectedFault] = field(default_factory=list)
    t0: float = 0.0  # perf_counter when the load started


def _ready(bench: BenchSettings) -> bool:
    try:
        check_deployment(bench, [ENSEMBLE, BASELINE])
        return True
    except BenchError:
        return False


def _log_size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path else 0
    except OSError:
        return 0


def log_error_lines(text: str) -> list[str]:
    """Error lines of a Triton log: glog's E-lines (E1123 04:50:00.123 ...) and Python tracebacks' last lines."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        s = line.strip()
        if len(s) > 5 and s[0] == "E" and s[1:5].isdigit():
            out.append(s)
        elif s.startswith("Traceback (most recent call last)"):
            tail = next((x.strip() for x in lines[i + 1 :] if x and not x.startswith((" ", "\t"))), s)
            out.append(tail)
    return out


class SoakLoad:
    """The soak's clients: `streams` threads that send requests back to back until the deadline, alternating the
    two endpoints; a share of the clients leave early and a share of the requests carry a bad value."""

    def __init__(self, bench: BenchSettings, soak: SoakSettings, prompts: Sequence[Prompt], cells: Sequence[Cell],
                 deadline: float, watchdog: Any) -> None:
        self.bench, self.soak, self.prompts, self.cells = bench, soak, prompts, cells
        self.deadline, self.watchdog = deadline, watchdog
        self.bad_settings = (bench if soak.grpc_url is None
                             else dataclasses.replace(bench, protocol="grpc", url=soak.grpc_url))
        self.bad_set = soak.bad_requests(bench.protocol)
        self.records: list[SoakRecord] = []
        self._lock = threading.Lock()
        self._counter = iter(range(10**9))
        self._stop = threading.Event()

    def run(self, t0: float, on_tick: Callable[[list[SoakRecord], float], None] | None) -> None:
        """Runs the clients until the deadline, calling `on_tick` with the records so far every second."""
        threads = [threading.Thread(target=self._client, args=(i,), daemon=True, name=f"soak-{i}")
                   for i in range(self.soak.streams)]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                time.sleep(1.0)
                if on_tick is not None:
                    with self._lock:
                        snapshot = list(self.records)
                    on_tick(snapshot, time.perf_counter() - t0)
        except KeyboardInterrupt:
            self._stop.set()
            raise

    def _client(self, i: int) -> None:
        rng = random.Random(self.soak.seed * 1000 + i)
        n = 0
        while not self._stop.is_set() and time.perf_counter() < self.deadline:
            if self.watchdog is not None:  # as a client told to retry later would: no requests into a restart
                waited = time.perf_counter()
                while self.watchdog.unready and time.perf_counter() - waited < RECOVERY_BOUND_S:
                    time.sleep(0.1)
            with self._lock:
                index = next(self._counter)
            cell = self.cells[(i + n) % 2]
            n += 1
            out = self._request(rng, cell, index, self.prompts[index % len(self.prompts)])
            out.finished = time.perf_counter()
            with self._lock:
                self.records.append(out)

    def _request(self, rng: random.Random, cell: Cell, index: int, prompt: Prompt) -> SoakRecord:
        """One request: bad, one whose client leaves early, or a normal one, as `rng` rolls."""
        bench, soak = self.bench, self.soak
        roll = rng.random()
        if self.bad_set and roll < soak.bad_share:
            bad = rng.choice(self.bad_set)
            s = self.bad_settings if bad.grpc_only else bench
            return SoakRecord("bad", one_request(s, cell, index, prompt, False, extra=bad.fields), bad)
        if roll < soak.bad_share + soak.disconnect_share:
            return SoakRecord("disconnect", one_request(bench, cell, index, prompt, False,
                                                        leave_after=rng.randint(1, 3)))
        return SoakRecord("normal", one_request(bench, cell, index, prompt, False))


def run_soak(
    bench: BenchSettings,
    soak: SoakSettings,
    prompts: Sequence[Prompt],
    on_tick: Callable[[list[SoakRecord], float], None] | None = None,
) -> SoakRun:
    bench.validate()
    soak.validate()
    if not prompts:
        raise BenchError("no prompt to send")
    check_deployment(bench, [ENSEMBLE, BASELINE])
    k = max((k for k in bench.draft_tokens if k > 0), default=0)
    cells = [Cell(soak.streams, k, ENSEMBLE), Cell(soak.streams, 0, BASELINE)]
    for cell in cells:  # warm-up: not counted, not sampled
        rec = one_request(bench, cell, -1, prompts[0], True)
        if rec.error:
            raise BenchError(f"the warm-up request to {cell.endpoint} failed: {rec.error}")
    metrics_url = bench.resolved_metrics_url
    before = _scrape(metrics_url)
    log_offset = _log_size(soak.log_file)
    t0 = time.perf_counter()
    pids = (lambda: [soak.server.pid]) if soak.fault_every_s else soak.server_pids
    sampler = RssSampler(pids, soak.rss_interval_s, t0).start()
    watchdog: Any = None
    injector: FaultInjector | None = None
    if soak.fault_every_s:
        from trtspec.server.watchdog import deployment_watchdog

        watchdog = deployment_watchdog(soak.server, give_up_s=RECOVERY_BOUND_S).start()
        injector = FaultInjector(watchdog, soak.fault_every_s, soak.seed).start()
    load = SoakLoad(bench, soak, prompts, cells, t0 + soak.minutes * 60, watchdog)
    try:
        load.run(t0, on_tick)
    finally:
        if injector is not None:
            injector.stop()
        if watchdog is not None:
            watchdog.stop()
    load_end = time.perf_counter() - t0
    time.sleep(3.0)  # a cancelled request is counted when its loop notices, within one iteration
    after = _scrape(metrics_url)
    time.sleep(soak.settle_s)
    sampler.stop()
    log_errors = _log_errors_since(soak.log_file, log_offset)
    records = sorted(load.records, key=lambda r: r.record.index)
    return SoakRun(soak, bench, records, load_end, before, after, sampler.samples, load_end, _ready(bench),
                   log_errors, k, injector.faults if injector else [], t0)


def _log_errors_since(log_file: Path | None, offset: int) -> list[str]:
    """The error lines the server's log gained after `offset`."""
    if log_file is None or not log_file.exists():
        return []
    with log_file.open("rb") as f:
        f.seek(offset)
        return log_error_lines(f.read().decode("utf-8", errors="replace"))


def _scrape(url: str | None) -> dict[Sample, float] | None:
    if not url:
        return None
    try:
        return scrape(url)
    except MetricsError:
        return None


# ------------------------------------------------------------------------------------------------ figures


def counter(samples: dict[Sample, float], name: str, model: str) -> float:
    return sum(v for (n, labels), v in samples.items() if n == name and ("model", model) in labels)


def summarize(run: SoakRun) -> dict[str, Any]:
    """Every figure of the soak as plain data (soak.json)."""
    recs = run.records
    normal = [r.record for r in recs if r.kind == "normal"]
    left = [r.record for r in recs if r.kind == "disconnect" and r.record.left_early and not r.record.error]
    faults, by_fault = attribute_failures(run.faults, recs, run.t0)
    bad = [r for r in recs if r.kind == "bad" and r.record.index not in by_fault]
    refused = [_refused_by_name(r) for r in bad]
    unexpected_bad = [{"request": r.bad.name if r.bad else "?", "got": r.record.error or "accepted"}
                      for r, ok in zip(bad, refused) if not ok]
    errored = [r.record for r in recs if r.kind != "bad" and r.record.error and r.record.index not in by_fault]
    completed = [r for r in normal if not r.error] + [
        r.record for r in recs if r.kind == "disconnect" and not r.record.left_early and not r.record.error]
    server: dict[str, Any] = {}
    # a restart (a fault's recovery) sets Triton's counters back to 0: their differences would mean nothing
    if run.counters_before is not None and run.counters_after is not None and not run.faults:
        for endpoint in (ENSEMBLE, BASELINE):  # a text endpoint counts its own requests
            server[endpoint] = {
                name: counter(run.counters_after, name, endpoint) - counter(run.counters_before, name, endpoint)
                for name in COUNTERS
            }
    cancelled = sum(m[CANCELLED_COUNTER] for m in server.values()) if server else None
    after_cancel = sum(m[AFTER_CANCEL_COUNTER] for m in server.values()) if server else None
    iteration_tokens = {ENSEMBLE: run.k + 1, BASELINE: 1}  # the most one target call adds
    per_disconnect = {
        e: {"cancelled": m[CANCELLED_COUNTER], "tokens_after_cancel": m[AFTER_CANCEL_COUNTER],
            "per_cancel": m[AFTER_CANCEL_COUNTER] / m[CANCELLED_COUNTER] if m[CANCELLED_COUNTER] else None,
            "one_iteration": iteration_tokens[e]}
        for e, m in server.items()
    }
    rss = rss_summary(run.rss, run.load_end_t)
    checks = {
        "no_errors": not errored,
        "bad_requests_refused_by_name": not unexpected_bad,
        "server_ready_after": run.ready_after,
        "tokens_after_cancel_within_one_iteration": all(
            d["per_cancel"] is None or d["per_cancel"] <= d["one_iteration"] for d in per_disconnect.values()
        ) if per_disconnect else None,
        "rss_end_within_10pct_of_start": (abs(rss["end_vs_start"]) <= RSS_TOLERANCE
                                          if rss.get("end_vs_start") is not None else None),
    }
    if run.faults:
        checks["every_fault_recovered"] = all(f["recovery_s"] is not None for f in faults)
        checks["fault_failures_clean"] = all(f["failed_cleanly"] for f in faults)
    s, b = run.settings, run.bench
    return {
        "schema": SCHEMA,
        "settings": {"minutes": s.minutes, "streams": s.streams, "disconnect_share": s.disconnect_share,
                     "bad_share": s.bad_share, "settle_s": s.settle_s, "fault_every_s": s.fault_every_s,
                     "protocol": b.protocol, "url": b.url,
                     "max_tokens": b.max_tokens, NUM_DRAFT_TOKENS: run.k,
                     "bad_requests": [x.name for x in s.bad_requests(b.protocol)]},
        "load_s": run.load_s,
        "requests": {
            "sent": len(recs),
            "completed": len(completed),
            "errored": len(errored),
            "left_early": len(left),
            "injected_bad": len(bad),  # less those a fault failed
            "bad_refused_by_name": sum(refused),
            "failed_by_faults": len(by_fault),
        },
        "faults": faults,
        "errors": sorted({r.error for r in errored if r.error})[:20],
        "unexpected_bad": unexpected_bad[:20],
        "output_tokens": sum(r.output_tokens for r in completed),
        "latency_s": {"e2e": st.describe(r.e2e_s for r in completed)
                      | {"p95": st.percentile([r.e2e_s for r in completed], 95)},
                      "ttft": st.describe(t for r in completed if (t := r.ttft_s) is not None)},
        "server": {"counters": server, "cancelled": cancelled, "tokens_after_cancel": after_cancel,
                   "per_endpoint": per_disconnect},
        "rss": rss,
        "server_ready_after": run.ready_after,
        "log_errors": {"count": len(run.log_errors), "lines": run.log_errors[:20]},
        "checks": checks,
    }


def _mb(v: int | None) -> str:
    return "-" if v is None else f"{v / 1e6:,.0f} MB"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def table(summary: dict[str, Any]) -> Any:
    from rich import box
    from rich.table import Table

    cfg, req, srv, rss = summary["settings"], summary["requests"], summary["server"], summary["rss"]
    t = Table(title=f"trtspec soak: {cfg['minutes']:g} min, {cfg['streams']} streams ({cfg['protocol']}, "
                    f"max_tokens {cfg['max_tokens']}, k={cfg[NUM_DRAFT_TOKENS]}), "
                    f"{cfg['disconnect_share']:.0%} leave early, {cfg['bad_share']:.0%} bad",
              title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    e2e = summary["latency_s"]["e2e"]
    rows = [
        ("requests sent", str(req["sent"])),
        ("completed", str(req["completed"])),
        ("errored (not injected)", f"[red]{req['errored']}[/]" if req["errored"] else "0"),
        ("clients that left early", str(req["left_early"])),
        ("injected bad / refused by name", f"{req['injected_bad']} / {req['bad_refused_by_name']}"),
        ("cancelled (server counter)", "-" if srv["cancelled"] is None else f"{srv['cancelled']:.0f}"),
        ("tokens generated after cancel",
         "-" if srv["tokens_after_cancel"] is None else f"{srv['tokens_after_cancel']:.0f}"),
    ]
    for e, d in srv["per_endpoint"].items():
        per = "-" if d["per_cancel"] is None else f"{d['per_cancel']:.2f}"
        rows.append((f"  {e}: per cancel (one iteration)", f"{per} ({d['one_iteration']})"))
    rows += [
        ("output tokens (completed)", str(summary["output_tokens"])),
        ("E2E p50 / p95", f"{_s(e2e['p50'])} / {_s(e2e['p95'])}"),
        ("TTFT p50", _s(summary["latency_s"]["ttft"]["p50"])),
        ("RSS after warm-up", _mb(rss.get("start_bytes"))),
        ("RSS peak", _mb(rss.get("peak_bytes"))),
        ("RSS end of load", _mb(rss.get("end_of_load_bytes"))),
        (f"RSS after settle ({summary['settings']['settle_s']:g} s)", _mb(rss.get("end_bytes"))
         + ("" if rss.get("end_vs_start") is None else f" ({rss['end_vs_start']:+.1%})")),
        ("server ready after", "yes" if summary["server_ready_after"] else "[red]NO[/]"),
        *[(f"fault {i + 1}: {f['model']} killed at {f['killed_at_s']:.0f} s",
           f"not ready after {_s(f['not_ready_after_s'])}, back after {_s(f['recovery_s'])}, "
           f"{f['requests_failed']} failed ({f['in_flight_failed']} in flight at the kill)"
           f"{'' if f['failed_cleanly'] else ' [red](not cleanly)[/]'}")
          for i, f in enumerate(summary.get("faults", []))],
        ("server log error lines", str(summary["log_errors"]["count"])),
    ]
    for r in rows:
        t.add_row(*r)
    return t


def failed_checks(summary: dict[str, Any]) -> list[str]:
    """The checks that failed, each with its figure where one says why ("n/a" checks are not failures)."""
    out = []
    for name, ok in summary["checks"].items():
        if ok is not False:
            continue
        text = name.replace("_", " ")
        if name == "rss_end_within_10pct_of_start":
            rss = summary["rss"]
            text += (f" (RSS {rss['end_vs_start']:+.1%}: {_mb(rss['start_bytes'])} after warm-up, "
                     f"{_mb(rss['end_bytes'])} after the settle)")
        out.append(text)
    return out


def check_lines(summary: dict[str, Any]) -> list[str]:
    out = []
    for name, ok in summary["checks"].items():
        mark = "[green]ok[/]" if ok else ("[yellow]n/a[/]" if ok is None else "[red]FAILED[/]")
        out.append(f"{mark}  {name.replace('_', ' ')}")
    for e in summary["errors"][:3]:
        out.append(f"[red]error[/]: {e}")
    for u in summary["unexpected_bad"][:3]:
        out.append(f"[red]bad request not refused by name[/]: {u['request']}: {u['got']}")
    for line in summary["log_errors"]["lines"][:5]:
        out.append(f"[yellow]log[/]: {line}")
    return out
