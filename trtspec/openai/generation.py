"""One OpenAI request in flight: its choices' requests to Triton, their outputs past the stop strings, and the
OpenAI objects that answer it (a whole response here; streamed chunks in `trtspec.openai.streaming`).

Every request is streamed from Triton, also when the client asked for one response: a stop string found in
the text ends the request in Triton at once instead of after max_tokens.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from trtspec.client import request_fields
from trtspec.contract import NUM_DRAFT_TOKENS, STAT
from trtspec.contract.limits import LimitError, RequestLimits
from trtspec.spec.logprobs import TopLogProbs
from trtspec.spec.metrics import SpecStats
from trtspec.openai.backend import TritonBackend, TritonStream
from trtspec.openai.protocol import GenerationRequest, OpenAIError
from trtspec.openai.stop import StopMatcher
from trtspec.openai.structured import Plan, content_before_calls
from trtspec.openai.tool_calls import parse_tool_calls

#: how often a request that is not streamed asks whether its client is still there (the loop in Triton asks as often)
DISCONNECT_CHECK_S = 0.25

#: one response of a choice: (text, token ids, their log probs, the most likely tokens at their positions)
Delta = tuple[str, list[int], list[float], TopLogProbs | None]


async def _client_left(request: Request) -> None:
    """Returns once the client of `request` has gone away. A streamed response learns it from its failed writes; one
    that is not streamed writes only at its end, so it asks."""
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_CHECK_S)


class Output:
    """The generation so far: token ids, the text released past the stop strings, the latest statistics."""

    def __init__(self, stops: list[str], max_tokens: int) -> None:
        self.matcher, self.max_tokens = StopMatcher(stops), max_tokens
        self.ids: list[int] = []
        self.log_probs: list[float] = []  # the target's, of ids (when the request asked for them)
        self.tops: list[TopLogProbs] = []  # the target's most likely tokens at ids' positions (top_logprobs)
        self.text = ""
        self.stats: dict[str, Any] = {}  # the latest statistics, as the wire names them (trtspec.contract)

    async def deltas(self, stream: TritonStream) -> AsyncIterator[Delta]:
        """One Delta per response; ends at a stop string and then cancels the rest in Triton."""
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


def finish_reason(out: Output, tool_calls: list[dict[str, Any]] | None, structured: Plan) -> str:
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


class Reply:
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
        message = "delta" if delta else "message"
        if self.chat and tool_calls:  # `text`: what the model wrote beside its calls, or nothing
            c[message] = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
        elif self.chat:
            c[message] = {"role": "assistant", "content": text}
        else:
            c["text"] = text
        if self.return_token_ids and ids is not None:
            c["token_ids"] = ids
        return c

    def envelope(self, choices: list[dict[str, Any]], stream: bool, **extra: Any) -> dict[str, Any]:
        obj = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                **extra}


def checked_max_tokens(limits: RequestLimits, req: GenerationRequest, prompt_tokens: int, prompt_param: str) -> int:
    """The request's max_tokens within the deployment's limits (without one, up to the limit, at least one token);
    a 400 naming the field over its limit."""
    max_tokens = req.requested_max_tokens or max(1, (limits.max_input_len or 0) - prompt_tokens)
    try:
        limits.check(prompt_tokens, max_tokens, req.num_draft_tokens)
    except LimitError as e:
        if e.field == NUM_DRAFT_TOKENS:
            raise OpenAIError(400, str(e), param=e.field) from None
        raise OpenAIError(400, str(e), param=prompt_param, code="context_length_exceeded") from None
    return max_tokens


def triton_fields(req: GenerationRequest, prompt: str, max_tokens: int, structured: Plan, choice: int
                  ) -> dict[str, Any]:
    """The request fields of one choice's request to Triton (the prompt goes as token ids, not text_input)."""
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


async def _drain(deltas: AsyncIterator[Any]) -> None:
    async for _ in deltas:
        pass


