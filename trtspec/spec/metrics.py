"""Speculative-decoding statistics: counting (per request), aggregation (over requests), Prometheus export.

One class, `SpecStats`, counts a request, sums many (`merge`), derives the rates, and goes to and from the
wire; its attribute names are the statistic names of `trtspec.contract.RESPONSE_STATS`. The Prometheus
exporter sums the same statistics into the counters named in that table. Like vLLM's
`spec_decode/metrics.py`, all of it is here and testable without a server: the exporter takes Triton's
`pb_utils` as an argument.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from trtspec.contract import RESPONSE_STATS
from trtspec.spec.drafters import ESTIMATE_KEYS, SOURCES
from trtspec.spec.controller import GoodputController

REQUESTS_COUNTER = "spec_decode_num_requests"
EMITTED_COUNTER = "spec_decode_num_emitted_tokens"
CANCELLED_COUNTER = "spec_decode_num_cancelled_requests"
AFTER_CANCEL_COUNTER = "spec_decode_num_tokens_after_cancel"


@dataclass
class SpecStats:
    """Counters of one request, or summed over many. Rates are derived, never stored."""

    num_drafts: int = 0  # iterations that proposed at least one token
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    num_iterations: int = 0  # target calls
    draft_fallbacks: int = 0  # draft calls that failed; the request went on target-only
    load_paused_iterations: int = 0  # iterations without a draft for load: max_concurrency or draft_len_schedule
    acceptance_derived: int = 0  # 1 (per request): figures derived from tokens and steps, the engine reported none
    guided_without_drafting: int = 0  # 1 (per request): guided, on an engine that cannot verify drafts under a guide
    proposed_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    draft_len_counts: list[int] = field(default_factory=list)  # entry k: iterations that verified k draft tokens
    accepted_by_source: list[int] = field(default_factory=lambda: [0] * len(SOURCES))

    def record(self, proposed: int, accepted: int, source: str | None = None) -> None:
        """One target call that verified `proposed` draft tokens from `source`, of which `accepted` were taken."""
        self.num_iterations += 1
        self.draft_len_counts += [0] * (proposed + 1 - len(self.draft_len_counts))
        self.draft_len_counts[proposed] += 1
        if proposed == 0:
            return
        self.num_drafts += 1
        self.total_draft_tokens += proposed
        self.total_accepted_draft_tokens += accepted
        if source is not None:
            self.accepted_by_source[list(SOURCES).index(source)] += accepted
        for name, n in (("proposed_per_position", proposed), ("accepted_per_position", accepted)):
            per_pos = getattr(self, name)
            per_pos += [0] * (max(proposed, len(per_pos)) - len(per_pos))
            for i in range(n):
                per_pos[i] += 1

    def merge(self, other: "SpecStats") -> "SpecStats":
        for s in RESPONSE_STATS:
            if s.counter is None:
                continue
            a, b = getattr(self, s.name), getattr(other, s.name)
            if s.vector:
                n = max(len(a), len(b))
                setattr(self, s.name, [x + y for x, y in zip(a + [0] * (n - len(a)), b + [0] * (n - len(b)))])
            else:
                setattr(self, s.name, a + b)
        return self

    @classmethod
    def total(cls, stats: Iterable["SpecStats"]) -> "SpecStats":
        out = cls()
        for s in stats:
            out.merge(s)
        return out

    @property
    def acceptance_rate(self) -> float:
        return self.total_accepted_draft_tokens / self.total_draft_tokens if self.total_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per target call that drafted: accepted + the target's own (vLLM's definition)."""
        return 1.0 + self.total_accepted_draft_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def tokens_per_target_call(self) -> float | None:
        """Accepted draft tokens + the target's own token, per target call, drafting or not."""
        return (self.total_accepted_draft_tokens + self.num_iterations) / self.num_iterations if self.num_iterations else None

    def by_source(self) -> dict[str, int]:
        return dict(zip(SOURCES, self.accepted_by_source))

    # ------------------------------------------------------------------ the wire

    def to_wire(self) -> dict[str, Any]:
        """{stat name: value} for a response (JSON-able: ints, floats, lists of ints)."""
        return {s.name: getattr(self, s.name) for s in RESPONSE_STATS}

    def to_arrays(self) -> dict[str, np.ndarray]:
        """{stat name: [1, n] array} as the loop model returns them."""
        out = {}
        for s in RESPONSE_STATS:
            v = getattr(self, s.name)
            dtype = np.float32 if s.dtype == "FP32" else np.int32
            out[s.name] = np.asarray((v or [0]) if s.vector else [v], dtype=dtype).reshape(1, -1)
        return out

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> "SpecStats":
        """From a response's statistics (JSON values or arrays); absent ones count as zero."""
        out = cls()
        for s in RESPONSE_STATS:
            if s.counter is None or values.get(s.name) is None:
                continue
            flat = [int(x) for x in np.asarray(values[s.name]).reshape(-1)]
            setattr(out, s.name, flat if s.vector else flat[0])
        return out


