"""The speculative loop as a decoupled Python BLS model.

Unlike NVIDIA's tensorrt_llm_bls it streams accepted tokens as they come, serves many requests at
once (each request runs in its own worker thread; execute() returns at once), reports acceptance in
every response and in Prometheus counters, and falls back to target-only decoding when the draft
fails. The loop itself is trtspec.loop.SpeculativeLoop; this file moves tensors and counts.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec import triton_io as io
from trtspec.loop import EngineCallError, LoopRequest, LoopRequestError, LoopSettings, SpeculativeLoop

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
SOURCES = ("model", "ngram")


class Metrics:
    """Triton custom metrics, named after vLLM's spec_decode_* series so dashboards carry over."""

    def __init__(self, model_name):
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


def _call(model_name, tensors, wanted):
    request = pb_utils.InferenceRequest(
        model_name=model_name,
        requested_output_names=wanted,
        inputs=[pb_utils.Tensor(k, v) for k, v in tensors.items()],
    )
    response = request.exec()
    if response.has_error():
        raise EngineCallError(f"{model_name}: {response.error().message()}")
    out = {}
    for name in wanted:
        t = pb_utils.get_output_tensor_by_name(response, name)
        if t is not None:
            out[name] = t.as_numpy()
    return out


class TritonPythonModel:
    def initialize(self, args):
        p = io.model_parameters(args)
        opt = lambda key: p.get(key) or None  # noqa: E731 - an empty parameter means "none"
        self.settings = LoopSettings(
            target_model=p.get("target_model_name", "tensorrt_llm"),
            draft_model=opt("draft_model_name"),
            ngram_model=opt("ngram_model_name"),
            max_draft_len=int(p.get("max_draft_len", "8")),
            default_num_draft_tokens=int(p.get("num_draft_tokens", "4")),
            default_draft_source=p.get("draft_source", "model"),
            adaptive=p.get("draft_length_policy", "fixed") == "adaptive",
            adaptive_min_k=int(p.get("adaptive_min_draft_len", "1")),
            adaptive_pause_below=float(p.get("adaptive_pause_below_acceptance", "0.2")),
            adaptive_window=int(p.get("adaptive_window", "4")),
            adaptive_probe_every=int(p.get("adaptive_probe_every", "8")),
            adaptive_payoff=p.get("adaptive_measure_payoff", "true").lower() == "true",
            max_input_len=int(p.get("max_input_len", "2048")),
            draft_disabled=p.get("draft_disabled", "false").lower() == "true",
            min_tokens_name=p.get("engine_min_tokens_name", "min_tokens"),
            seed_name=p.get("engine_seed_name", "seed"),
        )
        self.loop = SpeculativeLoop(self.settings, _call)
        self.metrics = Metrics(args["model_name"])
        self.pool = ThreadPoolExecutor(max_workers=int(p.get("max_concurrent_requests", "64")))

    def execute(self, requests):
        for request in requests:
            self.pool.submit(self._serve, request)
        return None

    def finalize(self):
        self.pool.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------------------------------------

    def _parse(self, request):
        get = lambda name, default=None: io.scalar(pb_utils, request, name, default)  # noqa: E731
        prompt = io.ids(pb_utils, request, "input_ids") or []
        prompt = prompt[: int(get("input_lengths", len(prompt)))]
        stop_tensor = io.tensor(pb_utils, request, "stop_words_list")
        bad_tensor = io.tensor(pb_utils, request, "bad_words_list")
        stop_words = io.words_list(stop_tensor)
        bad_words = io.words_list(bad_tensor)
        return LoopRequest(
            prompt=prompt,
            max_tokens=int(get("request_output_len", 0)),
            num_draft_tokens=get("num_draft_tokens"),
            use_draft_logits=bool(get("use_draft_logits", False)),
            draft_source=get("draft_source") or None,
            draft_length_policy=get("draft_length_policy") or None,
            end_id=get("end_id"),
            pad_id=get("pad_id"),
            stop_words=stop_words,
            stop_words_tensor=io.to_words_list(stop_words) if stop_words else None,
            bad_words_tensor=io.to_words_list(bad_words) if bad_words else None,
            temperature=get("temperature"),
            top_k=get("runtime_top_k"),
            top_p=get("runtime_top_p"),
            seed=get("seed"),
        ), bool(get("streaming", False))

    @staticmethod
    def _response(tokens, before, chunk):
        st = chunk.stats
        pos_a = np.asarray(st.accepted_per_pos or [0], dtype=np.int32)
        pos_p = np.asarray(st.proposed_per_pos or [0], dtype=np.int32)
        by_source = [chunk.source_counts.get(s, 0) for s in SOURCES]
        tensors = [
            pb_utils.Tensor("output_ids", np.asarray(tokens, dtype=np.int32).reshape(1, -1)),
            pb_utils.Tensor("prefix_ids", np.asarray(before, dtype=np.int32).reshape(1, -1)),
            pb_utils.Tensor("sequence_length", np.array([[len(before) + len(tokens)]], dtype=np.int32)),
            pb_utils.Tensor("acceptance_rate", np.array([[st.acceptance_rate]], dtype=np.float32)),
            pb_utils.Tensor("total_accepted_draft_tokens", np.array([[st.num_accepted_tokens]], dtype=np.int32)),
            pb_utils.Tensor("total_draft_tokens", np.array([[st.num_draft_tokens]], dtype=np.int32)),
            pb_utils.Tensor("num_iterations", np.array([[st.num_iterations]], dtype=np.int32)),
            pb_utils.Tensor("num_drafts", np.array([[st.num_drafts]], dtype=np.int32)),
            pb_utils.Tensor("draft_fallbacks", np.array([[st.num_fallbacks]], dtype=np.int32)),
            pb_utils.Tensor("accepted_per_position", pos_a.reshape(1, -1)),
            pb_utils.Tensor("proposed_per_position", pos_p.reshape(1, -1)),
            pb_utils.Tensor("accepted_by_source", np.asarray(by_source, dtype=np.int32).reshape(1, -1)),
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _serve(self, request):
        sender = request.get_response_sender()
        try:
            req, streaming = self._parse(request)
            last = None
            for chunk in self.loop.run(req):
                last = chunk
                if chunk.final:
                    break
                if sender.is_cancelled():
                    break
                if streaming:
                    sender.send(self._response(chunk.new_tokens, chunk.generated_before, chunk))
            if last is None:
                raise EngineCallError("the loop produced no output")
            generated = last.generated_before + last.new_tokens
            # counters first: a client that scrapes /metrics after its final response sees them
            self.metrics.record(last.stats, last.source_counts, len(generated))
            if not last.final:  # cancelled mid-way
                sender.send(flags=_FINAL)
            elif streaming:
                sender.send(self._response(last.new_tokens, last.generated_before, last), flags=_FINAL)
            else:
                sender.send(self._response(generated, [], last), flags=_FINAL)
        except LoopRequestError as e:
            sender.send(pb_utils.InferenceResponse(error=io.bad_request(pb_utils, e)), flags=_FINAL)
        except Exception as e:  # engine failure: report it, keep serving
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"speculative loop: {e}")), flags=_FINAL)
