"""Reference engine: serves a Hugging Face causal LM with the tensor contract of the tensorrtllm backend.

The speculative loop cannot tell this model from a TensorRT-LLM engine: same tensor names, dtypes and
semantics (draft_input_ids verified in one forward pass, accepted prefix + one token returned, prefix
KV-cache reuse). The logic lives in trtspec.reference_engine; this file only moves tensors.
"""

import os

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
        self.engine = ReferenceEngine(
            params["checkpoint"],
            device=params.get("device", "auto"),
            dtype=params.get("dtype", "float32"),
            cache_entries=int(params.get("kv_cache_entries", "16")),
            salt=sum(args["model_name"].encode()),
            use_draft_vocab=params.get("use_draft_vocab", "false").lower() == "true",
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._run(request))
            except RequestTensorError as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
            except Exception as e:  # the model must stay up whatever one request does
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"reference engine: {e!r}")))
        return responses

    def _run(self, request):
        get = lambda name: io.tensor(pb_utils, request, name)  # noqa: E731
        result = self.engine.run(request_from_tensors(get, self.max_input_len))
        perf = io.scalar(pb_utils, request, "return_perf_metrics", False)
        tensors = result_tensors(result, bool(perf))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()])
