"""Reference engine: serves a Hugging Face causal LM with the tensor contract of the tensorrtllm backend.

The speculative loop cannot tell this model from a TensorRT-LLM engine: it declares exactly the inputs and
outputs of NVIDIA's `tensorrt_llm` model for the deployment's TensorRT-LLM version (trtspec.contract.nvidia)
and gives them the executor's meaning. The logic (request parsing, refusals, outputs) lives in
trtspec.reference_engine; this file moves tensors.
"""

import time

import triton_python_backend_utils as pb_utils

# importing trtspec sets OMP_WAIT_POLICY=PASSIVE before torch loads (see trtspec/__init__.py)
from trtspec import log_to_stderr
from trtspec import triton_io as io
from trtspec.reference_engine.batching import BatchScheduler, QueueFull
from trtspec.medusa import from_pbtxt
from trtspec.spec.metrics import EngineGauges
from trtspec.reference_engine import ReferenceEngine, RequestTensorError, request_from_tensors, result_tensors
from trtspec.reference_engine.tensor_io import token_tensors
from trtspec.reference_engine.device import serving_threads


class TritonPythonModel:
    """Decoupled, like tensorrt_llm with decoupled_mode true: execute() does not wait, it hands each request to the
    engine's scheduler and returns, and the scheduler thread answers through the request's response sender as soon
    as that request is done (one response, FINAL flag), so a request joins the running batch at the next step,
    whoever sent it, as on TensorRT-LLM's executor. With streaming=true each step's new tokens go out as they are
    known, and the final response carries the rest (the executor's streamed responses, llmRequest.cpp createResult)."""

    def initialize(self, args):
        log_to_stderr()  # into the server log
        params = io.model_parameters(args)
        threads = serving_threads(params.get("device", "auto"))
        if threads is not None:  # engines sharing few cores: oversubscribed OpenMP pools are very slow
            import torch

            torch.set_num_threads(threads)
        self.max_input_len = int(params.get("max_input_len", "0")) or None
        self.exclude_input_default = params.get("exclude_input_in_output", "false").lower() == "true"
        engine = ReferenceEngine(
            params["checkpoint"],
            device=params.get("device", "auto"),
            dtype=params.get("dtype", "float32"),
            cache_entries=int(params.get("kv_cache_entries", "16")),
            cache_bytes=int(params["kv_cache_max_bytes"]) if "kv_cache_max_bytes" in params else None,
            cache_tokens=int(params.get("kv_cache_max_tokens", "0")) or None,
            salt=sum(args["model_name"].encode()),
            use_draft_vocab=params.get("use_draft_vocab", "false").lower() == "true",
            eagle3_head=params.get("eagle3_head") or None,
            medusa_heads=params.get("medusa_heads") or None,
            medusa_choices=from_pbtxt(params["medusa_choices"]) if params.get("medusa_choices") else None,
            linear_kernels=params.get("linear_kernels", "auto"),
            kernel_dir=params.get("kernel_dir") or None,
            # NVIDIA's tensorrt_llm parameters for guided decoding (trtspec.guided)
            xgrammar_tokenizer_info=params.get("xgrammar_tokenizer_info_path") or None
            if params.get("guided_decoding_backend") == "xgrammar" else None,
        )
        head = engine.eagle3.work if engine.eagle3 is not None else None
        tree = engine.medusa_tree
        self.gauges = EngineGauges(pb_utils, args["model_name"], head_work=list(head.as_dict()) if head else (),
                                   tree_nodes=len(tree) if tree is not None else None)

        def on_forward(ns):  # before the step's finished requests are answered: their head work is counted
            self.gauges.busy(ns)
            if head is not None:
                self.gauges.head_work(head.as_dict())
            if tree is not None:
                self.gauges.tree_steps(engine.medusa_work.sizes)

        self.scheduler = BatchScheduler(
            engine,
            max_batch_size=int(params.get("max_batch_size", "8")),
            max_num_tokens=int(params.get("max_num_tokens", "2048")),
            max_queue_size=int(params.get("max_queue_size", "0")),
            on_step=self.gauges.update,
            on_forward=on_forward,
        )

    def execute(self, requests):
        for request in requests:
            arrival = time.monotonic_ns()
            sender = request.get_response_sender()
            try:
                self._submit(request, sender, arrival)
            except (RequestTensorError, QueueFull) as e:  # QueueFull: encoded as overloaded (trtspec.contract.errors)
                _send(sender, pb_utils.InferenceResponse(error=io.error(pb_utils, e)))
            except Exception as e:  # the model must stay up whatever one request does
                _send(sender, pb_utils.InferenceResponse(error=pb_utils.TritonError(f"reference engine: {e!r}")))
        return None

    def _submit(self, request, sender, arrival):
        get = lambda name: io.tensor(pb_utils, request, name)  # noqa: E731
        req = request_from_tensors(get, self.max_input_len)
        if req is None:  # a `stop` request
            _send(sender, pb_utils.InferenceResponse(output_tensors=[]))
            return
        scheduled = time.monotonic_ns()
        sent = [0] if req.streaming else None  # streamed: the new tokens earlier responses carried

        if sent is not None:
            def on_tokens(tokens):  # on the scheduler thread, each step's tokens as they are known
                sent[0] += len(tokens)
                sender.send(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(k, v) for k, v in token_tensors(tokens).items()]))

            req.on_tokens = on_tokens

        def answer(future):  # on the scheduler thread, as soon as this request is done
            try:
                tensors = result_tensors(future.result(), get, self.exclude_input_default, arrival, scheduled,
                                         streamed_tokens=None if sent is None else sent[0])
                response = pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()])
            except Exception as e:
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"reference engine: {e!r}"))
            _send(sender, response)

        self.scheduler.submit(req).add_done_callback(answer)

    def finalize(self):
        self.scheduler.close()


def _send(sender, response):
    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