# Every custom-metric call of a model process goes through this lock: the Python backend of tritonserver 2.51
# crashes (SIGSEGV in ModelInstanceState::ProcessMetricRequest) when one process has metric messages in flight
# from several threads at once.
TRITON_METRICS_LOCK = threading.RLock()


class PrometheusExporter:
    """The loop's counters as Triton custom metrics, named after vLLM's spec_decode_* series.

    Each RESPONSE_STATS row with a counter becomes a counter family (vector stats get a label per position or
    source), plus requests and emitted tokens. `pb_utils` is Triton's module (a fake one in unit tests).
    """

    def __init__(self, pb_utils: Any, model_name: str):
        self._labels = {"model": model_name}
        self._lock = TRITON_METRICS_LOCK
        self._families: dict[str, Any] = {}  # kept alive: Triton drops a family's metrics once it is collected
        self._metrics: dict[tuple, Any] = {}
        kind = pb_utils.MetricFamily.COUNTER
        docs = {
            REQUESTS_COUNTER: "Requests finished by the speculative loop",
            EMITTED_COUNTER: "Tokens returned to clients",
            CANCELLED_COUNTER: "Requests stopped because their client cancelled or went away",
            AFTER_CANCEL_COUNTER: "Tokens generated for a request after its client cancelled (never sent)",
        }
        docs |= {s.counter: s.doc.capitalize() for s in RESPONSE_STATS if s.counter}
        for name, doc in docs.items():
            self._families[name] = pb_utils.MetricFamily(name=name, description=doc, kind=kind)
        for name in (CANCELLED_COUNTER, AFTER_CANCEL_COUNTER):  # on /metrics from the start, at 0
            self._metric(name)

    def _metric(self, family: str, **extra: str) -> Any:
        key = (family, tuple(sorted(extra.items())))
        with self._lock:
            if key not in self._metrics:
                self._metrics[key] = self._families[family].Metric(dict(self._labels, **extra))
            return self._metrics[key]

    def record_cancelled(self, tokens_after_cancel: int) -> None:
        """A request whose client cancelled; `tokens_after_cancel` were generated for it and never sent."""
        with self._lock:
            self._metric(CANCELLED_COUNTER).increment(1)
            self._metric(AFTER_CANCEL_COUNTER).increment(tokens_after_cancel)

    def record(self, stats: SpecStats, emitted: int) -> None:
        with self._lock:
            self._metric(REQUESTS_COUNTER).increment(1)
            self._metric(EMITTED_COUNTER).increment(emitted)
            for s in RESPONSE_STATS:
                if s.counter is None:
                    continue
                value = getattr(stats, s.name)
                if not s.vector:
                    self._metric(s.counter).increment(value)
                    continue
                keys = list(SOURCES) if s.label == "source" else [str(i) for i in range(len(value))]
                for key, n in zip(keys, value):
                    self._metric(s.counter, **{s.label: key}).increment(n)


ENGINE_REQUESTS_GAUGE = "trtspec_engine_requests"
ENGINE_STEP_TOKENS_GAUGE = "trtspec_engine_step_tokens"
ENGINE_KV_BYTES_GAUGE = "trtspec_engine_kv_cache_bytes"
# execute() only queues a request for the scheduler, so Triton's compute_infer no longer holds the engine's work
ENGINE_BUSY_COUNTER = "trtspec_engine_busy_ns"
ENGINE_STEPS_COUNTER = "trtspec_engine_steps"
# the in-engine EAGLE-3 head's work by kind (trtspec.reference_engine.eagle3.HeadWork): a k = 0 stretch adds none
ENGINE_EAGLE3_HEAD_COUNTER = "trtspec_engine_eagle3_head_work"
# a Medusa engine's request steps by the nodes of the tree it verified (trtspec.reference_engine.medusa.TreeWork)
ENGINE_MEDUSA_TREE_COUNTER = "trtspec_engine_medusa_tree_steps"


