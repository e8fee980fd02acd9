"""A CPU stand-in for the part of TensorRT-LLM's LLM API that trtspec's llmapi Triton model uses.

It follows the real API's names and behaviour (recorded in api_surface.json and checked by the tests):
`LLM(model, speculative_config=..., **TorchLlmArgs)`, `generate_async(inputs, sampling_params,
streaming=True)` returning an async-iterable `RequestOutput` whose `outputs[0]` carries cumulative
`token_ids`/`text`, their `*_diff`, `finish_reason`, and `request_perf_metrics.speculative_decoding`.

Behind it run trtspec's reference engine and trtspec's speculative loop (greedy verification or
rejection sampling, trtspec.spec.loop), so the llmapi flavour's Triton model, repository and clients are
exercised on CPU exactly as they are on a GPU. Each request's loop runs on its own thread and its engine
calls meet in the engines' in-flight batchers (trtspec.reference_engine.batching, the reference engine's own), so every
request in flight shares each forward pass as on TensorRT-LLM's executor. TensorRT-LLM's load controls are
honoured per request at admission
(`max_concurrency`, `draft_len_schedule` by the number of requests in flight) and across requests
(`acceptance_window` / `acceptance_length_threshold` switch speculation off for good).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json as _json
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtspec.reference_engine.batching import BatchScheduler
from trtspec.config import SpeculativeConfig
from trtspec.guided import GuidedSettings
from trtspec.llmapi.fields import version_fields
from trtspec.llmapi.parser import MAX_DRAFT_LEN, decoding_config_from_dict
from trtspec.spec.loop import LoopRequest, LoopRequestError, LoopSettings, SpeculativeLoop
from trtspec.reference_engine import ReferenceEngine, run_tensors
from trtspec.spec.speculative import draft_len_at_load

TARGET, DRAFT = "target", "draft"


@dataclass(kw_only=True)
class GuidedDecodingParams:
    """TensorRT-LLM's (tensorrt_llm/sampling_params.py): one guide a request."""

    json: str | dict | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def _validate(self) -> None:
        n = sum(bool(getattr(self, f.name)) for f in dataclasses.fields(self))
        if n > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {n}.")

    def guide(self) -> tuple[str, str | None] | None:
        """(the Triton backend's guide type, the guide) of this guide: the executor's GuideType it maps to."""
        self._validate()
        if self.json_object:
            return "json", None
        if self.json is not None:
            return "json_schema", self.json if isinstance(self.json, str) else _json.dumps(self.json)
        if self.regex is not None:
            return "regex", self.regex
        if self.grammar is not None:
            return "ebnf_grammar", self.grammar
        if self.structural_tag is not None:
            raise ValueError("guided_decoding.structural_tag: not served by the CPU stand-in (json, json_object, "
                             "regex and grammar are)")
        return None


@dataclass
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: str | list[str] | None = None
    stop: str | list[str] | None = None
    top_k: int | None = None
    top_p: float | None = None
    temperature: float | None = None
    seed: int | None = None
    min_tokens: int | None = None
    return_perf_metrics: bool = False
    detokenize: bool = True
    guided_decoding: GuidedDecodingParams | None = None


@dataclass
class SpeculativeDecodingMetrics:
    acceptance_rate: float = 0.0
    total_accepted_draft_tokens: int = 0
    total_draft_tokens: int = 0


@dataclass
class RequestPerfMetrics:
    first_iter: int = 0
    last_iter: int = 0
    iter: int = 0
    speculative_decoding: SpeculativeDecodingMetrics = field(default_factory=SpeculativeDecodingMetrics)


@dataclass
class CompletionOutput:
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    request_perf_metrics: RequestPerfMetrics | None = None
    _prev_text: int = 0
    _prev_ids: int = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._prev_text :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._prev_ids :]


@dataclass
class _Update:
    new_tokens: list[int]
    stats: Any
    first_iter: int
    last_iter: int
    finish_reason: str | None = None
    error: BaseException | None = None


