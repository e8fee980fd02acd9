"""The Grafana dashboard of a trtspec deployment, generated from the metric names the server exports.

The speculation panels come from the response statistics' counters (trtspec.contract.RESPONSE_STATS) and the
exporter's own series (trtspec.spec.metrics), so a statistic added there is on the board without editing this file;
latency, throughput and queue come from Triton's own `nv_inference_*` metrics. `trtspec k8s` ships it as a
ConfigMap that Grafana's dashboard sidecar picks up; deploy/grafana/trtspec-dashboard.json is the same board for
importing by hand (a test fails when it drifts). Regenerate with:

    python -m trtspec.k8s.dashboard > deploy/grafana/trtspec-dashboard.json
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

from trtspec.spec import metrics
from trtspec.contract import RESPONSE_STATS, STAT, stat_by_name

UID = "trtspec"
TITLE = "trtspec: speculative decoding on Triton"
# kube-prometheus-stack's Grafana sidecar loads ConfigMaps carrying this label (its default `sidecar.dashboards.label`)
SIDECAR_LABEL = {"grafana_dashboard": "1"}
MODEL = '{model=~"$model"}'


def _counter(stat: str) -> str:
    counter = stat_by_name(stat).counter
    assert counter is not None, f"{stat} has no Prometheus counter"
    return counter


def _rate(series: str, by: str = "") -> str:
    inner = f"rate({series}{MODEL}[$__rate_interval])"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def _panel(title: str, exprs: list[tuple[str, str]], unit: str = "short", description: str = "") -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "expr": e, "legendFormat": legend}
                    for i, (e, legend) in enumerate(exprs)],
    }


def _speculation() -> list[dict[str, Any]]:
    accepted, proposed = _counter(STAT.total_accepted_draft_tokens), _counter(STAT.total_draft_tokens)
    iterations, drafts = _counter(STAT.num_iterations), _counter(STAT.num_drafts)
    per_pos_acc, per_pos_prop = _counter(STAT.accepted_per_position), _counter(STAT.proposed_per_position)
    panels = [
        _panel("Acceptance rate", [(f"{_rate(accepted, 'model')} / {_rate(proposed, 'model')}", "{{model}}")],
               "percentunit", "accepted ÷ proposed draft tokens"),
        _panel("Acceptance by draft position",
               [(f"{_rate(per_pos_acc, 'model, position')} / {_rate(per_pos_prop, 'model, position')}",
                 "{{model}} position {{position}}")], "percentunit",
               "the share of drafts reaching each position that were accepted there"),
        _panel("Tokens per target call",
               [(f"({_rate(accepted, 'model')} + {_rate(iterations, 'model')}) / {_rate(iterations, 'model')}",
                 "{{model}}")], "short", "accepted draft tokens + the target's own, per verify step"),
        _panel("Iterations without a draft, and why",
               [(f"{_rate(iterations, 'model')} - {_rate(drafts, 'model')}", "{{model}} no draft (any reason)"),
                (_rate(_counter(STAT.load_paused_iterations), "model"),
                 "{{model}} paused for load (max_concurrency, schedule)"),
                (_rate(_counter(STAT.draft_fallbacks), "model"), "{{model}} draft call failed")], "ops"),
        _panel("Accepted draft tokens by source",
               [(_rate(_counter(STAT.accepted_by_source), "model, source"), "{{model}} {{source}}")], "ops"),
    ]
    by_len = next((s for s in RESPONSE_STATS if s.name == STAT.draft_len_counts and s.counter), None)
    if by_len is not None:
        legend = f"{{{{model}}}} k={{{{{by_len.label}}}}}"
        panels.append(_panel("Draft length chosen", [(_rate(by_len.counter, f"model, {by_len.label}"), legend)],
                             "ops", "iterations by the draft length the controller chose (0: a plain target step)"))
    panels.append(_panel("Cancelled requests, and tokens generated after a cancel",
                         [(_rate(metrics.CANCELLED_COUNTER, "model"), "{{model}} cancelled"),
                          (_rate(metrics.AFTER_CANCEL_COUNTER, "model"), "{{model}} tokens after cancel")], "ops"))
    return panels


def _controller() -> list[dict[str, Any]]:
    def gauge(name: str, by: str) -> str:
        return f"max by ({by}) ({name}{MODEL})"

    return [
        _panel("Controller: acceptance estimate by source and position",
               [(gauge(metrics.CONTROLLER_ACCEPTANCE_GAUGE, "source, position"), "{{source}} position {{position}}")],
               "percentunit", "the acceptance the goodput controller expects at each draft position (given every "
               "earlier one was accepted)"),
        _panel("Controller: verify cost by draft length and load",
               [(gauge(metrics.CONTROLLER_VERIFY_GAUGE, "draft_len, load"), "k={{draft_len}} at {{load}} in flight")],
               "s", "measured seconds of a target call verifying k draft tokens (k=0: a plain step)"),
        _panel("Controller: draft cost by draft length and load",
               [(gauge(metrics.CONTROLLER_DRAFT_GAUGE, "draft_len, load"), "k={{draft_len}} at {{load}} in flight"),
                (gauge(metrics.CONTROLLER_CATCHUP_GAUGE, "load"), "catch-up per missed token at {{load}} in flight")],
               "s", "measured seconds of a draft-model call, and of its catch-up prefill per token it missed while not "
               "drafting"),
    ]


def _serving() -> list[dict[str, Any]]:
    success = _rate("nv_inference_request_success", "model")
    return [
        _panel("Requests per second", [(_rate("nv_inference_request_success", "model"), "{{model}} ok"),
                                       (_rate("nv_inference_request_failure", "model"), "{{model}} failed")], "reqps"),
        _panel("Output tokens per second", [(_rate(metrics.EMITTED_COUNTER, "model"), "{{model}}")], "short"),
        _panel("Mean request latency",
               [(f"{_rate('nv_inference_request_duration_us', 'model')} / {success} / 1e6", "{{model}}")], "s",
               "Triton's request duration (a streamed request: until its last response)"),
        _panel("Queue", [(f"sum by (model) (nv_inference_pending_request_count{MODEL})", "{{model}} pending"),
                         (f"{_rate('nv_inference_queue_duration_us', 'model')} / {success} / 1e6",
                          "{{model}} mean queue time (s)")], "short"),
        _panel("Batch size (inferences per execution)",
               [(f"{_rate('nv_inference_count', 'model')} / {_rate('nv_inference_exec_count', 'model')}",
                 "{{model}}")], "short"),
    ]


def _engine() -> list[dict[str, Any]]:
    return [
        _panel("Engine requests",
               [(f"sum by (model, state) ({metrics.ENGINE_REQUESTS_GAUGE}{MODEL})", "{{model}} {{state}}")], "short",
               "reference engine: requests in the running batch and waiting"),
        _panel("Engine busy", [(f"{_rate(metrics.ENGINE_BUSY_COUNTER, 'model')} / 1e9", "{{model}}")], "percentunit",
               "share of wall time the engine spent in forward steps"),
        _panel("Tokens per engine step",
               [(f"sum by (model) ({metrics.ENGINE_STEP_TOKENS_GAUGE}{MODEL})", "{{model}}")], "short"),
        _panel("KV cache held by running requests",
               [(f"sum by (model) ({metrics.ENGINE_KV_BYTES_GAUGE}{MODEL})", "{{model}}")], "bytes"),
    ]


def _layout(rows: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    panels, y, pid = [], 0, 1
    for title, row in rows:
        panels.append({"type": "row", "title": title, "id": pid, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        pid, y = pid + 1, y + 1
        for i, p in enumerate(row):
            p = dict(p, id=pid, gridPos={"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8 * (i // 2)})
            panels.append(p)
            pid += 1
        y += 8 * ((len(row) + 1) // 2)
    return panels


def dashboard() -> dict[str, Any]:
    return {
        "uid": UID,
        "title": TITLE,
        "tags": ["trtspec", "triton", "speculative-decoding"],
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {"name": "model", "type": "query", "label": "model",
                 "datasource": {"type": "prometheus", "uid": "${datasource}"},
                 "query": "label_values(nv_inference_request_success, model)", "includeAll": True, "multi": True,
                 "current": {"text": "All", "value": "$__all"}, "allValue": ".*", "refresh": 2},
            ]
        },
        "panels": _layout([("Speculation", _speculation()), ("Draft-length controller", _controller()),
                           ("Serving (Triton)", _serving()), ("Engine", _engine())]),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


_FUNCTIONS = {"sum", "by", "rate", "irate", "increase", "avg", "max", "min", "count", "without", "on", "ignoring",
              "label_values"}


def queried_metrics(board: dict[str, Any]) -> set[str]:
    """Every metric name a board's queries read (the identifiers followed by a label matcher or a range)."""

    def exprs() -> Iterator[str]:
        for p in board["panels"]:
            for t in p.get("targets", []):
                yield t["expr"]
        for v in board.get("templating", {}).get("list", []):
            if v.get("type") == "query":
                yield v["query"]

    names = set()
    for e in exprs():
        e = re.sub(r'"[^"]*"', '""', e)
        names |= {m for m in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{\[,)]", e) if m not in _FUNCTIONS}
    return names - {"model", "position", "source", "state", "le", "draft_len", "load"}


if __name__ == "__main__":
    print(render(), end="")
