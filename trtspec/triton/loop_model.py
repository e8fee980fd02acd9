"""The speculative loop as a decoupled Python BLS model: the `speculative` and `baseline_loop` models (token ids in
and out, or text as NVIDIA's tensorrt_llm_bls takes it) and the text endpoints `ensemble` and `baseline` (text in and
out: tokenizer + loop + detokenizer in one model, so a client's cancellation reaches the loop; Triton's ensemble
scheduler does not pass cancellation on to a decoupled step).

It streams accepted tokens as they come, serves many requests at once (each in its own worker thread;
execute() returns at once), reports the statistics of trtspec.contract in every response and in Prometheus,
and stops a request when its client cancels it.
"""

from __future__ import annotations

import faulthandler
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from trtspec import triton_io as io
from trtspec.contract import REQUEST_FIELDS, EngineCallError, RequestError
from trtspec.contract.errors import engine_error
from trtspec.spec.load import InFlight, SharedEstimates
from trtspec.spec.logprobs import TopLogProbs
from trtspec.spec.loop import SETTINGS_PARAMETER, Step, LoopRequest, LoopSettings, SpeculativeLoop
from trtspec.spec.metrics import ControllerGauges, PrometheusExporter
from trtspec.text import TextCodec
from trtspec.triton.callees import CalleeProcesses

# is_cancelled() is a round trip to the server: asked after a target call once this long
# has passed since it was last asked, so a client that leaves stops the loop within this or one target call
CANCEL_CHECK_S = 0.25
PREFIX_WINDOW = 8  # generated tokens sent back as prefix_ids: enough context for detokenizing a chunk


def engine_stream(pb_utils: Any, callees: CalleeProcesses | None = None):
    """The loop's engine boundary as BLS requests to other models of the server, each read response by response
    (the engine models are decoupled: one response unless the request streams), responses without outputs (a final
    flag alone) skipped. With `callees`, a call ends when the called model's process dies."""

    def stream(model_name: str, tensors: Mapping[str, np.ndarray], wanted: list[str]) -> Iterator[dict[str, np.ndarray]]:
        request = pb_utils.InferenceRequest(
            model_name=model_name,
            requested_output_names=wanted,
            inputs=[pb_utils.Tensor(k, v) for k, v in tensors.items()],
        )
        wait = (lambda fn: fn()) if callees is None else (lambda fn: callees.call(model_name, fn))
        responses = wait(lambda: request.exec(decoupled=True))
        while (response := wait(lambda: next(responses, None))) is not None:
            if response.has_error():
                raise engine_error(model_name, response.error().message())
            out = {}
            for name in wanted:
                t = pb_utils.get_output_tensor_by_name(response, name)
                if t is not None:
                    out[name] = t.as_numpy()
            if out:
                yield out

    return stream