class RequestOutput:
    """One request's output, updated in place on every streamed step (as TensorRT-LLM's is)."""

    def __init__(self, request_id: int, prompt: str | None, prompt_ids: list[int], llm: "LLM", sp: SamplingParams):
        self.request_id, self.prompt, self.prompt_token_ids = request_id, prompt, prompt_ids
        self.outputs = [CompletionOutput()]
        self.finished = False
        self._llm, self._sp = llm, sp
        self._loop = asyncio.get_running_loop()
        self._updates: asyncio.Queue[_Update] = asyncio.Queue()
        self.aborted = threading.Event()

    def abort(self) -> None:
        """Stop generating: the scheduler drops the request at its next round."""
        self.aborted.set()

    def _post(self, update: _Update) -> None:  # scheduler thread
        self._loop.call_soon_threadsafe(self._updates.put_nowait, update)

    def _apply(self, u: _Update) -> None:
        out = self.outputs[0]
        out._prev_text, out._prev_ids = len(out.text), len(out.token_ids)
        out.token_ids = out.token_ids + u.new_tokens
        final = u.finish_reason is not None
        if self._sp.detokenize:
            text = self._llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            if final or not text.endswith("\ufffd"):  # hold back a partial UTF-8 character
                out.text = text
        if self._sp.return_perf_metrics and u.stats is not None:
            st = u.stats
            out.request_perf_metrics = RequestPerfMetrics(
                first_iter=u.first_iter,
                last_iter=u.last_iter,
                iter=u.last_iter,
                speculative_decoding=SpeculativeDecodingMetrics(
                    st.acceptance_rate, st.total_accepted_draft_tokens, st.total_draft_tokens
                ),
            )
        if final:
            out.finish_reason = u.finish_reason
            self.finished = True

    def __aiter__(self) -> "RequestOutput":
        return self

    async def __anext__(self) -> "RequestOutput":
        if self.finished:
            raise StopAsyncIteration
        u = await self._updates.get()
        if u.error is not None:
            self.finished = True
            raise u.error
        self._apply(u)
        return self

    async def aresult(self) -> "RequestOutput":
        async for _ in self:
            pass
        return self


class _EngineCall:
    """trtspec.spec.loop's engine interface served in process: tensors in, tensors out, as Triton would."""

    def __init__(self, engines: dict[str, BatchScheduler]):
        self.engines = engines

    def __call__(self, model: str, tensors: dict[str, np.ndarray], wanted: list[str]) -> dict[str, np.ndarray]:
        return run_tensors(self.engines[model], tensors)


class _Requests:
    """Runs each request's speculative loop on a thread of its own."""

    def __init__(self, llm: "LLM"):
        self.llm = llm
        self._lock = threading.Lock()
        self.in_flight = 0

    def start(self, out: RequestOutput, req: LoopRequest) -> None:
        with self._lock:
            self.in_flight += 1
            req.num_draft_tokens = self.llm.draft_len_for(self.in_flight)
        threading.Thread(target=self._serve, args=(out, req), name=f"llmapi-request-{out.request_id}", daemon=True).start()

    def _serve(self, out: RequestOutput, req: LoopRequest) -> None:
        # iteration numbers as the executor's: the request takes part in every one from its first to its last
        first = last = self.llm.iteration()
        stats = None
        try:
            for chunk in self.llm.loop.run(req):
                if out.aborted.is_set():
                    out._post(_Update([], stats, first, last, "cancelled"))
                    return
                stats = chunk.stats
                last = first + stats.num_iterations - 1
                reason = None
                if chunk.final:
                    done = len(chunk.generated_before) + len(chunk.new_tokens) >= out._sp.max_tokens
                    reason = "length" if done else "stop"
                    self.llm.record_acceptance(stats)
                out._post(_Update(list(chunk.new_tokens), stats, first, last, reason))
                if chunk.final:
                    return
        except Exception as e:  # noqa: BLE001 - reported to the caller of generate_async
            out._post(_Update([], None, first, last, error=e))
        finally:
            with self._lock:
                self.in_flight -= 1


