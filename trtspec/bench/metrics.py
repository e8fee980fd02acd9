"""Cross-check of the bench's own counts against the speculative loop's Prometheus counters.

The text endpoints (``ensemble``, ``baseline``) run the loop in-process and count every request they finish
in ``spec_decode_*`` counters on Triton's metrics port, labelled ``model="<endpoint>"``. The bench scrapes
``/metrics`` (a plain HTTP GET, Prometheus text format) before
and after the run and compares the deltas with the sums of the final per-response statistics of the
requests it sent (warm-ups included on both sides; requests that failed are counted by neither).
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from trtspec.contract import RESPONSE_STATS, STAT, stat_by_name
from trtspec.spec.metrics import EMITTED_COUNTER, ENGINE_MEDUSA_TREE_COUNTER, REQUESTS_COUNTER, SpecStats

# counter -> the per-request quantity it must equal the sum of (a statistic of trtspec.contract, or these two)
COUNTERS = {REQUESTS_COUNTER: "requests", EMITTED_COUNTER: "output_tokens"} | {
    s.counter: s.name for s in RESPONSE_STATS if s.counter and not s.vector
}
# the three the check is about (the others are reported and must match too)
PRIMARY = (REQUESTS_COUNTER, stat_by_name(STAT.total_draft_tokens).counter,
           stat_by_name(STAT.total_accepted_draft_tokens).counter)
PER_POSITION = {s.counter: s.name for s in RESPONSE_STATS if s.label == "position"}

Sample = tuple[str, tuple[tuple[str, str], ...]]  # (metric name, sorted labels)

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class MetricsError(Exception):
    pass


def parse_prometheus(text: str) -> dict[Sample, float]:
    """Prometheus text exposition -> {(name, ((label, value), ...)): value}. Comments are skipped."""
    out: dict[Sample, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, _, labels, value = m.group(1), m.group(2), m.group(3) or "", m.group(4)
        pairs = tuple(sorted(
            (k, v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")) for k, v in _LABEL.findall(labels)
        ))
        try:
            out[(name, pairs)] = float(value)
        except ValueError:
            continue
    return out


def scrape(url: str, timeout: float = 5.0) -> dict[Sample, float]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return parse_prometheus(resp.read().decode("utf-8", errors="replace"))
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise MetricsError(f"cannot read metrics from {url}: {reason}") from None


def default_metrics_url(url: str) -> str:
    """Triton's default layout: metrics on port 8002 of the same host."""
    host = url.removeprefix("http://").removeprefix("https://").split("/")[0]
    host = host.rsplit(":", 1)[0] if ":" in host and not host.endswith("]") else host
    return f"http://{host or 'localhost'}:8002/metrics"


