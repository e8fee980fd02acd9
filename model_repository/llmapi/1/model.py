"""The llmapi flavour's endpoint: TensorRT-LLM's LLM API (PyTorch backend; or trtspec's CPU stand-in) in a
decoupled Python model with the `ensemble` endpoint's request and response names. Streams, stops a request
whose client went away (abort), reports acceptance per response and in Prometheus. The LLM arguments are the
model.yaml next to this file; the logic is in trtspec.llmapi; this file moves tensors."""

import asyncio
import threading
from pathlib import Path

import triton_python_backend_utils as pb_utils
import yaml

from trtspec import triton_io as io
from trtspec.llmapi import serving
from trtspec.llmapi.parser import MAX_DRAFT_LEN
from trtspec.llmapi.seam import load_api, load_guided_params
from trtspec.spec.metrics import PrometheusExporter

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_LISTS = ("stop_words", "bad_words")


class TritonPythonModel:
    def initialize(self, args):
        doc = yaml.safe_load((Path(__file__).parent / "model.yaml").read_text())
        doc.pop("triton_config", None)
        self.max_k = int((doc.get("speculative_config") or {}).get(MAX_DRAFT_LEN) or 0)
        LLM, self.SamplingParams, self.implementation, parse = load_api()
        self.GuidedDecodingParams = load_guided_params()
        self.guided_refused = io.model_parameters(args).get(serving.GUIDED_REFUSAL) or None
        # as NVIDIA's llmapi model and trtllm-serve do: the YAML goes through update_llm_args_with_extra_dict
        self.llm = LLM(**parse({}, doc))
        label = io.model_parameters(args).get("metrics_label") or args["model_name"]
        self.metrics = PrometheusExporter(pb_utils, label)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def execute(self, requests):
        for request in requests:
            asyncio.run_coroutine_threadsafe(self._serve(request), self.loop)
        return None

    def finalize(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        shutdown = getattr(self.llm, "shutdown", None)
        if shutdown:
            shutdown()

    def _get(self, request, name):
        if name in _LISTS:
            a = io.tensor(pb_utils, request, name)
            return None if a is None else [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in a.reshape(-1)]
        return io.scalar(pb_utils, request, name)

    @staticmethod
    def _response(text, ids, stats):
        tensors = serving.response_tensors(text, ids, stats)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()])

    async def _serve(self, request):
        sender = request.get_response_sender()
        try:
            parsed = serving.parse(lambda name: self._get(request, name), self.max_k, self.guided_refused)
            sampling = dict(parsed.sampling)
            if "guided_decoding" in sampling:
                sampling["guided_decoding"] = self.GuidedDecodingParams(**sampling["guided_decoding"])
            params = self.SamplingParams(**sampling)
            output = None
            # always streamed internally: a step at a time is where a disconnected client is noticed
            async for result in self.llm.generate_async(parsed.prompt, params, streaming=True):
                output = result.outputs[0]
                if sender.is_cancelled():
                    result.abort()
                    break
                if parsed.streaming and output.token_ids_diff and not result.finished:
                    stats = serving.stats_of(output, self.max_k)
                    sender.send(self._response(output.text_diff, output.token_ids_diff, stats))
            if output is None:
                raise RuntimeError("the LLM produced no output")
            stats = serving.stats_of(output, self.max_k)
            self.metrics.record(stats, len(output.token_ids))  # before the final response: scrapes see it
            if sender.is_cancelled():
                sender.send(flags=_FINAL)
            elif parsed.streaming:
                sender.send(self._response(output.text_diff, output.token_ids_diff, stats), flags=_FINAL)
            else:
                sender.send(self._response(output.text, output.token_ids, stats), flags=_FINAL)
        except serving.RequestError as e:
            sender.send(pb_utils.InferenceResponse(error=io.error(pb_utils, e)), flags=_FINAL)
        except Exception as e:  # the model stays up whatever one request does
            msg = f"llmapi ({self.implementation}): {type(e).__name__}: {e}"
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(msg)), flags=_FINAL)
