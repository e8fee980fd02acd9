"""The OpenAI-compatible HTTP API (FastAPI): /v1/models, /v1/completions, /v1/chat/completions, streamed as
server-sent events or not, over a backend that talks to the deployment's Triton endpoints. The routes and the
errors' shape live here; a request's generation in `trtspec.openai.generation`, its events in
`trtspec.openai.streaming`.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trtspec.openai.backend import Deployment, TritonBackend, unavailable
from trtspec.openai.generation import Generation, checked_max_tokens
from trtspec.openai.protocol import ERROR_RESPONSES, ChatCompletionRequest, CompletionRequest, OpenAIError
from trtspec.openai.protocol import GenerationRequest
from trtspec.openai.streaming import events
from trtspec.openai.structured import Plan
from trtspec.server.watchdog import Health

#: how long a request that arrives while the deployment restarts waits for it before it gets a 503
RECOVERY_WAIT_S = 10.0


def _error_response(e: OpenAIError) -> JSONResponse:
    headers = {"Retry-After": str(e.retry_after_s)} if e.retry_after_s is not None else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def _validation_error(exc: RequestValidationError) -> OpenAIError:
    """FastAPI answers 422 with its own shape; OpenAI clients expect 400 and the error object."""
    first = exc.errors()[0] if exc.errors() else {}
    param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        return OpenAIError(400, f"the request body is not valid JSON: {message}")
    return OpenAIError(400, f"{param}: {message}" if param else message, param=param)


def _answer_errors_as_openai(app: FastAPI) -> None:
    """Every error, FastAPI's and Starlette's included, as OpenAI's error object; FastAPI's 422 for an invalid body
    is a 400 (and documented so)."""
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = default_openapi()
            for path in schema.get("paths", {}).values():
                for op in path.values():
                    op.get("responses", {}).pop("422", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(OpenAIError)
    async def _openai_error(_request: Request, exc: OpenAIError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_response(OpenAIError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        return _error_response(OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}"))


def _triton_model(deployment: Deployment, model: str) -> str:
    """The Triton model that serves the OpenAI model `model`; a 404 naming the ones served."""
    triton_model = deployment.models.get(model)
    if triton_model is None:
        raise OpenAIError(404, f"model {model!r} does not exist; this server serves "
                               f"{', '.join(deployment.models)}", param="model", code="model_not_found")
    return triton_model


def create_app(backend: TritonBackend, health: Callable[[], Health] | None = None) -> FastAPI:
    """``health``: what the deployment's watchdog says (``ModelWatchdog.health``); None: always healthy."""
    deployment = backend.deployment

    async def wait_until_ready() -> None:
        """A request that arrives while the deployment restarts waits up to RECOVERY_WAIT_S, then gets a 503."""
        if health is None:
            return
        deadline = time.monotonic() + RECOVERY_WAIT_S
        while not (state := health()).ready:
            if not state.live or time.monotonic() >= deadline:
                raise unavailable(f"the deployment cannot serve now: {state.reason}")
            await asyncio.sleep(0.1)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await backend.open()
        try:
            yield
        finally:
            await backend.close()

    app = FastAPI(title=f"trtspec: {deployment.name}", lifespan=lifespan,
                  description="OpenAI-compatible API over a trtspec speculative decoding deployment on Triton")
    _answer_errors_as_openai(app)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "trtspec", "triton_model": triton_model}
            for name, triton_model in deployment.models.items()
        ]}

    @app.get("/health", response_model=None)
    async def health_probe() -> Any:
        if health is None:
            return {"status": "ok"}
        state = health()
        return JSONResponse(state.as_dict(), status_code=200 if state.ready else 503)

    @app.post("/v1/completions", response_model=None, responses=ERROR_RESPONSES)
    async def completions(req: CompletionRequest, request: Request) -> Any:
        return await _generate(req, request, str(req.prompt), "prompt", chat=False,
                               echo=str(req.prompt) if req.echo else "")

    @app.post("/v1/chat/completions", response_model=None, responses=ERROR_RESPONSES)
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Any:
        structured = req.structured()
        prompt = backend.render_chat(req.template_messages(), structured.tools)
        return await _generate(req, request, prompt, "messages", chat=True, structured=structured)

    async def _generate(req: GenerationRequest, request: Request, prompt: str, prompt_param: str, chat: bool,
                        echo: str = "", structured: Plan | None = None) -> Any:
        """`prompt_param`: the request field a prompt over the deployment's limit is blamed on."""
        triton_model = _triton_model(deployment, req.model)
        await wait_until_ready()
        prompt_ids = backend.encode(prompt)
        max_tokens = checked_max_tokens(deployment.limits, req, len(prompt_ids), prompt_param)
        generation = Generation(backend, triton_model, req, prompt, prompt_ids, max_tokens, chat, echo,
                                structured or Plan())
        firsts = await generation.first_deltas()
        if not req.stream:
            return await generation.complete(request)
        return EventSourceResponse(events(generation, firsts), sep="\n")

    return app