def value(samples: Mapping[Sample, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def by_label(samples: Mapping[Sample, float], name: str, label: str, **labels: str) -> dict[int, float]:
    """Sums of the samples of ``name`` whose labels include ``labels``, by the integer value of ``label``."""
    want = set(labels.items())
    out: dict[int, float] = {}
    for (n, ls), v in samples.items():
        d = dict(ls)
        if n == name and label in d and want <= set(ls):
            out[int(d[label])] = out.get(int(d[label]), 0.0) + v
    return out


def per_position(samples: Mapping[Sample, float], name: str, model: str) -> dict[int, float]:
    return by_label(samples, name, "position", model=model)


def tree_steps(before: Mapping[Sample, float], after: Mapping[Sample, float]) -> list[int]:
    """A Medusa engine's request steps over the run by the nodes of the tree it verified (entry m: m nodes; 0: the
    root alone), from its counter (trtspec.spec.metrics.EngineGauges); [] where no engine counts them."""
    a, b = (by_label(x, ENGINE_MEDUSA_TREE_COUNTER, "nodes") for x in (after, before))
    return [int(round(a.get(m, 0.0) - b.get(m, 0.0))) for m in range(max(a) + 1)] if a else []


def check_result(status: str, url: str | None, reason: str | None = None) -> dict[str, Any]:
    """`metrics_check` of results.json before anything is compared (docs/bench-results.md)."""
    return {"status": status, "url": url, "reason": reason, "models": {}, "medusa_tree_steps": []}


def expected_counts(requests: Iterable[Any], labels: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Sum of the final per-response stats of the successful requests, per loop model (`labels`: endpoint -> the
    model that counts its requests, where that is not the endpoint itself)."""
    labels = labels or {}
    by_model: dict[str, list[Any]] = {}
    for r in requests:
        if r.error is None:
            by_model.setdefault(labels.get(r.endpoint, r.endpoint), []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for model, recs in by_model.items():
        total = SpecStats.total(r.stats for r in recs)
        acc: dict[str, Any] = {"requests": len(recs), "output_tokens": sum(r.output_tokens for r in recs)}
        acc |= {name: getattr(total, name) for name in COUNTERS.values() if name not in acc}
        acc |= {name: dict(enumerate(getattr(total, name))) for name in PER_POSITION.values()}
        out[model] = acc
    return out


@dataclass
class CrossCheck:
    url: str
    labels: Mapping[str, str] = field(default_factory=dict)  # endpoint -> counting model, where not itself
    before: dict[Sample, float] | None = None
    error: str | None = None

    def start(self) -> None:
        try:
            self.before = scrape(self.url)
        except MetricsError as e:
            self.error = str(e)

    def finish(self, requests: list[Any], settle_s: float = 15.0, sleep: Callable[[float], None] = time.sleep) -> dict:
        """Compare. The loop counts a request just after sending its final response, one counter after the
        other, so the counters are read again (for up to ``settle_s``) until they all match; what is left
        different after that is a mismatch."""
        result = check_result("unavailable", self.url)
        if self.before is None:
            result["reason"] = self.error or "not scraped"
            return result
        expected = expected_counts(requests, self.labels)
        if not expected:
            result.update(status="skipped", reason="no successful request to check")
            return result
        deadline = time.monotonic() + settle_s
        while True:
            try:
                after = scrape(self.url)
            except MetricsError as e:
                result["reason"] = str(e)
                return result
            if not any(name.startswith("spec_decode_") for name, _ in after):
                result["reason"] = (f"no spec_decode_* series on {self.url}: the loop models did not register their "
                                    "counters, or this is not a trtspec deployment")
                return result
            ok, models = self._compare(expected, after)
            if ok or time.monotonic() >= deadline:
                break
            sleep(0.2)
        result["models"] = models
        result["medusa_tree_steps"] = tree_steps(self.before, after)
        result["status"] = "ok" if ok else "mismatch"
        if not ok:
            result["reason"] = ("the server's counters differ from the bench's own counts "
                                "(other clients using the server during the run also cause this)")
        return result

    def _compare(self, expected: dict[str, dict[str, Any]], after: dict[Sample, float]) -> tuple[bool, dict]:
        assert self.before is not None
        ok, models = True, {}
        for model, exp in expected.items():
            rows: dict[str, Any] = {}
            for counter, key in COUNTERS.items():
                observed = value(after, counter, model=model) - value(self.before, counter, model=model)
                match = int(round(observed)) == exp[key] and abs(observed - round(observed)) < 1e-6
                rows[counter] = {"expected": exp[key], "observed": int(round(observed)), "ok": match,
                                 "primary": counter in PRIMARY}
                ok &= match
            for counter, key in PER_POSITION.items():
                a, b = per_position(after, counter, model), per_position(self.before, counter, model)
                observed_pos = {p: int(round(a.get(p, 0) - b.get(p, 0))) for p in set(a) | set(b)}
                observed_pos = {p: n for p, n in observed_pos.items() if n}
                expected_pos = {p: n for p, n in exp[key].items() if n}
                width = max([*expected_pos, *observed_pos, -1]) + 1
                match = observed_pos == expected_pos
                rows[counter] = {"expected": [expected_pos.get(p, 0) for p in range(width)],
                                 "observed": [observed_pos.get(p, 0) for p in range(width)],
                                 "ok": match, "primary": False}
                ok &= match
            models[model] = rows
        return ok, models
