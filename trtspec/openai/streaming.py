"""A streamed answer: the choices' responses as server-sent events, in the order they come, as OpenAI sends them
(text chunks, tool-call deltas, each choice's last chunk with why it ended, usage, then [DONE])."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from trtspec.spec.logprobs import TopLogProbs
from trtspec.openai.generation import Delta, Generation, finish_reason
from trtspec.openai.protocol import OpenAIError
from trtspec.openai.tool_calls import ToolCallStream, parse_tool_calls


async def _merged(deltas: list[AsyncIterator[Delta]]) -> AsyncIterator[tuple[int, Delta | None]]:
    """(choice, delta) as they come, then (choice, None) when that choice has ended."""
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


class _Chunks:
    """The events of one streamed answer, serialised; counts the text sent of each choice (completions'
    text_offset)."""

    def __init__(self, generation: Generation) -> None:
        self.generation, self.reply = generation, generation.reply
        self.sent = [0] * len(generation.outs)

    def text(self, i: int, text: str, ids: list[int], lps: list[float], top: TopLogProbs | None = None,
             finish: str | None = None, prefix: str = "", **extra: Any) -> str:
        """`prefix`: text sent before this chunk's tokens in the same chunk (the echoed prompt)."""
        logprobs = self.generation.token_logprobs(ids, lps, self.sent[i] + len(prefix), top) if ids else None
        text = prefix + text
        self.sent[i] += len(text)
        choice = self.reply.choice(text, ids, finish, delta=True, index=i, logprobs=logprobs)
        return json.dumps(self.reply.envelope([choice], stream=True, **extra))

    def tool_calls(self, i: int, content: str, calls: list[dict[str, Any]]) -> list[str]:
        """A tool-call choice's next pieces: text beside the calls, and tool_calls deltas (OpenAI's)."""
        out = [self.text(i, content, [], [])] if content else []
        # one entry a chunk, as OpenAI sends them: a call's name, then its arguments piece by piece
        return out + [json.dumps(self.reply.envelope(
            [self.reply.choice("", None, None, delta=True, index=i, tool_calls=[c])], stream=True)) for c in calls]


async def events(generation: Generation, firsts: list[Delta | None]) -> AsyncIterator[str]:
    """The answer's events, from each choice's first response (already received) on; an error after the first
    responses ends the stream with its error object."""
    chunks, structured, outs = _Chunks(generation), generation.structured, generation.outs
    streams = [ToolCallStream(structured) for _ in outs] if structured.calls_tools else []
    try:
        for i, first in enumerate(firsts):
            if streams:
                for c in chunks.tool_calls(i, *streams[i].feed(first[0] if first is not None else "")):
                    yield c
            elif generation.echo or first is not None:
                text, ids, lps, top = first if first is not None else ("", [], [], None)
                yield chunks.text(i, text, ids, lps, top, prefix=generation.echo)
        async for i, item in _merged(generation.deltas):
            if item is None:  # the choice's last chunk: why it ended and its acceptance figures
                calls = parse_tool_calls(structured, outs[i].text) if streams else None
                for c in chunks.tool_calls(i, *streams[i].finish()) if streams else []:
                    yield c
                yield chunks.text(i, "", [], [], None, finish_reason(outs[i], calls, structured),
                                  speculative=outs[i].stats)
            elif streams:
                for c in chunks.tool_calls(i, *streams[i].feed(item[0])):
                    yield c
            elif item[0] or item[1]:
                yield chunks.text(i, *item)
        if generation.req.include_usage:
            yield json.dumps(generation.reply.envelope([], stream=True, usage=generation.usage()))
    except OpenAIError as e:
        yield json.dumps(e.body())
    yield "[DONE]"
