"""Reference engine: serves a Hugging Face causal LM with the tensor contract of the tensorrtllm backend.

The speculative loop cannot tell this model from a TensorRT-LLM engine: it declares exactly the inputs and
outputs of NVIDIA's `tensorrt_llm` model for the deployment's TensorRT-LLM version (trtspec.contract.nvidia)
and gives them the executor's meaning. The logic lives in trtspec.reference_engine; this file moves tensors
and returns outputs the way the C++ backend's fillTritonResponse does (model_instance_state.cc): a requested
output the request did not enable (log probs, logits, perf metrics, token counts) is left out, not zeroed;
batch_index / sequence_index only exist for batches / several sequences, which this model does not serve.
"""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

# importing trtspec sets OMP_WAIT_POLICY=PASSIVE before torch loads (see trtspec/__init__.py)
from trtspec import triton_io as io
from trtspec.reference_engine import DEFAULTS, UNSUPPORTED_INPUTS, EngineRequest, ReferenceEngine
from trtspec.speculative import SamplingParams


def _t(name, value, dtype):
    return pb_utils.Tensor(name, np.asarray(value, dtype=dtype))


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
            salt=sum(args["model_name"].encode()),
            use_draft_vocab=params.get("use_draft_vocab", "false").lower() == "true",
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            arrival = time.monotonic_ns()
            try:
                responses.append(self._run(request, arrival))
            except (io.RequestError, ValueError) as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
            except Exception as e:  # the model must stay up whatever one request does
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"reference engine: {e!r}")))
        return responses

    @staticmethod
    def _refuse_unsupported(request, get):
        for name, what in UNSUPPORTED_INPUTS.items():
            if io.tensor(pb_utils, request, name) is not None:
                raise io.RequestError(f"{name}: {what} are not supported by the reference engine; leave {name} out")
        for name, default in DEFAULTS.items():
            v = get(name)
            if v is not None and not np.isclose(float(v), default):
                raise io.RequestError(
                    f"{name}={v}: the reference engine only serves {name}={default:g} (TensorRT-LLM's default)"
                )

    def _run(self, request, arrival):
        get = lambda name, default=None: io.scalar(pb_utils, request, name, default)  # noqa: E731
        if get("stop", False):
            # Cancellation (NVIDIA's BLS sends it with requested_output_names=[]): requests run one at a time to
            # completion inside execute(), so nothing of this model is in flight to cancel.
            return pb_utils.InferenceResponse(output_tensors=[])
        if get("streaming", False):
            raise io.RequestError(
                "streaming=true needs a decoupled model; the reference engine (like tensorrt_llm deployed with "
                "decoupled_mode false) answers once: send streaming=false"
            )
        self._refuse_unsupported(request, get)
        input_ids = io.ids(pb_utils, request, "input_ids") or []
        input_ids = input_ids[: int(get("input_lengths", len(input_ids)))]
        if not input_ids:
            raise io.RequestError("input_ids is empty")
        if self.max_input_len and len(input_ids) > self.max_input_len:
            raise io.RequestError(f"input length {len(input_ids)} exceeds max_input_len {self.max_input_len}")
        output_len = int(get("request_output_len", 0))
        if output_len <= 0:
            raise io.RequestError(f"request_output_len must be > 0, got {output_len}")
        draft_logits = io.tensor(pb_utils, request, "draft_logits")
        if draft_logits is not None:
            draft_logits = draft_logits.reshape(-1, draft_logits.shape[-1])
        bias = io.tensor(pb_utils, request, "embedding_bias")
        top_p = float(get("runtime_top_p", 0.0))
        scheduled = time.monotonic_ns()
        req = EngineRequest(
            input_ids=input_ids,
            output_len=output_len,
            draft_ids=io.ids(pb_utils, request, "draft_input_ids") or None,
            draft_logits=draft_logits,
            end_id=get("end_id"),
            sampling=SamplingParams(
                temperature=float(get("temperature", 0.0)),
                top_k=int(get("runtime_top_k", 0)),
                top_p=top_p if top_p > 0 else 1.0,
            ),
            seed=get("seed", get("random_seed")),  # the name depends on the TensorRT-LLM version (contract data)
            min_tokens=int(get("min_tokens", get("min_length", 0))),
            stop_words=io.words_list(io.tensor(pb_utils, request, "stop_words_list")),
            bad_words=io.words_list(io.tensor(pb_utils, request, "bad_words_list")),
            embedding_bias=None if bias is None else bias.reshape(-1).astype(np.float32),
            repetition_penalty=get("repetition_penalty"),
            presence_penalty=get("presence_penalty"),
            frequency_penalty=get("frequency_penalty"),
            return_generation_logits=bool(get("return_generation_logits", False)),
            return_context_logits=bool(get("return_context_logits", False)),
            return_log_probs=bool(get("return_log_probs", False)),
        )
        result = self.engine.run(req)
        exclude = bool(get("exclude_input_in_output", self.exclude_input_default))
        tokens = np.asarray(result.new_tokens if exclude else result.tokens, dtype=np.int32)
        out = [_t("output_ids", tokens.reshape(1, 1, -1), np.int32), _t("sequence_length", [[len(tokens)]], np.int32)]
        if result.generation_logits is not None:
            out.append(_t("generation_logits", result.generation_logits[None, None], np.float32))
        if result.context_logits is not None:
            out.append(_t("context_logits", result.context_logits[None], np.float32))
        if result.log_probs is not None:
            out += [
                _t("output_log_probs", np.reshape(result.log_probs, (1, 1, -1)), np.float32),
                _t("cum_log_probs", [[sum(result.log_probs)]], np.float32),
            ]
        if get("return_perf_metrics", False):
            k, a = result.num_draft_tokens, result.num_accepted
            new_blocks, reused_blocks, total_blocks = result.kv_blocks()
            for name, value, dtype in (
                ("kv_cache_alloc_new_blocks", new_blocks, np.int32),
                ("kv_cache_reused_blocks", reused_blocks, np.int32),
                ("kv_cache_alloc_total_blocks", total_blocks, np.int32),
                ("arrival_time_ns", arrival, np.int64),
                ("first_scheduled_time_ns", scheduled, np.int64),
                ("first_token_time_ns", result.first_token_ns, np.int64),
                ("last_token_time_ns", result.last_token_ns, np.int64),
                ("acceptance_rate", a / k if k else 0.0, np.float32),
                ("total_accepted_draft_tokens", a, np.int32),
                ("total_draft_tokens", k, np.int32),
            ):
                out.append(_t(name, [[value]], dtype))
        if get("return_num_input_tokens", False):
            out.append(_t("num_input_tokens", [[result.input_len]], np.int32))
        if get("return_num_output_tokens", False):
            out.append(_t("num_output_tokens", [[len(result.new_tokens)]], np.int32))
        return pb_utils.InferenceResponse(output_tensors=out)
