"""Prometheus counters of the speculative endpoint, shared by every flavour's serving model (Triton custom
metrics; `pb_utils` is passed in so this module imports without a server)."""

import threading


class Metrics:
    """Triton custom metrics, named after vLLM's spec_decode_* series so dashboards carry over."""

    def __init__(self, pb_utils, model_name):
        counter = pb_utils.MetricFamily.COUNTER
        labels = {"model": model_name}

        self._families = []  # Triton deletes a family (and fails its metrics) once its object is collected

        def family(name, doc):
            f = pb_utils.MetricFamily(name=name, description=doc, kind=counter)
            self._families.append(f)
            return f

        self.requests = family("spec_decode_num_requests", "Requests finished by the speculative loop").Metric(labels)
        self.drafts = family("spec_decode_num_drafts", "Iterations that proposed draft tokens").Metric(labels)
        self.draft_tokens = family("spec_decode_num_draft_tokens", "Draft tokens proposed").Metric(labels)
        self.accepted = family("spec_decode_num_accepted_tokens", "Draft tokens accepted").Metric(labels)
        self.iterations = family("spec_decode_num_iterations", "Target calls (verify steps)").Metric(labels)
        self.emitted = family("spec_decode_num_emitted_tokens", "Tokens returned to clients").Metric(labels)
        self.fallbacks = family(
            "spec_decode_num_fallbacks", "Draft calls that failed; the request continued target-only"
        ).Metric(labels)
        self._per_pos_family = family(
            "spec_decode_num_accepted_tokens_per_pos", "Accepted draft tokens by position in the draft"
        )
        self._proposed_pos_family = family(
            "spec_decode_num_draft_tokens_per_pos", "Proposed draft tokens by position in the draft"
        )
        self._by_source_family = family(
            "spec_decode_num_accepted_tokens_by_source", "Accepted draft tokens by the drafter that proposed them"
        )
        self._labels = labels
        self._lock = threading.Lock()
        self._per_pos, self._proposed_pos, self._by_source = {}, {}, {}

    def _metric(self, cache, fam, **extra):
        key = tuple(sorted(extra.items()))
        with self._lock:
            if key not in cache:
                cache[key] = fam.Metric(dict(self._labels, **extra))
            return cache[key]

    def record(self, stats, source_counts, emitted):
        self.requests.increment(1)
        self.drafts.increment(stats.num_drafts)
        self.draft_tokens.increment(stats.num_draft_tokens)
        self.accepted.increment(stats.num_accepted_tokens)
        self.iterations.increment(stats.num_iterations)
        self.emitted.increment(emitted)
        self.fallbacks.increment(stats.num_fallbacks)
        for pos, (a, p) in enumerate(zip(stats.accepted_per_pos, stats.proposed_per_pos)):
            self._metric(self._per_pos, self._per_pos_family, position=str(pos)).increment(a)
            self._metric(self._proposed_pos, self._proposed_pos_family, position=str(pos)).increment(p)
        for src, n in source_counts.items():
            self._metric(self._by_source, self._by_source_family, source=src).increment(n)
