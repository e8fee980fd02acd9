"""The OpenAI server's view of a deployment: what its repository says (name, limits, tokenizer), and requests
to it over gRPC streaming (asyncio).

Requests go to the loop models the `ensemble` (speculative) and `baseline` (target only) endpoints run, with the
ensemble's pre- and postprocessing done here with the same tokenizer and the same code: Triton does not cancel
the running step of an ensemble when its client goes away (it checks only between steps), while the loop,
called directly, sees the cancellation and stops. It also gives the prompt's token count for free.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

import numpy as np

from trtspec.client import STAT_NAMES, Chunk, infer_input, log_probs, response_stats, top_log_probs
from trtspec.contract import REQUEST_FIELDS, RequestError, field_by_name
from trtspec.contract.errors import ErrorKind, decode
from trtspec.contract.limits import RequestLimits
from trtspec.spec.loop import SETTINGS_PARAMETER, LoopSettings
from trtspec.openai.protocol import OpenAIError
from trtspec.contract.models import BASELINE, ENSEMBLE, LOOP, LOOP_OF, POSTPROCESSING, PREPROCESSING
from trtspec.repository import list_models
from trtspec.text import TextCodec
from trtspec.openai.structured import Tool, with_tool_prompt
from trtspec.triton_io import to_words_list


class DeploymentError(Exception):
    """The repository is not a trtspec deployment the OpenAI server can front; the message says why."""


def deployment_name(repo: Path) -> str:
    """The build config's name: `trtspec build` writes it to manifest.json beside model_repository/; a
    repository written another way is named after the folder that holds it."""
    repo = Path(repo).resolve()
    try:
        name = json.loads((repo.parent / "manifest.json").read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        name = None
    return str(name or repo.parent.name or repo.name)


@dataclass(frozen=True)
class Deployment:
    name: str
    limits: RequestLimits  # the loop's: prompt + max_tokens, draft tokens per call
    tokenizer_dir: str
    add_special_tokens: bool  # what preprocessing does when it tokenizes text_input
    skip_special_tokens: bool  # what postprocessing does when it detokenizes
    loops: dict[str, str]  # endpoint (ensemble, baseline) -> the loop model its middle step runs
    loop_inputs: dict[str, str]  # endpoint request field -> the loop's input it maps to (top_k -> runtime_top_k)

    @classmethod
    def from_repository(cls, repo: Path, name: str | None = None) -> "Deployment":
        models = list_models(repo)
        missing = [m for m in (ENSEMBLE, BASELINE, LOOP, PREPROCESSING, POSTPROCESSING) if m not in models]
        if missing:
            raise DeploymentError(f"{repo} has no {', '.join(missing)} model: the OpenAI server needs a repository "
                                  "written by `trtspec build`")

        def params(model: str) -> dict[str, str]:
            return {k: v.string_value for k, v in models[model].parameters.items()}

        loop, pre, post = params(LOOP), params(PREPROCESSING), params(POSTPROCESSING)
        settings = LoopSettings.model_validate_json(loop[SETTINGS_PARAMETER])
        return cls(
            name=name or deployment_name(repo),
            limits=settings.limits,
            tokenizer_dir=pre["tokenizer_dir"],
            add_special_tokens=pre.get("add_special_tokens", "false").lower() == "true",
            skip_special_tokens=post.get("skip_special_tokens", "true").lower() == "true",
            loops=dict(LOOP_OF),
            loop_inputs={f.name: f.loop_input for f in REQUEST_FIELDS if f.loop_input is not None},
        )

    @property
    def models(self) -> dict[str, str]:
        """OpenAI model name -> Triton endpoint: an A/B is two model names."""
        return {self.name: ENSEMBLE, f"{self.name}-baseline": BASELINE}


class TritonBackend:
    def __init__(self, deployment: Deployment, grpc_url: str) -> None:
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise DeploymentError("the OpenAI API needs transformers (the target's chat template and token "
                                  "counts): pip install transformers") from None

        self.deployment, self.grpc_url = deployment, grpc_url
        try:  # the tokenizer code the text endpoints use (trtspec.text), with this deployment's settings
            self.codec = TextCodec(deployment.tokenizer_dir, add_special_tokens=deployment.add_special_tokens,
                                   skip_special_tokens=deployment.skip_special_tokens)
        except (OSError, ValueError) as e:
            raise DeploymentError(f"cannot load the target tokenizer from {deployment.tokenizer_dir} "
                                  f"(the preprocessing model's tokenizer_dir): {e}") from None
        self.tokenizer = self.codec.tokenizer
        self._client: Any = None

    # the grpc.aio channel belongs to the event loop that serves requests: opened and closed by the app
    async def open(self) -> None:
        import tritonclient.grpc.aio as grpcaio

        self._client = grpcaio.InferenceServerClient(self.grpc_url)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def encode(self, text: str) -> list[int]:
        """What preprocessing does to text_input."""
        return self.tokenizer.encode(text, add_special_tokens=self.deployment.add_special_tokens)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[Tool] | None = None) -> str:
        """The target's chat template with the assistant's turn opened. Its special tokens (BOS) are in the text,
        and preprocessing adds none of its own unless add_special_tokens is set: then the template's BOS is
        dropped here so that it is not doubled. `tools` are rendered by the template (its `tools` variable), or,
        where the template has none, described in a system message."""
        kwargs: dict[str, Any] = {}
        if tools:
            if "tools" in (self.tokenizer.chat_template or ""):
                kwargs["tools"] = [t.model_dump(exclude_none=True) for t in tools]
            else:
                messages = with_tool_prompt(messages, tools)
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        except Exception as e:  # noqa: BLE001 - jinja's TemplateError, or ValueError: no chat template
            raise OpenAIError(400, f"the model's chat template cannot render these messages: {e}",
                              param="messages") from None
        bos = self.tokenizer.bos_token
        if self.deployment.add_special_tokens and bos and text.startswith(bos):
            text = text[len(bos):]
        return text

    def generate(self, endpoint: str, prompt_ids: list[int], fields: dict[str, Any]) -> "TritonStream":
        """The responses of one request to `endpoint` (ensemble or baseline), streamed; `fields` are the endpoint's
        request fields other than text_input and max_tokens. `cancel()` ends the request in Triton."""
        fields = dict(fields)
        stops = fields.pop("stop_words", None) or []
        end_id, pad_id = fields.pop("end_id", self.codec.end_id), self.codec.pad_id
        i32 = lambda v: np.array([[-1 if v is None else v]], dtype=np.int32)  # noqa: E731
        inputs = [
            infer_input("input_ids", np.array([prompt_ids], dtype=np.int32)),
            infer_input("input_lengths", i32(len(prompt_ids))),
            infer_input("request_output_len", i32(fields.pop("max_tokens"))),
            infer_input("end_id", i32(end_id)),
            infer_input("pad_id", i32(pad_id)),
        ]
        if stops:  # as the text endpoints make them
            try:
                words = self.codec.encode_words(stops, "stop")
            except RequestError as e:
                raise OpenAIError(400, str(e), param="stop") from None
            inputs.append(infer_input("stop_words_list", to_words_list(words)))
        for name, value in fields.items():
            value = np.array([[value]], dtype=field_by_name(name).numpy)
            inputs.append(infer_input(self.deployment.loop_inputs[name], value))

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": self.deployment.loops[endpoint], "inputs": inputs}

        # one request per stream: Triton ends the stream once the request's last response is sent
        return TritonStream(self._client.stream_infer(one_request()), self.grpc_url, self.detokenize)

    def detokenize(self, prefix: list[int], new: list[int]) -> str:
        """What postprocessing does to a streamed response."""
        return self.codec.decode_chunk(prefix, new)


class TritonStream:
    """Chunks of one request. `cancel()` is synchronous, so it also runs in a task being cancelled (a client
    that went away): it cancels the gRPC call, Triton cancels the request and the loop stops generating."""

    def __init__(self, responses: Any, url: str, detokenize: Any) -> None:
        self._responses, self._url, self._detokenize = responses, url, detokenize

    def __aiter__(self) -> "TritonStream":
        return self

    async def __anext__(self) -> Chunk:
        import grpc
        from tritonclient.utils import InferenceServerException

        while True:
            try:
                result, error = await self._responses.__anext__()
            except InferenceServerException as e:
                raise openai_error(e.message()) from None
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    raise unavailable(f"lost the connection to Triton at {self._url}: {e.details()}") from None
                raise OpenAIError(500, f"Triton at {self._url}: {e.details()}") from None
            if error is not None:
                raise openai_error(error.message())
            t = time.perf_counter()
            if result.as_numpy("output_ids") is None:
                continue  # an empty final response
            ids, prefix = ([int(x) for x in result.as_numpy(n).reshape(-1)] for n in ("output_ids", "prefix_ids"))
            stats = response_stats({k: result.as_numpy(k) for k in STAT_NAMES})
            return Chunk(self._detokenize(prefix, ids), ids, t, stats, log_probs(result.as_numpy("output_log_probs")),
                         top_log_probs(result.as_numpy))

    def cancel(self) -> None:
        self._responses.cancel()


#: what a client is told to wait before it retries a request that met a dead model process
RETRY_AFTER_S = 5


def unavailable(message: str) -> OpenAIError:
    """A retryable failure: 503 with Retry-After."""
    return OpenAIError(503, f"{message}; the deployment is recovering, retry in {RETRY_AFTER_S} s",
                       code="service_unavailable", retry_after_s=RETRY_AFTER_S)


def openai_error(message: str) -> OpenAIError:
    """The OpenAI API's answer to an error Triton streamed back, by its kind (trtspec.contract.errors)."""
    kind, detail = decode(message)
    if kind is ErrorKind.BAD_REQUEST:
        return OpenAIError(400, detail)
    if kind is ErrorKind.PROCESS_DIED:
        return unavailable(f"a model process of the deployment died ({message})")
    if kind is ErrorKind.OVERLOADED:
        return unavailable(f"the deployment is overloaded ({detail})")
    if kind is ErrorKind.CANCELLED:
        return unavailable(f"the deployment cancelled the request ({detail})")
    return OpenAIError(500, f"the deployment failed: {message}")