class EngineGauges:
    """The reference engine's in-flight batcher as Triton gauges, like the tensorrtllm backend's
    nv_trt_llm_request_metrics / inflight_batcher / kv_cache_block metrics: requests running and queued,
    tokens computed in the last step, and bytes of KV cache held by the running requests; plus the engine's
    compute time (a counter, sent after every step before its requests are answered, so a client that reads
    it after its response sees its own steps counted), and its forward steps (a counter, sent with the gauges:
    requests that share steps make fewer of them than they would alone)."""

    MIN_INTERVAL_S = 0.25  # each gauge update is a round trip to the server: not at every step

    def __init__(self, pb_utils: Any, model_name: str, head_work: Sequence[str] = (), tree_nodes: int | None = None):
        """`head_work`: the kinds of an in-engine EAGLE-3 head's work to count (none: the engine has no head);
        `tree_nodes`: a Medusa engine's tree size (its steps are counted by the nodes they verified, 0 to it)."""
        kind = pb_utils.MetricFamily.GAUGE
        self._families = {
            ENGINE_REQUESTS_GAUGE: pb_utils.MetricFamily(
                name=ENGINE_REQUESTS_GAUGE, description="Engine requests by state (active: in the running batch, queued: waiting)", kind=kind),
            ENGINE_STEP_TOKENS_GAUGE: pb_utils.MetricFamily(
                name=ENGINE_STEP_TOKENS_GAUGE, description="Tokens computed in the engine's last forward step", kind=kind),
            ENGINE_KV_BYTES_GAUGE: pb_utils.MetricFamily(
                name=ENGINE_KV_BYTES_GAUGE, description="Bytes of KV cache held by the running requests", kind=kind),
        }
        self._families[ENGINE_BUSY_COUNTER] = pb_utils.MetricFamily(  # kept: a Metric dies with its family
            name=ENGINE_BUSY_COUNTER, description="Nanoseconds the engine spent in forward steps",
            kind=pb_utils.MetricFamily.COUNTER)
        self._families[ENGINE_STEPS_COUNTER] = pb_utils.MetricFamily(
            name=ENGINE_STEPS_COUNTER, description="Forward steps the engine ran (one per batch of requests)",
            kind=pb_utils.MetricFamily.COUNTER)
        labels = {"model": model_name}
        self._steps = self._families[ENGINE_STEPS_COUNTER].Metric(labels)
        self._steps_sent = 0
        self._busy = self._families[ENGINE_BUSY_COUNTER].Metric(labels)
        self._active = self._families[ENGINE_REQUESTS_GAUGE].Metric(dict(labels, state="active"))
        self._queued = self._families[ENGINE_REQUESTS_GAUGE].Metric(dict(labels, state="queued"))
        self._tokens = self._families[ENGINE_STEP_TOKENS_GAUGE].Metric(labels)
        self._kv = self._families[ENGINE_KV_BYTES_GAUGE].Metric(labels)
        self._sent_at = 0.0
        # counters of work the engine counts since it started, by label value: what was sent, to send increments
        self._head: dict[str, Any] = {}
        self._head_sent: dict[str, int] = {}
        if head_work:
            self._families[ENGINE_EAGLE3_HEAD_COUNTER] = family = pb_utils.MetricFamily(
                name=ENGINE_EAGLE3_HEAD_COUNTER, kind=pb_utils.MetricFamily.COUNTER,
                description="The in-engine EAGLE-3 head's work: target rows captured, head cache positions extended, "
                "tokens drafted")
            self._head = {kind: family.Metric(dict(labels, kind=kind)) for kind in head_work}
            self._head_sent = dict.fromkeys(head_work, 0)
        self._tree: dict[str, Any] = {}
        self._tree_sent: dict[str, int] = {}
        if tree_nodes is not None:
            self._families[ENGINE_MEDUSA_TREE_COUNTER] = family = pb_utils.MetricFamily(
                name=ENGINE_MEDUSA_TREE_COUNTER, kind=pb_utils.MetricFamily.COUNTER,
                description="Medusa request steps by the nodes of the tree verified (0: the root alone, a plain step)")
            self._tree = {str(m): family.Metric(dict(labels, nodes=str(m))) for m in range(tree_nodes + 1)}
            self._tree_sent = dict.fromkeys(self._tree, 0)

    def busy(self, ns: int) -> None:
        with TRITON_METRICS_LOCK:
            self._busy.increment(ns)

    def head_work(self, totals: dict[str, int]) -> None:
        """`totals`: HeadWork.as_dict(), counted since the engine started; sent as increments."""
        _send_totals(self._head, self._head_sent, totals)

    def tree_steps(self, sizes: Sequence[int]) -> None:
        """`sizes`: TreeWork.sizes (request steps by nodes verified), counted since the engine started."""
        _send_totals(self._tree, self._tree_sent, {str(m): n for m, n in enumerate(sizes)})

    def update(self, stats: Any) -> None:
        """`stats`: a trtspec.reference_engine.batching.SchedulerStats. Called after every step and once more when the engine has
        stayed drained (batching.DRAINED_REPORT_S > MIN_INTERVAL_S), so an idle engine never shows stale load; sent
        at most every MIN_INTERVAL_S."""
        now = time.monotonic()
        if now - self._sent_at < self.MIN_INTERVAL_S:
            return
        self._sent_at = now
        with TRITON_METRICS_LOCK:
            self._active.set(stats.active)
            self._queued.set(stats.queued)
            self._tokens.set(stats.last_step_tokens)
            self._kv.set(stats.kv_bytes)
            self._steps.increment(stats.steps - self._steps_sent)
        self._steps_sent = stats.steps