class Generation:
    """One request's n choices, each its own request to Triton: their outputs, and what the answer reports of them
    (usage, acceptance figures, log probs as OpenAI spells them)."""

    def __init__(self, backend: TritonBackend, triton_model: str, req: GenerationRequest, prompt: str,
                 prompt_ids: list[int], max_tokens: int, chat: bool, echo: str, structured: Plan) -> None:
        self.backend, self.req, self.echo, self.structured = backend, req, echo, structured
        self.prompt_tokens = len(prompt_ids)
        self.reply = Reply(chat, req.model, req.return_token_ids)
        self.outs = [Output(list(req.stop or []), max_tokens) for _ in range(req.n)]
        self.deltas = [out.deltas(backend.generate(triton_model, prompt_ids,
                                                   triton_fields(req, prompt, max_tokens, structured, i)))
                       for i, out in enumerate(self.outs)]

    async def first_deltas(self) -> list[Delta | None]:
        """The first response of each choice (None: it ended without one), awaited before answering: a request
        Triton refuses gets its status code, not a broken stream."""
        try:
            return await asyncio.gather(*(anext(d, None) for d in self.deltas))
        except OpenAIError as e:
            await self._close()
            raise guide_error(e, self.structured) from None
        except BaseException:
            await self._close()
            raise

    async def _close(self) -> None:
        await asyncio.gather(*(d.aclose() for d in self.deltas), return_exceptions=True)

    async def complete(self, request: Request) -> dict[str, Any] | Response:
        """The answer to a request that is not streamed, once every choice has ended; a client that leaves first
        cancels its choices in Triton and gets no answer."""
        drained = asyncio.gather(*(_drain(d) for d in self.deltas))
        left = asyncio.create_task(_client_left(request))
        try:
            await asyncio.wait((drained, left), return_when=asyncio.FIRST_COMPLETED)
            if not drained.done():  # the client left: its choices are cancelled in Triton (below), no answer
                return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
            drained.result()
        finally:  # a failed choice, or a client that left, ends the others in Triton too
            left.cancel()
            drained.cancel()
            await asyncio.gather(left, drained, *(d.aclose() for d in self.deltas), return_exceptions=True)
        return self.reply.envelope([self._choice(i) for i in range(len(self.outs))], stream=False,
                                   usage=self.usage(), speculative=self.speculative())

    def _choice(self, i: int) -> dict[str, Any]:
        """Choice i of the whole response: its text (beside its tool calls, if it called any) and how it ended."""
        out, structured = self.outs[i], self.structured
        calls = parse_tool_calls(structured, out.text) if structured.calls_tools else None
        text = content_before_calls(out.text) if calls else self.echo + out.text
        logprobs = self.token_logprobs(out.ids, out.log_probs, len(self.echo), TopLogProbs.concat(out.tops))
        extra = {"speculative": out.stats} if len(self.outs) > 1 else {}
        return self.reply.choice(text, out.ids, finish_reason(out, calls, structured), delta=False, index=i,
                                 tool_calls=calls, logprobs=logprobs, **extra)

    def usage(self) -> dict[str, int]:
        completion = sum(len(o.ids) for o in self.outs)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}

    def speculative(self) -> dict[str, Any]:
        """The request's acceptance figures: with n > 1, summed over its choices (each choice has its own)."""
        if len(self.outs) == 1:
            return self.outs[0].stats
        total = SpecStats.total(SpecStats.from_wire(o.stats) for o in self.outs)
        return total.to_wire() | {STAT.acceptance_rate: total.acceptance_rate}

    def token_logprobs(self, ids: list[int], lps: list[float], offset: int, top: TopLogProbs | None
                       ) -> dict[str, Any] | None:
        """OpenAI's logprobs object of these tokens, or None where the request did not ask for log probs."""
        if not self.req.wants_log_probs:
            return None
        decode = lambda t: self.backend.tokenizer.decode([t])  # noqa: E731
        # a token with probability 0 there (refused by a guide: -inf) is no alternative
        tops = ([[(decode(a), lp) for a, lp in row if lp > float("-inf")] for row in top.rows()[: len(ids)]]
                if top is not None else None)
        return self.reply.logprobs([decode(t) for t in ids], lps, offset, tops)