def _check_guided(backend: str | None, method: str | None) -> str | None:
    """guided_decoding_backend, refused where the pinned release refuses it with this speculation (api_surface.json
    guided_decoding: py_executor_creator's check)."""
    if backend is None:
        return None
    if backend != "xgrammar":
        raise ValueError(f"guided_decoding_backend {backend!r}: the CPU stand-in serves xgrammar only")
    g = version_fields()["guided_decoding"]
    if method is not None and method not in g["methods"]:
        raise ValueError(f"Guided decoding with speculative_config {method}: {g['refused'].get(method, 'not supported')}")
    return backend


# speculative method -> the loop's draft source (None: no speculation)
STANDIN_SOURCES: dict[str | None, str | None] = {None: None, "draft_model": "model", "ngram": "ngram", "eagle3": "model"}


class LLM:
    """`tensorrt_llm.LLM` for CPU: the arguments are TorchLlmArgs fields (unknown ones are refused, as the
    real pydantic model refuses them); the ones that matter on CPU are used, the rest are accepted as is."""

    def __init__(self, model: str | Path, tokenizer: str | Path | None = None, speculative_config: Any = None, **kwargs: Any):
        from transformers import AutoTokenizer

        known = set(version_fields()["TorchLlmArgs"])
        unknown = sorted(k for k in kwargs if k not in known)
        if unknown:
            raise TypeError(f"LLM() got unexpected arguments: {', '.join(unknown)}")
        if isinstance(speculative_config, dict):  # LLM(speculative_config={...}) without the YAML parser
            speculative_config = decoding_config_from_dict(speculative_config)
        self.args = dict(kwargs, model=str(model), speculative_config=speculative_config)
        spec = speculative_config.values if speculative_config is not None else {}
        method = speculative_config.method if speculative_config is not None else None
        two_model = method == "eagle3" and spec.get("eagle3_one_model") is False
        self.guided_backend = _check_guided(kwargs.get("guided_decoding_backend"), "eagle3_two_model" if two_model else method)
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or model))
        if method not in STANDIN_SOURCES:
            raise ValueError(
                f"speculative_config: {speculative_config.cls} ({method}) is not served by the CPU stand-in; "
                f"it serves {', '.join(k for k in STANDIN_SOURCES if k)} (the GPU runs TensorRT-LLM itself)"
            )
        self.source = STANDIN_SOURCES[method]
        self.max_k = int(spec.get(MAX_DRAFT_LEN) or 0)
        self.max_concurrency = spec.get("max_concurrency")
        self.schedule = {int(b): int(k) for b, k in (spec.get("draft_len_schedule") or {}).items()}
        self.window = int(spec.get("acceptance_window") or 0)
        self.threshold = float(spec.get("acceptance_length_threshold") or 0.0)
        self._lengths: list[float] = []
        self.speculation_off = False

        batch = int(kwargs.get("max_batch_size") or 8)
        limits = {"max_batch_size": batch, "max_num_tokens": int(kwargs.get("max_num_tokens") or 8192)}
        draft = spec.get("speculative_model") or spec.get("speculative_model_dir")
        info = self._tokenizer_info() if self.guided_backend else None
        # EAGLE-3: the head drafts inside the target engine (TensorRT-LLM's one-model path), no draft engine
        head = draft if method == "eagle3" else None
        target = ReferenceEngine(model, dtype="float32", cache_entries=2 * batch, eagle3_head=head, xgrammar_tokenizer_info=info)
        engines = {TARGET: BatchScheduler(target, **limits)}
        if method == "draft_model":
            engines[DRAFT] = BatchScheduler(ReferenceEngine(draft, dtype="float32", cache_entries=2 * batch, salt=1, use_draft_vocab=True,
                                                            xgrammar_tokenizer_info=info), **limits)
        self.engines = engines
        guided = None if info is None else GuidedSettings(tokenizer_info=str(info), vocab_size=target.vocab_size)
        # TensorRT-LLM's NGram drafter has no minimum n-gram size: n goes down to 1
        ngram_max = int(spec.get("max_matching_ngram_size") or 2)
        settings = LoopSettings(
            speculative=SpeculativeConfig.of(
                max(1, self.max_k),
                self.max_k,
                draft_length_policy="fixed",  # TensorRT-LLM drafts its most (its schedule caps it), no controller
                method="eagle3" if method == "eagle3" else None,
                draft_source=self.source or "model",
                ngram_max=ngram_max,
                ngram_min=1,
            ),
            max_input_len=int(kwargs.get("max_seq_len") or 1 << 30),
            target_model=TARGET,
            draft_model=DRAFT if method == "draft_model" else None,
            draft_disabled=self.source is None,
            guided=guided,
        )
        self.loop = SpeculativeLoop(settings, _EngineCall(engines))
        self._ids = itertools.count()
        self._requests = _Requests(self)

    def _tokenizer_info(self) -> Path:
        """The xgrammar tokenizer info the engines mask with, written from the tokenizer as TensorRT-LLM's
        _xgrammar_tokenizer_info builds it."""
        from trtspec.guided import tokenizer_info_dict, write_tokenizer_info

        self._guided_dir = tempfile.TemporaryDirectory(prefix="trtspec-llmapi-guided-")
        return write_tokenizer_info("", Path(self._guided_dir.name), tokenizer_info_dict(self.tokenizer))

    def iteration(self) -> int:
        """The target engine's step count: the executor's iteration counter."""
        return self.engines[TARGET].stats.steps

    # ------------------------------------------------------------------ load controls

    def draft_len_for(self, batch_size: int) -> int:
        if self.source is None or self.speculation_off:
            return 0
        return draft_len_at_load(self.max_k, batch_size, self.max_concurrency, self.schedule)[0]

    def record_acceptance(self, stats: Any) -> None:
        if not self.window or not stats.num_drafts:
            return
        self._lengths = (self._lengths + [stats.mean_acceptance_length])[-self.window :]
        if len(self._lengths) == self.window and sum(self._lengths) / self.window < self.threshold:
            self.speculation_off = True

    # ------------------------------------------------------------------ the API

    def generate_async(
        self, inputs: str | list[int], sampling_params: SamplingParams | None = None, streaming: bool = False
    ) -> RequestOutput:
        sp = sampling_params or SamplingParams()
        prompt = inputs if isinstance(inputs, str) else None
        ids = self.tokenizer.encode(inputs) if isinstance(inputs, str) else [int(t) for t in inputs]
        out = RequestOutput(next(self._ids), prompt, ids, self, sp)
        stop, bad = self._words(sp.stop), self._words(sp.bad)
        end_id = sp.end_id if sp.end_id is not None else self.tokenizer.eos_token_id
        guide = sp.guided_decoding.guide() if sp.guided_decoding is not None else None
        if guide is not None and self.guided_backend is None:
            raise ValueError("SamplingParams.guided_decoding needs the LLM's guided_decoding_backend (xgrammar)")
        req = LoopRequest(
            prompt=ids,
            max_tokens=sp.max_tokens,
            end_id=None if end_id is None or end_id < 0 else end_id,
            pad_id=sp.pad_id,
            stop_words=stop,
            bad_words=bad,
            temperature=sp.temperature,
            min_tokens=sp.min_tokens,
            top_k=sp.top_k,
            top_p=sp.top_p,
            seed=sp.seed,
            guided_decoding_guide_type=guide[0] if guide else None,
            guided_decoding_guide=guide[1] if guide else None,
        )
        self._requests.start(out, req)
        return out

    def _words(self, words: str | list[str] | None) -> list[list[int]]:
        if not words:
            return []
        words = [words] if isinstance(words, str) else list(words)
        return [s for s in (self.tokenizer.encode(w, add_special_tokens=False) for w in words if w) if s]

    def shutdown(self) -> None:
        for engine in self.engines.values():
            engine.close()


__all__ = ["LLM", "SamplingParams", "GuidedDecodingParams", "RequestOutput", "CompletionOutput", "LoopRequestError"]
