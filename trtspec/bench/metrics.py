"""Cross-check of the bench's own counts against the speculative loop's Prometheus counters.

The loop models (``speculative`` behind the ``ensemble`` endpoint, ``baseline_loop`` behind ``baseline``)
count every request they finish in ``spec_decode_*`` counters on Triton's metrics port, labelled
``model="<loop model>"``. The bench scrapes ``/metrics`` (a plain HTTP GET, Prometheus text format) before
and after the run and compares the deltas with the sums of the final per-response statistics of the
requests it sent (warm-ups included on both sides; requests that failed are counted by neither).
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

# endpoint -> the loop model that counts its requests (trtspec.repository.LOOP / BASELINE_LOOP)
LOOP_MODEL = {"ensemble": "speculative", "baseline": "baseline_loop"}

# counter -> the per-request quantity it must equal the sum of
COUNTERS = {
    "spec_decode_num_requests": "requests",
    "spec_decode_num_draft_tokens": "total_draft_tokens",
    "spec_decode_num_accepted_tokens": "total_accepted_draft_tokens",
    "spec_decode_num_drafts": "num_drafts",
    "spec_decode_num_iterations": "num_iterations",
    "spec_decode_num_emitted_tokens": "output_tokens",
    "spec_decode_num_fallbacks": "draft_fallbacks",
}
# the three the check is about (the others are reported and must match too)
PRIMARY = ("spec_decode_num_requests", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
PER_POSITION = {
    "spec_decode_num_accepted_tokens_per_pos": "accepted_per_position",
    "spec_decode_num_draft_tokens_per_pos": "proposed_per_position",
}

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


def per_position(samples: Mapping[Sample, float], name: str, model: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for (n, ls), v in samples.items():
        d = dict(ls)
        if n == name and d.get("model") == model and "position" in d:
            out[int(d["position"])] = out.get(int(d["position"]), 0.0) + v
    return out


def expected_counts(requests: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Sum of the final per-response stats of the successful requests, per loop model."""
    out: dict[str, dict[str, Any]] = {}
    for r in requests:
        if r.error is not None:
            continue
        model = LOOP_MODEL[r.endpoint]
        acc = out.setdefault(model, {k: 0 for k in COUNTERS.values()} | {k: {} for k in PER_POSITION.values()})
        acc["requests"] += 1
        acc["output_tokens"] += r.output_tokens
        for key in ("total_draft_tokens", "total_accepted_draft_tokens", "num_drafts", "num_iterations",
                    "draft_fallbacks"):
            acc[key] += int(r.stats.get(key, 0))
        for key in PER_POSITION.values():
            for pos, n in enumerate(r.stats.get(key, [])):
                acc[key][pos] = acc[key].get(pos, 0) + int(n)
    return out


@dataclass
class CrossCheck:
    url: str
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
        result: dict[str, Any] = {"status": "unavailable", "url": self.url, "reason": None, "models": {}}
        if self.before is None:
            result["reason"] = self.error or "not scraped"
            return result
        expected = expected_counts(requests)
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
