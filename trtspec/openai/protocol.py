"""OpenAI request bodies (pydantic) with trtspec's speculation controls as extra fields, and the error shape.

Only what the deployment can honour is accepted: a value it cannot serve (tools, echo with logprobs) is a 400 naming
the field, never silently ignored. Unknown fields are allowed, as OpenAI clients send fields this server does
not need (`user`, `metadata`, ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trtspec.contract import MAX_TOP_LOG_PROBS, RequestError, field_by_name
from trtspec.openai.structured import Plan, PlanError, ResponseFormat, Tool, ToolChoice, plan


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        #: a retryable failure (the deployment is recovering): sent as the Retry-After header
        self.retry_after_s = retry_after_s

    @property
    def type(self) -> str:
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# OpenAI's legacy completions API returns at most this many alternatives per token (its `logprobs`)
MAX_COMPLETION_LOG_PROBS = 5
MAX_CHOICES = 16  # n: choices per request, each a request of its own to the deployment


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error (4xx) or server_error (5xx)")
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """What every error response carries (OpenAI's error object), in the OpenAPI document."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "a value the deployment cannot serve, named in `param` (also for "
          "malformed JSON and values of the wrong type)"},
    404: {"model": ErrorBody, "description": "the model is not served here (`code`: model_not_found)"},
    500: {"model": ErrorBody, "description": "the deployment failed while serving the request"},
    503: {"model": ErrorBody, "description": "a model process of the deployment died and it is recovering "
          "(`code`: service_unavailable); retry after the `Retry-After` header's seconds",
          "headers": {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}},
}


class StreamOptions(BaseModel):
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """What completions and chat completions share."""

    model_config = ConfigDict(extra="allow")

    model: str
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    # trtspec extensions (extra body fields): speculation per request
    num_draft_tokens: int | None = None
    draft_source: str | None = None
    draft_length_policy: str | None = None
    use_draft_logits: bool | None = None
    top_k: int | None = None
    # vLLM's and trtllm-serve's extensions: AIPerf and other benchmarks send them for a fixed output length
    min_tokens: int | None = None
    ignore_eos: bool = False  # the end token does not end the request (TensorRT-LLM: end_id -1)
    return_token_ids: bool = False  # vLLM's name: each choice also carries the token ids it adds

    @field_validator("temperature", "top_p", "top_k", "min_tokens", "num_draft_tokens", "draft_source", "draft_length_policy")
    @classmethod
    def _request_field(cls, v: Any, info: Any) -> Any:
        """The checks every endpoint applies to these request fields (trtspec.contract)."""
        try:
            field_by_name(info.field_name).validate(v)
        except RequestError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("n")
    @classmethod
    def _n(cls, v: int) -> int:
        if not 1 <= v <= MAX_CHOICES:
            raise ValueError(f"n must be between 1 and {MAX_CHOICES} (each choice is its own request), got {v}")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @model_validator(mode="after")
    def _unsupported(self) -> "GenerationRequest":
        for name in ("suffix", "tools", "functions", "response_format"):
            if (self.model_extra or {}).get(name) not in (None, False, 0, ""):
                raise ValueError(f"{name} is not supported by this server")
        return self

    @property
    def wants_log_probs(self) -> bool:
        return False

    @property
    def top_log_probs(self) -> int:
        """How many alternatives per token the request asks for (0: none)."""
        return 0

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def requested_max_tokens(self) -> int | None:
        return getattr(self, "max_tokens", None)


class CompletionRequest(GenerationRequest):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=None, gt=0)
    echo: bool = False  # the prompt is returned before the completion, in the choice's text
    # the target's log-probability of each token it emits, and that many most likely tokens at each position
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOG_PROBS)

    @model_validator(mode="after")
    def _logprobs(self) -> "CompletionRequest":
        if self.logprobs is not None and self.echo:
            raise ValueError("echo with logprobs: the prompt's log-probabilities are not computed; leave one of them out")
        return self

    @property
    def wants_log_probs(self) -> bool:
        return self.logprobs is not None

    @property
    def top_log_probs(self) -> int:
        return self.logprobs or 0

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str:
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError(f"give one prompt (a string, or a list of one string), got a list of {len(v)}")
            v = v[0]
        if not v.strip():
            raise ValueError("the prompt is empty")
        return v


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls, for the chat template
    tool_call_id: str | None = None  # a tool message: the call it answers

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    logprobs: bool = False  # the target's log-probability of each token it emits
    # that many most likely tokens at each emitted token's position, with their log-probabilities
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOG_PROBS)
    # structured output and tool calls (trtspec.openai.structured): guided decoding, exact under speculation
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def structured(self) -> Plan:
        """The guide and how the output is read (raises OpenAIError 400 naming the field)."""
        try:
            return plan(self.response_format, self.tools, self.tool_choice, self.parallel_tool_calls)
        except PlanError as e:
            raise OpenAIError(400, str(e), param=e.param) from None

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true (as in OpenAI's API); set logprobs: true")
        return self

    @property
    def wants_log_probs(self) -> bool:
        return self.logprobs

    @property
    def top_log_probs(self) -> int:
        return self.top_logprobs or 0

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        # "developer" is OpenAI's newer name for the system role; chat templates know "system"
        out: list[dict[str, Any]] = []
        for m in self.messages:
            msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            if m.tool_calls:
                msg["tool_calls"] = m.tool_calls
            if m.tool_call_id:
                msg["tool_call_id"] = m.tool_call_id
            out.append(msg)
        return out
