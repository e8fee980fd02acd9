"""The speculative loop as a decoupled Python BLS model (the `speculative` and `baseline_loop` models).

It streams accepted tokens as they come, serves many requests at once (each in its own worker thread;
execute() returns at once), reports the statistics of trtspec.contract in every response and in Prometheus,
and stops a request when its client cancels it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping

import numpy as np

from trtspec import triton_io as io
from trtspec.contract import REQUEST_FIELDS, RequestError
from trtspec.loop import Step, EngineCallError, LoopRequest, LoopSettings, SpeculativeLoop
from trtspec.metrics import PrometheusExporter

SETTINGS_PARAMETER = "loop_settings"  # the one model parameter: LoopSettings as JSON
PREFIX_WINDOW = 8  # generated tokens sent back as prefix_ids: enough context for detokenizing a chunk


def engine_call(pb_utils: Any):
    """The loop's engine boundary as BLS requests to other models of the server."""

    def call(model_name: str, tensors: Mapping[str, np.ndarray], wanted: list[str]) -> dict[str, np.ndarray]:
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

    return call


def loop_request(
    prompt: list[int], max_tokens: int, end_id: int | None, pad_id: int | None, fields: Mapping[str, Any], **words: Any
) -> LoopRequest:
    """A LoopRequest from what an endpoint read: `fields` are request fields by their contract name (None or ""
    means unset); an end or pad id of -1 means unset (preprocessing sends -1 for "none")."""
    return LoopRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        end_id=None if end_id is None or end_id < 0 else end_id,
        pad_id=None if pad_id is None or pad_id < 0 else pad_id,
        **words,
        **{k: v for k, v in fields.items() if v is not None and v != ""},
    )


def parse_request(pb_utils: Any, request: Any) -> LoopRequest:
    get = lambda name, default=None: io.scalar(pb_utils, request, name, default)  # noqa: E731
    prompt = io.ids(pb_utils, request, "input_ids") or []
    return loop_request(
        prompt[: int(get("input_lengths", len(prompt)))],
        int(get("request_output_len", 0)),
        get("end_id"),
        get("pad_id"),
        {f.name: get(f.loop_input) for f in REQUEST_FIELDS if f.loop_input is not None},
        stop_words=io.words_list(io.tensor(pb_utils, request, "stop_words_list")),
        bad_words=io.words_list(io.tensor(pb_utils, request, "bad_words_list")),
    )


def response_tensors(tokens: list[int], before: list[int], chunk: Step) -> dict[str, np.ndarray]:
    out = {
        "output_ids": np.asarray(tokens, dtype=np.int32).reshape(1, -1),
        "prefix_ids": np.asarray(before[-PREFIX_WINDOW:], dtype=np.int32).reshape(1, -1),
        "sequence_length": np.array([[len(before) + len(tokens)]], dtype=np.int32),
    }
    out.update(chunk.stats.to_arrays())
    return out


class LoopModel:
    def __init__(self, pb_utils: Any, args: Mapping[str, Any]):
        self.pb = pb_utils
        params = io.model_parameters(args)
        self.settings = LoopSettings.model_validate_json(params[SETTINGS_PARAMETER])
        self.loop = SpeculativeLoop(self.settings, engine_call(pb_utils))
        self.name = args["model_name"]
        self.metrics = PrometheusExporter(pb_utils, self.name)
        self.pool = ThreadPoolExecutor(max_workers=self.settings.max_concurrent_requests)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self.pool.submit(self.serve, request)
        return None

    def finalize(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def parse(self, request: Any) -> LoopRequest:
        return parse_request(self.pb, request)

    def response_tensors(self, tokens: list[int], before: list[int], chunk: Step) -> dict[str, np.ndarray]:
        return response_tensors(tokens, before, chunk)

    def _response(self, tokens: list[int], before: list[int], chunk: Step) -> Any:
        tensors = self.response_tensors(tokens, before, chunk)
        return self.pb.InferenceResponse(output_tensors=[self.pb.Tensor(k, v) for k, v in tensors.items()])

    def _error(self, message: str) -> Any:
        return self.pb.InferenceResponse(error=self.pb.TritonError(message))

    def serve(self, request: Any) -> None:
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        sender = request.get_response_sender()
        try:
            req = self.parse(request)
            last, cancelled = None, False
            for chunk in self.loop.run(req):
                last = chunk
                # checked every iteration: a client that cancels or goes away stops the loop within one target call
                cancelled = not chunk.final and sender.is_cancelled()
                if chunk.final or cancelled:
                    break
                if req.stream:
                    sender.send(self._response(chunk.new_tokens, chunk.generated_before, chunk))
            if last is None:
                raise EngineCallError("the loop produced no output")
            generated = last.generated_before + last.new_tokens
            # counters first: a client that scrapes /metrics after its final response sees them
            if cancelled:
                self.metrics.record(last.stats, len(last.generated_before) if req.stream else 0)
                self.metrics.record_cancelled(len(last.new_tokens))
                sender.send(flags=final)
            elif req.stream:
                self.metrics.record(last.stats, len(generated))
                sender.send(self._response(last.new_tokens, last.generated_before, last), flags=final)
            else:
                self.metrics.record(last.stats, len(generated))
                sender.send(self._response(generated, [], last), flags=final)
        except RequestError as e:
            sender.send(self.pb.InferenceResponse(error=io.bad_request(self.pb, e)), flags=final)
        except Exception as e:  # engine failure: report it, keep serving
            sender.send(self._error(f"{self.name}: {e}"), flags=final)


def settings_parameter(settings: LoopSettings) -> dict[str, str]:
    return {SETTINGS_PARAMETER: settings.model_dump_json()}

