"""Client for a trtspec deployment: HTTP (Triton's generate / generate_stream) or gRPC (streaming API).

Every response carries the token ids it adds, so callers count tokens from ids, not from text chunks.
"""

from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from trtspec.contract import REQUEST_FIELDS, RESPONSE_STATS, field_by_name
from trtspec.contract.models import ENSEMBLE
from trtspec.spec.logprobs import TopLogProbs
from trtspec.spec.metrics import SpecStats

STAT_NAMES = tuple(s.name for s in RESPONSE_STATS)


class ClientError(Exception):
    """The server answered with an error (bad request, model failure) or could not be reached."""


@dataclass
class Chunk:
    text: str
    token_ids: list[int]
    time: float  # perf_counter when the chunk arrived
    stats: SpecStats | None = None  # the request's running statistics (the last chunk's are the final ones)
    log_probs: list[float] | None = None  # the target's, of token_ids (with return_log_probs)
    top: TopLogProbs | None = None  # the target's most likely tokens at token_ids' positions (with top_log_probs)


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    chunks: list[Chunk]
    start: float
    stats: SpecStats

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
        return self.stats.acceptance_rate


def response_stats(values: dict[str, Any]) -> SpecStats | None:
    """The statistics of a response's outputs (name -> array or None); None when it carries none."""
    return SpecStats.from_wire(values) if any(values.get(n) is not None for n in STAT_NAMES) else None


def request_fields(prompt: str, max_tokens: int, stream: bool, **params: Any) -> dict[str, Any]:
    """The request as the text endpoints take it; `params` are other request fields (trtspec.contract), None = unset."""
    fields: dict[str, Any] = {"text_input": prompt, "max_tokens": max_tokens, "stream": stream,
                              "return_perf_metrics": True}
    for name, value in params.items():
        try:
            field_by_name(name)
        except KeyError:
            known = ", ".join(f.name for f in REQUEST_FIELDS)
            raise TypeError(f"unknown request field {name!r}; known: {known}") from None
        if value is not None:
            fields[name] = value
    return fields


class Client:
    """One deployment endpoint. `model` is `ensemble` (speculative) or `baseline` (target only)."""

    def __init__(self, url: str = "localhost:8000", protocol: str = "http", model: str = ENSEMBLE,
                 timeout: float = 600):
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be http or grpc, got {protocol!r}")
        self.url = url.removeprefix("http://").removeprefix("https://")
        self.protocol, self.model, self.timeout = protocol, model, timeout

    def generate(self, prompt: str, max_tokens: int = 64, stream: bool = False, **params: Any) -> Generation:
        start = time.perf_counter()
        chunks = list(self.stream(prompt, max_tokens, stream=stream, **params))
        stats = next((c.stats for c in reversed(chunks) if c.stats is not None), SpecStats())
        return Generation(
            "".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids], chunks, start, stats
        )

    def stream(self, prompt: str, max_tokens: int = 64, stream: bool = True, **params: Any) -> Iterator[Chunk]:
        fields = request_fields(prompt, max_tokens, stream, **params)
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
                yield _chunk(json.loads(resp.read()), fields.get("top_log_probs", 0))
                return
            for raw in resp:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                body = json.loads(line[5:])
                if "error" in body:
                    raise ClientError(body["error"])
                yield _chunk(body, fields.get("top_log_probs", 0))
            # iterating a chunked response also ends quietly when the connection is cut (a server that died
            # mid-stream); only a stream that had its last chunk leaves http.client's chunk_left at None
            if resp.chunked and resp.chunk_left is not None:
                raise ClientError(f"{self.model}: the server closed the stream before its end")

    # ------------------------------------------------------------------ gRPC

    def _grpc(self, fields: dict[str, Any]) -> Iterator[Chunk]:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        inputs = grpc_inputs(fields)
        results: "queue.Queue[Any]" = queue.Queue()
        client = grpcclient.InferenceServerClient(self.url)
        try:
            client.start_stream(callback=lambda result, error: results.put((result, error, time.perf_counter())))
            client.async_stream_infer(self.model, inputs, enable_empty_final_response=True)
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
def grpc_inputs(fields: dict[str, Any]) -> list[Any]:
    """Request fields (see `request_fields`) as gRPC InferInputs (also what tritonclient.grpc.aio takes)."""
    return [infer_input(name, np.array([value if isinstance(value, list) else [value]],
                                       dtype=field_by_name(name).numpy))
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
    values = {name: result.as_numpy(name) for name in ("text_output", "output_ids", *STAT_NAMES)}
    text = values.pop("text_output").reshape(-1)[0]
    return Chunk(
        text.decode("utf-8") if isinstance(text, bytes) else str(text),
        [int(x) for x in np.asarray(values.pop("output_ids")).reshape(-1)],
        t,
        response_stats(values),
        log_probs(result.as_numpy("output_log_probs")),
        top_log_probs(result.as_numpy),
    )


def log_probs(value: Any) -> list[float] | None:
    """output_log_probs of a response ([beam, tokens], beam 1) as a list; None when it has none."""
    return None if value is None else [float(x) for x in np.asarray(value, dtype=np.float64).reshape(-1)]


def top_log_probs(get: Any) -> TopLogProbs | None:
    """output_top_ids and output_top_log_probs of a response (`get(name)`: the output or None) as TopLogProbs."""
    ids, lps = get("output_top_ids"), get("output_top_log_probs")
    if ids is None or lps is None:
        return None
    ids, lps = np.asarray(ids, dtype=np.int32), np.asarray(lps, dtype=np.float32)
    n = ids.shape[-1] if ids.ndim else 0
    return TopLogProbs(ids.reshape(-1, n), lps.reshape(-1, n))


def _chunk(body: dict[str, Any], top_n: int = 0) -> Chunk:
    """`top_n`: the request's top_log_probs (Triton's generate endpoint flattens the [tokens, N] outputs)."""
    ids = body.get("output_ids", [])
    ids = ids if isinstance(ids, list) else [ids]
    top = top_log_probs(lambda k: None if k not in body else np.asarray(body[k]).reshape(-1, top_n)) if top_n else None
    return Chunk(body.get("text_output", ""), [int(x) for x in np.asarray(ids).reshape(-1)], time.perf_counter(),
                 response_stats(body),
                 log_probs(body.get("output_log_probs")), top)


def _http_error(e: urllib.error.HTTPError) -> str:
    """Triton's error message: a JSON body, or for generate_stream one server-sent event (`data: {...}`)."""
    try:
        body = e.read().decode("utf-8", errors="replace").strip()
        return json.loads(body.removeprefix("data:")).get("error", str(e))
    except Exception:
        return str(e)
