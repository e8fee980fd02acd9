"""The OpenAI-compatible HTTP API (FastAPI): /v1/models, /v1/completions, /v1/chat/completions, streamed as
server-sent events or not, over a backend that talks to the deployment's Triton endpoints.

Every request is streamed from Triton, also when the client asked for one response: a stop string found in
the text ends the request in Triton at once instead of after max_tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trtspec.client import request_fields
from trtspec.contract import STAT
from trtspec.contract.limits import LimitError
from trtspec.spec.logprobs import TopLogProbs
from trtspec.spec.metrics import SpecStats
from trtspec.openai.backend import TritonBackend, TritonStream, unavailable
from trtspec.openai.protocol import ERROR_RESPONSES, ChatCompletionRequest, CompletionRequest, OpenAIError, GenerationRequest
from trtspec.openai.stop import StopMatcher
from trtspec.openai.structured import Plan, content_before_calls
from trtspec.openai.tool_calls import parse_tool_calls
from trtspec.openai.tool_calls import ToolCallStream
from trtspec.server.watchdog import Health

#: how long a request that arrives while the deployment restarts waits for it before it gets a 503
RECOVERY_WAIT_S = 10.0
#: how often a request that is not streamed asks whether its client is still there (the loop in Triton asks as often)
DISCONNECT_CHECK_S = 0.25


async def _client_left(request: Request) -> None:
    """Returns once the client of `request` has gone away. A streamed response learns it from its failed writes; one
    that is not streamed writes only at its end, so it asks."""
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_CHECK_S)


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


class _Output:
    """The generation so far: token ids, the text released past the stop strings, the latest statistics."""

    def __init__(self, stops: list[str], max_tokens: int) -> None:
        self.matcher, self.max_tokens = StopMatcher(stops), max_tokens
        self.ids: list[int] = []
        self.log_probs: list[float] = []  # the target's, of ids (when the request asked for them)
        self.tops: list[TopLogProbs] = []  # the target's most likely tokens at ids' positions (top_logprobs)
        self.text = ""
        self.stats: dict[str, Any] = {}  # the latest statistics, as the wire names them (trtspec.contract)

    async def deltas(self, stream: TritonStream) -> AsyncIterator[tuple[str, list[int], list[float], TopLogProbs | None]]:
        """(text, token ids, their log probs, the most likely tokens at their positions) per response; ends at a stop
        string and then cancels the rest in Triton."""
        try:
            async for chunk in stream:
                self.ids += chunk.token_ids
                self.log_probs += chunk.log_probs or []
                self.tops += [chunk.top] if chunk.top is not None else []
                self.stats = chunk.stats.to_wire() if chunk.stats is not None else self.stats
                text = self.matcher.feed(chunk.text)
                self.text += text
                yield text, chunk.token_ids, chunk.log_probs or [], chunk.top
                if self.matcher.stopped:
                    return
            tail = self.matcher.flush()
            self.text += tail
            if tail:
                yield tail, [], [], None
        finally:
            stream.cancel()

    @property
    def finish_reason(self) -> str:
        return "stop" if self.matcher.stopped or len(self.ids) < self.max_tokens else "length"


def finish_reason(out: "_Output", tool_calls: list[dict[str, Any]] | None, structured: Plan) -> str:
    """OpenAI's: tool_calls where the model chose to call (auto, required); a named call ends as any answer."""
    called = tool_calls and structured.mode != "named" and out.finish_reason == "stop"
    return "tool_calls" if called else out.finish_reason


def guide_error(e: OpenAIError, structured: Plan) -> OpenAIError:
    """A guide the deployment could not compile, named as the client sent it (the schema, or the tools)."""
    if e.status != 400 or not e.message.startswith("guided_decoding_guide"):
        return e
    what = e.message.split(": ", 1)[1] if ": " in e.message else e.message
    return OpenAIError(400, f"{structured.param}: {what}", param=structured.param)


def _first_per_text(row: list[tuple[str, float]]) -> dict[str, float]:
    """{text: log prob}, most likely first; of tokens that decode to the same text, the most likely one's."""
    out: dict[str, float] = {}
    for text, lp in row:
        out.setdefault(text, lp)
    return out


