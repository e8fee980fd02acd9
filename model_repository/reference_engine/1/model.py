"""Reference engine: serves a Hugging Face causal LM with the tensor contract of the tensorrtllm backend.

The speculative loop cannot tell this model from a TensorRT-LLM engine: it declares exactly the inputs and
outputs of NVIDIA's `tensorrt_llm` model for the deployment's TensorRT-LLM version (trtspec.contract.nvidia)
and gives them the executor's meaning. The logic (request parsing, refusals, outputs) lives in
trtspec.reference_engine; this file moves tensors.
"""

import os
import time

import triton_python_backend_utils as pb_utils

# importing trtspec sets OMP_WAIT_POLICY=PASSIVE before torch loads (see trtspec/__init__.py)
from trtspec import triton_io as io
from trtspec.reference_engine import ReferenceEngine, RequestTensorError, request_from_tensors, result_tensors


class TritonPythonModel:
    def initialize(self, args):
        params = io.model_parameters(args)
        threads = int(os.environ.get("TRTSPEC_TORCH_THREADS", "0"))
        if threads > 0:  # several servers or models sharing few cores: oversubscribed OpenMP is very slow
            import torch

            torch.set_num_threads(threads)
        self.max_input_len = int(params.get("max_input_len", "0")) or None
        self.exclude_input_default = params.get("exclude_input_in_output", "false").lower() == "true"
        self.engine = ReferenceEngine(
            params["checkpoint"],
            device=params.get("device", "auto"),
            dtype=params.get("dtype", "float32"),
            cache_entries=int(params.get("kv_cache_entries", "16")),
            cache_bytes=int(params["kv_cache_max_bytes"]) if "kv_cache_max_bytes" in params else None,
            salt=sum(args["model_name"].encode()),
            use_draft_vocab=params.get("use_draft_vocab", "false").lower() == "true",
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            arrival = time.monotonic_ns()
            try:
                responses.append(self._run(request, arrival))
            except RequestTensorError as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
            except Exception as e:  # the model must stay up whatever one request does
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"reference engine: {e!r}")))
        return responses

    def _run(self, request, arrival):
        get = lambda name: io.tensor(pb_utils, request, name)  # noqa: E731
        req = request_from_tensors(get, self.max_input_len)
        if req is None:  # a `stop` request
            return pb_utils.InferenceResponse(output_tensors=[])
        scheduled = time.monotonic_ns()
        result = self.engine.run(req)
        tensors = result_tensors(result, get, self.exclude_input_default, arrival, scheduled)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()])
