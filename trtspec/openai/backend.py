"""The OpenAI server's view of a deployment: what its repository says (name, limits, tokenizer), and requests
to its Triton endpoints (`ensemble`: speculative, `baseline`: target only) over gRPC streaming (asyncio)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

from trtspec.client import Chunk, grpc_chunk, grpc_inputs
from trtspec.openai.protocol import OpenAIError
from trtspec.repository import BASELINE, ENSEMBLE, LOOP, list_models
from trtspec.triton_io import BAD_REQUEST

PREPROCESSING = "preprocessing"


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
    max_input_len: int  # prompt + max_tokens, in tokens (the speculative loop's limit)
    max_draft_len: int
    tokenizer_dir: str
    add_special_tokens: bool  # what preprocessing does when it tokenizes text_input

    @classmethod
    def from_repository(cls, repo: Path, name: str | None = None) -> "Deployment":
        models = list_models(repo)
        missing = [m for m in (ENSEMBLE, BASELINE, LOOP, PREPROCESSING) if m not in models]
        if missing:
            raise DeploymentError(f"{repo} has no {', '.join(missing)} model: the OpenAI server needs a repository "
                                  "written by `trtspec build`")

        def params(model: str) -> dict[str, str]:
            return {k: v.string_value for k, v in models[model].parameters.items()}

        loop, pre = params(LOOP), params(PREPROCESSING)
        return cls(
            name=name or deployment_name(repo),
            max_input_len=int(loop["max_input_len"]),
            max_draft_len=int(loop["max_draft_len"]),
            tokenizer_dir=pre["tokenizer_dir"],
            add_special_tokens=pre.get("add_special_tokens", "false").lower() == "true",
        )

    @property
    def models(self) -> dict[str, str]:
        """OpenAI model name -> Triton endpoint: an A/B is two model names."""
        return {self.name: ENSEMBLE, f"{self.name}-baseline": BASELINE}


class TritonBackend:
    def __init__(self, deployment: Deployment, grpc_url: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise DeploymentError("the OpenAI API needs transformers (the target's chat template and token "
                                  "counts): pip install transformers") from None

        self.deployment, self.grpc_url = deployment, grpc_url
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(deployment.tokenizer_dir)
        except (OSError, ValueError) as e:
            raise DeploymentError(f"cannot load the target tokenizer from {deployment.tokenizer_dir} "
                                  f"(the preprocessing model's tokenizer_dir): {e}") from None
        self._client: Any = None

    # the grpc.aio channel belongs to the event loop that serves requests: opened and closed by the app
    async def open(self) -> None:
        import tritonclient.grpc.aio as grpcaio

        self._client = grpcaio.InferenceServerClient(self.grpc_url)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=self.deployment.add_special_tokens))

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The target's chat template with the assistant's turn opened. Its special tokens (BOS) are in the text,
        and preprocessing adds none of its own unless add_special_tokens is set: then the template's BOS is
        dropped here so that it is not doubled."""
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - jinja's TemplateError, or ValueError: no chat template
            raise OpenAIError(400, f"the model's chat template cannot render these messages: {e}",
                              param="messages") from None
        bos = self.tokenizer.bos_token
        if self.deployment.add_special_tokens and bos and text.startswith(bos):
            text = text[len(bos):]
        return text

    def generate(self, triton_model: str, fields: dict[str, Any]) -> "TritonStream":
        """The responses of one request, streamed; `cancel()` ends the request in Triton."""
        inputs = grpc_inputs(fields)

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": triton_model, "inputs": inputs}

        # one request per stream: Triton ends the stream once the request's last response is sent
        return TritonStream(self._client.stream_infer(one_request()), self.grpc_url)


class TritonStream:
    """Chunks of one request. `cancel()` is synchronous, so it also runs in a task being cancelled (a client
    that went away): it cancels the gRPC call, Triton cancels the request and the loop stops generating."""

    def __init__(self, responses: Any, url: str) -> None:
        self._responses, self._url = responses, url

    def __aiter__(self) -> "TritonStream":
        return self

    async def __anext__(self) -> Chunk:
        import grpc
        from tritonclient.utils import InferenceServerException

        while True:
            try:
                result, error = await self._responses.__anext__()
            except InferenceServerException as e:
                raise _triton_error(e.message()) from None
            except grpc.aio.AioRpcError as e:
                raise OpenAIError(500, f"Triton at {self._url}: {e.details()}") from None
            if error is not None:
                raise _triton_error(error.message())
            chunk = grpc_chunk(result, time.perf_counter())
            if chunk is not None:
                return chunk

    def cancel(self) -> None:
        self._responses.cancel()


def _triton_error(message: str) -> OpenAIError:
    if BAD_REQUEST in message:
        return OpenAIError(400, message[message.index(BAD_REQUEST) + len(BAD_REQUEST):])
    return OpenAIError(500, f"the deployment failed: {message}")