def engine_call(pb_utils: Any, callees: CalleeProcesses | None = None):
    """One answer per call: the last response's outputs (a request that does not stream has one)."""
    stream = engine_stream(pb_utils, callees)

    def call(model_name: str, tensors: Mapping[str, np.ndarray], wanted: list[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for response in stream(model_name, tensors, wanted):
            out = response
        return out

    return call


def read_fields(pb_utils: Any, request: Any) -> dict[str, Any]:
    """Every request field the request carries, by its contract name, read under any of its names (trtspec.contract:
    `top_k` or `runtime_top_k`, `min_tokens` or `min_length`), checked; "" counts as unset. A field sent under two
    names, a refused field, or a bad value is a RequestError naming it."""
    out: dict[str, Any] = {}
    for f in REQUEST_FIELDS:
        sent = [n for n in f.names if io.tensor(pb_utils, request, n) is not None]
        if not sent:
            continue
        if len(sent) > 1:
            raise RequestError(f"{f.name} was sent as both {sent[0]} and {sent[1]}; send one")
        if f.refuse:
            f.validate(True)  # raises, naming the field
        name = sent[0]
        if f.dims != (1,):
            a = io.tensor(pb_utils, request, name)
            value: Any = io.strings(pb_utils, request, name) if f.dtype == "STRING" else a.reshape(-1).tolist()
        else:
            value = io.scalar(pb_utils, request, name)
            if value == "":
                continue
            f.validate(value)
        out[f.name] = value
    return out


def _id(value: Any) -> int | None:
    """An end or pad id; -1 means unset (NVIDIA's preprocessing sends -1 for "none")."""
    return None if value is None or int(value) < 0 else int(value)


def response_tensors(tokens: list[int], before: list[int], chunk: Step) -> dict[str, np.ndarray]:
    out = {
        "output_ids": np.asarray(tokens, dtype=np.int32).reshape(1, -1),
        "prefix_ids": np.asarray(before[-PREFIX_WINDOW:], dtype=np.int32).reshape(1, -1),
        "sequence_length": np.array([[len(before) + len(tokens)]], dtype=np.int32),
    }
    out.update(chunk.stats.to_arrays())
    return out


FINALIZE_STACKS_AFTER_S = 6


class LoopModel:
    """Text in and text out (`text_input`, NVIDIA's ensemble and tensorrt_llm_bls interface; tokenized in-process
    with trtspec.text) or token ids in and out (`input_ids`, TensorRT-LLM's tensor names), per request."""

    def __init__(self, pb_utils: Any, args: Mapping[str, Any]):
        self.pb = pb_utils
        params = io.model_parameters(args)
        self.settings = LoopSettings.model_validate_json(params[SETTINGS_PARAMETER])
        self.codec = TextCodec(
            params["tokenizer_dir"],
            add_special_tokens=params.get("add_special_tokens", "false").lower() == "true",
            skip_special_tokens=params.get("skip_special_tokens", "true").lower() == "true",
        )
        self.in_flight = InFlight()
        self.estimates = SharedEstimates()
        # args["model_repository"] is this model's directory in the repository
        callees = CalleeProcesses(Path(args["model_repository"]).parent)
        self.loop = SpeculativeLoop(self.settings, engine_call(pb_utils, callees), self.in_flight, self.estimates,
                                    stream=engine_stream(pb_utils, callees))
        self.name = args["model_name"]
        self.metrics = PrometheusExporter(pb_utils, self.name)
        self.controller_gauges = ControllerGauges(pb_utils, self.name)
        self.pool = ThreadPoolExecutor(max_workers=self.settings.max_concurrent_requests)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self.pool.submit(self.serve, request)
        return None

    def finalize(self) -> None:
        # A stub that has not exited within Triton's exit timeout (10 s) leaves every thread's stack in Triton's
        # log (the stub's stderr): such a stop has been seen, not yet explained (docs/benchmarks/faults.md).
        try:
            faulthandler.dump_traceback_later(FINALIZE_STACKS_AFTER_S, file=sys.stderr)
        except (AttributeError, ValueError, OSError):  # a stderr without a file descriptor: no stacks, still stop
            pass
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.in_flight.close()
        self.estimates.close()

    def parse(self, request: Any) -> tuple[LoopRequest, bool]:
        """(the request, whether it came as text and is answered with text_output)."""
        fields = read_fields(self.pb, request)
        loop_fields = {f.name: fields[f.name] for f in REQUEST_FIELDS if f.loop_input is not None and f.name in fields}
        if io.tensor(self.pb, request, "text_input") is not None:
            words = {n: self.codec.encode_words(fields.get(n, []), n) for n in ("stop_words", "bad_words")}
            bias = self.codec.embedding_bias(fields.get("embedding_bias_words", []),
                                             fields.get("embedding_bias_weights", []))
            prompt = self.codec.encode_prompt(fields.get("text_input"))
            end_id, pad_id = fields.get("end_id", self.codec.end_id), fields.get("pad_id", self.codec.pad_id)
            max_tokens, text = fields.get("max_tokens"), True
        else:
            ids = io.ids(self.pb, request, "input_ids")
            if ids is None:
                raise RequestError("send text_input (text) or input_ids (token ids)")
            prompt = ids[: int(io.scalar(self.pb, request, "input_lengths", len(ids)))]
            words = {n: io.words_list(io.tensor(self.pb, request, f"{n}_list")) for n in ("stop_words", "bad_words")}
            bias = io.tensor(self.pb, request, "embedding_bias")
            bias = None if bias is None or bias.size == 0 else bias.reshape(-1).astype(np.float32)
            end_id, pad_id = fields.get("end_id"), fields.get("pad_id")
            max_tokens, text = io.scalar(self.pb, request, "request_output_len", fields.get("max_tokens")), False
        if max_tokens is None:
            raise RequestError("max_tokens (or request_output_len) is required")
        req = LoopRequest(prompt=prompt, max_tokens=int(max_tokens), end_id=_id(end_id), pad_id=_id(pad_id),
                          embedding_bias=bias, **words, **loop_fields)
        return req, text

    def response_tensors(
        self, req: LoopRequest, text: bool, tokens: list[int], before: list[int], chunk: Step,
        log_probs: list[float] | None = None, top: TopLogProbs | None = None,
    ) -> dict[str, np.ndarray]:
        """`log_probs`: of the generated tokens among `tokens` (TensorRT-LLM's output_log_probs: [beam, tokens]);
        `top`: the most likely tokens at their positions (trtspec.contract.RESPONSE_OUTPUTS: [tokens, N])."""
        out = response_tensors(tokens, before, chunk)
        if req.return_log_probs and log_probs is not None:
            out["output_log_probs"] = np.asarray(log_probs, dtype=np.float32).reshape(1, 1, -1)
            out["cum_log_probs"] = np.array([[sum(log_probs)]], dtype=np.float32)
        if req.top_log_probs and top is not None:
            out["output_top_ids"] = top.ids[None]
            out["output_top_log_probs"] = top.log_probs[None]
        if req.return_num_input_tokens:
            out["num_input_tokens"] = np.array([[len(req.prompt)]], dtype=np.int32)
        if req.return_num_output_tokens:
            out["num_output_tokens"] = np.array([[len(chunk.generated_before) + len(chunk.new_tokens)]], dtype=np.int32)
        if text:
            del out["prefix_ids"]
            decoded = self.codec.decode_chunk(before[-PREFIX_WINDOW:], tokens)
            out["text_output"] = np.array([[decoded.encode("utf-8")]], dtype=np.object_)
        return out

    def _response(
        self, req: LoopRequest, text: bool, tokens: list[int], before: list[int], chunk: Step,
        log_probs: list[float] | None = None, top: TopLogProbs | None = None,
    ) -> Any:
        tensors = self.response_tensors(req, text, tokens, before, chunk, log_probs, top)
        return self.pb.InferenceResponse(output_tensors=[self.pb.Tensor(k, v) for k, v in tensors.items()])

    def serve(self, request: Any) -> None:
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        sender = request.get_response_sender()
        try:
            req, text = self.parse(request)
            last, cancelled, log_probs, tops, asked = None, False, [], [], time.monotonic()
            seen_at = 0  # tokens generated before the call in which the cancel was seen
            with self.in_flight.request():
                for chunk in self.loop.run(req):
                    last = chunk
                    log_probs += chunk.log_probs or []
                    tops += [chunk.top] if chunk.top is not None else []
                    if not chunk.final and not cancelled and time.monotonic() - asked >= CANCEL_CHECK_S:
                        cancelled, asked = sender.is_cancelled(), time.monotonic()
                        seen_at = len(chunk.generated_before)
                    if chunk.final or cancelled:
                        break
                    if req.stream:
                        sender.send(self._response(req, text, chunk.new_tokens, chunk.generated_before, chunk,
                                                   chunk.log_probs, chunk.top))
            if last is None:
                raise EngineCallError("the loop produced no output")
            try:
                self.controller_gauges.update(self.estimates, self.settings.speculative.max_k)
            except Exception:  # noqa: BLE001 - the gauges explain; they must never fail the request they follow
                pass
            generated = last.generated_before + last.new_tokens
            # counters first: a client that scrapes /metrics after its final response sees them
            if cancelled:
                self.metrics.record(last.stats, seen_at if req.stream else 0)  # what the client got
                # every token from the call that saw the cancel to the loop's end: one call's, unless the loop ran on
                self.metrics.record_cancelled(len(last.generated_before) + len(last.new_tokens) - seen_at)
                sender.send(flags=final)
            elif req.stream:
                self.metrics.record(last.stats, len(generated))
                sender.send(self._response(req, text, last.new_tokens, last.generated_before, last, last.log_probs,
                                           last.top), flags=final)
            else:
                self.metrics.record(last.stats, len(generated))
                # TensorRT-LLM's exclude_input_in_output=false: a non-streamed output starts with the prompt
                whole = req.prompt + generated if req.exclude_input_in_output is False else generated
                sender.send(self._response(req, text, whole, [], last, log_probs, TopLogProbs.concat(tops)),
                            flags=final)
        except RequestError as e:  # the client's: the message names the field, not the model
            sender.send(self.pb.InferenceResponse(error=io.error(self.pb, e)), flags=final)
        except Exception as e:  # engine failure: report it, keep serving
            sender.send(self.pb.InferenceResponse(error=io.error(self.pb, e, self.name)), flags=final)

