"""Requests to a deployment's engine models (`tensorrt_llm`, `tensorrt_llm_draft`), which are decoupled as NVIDIA's
tensorrt_llm model with decoupled_mode true: Triton serves them over gRPC's stream only (its HTTP and unary gRPC
endpoints refuse a decoupled model)."""

from __future__ import annotations

import queue
from typing import Sequence

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype


def inputs(tensors: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    out = []
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        i = grpcclient.InferInput(name, list(arr.shape), "BYTES" if arr.dtype == np.object_ else np_to_triton_dtype(arr.dtype))
        i.set_data_from_numpy(arr)
        out.append(i)
    return out


def responses(url: str, model: str, request: Sequence[grpcclient.InferInput], outputs: Sequence[str] | None = None,
              timeout: float = 300.0) -> list[grpcclient.InferResult]:
    """Every response of one request, in order, to the final one (a response that is only the final flag left
    out). Raises the server's InferenceServerException for an error response."""
    got: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(lambda result, error: got.put((result, error)))
        try:
            client.async_stream_infer(
                model, list(request), enable_empty_final_response=True,
                outputs=None if outputs is None else [grpcclient.InferRequestedOutput(n) for n in outputs])
            out = []
            while True:
                result, error = got.get(timeout=timeout)
                if error is not None:
                    raise error
                response = result.get_response()
                if response.outputs:
                    out.append(result)
                if response.parameters["triton_final_response"].bool_param:
                    return out
        finally:
            client.stop_stream()


def infer(url: str, model: str, request: Sequence[grpcclient.InferInput], outputs: Sequence[str] | None = None,
          ) -> grpcclient.InferResult | None:
    """A request that is not streamed: its one answer (None: an answer without outputs, e.g. to `stop`)."""
    out = responses(url, model, request, outputs)
    if len(out) > 1:
        raise AssertionError(f"{model} answered a request that is not streamed with {len(out)} responses")
    return out[0] if out else None


__all__ = ["InferenceServerException", "infer", "inputs", "responses"]