def _send_totals(metrics: dict[str, Any], sent: dict[str, int], totals: Mapping[str, int]) -> None:
    """Counters by label value, from `totals` counted since the start: each sent the increment since the last."""
    with TRITON_METRICS_LOCK:
        for key, total in totals.items():
            if key in metrics and total > sent[key]:
                metrics[key].increment(total - sent[key])
                sent[key] = total


CONTROLLER_ACCEPTANCE_GAUGE = "trtspec_controller_acceptance"
CONTROLLER_VERIFY_GAUGE = "trtspec_controller_verify_seconds"
CONTROLLER_DRAFT_GAUGE = "trtspec_controller_draft_seconds"
CONTROLLER_CATCHUP_GAUGE = "trtspec_controller_catchup_seconds_per_token"


class ControllerGauges:
    """The goodput controller's current estimates (trtspec.spec.estimates.Estimates, shared by the deployment's loop
    processes) as Triton gauges: why it chose the k it chose. Acceptance per draft position per source (given every
    earlier position was accepted), the measured seconds of a verify call by draft length and requests in flight,
    and a draft-model call's fitted seconds per drafted and per caught-up token by requests in the call; only
    measured entries."""

    MIN_INTERVAL_S = 1.0  # each gauge is a round trip to the server: not after every request

    def __init__(self, pb_utils: Any, model_name: str):
        kind = pb_utils.MetricFamily.GAUGE
        docs = {
            CONTROLLER_ACCEPTANCE_GAUGE: "Controller's acceptance estimate by draft source and position",
            CONTROLLER_VERIFY_GAUGE: "Controller's measured verify-call seconds by draft length (0: a plain step) and load",
            CONTROLLER_DRAFT_GAUGE: "Controller's draft-model-call seconds per drafted token, by requests in the call",
            CONTROLLER_CATCHUP_GAUGE: "Controller's draft-model catch-up seconds per missed token, by requests in the call",
        }
        self._families = {n: pb_utils.MetricFamily(name=n, description=d, kind=kind) for n, d in docs.items()}
        self._labels = {"model": model_name}
        self._metrics: dict[tuple, Any] = {}
        self._sent_at = 0.0

    def _set(self, family: str, value: float, **labels: str) -> None:
        key = (family, tuple(sorted(labels.items())))
        if key not in self._metrics:
            self._metrics[key] = self._families[family].Metric(dict(self._labels, **labels))
        self._metrics[key].set(float(value))

    def update(self, est: Any, positions: int) -> None:
        """`est`: trtspec.spec.estimates.Estimates; `positions`: draft positions to report (the deployment's max_k)."""
        now = time.monotonic()
        if now - self._sent_at < self.MIN_INTERVAL_S:
            return
        self._sent_at = now
        # copies: other requests' threads and processes update the shared estimates while these are read
        reached, accepted = np.array(est.reached), np.array(est.accepted)
        verify_s, verify_n = np.array(est.verify_s), np.array(est.verify_n)
        fitted = np.flatnonzero(np.array(est.draft_fit_n))
        view = GoodputController(est, None)  # reads the deployment's estimates; one for every batch
        rates = {int(b): view.draft_rates(int(b)) for b in fitted}
        with TRITON_METRICS_LOCK:
            for si, source in enumerate(ESTIMATE_KEYS):
                for i in range(positions):
                    if reached[si, i] > 0:
                        self._set(CONTROLLER_ACCEPTANCE_GAUGE, accepted[si, i] / reached[si, i],
                                  source=source, position=str(i))
            for k, load in zip(*np.nonzero(verify_n)):
                self._set(CONTROLLER_VERIFY_GAUGE, verify_s[k, load], draft_len=str(k), load=str(load))
            for batch, (per_token, per_missed) in rates.items():
                self._set(CONTROLLER_DRAFT_GAUGE, per_token, batch=str(batch))
                self._set(CONTROLLER_CATCHUP_GAUGE, per_missed, batch=str(batch))