class _Reply:
    """The OpenAI objects of one request, chat or text completion."""

    def __init__(self, chat: bool, model: str, return_token_ids: bool) -> None:
        self.chat, self.model, self.return_token_ids = chat, model, return_token_ids
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def logprobs(self, tokens: list[str], log_probs: list[float], offset: int,
                 tops: list[list[tuple[str, float]]] | None = None) -> dict[str, Any]:
        """OpenAI's logprobs object for these tokens (decoded one by one) and the target's log probs of them;
        `offset`: where the first token starts in the choice's text (completions' text_offset); `tops`: per token,
        the most likely tokens at its position (decoded) and their log probs."""
        if self.chat:
            return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")),
                                 "top_logprobs": [{"token": a, "logprob": alp, "bytes": list(a.encode("utf-8"))}
                                                  for a, alp in (tops[i] if tops else [])]}
                                for i, (t, lp) in enumerate(zip(tokens, log_probs))], "refusal": None}
        offsets = [offset + sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        # the legacy API keys alternatives by text: tokens that decode alike keep the most likely one's
        top = [_first_per_text(row) for row in tops] if tops else None
        return {"tokens": tokens, "token_logprobs": log_probs, "top_logprobs": top, "text_offset": offsets}

    def choice(self, text: str, ids: list[int] | None, finish_reason: str | None, delta: bool, index: int = 0,
               logprobs: dict[str, Any] | None = None, tool_calls: list[dict[str, Any]] | None = None,
               **extra: Any) -> dict[str, Any]:
        c: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish_reason, **extra}
        if self.chat and tool_calls:  # `text`: what the model wrote beside its calls, or nothing
            c["delta" if delta else "message"] = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
        elif self.chat:
            c["delta" if delta else "message"] = {"role": "assistant", "content": text}
        else:
            c["text"] = text
        if self.return_token_ids and ids is not None:
            c["token_ids"] = ids
        return c

    def envelope(self, choices: list[dict[str, Any]], stream: bool, **extra: Any) -> dict[str, Any]:
        obj = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                **extra}


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

    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI documents its own 422 for invalid bodies; this server answers them as 400 (documented)."""
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
        structured = structured or Plan()
        triton_model = deployment.models.get(req.model)
        if triton_model is None:
            raise OpenAIError(404, f"model {req.model!r} does not exist; this server serves "
                                   f"{', '.join(deployment.models)}", param="model", code="model_not_found")
        await wait_until_ready()
        prompt_ids = backend.encode(prompt)
        prompt_tokens = len(prompt_ids)
        # without max_tokens a request may generate up to the limit (at least one token)
        max_tokens = req.requested_max_tokens or max(1, (deployment.limits.max_input_len or 0) - prompt_tokens)
        try:
            deployment.limits.check(prompt_tokens, max_tokens, req.num_draft_tokens)
        except LimitError as e:
            if e.field == "num_draft_tokens":
                raise OpenAIError(400, str(e), param=e.field) from None
            raise OpenAIError(400, str(e), param=prompt_param, code="context_length_exceeded") from None

        def fields_of(choice: int) -> dict[str, Any]:
            # each choice is its own request; with a seed, choice i samples with seed + i (reproducible, distinct)
            seed = None if req.seed is None else req.seed + choice
            fields = request_fields(
                prompt, max_tokens, True, num_draft_tokens=req.num_draft_tokens, use_draft_logits=req.use_draft_logits,
                temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=seed,
                stop_words=list(req.stop or []) or None, draft_source=req.draft_source,
                draft_length_policy=req.draft_length_policy, min_tokens=req.min_tokens,
                return_log_probs=True if req.wants_log_probs else None, top_log_probs=req.top_log_probs or None,
                guided_decoding_guide_type=structured.guide_type, guided_decoding_guide=structured.guide,
            )
            if req.ignore_eos:
                fields["end_id"] = None
            del fields["text_input"]
            return fields

        reply = _Reply(chat, req.model, req.return_token_ids)
        outs = [_Output(list(req.stop or []), max_tokens) for _ in range(req.n)]
        deltas = [out.deltas(backend.generate(triton_model, prompt_ids, fields_of(i))) for i, out in enumerate(outs)]

        def usage() -> dict[str, int]:
            completion = sum(len(o.ids) for o in outs)
            return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}

        def speculative() -> dict[str, Any]:
            """The request's acceptance figures: with n > 1, summed over its choices (each choice has its own)."""
            if len(outs) == 1:
                return outs[0].stats
            total = SpecStats.total(SpecStats.from_wire(o.stats) for o in outs)
            return total.to_wire() | {STAT.acceptance_rate: total.acceptance_rate}

        def token_logprobs(ids: list[int], lps: list[float], offset: int, top: TopLogProbs | None) -> dict[str, Any] | None:
            if not req.wants_log_probs:
                return None
            decode = lambda t: backend.tokenizer.decode([t])  # noqa: E731
            # a token with probability 0 there (refused by a guide: -inf) is no alternative
            tops = ([[(decode(a), lp) for a, lp in row if lp > float("-inf")] for row in top.rows()[: len(ids)]]
                    if top is not None else None)
            return reply.logprobs([decode(t) for t in ids], lps, offset, tops)

        def per_choice(i: int) -> dict[str, Any]:
            extra = {"logprobs": token_logprobs(outs[i].ids, outs[i].log_probs, len(echo), TopLogProbs.concat(outs[i].tops))}
            return extra | ({"speculative": outs[i].stats} if len(outs) > 1 else {})

        try:
            # the first response of each choice before answering: a request Triton refuses gets its status code,
            # not a broken stream
            firsts = await asyncio.gather(*(anext(d, None) for d in deltas))
        except OpenAIError as e:
            await asyncio.gather(*(d.aclose() for d in deltas), return_exceptions=True)
            raise guide_error(e, structured) from None
        except BaseException:
            await asyncio.gather(*(d.aclose() for d in deltas), return_exceptions=True)
            raise
        if not req.stream:
            async def drain(d: AsyncIterator[Any]) -> None:
                async for _ in d:
                    pass

            drained = asyncio.gather(*(drain(d) for d in deltas))
            left = asyncio.create_task(_client_left(request))
            try:
                await asyncio.wait((drained, left), return_when=asyncio.FIRST_COMPLETED)
                if not drained.done():  # the client left: its choices are cancelled in Triton (below), no answer
                    return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
                drained.result()
            finally:  # a failed choice, or a client that left, ends the others in Triton too
                left.cancel()
                drained.cancel()
                await asyncio.gather(left, drained, *(d.aclose() for d in deltas), return_exceptions=True)
            choices = [reply.choice(content_before_calls(o.text) if calls else echo + o.text, o.ids,
                                    finish_reason(o, calls, structured), delta=False, index=i, tool_calls=calls,
                                    **per_choice(i))
                       for i, o in enumerate(outs)
                       for calls in [parse_tool_calls(structured, o.text) if structured.calls_tools else None]]
            return reply.envelope(choices, stream=False, usage=usage(), speculative=speculative())

        async def merged() -> AsyncIterator[tuple[int, Any]]:
            """(choice, (text, ids)) as they come, then (choice, None) when that choice has ended."""
            queue: asyncio.Queue = asyncio.Queue()

            async def pump(i: int) -> None:
                try:
                    async for item in deltas[i]:
                        await queue.put((i, item))
                    await queue.put((i, None))
                except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
                    await queue.put((i, e))

            tasks = [asyncio.create_task(pump(i)) for i in range(len(deltas))]
            try:
                for _ in range(len(deltas)):
                    while True:
                        i, item = await queue.get()
                        if isinstance(item, BaseException):
                            raise item
                        yield i, item
                        if item is None:
                            break
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        async def events() -> AsyncIterator[str]:
            sent = [0] * len(outs)  # characters of each choice's text sent so far (completions' text_offset)

            def chunk(i: int, text: str, ids: list[int], lps: list[float], top: TopLogProbs | None = None,
                      finish: str | None = None, prefix: str = "", **extra: Any) -> str:
                """`prefix`: text sent before this chunk's tokens in the same chunk (the echoed prompt)."""
                logprobs = token_logprobs(ids, lps, sent[i] + len(prefix), top) if ids else None
                text = prefix + text
                sent[i] += len(text)
                return json.dumps(reply.envelope([reply.choice(text, ids, finish, delta=True, index=i, logprobs=logprobs)],
                                                 stream=True, **extra))

            def tool_chunks(i: int, content: str, calls: list[dict[str, Any]]) -> list[str]:
                """A tool-call choice's next pieces: text beside the calls, and tool_calls deltas (OpenAI's)."""
                out = [chunk(i, content, [], [])] if content else []
                # one entry a chunk, as OpenAI sends them: a call's name, then its arguments piece by piece
                return out + [json.dumps(reply.envelope([reply.choice("", None, None, delta=True, index=i, tool_calls=[c])],
                                                        stream=True)) for c in calls]

            streams = [ToolCallStream(structured) for _ in outs] if structured.calls_tools else []
            try:
                for i, first in enumerate(firsts):
                    if streams:
                        for c in tool_chunks(i, *streams[i].feed(first[0] if first is not None else "")):
                            yield c
                    elif echo or first is not None:
                        text, ids, lps, top = first if first is not None else ("", [], [], None)
                        yield chunk(i, text, ids, lps, top, prefix=echo)
                async for i, item in merged():
                    if item is None:  # the choice's last chunk: why it ended and its acceptance figures
                        calls = parse_tool_calls(structured, outs[i].text) if streams else None
                        for c in tool_chunks(i, *streams[i].finish()) if streams else []:
                            yield c
                        yield chunk(i, "", [], [], None, finish_reason(outs[i], calls, structured), speculative=outs[i].stats)
                    elif streams:
                        for c in tool_chunks(i, *streams[i].feed(item[0])):
                            yield c
                    elif item[0] or item[1]:
                        yield chunk(i, *item)
                if req.include_usage:
                    yield json.dumps(reply.envelope([], stream=True, usage=usage()))
            except OpenAIError as e:
                yield json.dumps(e.body())
            yield "[DONE]"

        return EventSourceResponse(events(), sep="\n")

    return app
