"""Client for a trtspec deployment: HTTP (Triton's generate / generate_stream) or gRPC (streaming API).

Every response carries the token ids it adds, so callers count tokens from ids, not from text chunks.
"""

from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

STAT_FIELDS = (
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "num_iterations",
    "num_drafts",
    "draft_fallbacks",
)
LIST_FIELDS = ("accepted_per_position", "proposed_per_position", "accepted_by_source")


class ClientError(Exception):
    """The server answered with an error (bad request, model failure) or could not be reached."""


@dataclass
class Chunk:
    text: str
    token_ids: list[int]
    time: float  # perf_counter when the chunk arrived
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    chunks: list[Chunk]
    start: float
    stats: dict[str, Any]

    @property
    def ttft(self) -> float:
        first = next((c for c in self.chunks if c.token_ids), None)
        return (first.time if first else self.end) - self.start

    @property
    def end(self) -> float:
        return self.chunks[-1].time if self.chunks else self.start

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def acceptance_rate(self) -> float:
        return float(self.stats.get("acceptance_rate", 0.0))


def _stats(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in STAT_FIELDS:
        if k in values and values[k] is not None:
            v = np.asarray(values[k]).reshape(-1)
            out[k] = float(v[0]) if k == "acceptance_rate" else int(v[0])
    for k in LIST_FIELDS:
        if k in values and values[k] is not None:
            out[k] = [int(x) for x in np.asarray(values[k]).reshape(-1)]
    return out


def _request_fields(
    prompt: str,
    max_tokens: int,
    stream: bool,
    num_draft_tokens: int | None,
    use_draft_logits: bool | None,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    stop_words: list[str] | None,
    bad_words: list[str] | None,
    draft_source: str | None,
    end_id: int | None,
    draft_length_policy: str | None = None,
) -> dict[str, Any]:
    fields: dict[str, Any] = {"text_input": prompt, "max_tokens": max_tokens, "stream": stream, "return_perf_metrics": True}
    optional = {
        "num_draft_tokens": num_draft_tokens,
        "use_draft_logits": use_draft_logits,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "seed": seed,
        "stop_words": stop_words,
        "bad_words": bad_words,
        "draft_source": draft_source,
        "end_id": end_id,
        "draft_length_policy": draft_length_policy,
    }
    fields.update({k: v for k, v in optional.items() if v is not None})
    return fields


class Client:
    """One deployment endpoint. `model` is `ensemble` (speculative) or `baseline` (target only)."""

    def __init__(self, url: str = "localhost:8000", protocol: str = "http", model: str = "ensemble", timeout: float = 600):
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be http or grpc, got {protocol!r}")
        self.url = url.removeprefix("http://").removeprefix("https://")
        self.protocol, self.model, self.timeout = protocol, model, timeout

    def generate(self, prompt: str, max_tokens: int = 64, stream: bool = False, **params: Any) -> Generation:
        start = time.perf_counter()
        chunks = list(self.stream(prompt, max_tokens, stream=stream, **params))
        stats = chunks[-1].stats if chunks else {}
        return Generation(
            "".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids], chunks, start, stats
        )

    def stream(self, prompt: str, max_tokens: int = 64, stream: bool = True, **params: Any) -> Iterator[Chunk]:
        fields = _request_fields(prompt, max_tokens, stream, *(params.pop(k, None) for k in (
            "num_draft_tokens", "use_draft_logits", "temperature", "top_k", "top_p", "seed",
            "stop_words", "bad_words", "draft_source", "end_id", "draft_length_policy")))
        if params:
            raise TypeError(f"unknown parameters: {', '.join(params)}")
        if self.protocol == "http":
            yield from self._http(fields)
        else:
            yield from self._grpc(fields)

    # ------------------------------------------------------------------ HTTP

    def _http(self, fields: dict[str, Any]) -> Iterator[Chunk]:
        path = "generate_stream" if fields["stream"] else "generate"
        req = urllib.request.Request(
            f"http://{self.url}/v2/models/{self.model}/{path}",
            data=json.dumps(fields).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise ClientError(_http_error(e)) from None
        except urllib.error.URLError as e:
            raise ClientError(f"cannot reach {self.url}: {e.reason}") from None
        with resp:
            if not fields["stream"]:
                yield _chunk(json.loads(resp.read()))
                return
            for raw in resp:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                body = json.loads(line[5:])
                if "error" in body:
                    raise ClientError(body["error"])
                yield _chunk(body)

    # ------------------------------------------------------------------ gRPC

    def _grpc(self, fields: dict[str, Any]) -> Iterator[Chunk]:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        results: "queue.Queue[Any]" = queue.Queue()
        client = grpcclient.InferenceServerClient(self.url)
        try:
            client.start_stream(callback=lambda result, error: results.put((result, error, time.perf_counter())))
            client.async_stream_infer(self.model, grpc_inputs(fields), enable_empty_final_response=True)
            while True:
                try:
                    result, error, t = results.get(timeout=self.timeout)
                except queue.Empty:
                    raise ClientError(f"no response from {self.model} within {self.timeout}s") from None
                if error is not None:
                    raise ClientError(str(error.message() if isinstance(error, InferenceServerException) else error))
                chunk = grpc_chunk(result, t)
                if chunk is not None:
                    yield chunk
                final = result.get_response().parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return
        finally:
            client.stop_stream(cancel_requests=True)
            client.close()


# the endpoint's input tensors and their types (an unknown field is a KeyError, i.e. a bug here)
GRPC_DTYPES = {
    "text_input": np.object_, "max_tokens": np.int32, "stream": np.bool_, "return_perf_metrics": np.bool_,
    "num_draft_tokens": np.int32, "use_draft_logits": np.bool_, "temperature": np.float32,
    "top_k": np.int32, "top_p": np.float32, "seed": np.uint64, "stop_words": np.object_,
    "bad_words": np.object_, "draft_source": np.object_, "end_id": np.int32,
    "draft_length_policy": np.object_,
}


def grpc_inputs(fields: dict[str, Any]) -> list[Any]:
    """Request fields (see `_request_fields`) as gRPC InferInputs (also what tritonclient.grpc.aio takes)."""
    return [infer_input(name, np.array([value if isinstance(value, list) else [value]], dtype=GRPC_DTYPES[name]))
            for name, value in fields.items()]


def infer_input(name: str, arr: np.ndarray) -> Any:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    if arr.dtype == np.object_:
        arr = np.vectorize(lambda s: s.encode("utf-8") if isinstance(s, str) else s, otypes=[np.object_])(arr)
    t = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
    t.set_data_from_numpy(arr)
    return t


def grpc_chunk(result: Any, t: float) -> Chunk | None:
    """One gRPC InferResult as a Chunk; None for an empty (final-flag only) response."""
    if result.as_numpy("text_output") is None:
        return None
    values = {name: result.as_numpy(name) for name in ("text_output", "output_ids", *STAT_FIELDS, *LIST_FIELDS)}
    text = values.pop("text_output").reshape(-1)[0]
    return Chunk(
        text.decode("utf-8") if isinstance(text, bytes) else str(text),
        [int(x) for x in np.asarray(values.pop("output_ids")).reshape(-1)],
        t,
        _stats(values),
    )


def _chunk(body: dict[str, Any]) -> Chunk:
    ids = body.get("output_ids", [])
    ids = ids if isinstance(ids, list) else [ids]
    return Chunk(body.get("text_output", ""), [int(x) for x in np.asarray(ids).reshape(-1)], time.perf_counter(), _stats(body))


def _http_error(e: urllib.error.HTTPError) -> str:
    try:
        return json.loads(e.read()).get("error", str(e))
    except Exception:
        return str(e)
