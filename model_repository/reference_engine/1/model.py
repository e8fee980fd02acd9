"""Reference engine: serves a Hugging Face causal LM with the tensor contract of the tensorrtllm backend.

The speculative loop cannot tell this model from a TensorRT-LLM engine: same tensor names, dtypes and
semantics (draft_input_ids verified in one forward pass, accepted prefix + one token returned, prefix
KV-cache reuse). The logic lives in trtspec.reference_engine; this file only moves tensors.
"""

import os

import numpy as np
import triton_python_backend_utils as pb_utils

# importing trtspec sets OMP_WAIT_POLICY=PASSIVE before torch loads (see trtspec/__init__.py)
from trtspec import triton_io as io
from trtspec.reference_engine import EngineRequest, ReferenceEngine
from trtspec.speculative import SamplingParams


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
            except io.RequestError as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
            except Exception as e:  # the model must stay up whatever one request does
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"reference engine: {e!r}")))
        return responses

    def _run(self, request):
        get = lambda name, default=None: io.scalar(pb_utils, request, name, default)  # noqa: E731
        input_ids = io.ids(pb_utils, request, "input_ids") or []
        n = get("input_lengths", len(input_ids))
        input_ids = input_ids[: int(n)]
        if not input_ids:
            raise io.RequestError("input_ids is empty")
        if self.max_input_len and len(input_ids) > self.max_input_len:
            raise io.RequestError(f"input length {len(input_ids)} exceeds max_input_len {self.max_input_len}")
        output_len = int(get("request_output_len", 0))
        draft_ids = io.ids(pb_utils, request, "draft_input_ids")
        if output_len <= 0:
            raise io.RequestError(f"request_output_len must be > 0, got {output_len}")
        draft_logits = io.tensor(pb_utils, request, "draft_logits")
        if draft_logits is not None:
            draft_logits = draft_logits.reshape(-1, draft_logits.shape[-1])
        top_p = float(get("runtime_top_p", 0.0))
        req = EngineRequest(
            input_ids=input_ids,
            output_len=output_len,
            draft_ids=draft_ids or None,
            draft_logits=draft_logits,
            end_id=get("end_id"),
            sampling=SamplingParams(
                temperature=float(get("temperature", 0.0)),
                top_k=int(get("runtime_top_k", 0)),
                top_p=top_p if top_p > 0 else 1.0,
            ),
            seed=get("seed"),
            min_tokens=int(get("min_tokens", 0)),
            stop_words=io.words_list(io.tensor(pb_utils, request, "stop_words_list")),
            bad_words=io.words_list(io.tensor(pb_utils, request, "bad_words_list")),
            return_generation_logits=bool(get("return_generation_logits", False)),
        )
        result = self.engine.run(req)
        tokens = np.asarray(result.tokens, dtype=np.int32)
        out = [
            pb_utils.Tensor("output_ids", tokens.reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
        ]
        if result.generation_logits is not None:
            out.append(pb_utils.Tensor("generation_logits", result.generation_logits[None, None]))
        if get("return_perf_metrics", False):
            k, a = result.num_draft_tokens, result.num_accepted
            out += [
                pb_utils.Tensor("acceptance_rate", np.array([[a / k if k else 0.0]], dtype=np.float32)),
                pb_utils.Tensor("total_accepted_draft_tokens", np.array([[a]], dtype=np.int32)),
                pb_utils.Tensor("total_draft_tokens", np.array([[k]], dtype=np.int32)),
            ]
        return pb_utils.InferenceResponse(output_tensors=out)
