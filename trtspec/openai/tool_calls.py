"""Tool calls in a model's output, as they are generated: where each call's name and arguments are in the text
(`scan`), and the OpenAI stream of them (`ToolCallStream`): per call a first `delta.tool_calls` entry with its
`index`, `id`, `type` and `function.name` (arguments ""), then its arguments in pieces as the model writes them,
as OpenAI and vLLM stream them.

The arguments are the text the model wrote for them (a JSON string value: its decoded string), so the pieces of a
streamed call add up to the `arguments` of the same answer not streamed (trtspec.openai.structured).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtspec.openai.structured import Plan

ARGUMENT_KEYS = ("arguments", "parameters")  # OpenAI's / Hermes' key, and vLLM's for tool_choice required
OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
_TAGGED = re.compile(re.escape(OPEN_TAG) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE_TAG) + r"|$)", re.S)


@dataclass
class CallSpan:
    """One call object in the text: its name once the string is complete, where its arguments value starts and
    ends (offsets in the scanned text; end None while it is still being written)."""

    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    key: str | None = None  # which of ARGUMENT_KEYS holds them (the first one written)

    def arguments(self, text: str) -> str | None:
        """The arguments written so far (a string value only once complete: its escapes decode then)."""
        if self.args_start is None:
            return None
        raw = text[self.args_start : len(text) if self.args_end is None else self.args_end]
        if raw.startswith('"'):
            return json.loads(raw) if self.args_end is not None else None
        return raw


def scan(text: str, offset: int = 0) -> list[CallSpan]:
    """The call objects of a JSON object or array of objects that `text` starts (after whitespace), complete or
    still being written: an object at the top is one call, an array's object items are one each. Offsets are
    `offset` + the position in `text`. A lenient scan, not a validator: the answer is checked with json.loads."""
    return _Scanner(text, offset).scan()


@dataclass
class _Open:
    """An object or array the scan is inside: what comes next in it, and the key whose value is being read."""

    kind: str  # "{" or "["
    expects: str  # "key", "colon", "value" or "comma"
    key: str | None = None
    call: CallSpan | None = None  # the call this object is, if it is one


class _Scanner:
    """One pass over the text, token by token; each step returns where the next starts, or None where the text ends
    (or stops being JSON) before it."""

    def __init__(self, text: str, offset: int) -> None:
        self.text, self.offset = text, offset
        self.calls: list[CallSpan] = []
        self.stack: list[_Open] = []
        self.call_depth = 0  # 1: the top-level object is the call; 2: an array's items are

    def scan(self) -> list[CallSpan]:
        i: int | None = 0
        while i is not None and i < len(self.text):
            c = self.text[i]
            if c.isspace():
                i += 1
                continue
            if not self.stack and (self.calls or c not in "{["):
                break  # one top-level value only
            if c == '"':
                i = self._string(i)
            elif c in "{[":
                i = self._open(c, i)
            elif c in "}]":
                i = self._close(i)
            elif c == ":":
                self.stack[-1].expects = "value"
                i += 1
            elif c == ",":
                self.stack[-1].expects = "key" if self.stack[-1].kind == "{" else "value"
                i += 1
            else:
                i = self._scalar(i)
        return self.calls

    def _string(self, i: int) -> int | None:
        text, n = self.text, len(self.text)
        j, esc = i + 1, False
        while j < n and (esc or text[j] != '"'):
            esc = not esc and text[j] == "\\"
            j += 1
        top = self.stack[-1]
        if j >= n:  # the string is still being written
            if top.kind == "{" and top.expects == "value":
                self._value_starts(i)
            return None
        try:
            s = json.loads(text[i : j + 1])
        except ValueError:
            return None
        if top.kind == "{" and top.expects == "key":
            top.key, top.expects = s, "colon"
        else:
            self._value_starts(i)
            self._value_ends(j + 1, s)
        return j + 1

    def _open(self, c: str, i: int) -> int:
        if self.stack:
            self._value_starts(i)
        else:
            self.call_depth = 1 if c == "{" else 2
        call = CallSpan() if c == "{" and len(self.stack) + 1 == self.call_depth else None
        if call is not None:
            self.calls.append(call)
        self.stack.append(_Open(c, "key" if c == "{" else "value", None, call))
        return i + 1

    def _close(self, i: int) -> int:
        self.stack.pop()
        if self.stack:
            self._value_ends(i + 1)
        return i + 1

    def _scalar(self, i: int) -> int | None:
        """A number, true, false or null: it ends at a delimiter."""
        text, n = self.text, len(self.text)
        j = i
        while j < n and text[j] not in ",}] \t\r\n":
            j += 1
        self._value_starts(i)
        if j >= n:
            return None  # it may go on
        self._value_ends(j)
        return j

    def _value_starts(self, at: int) -> None:
        top = self.stack[-1]
        if top.kind == "{" and top.call is not None and top.key in ARGUMENT_KEYS and top.call.args_start is None:
            top.call.args_start, top.call.args_end = self.offset + at, None
            top.call.key = top.key

    def _value_ends(self, at: int, string: str | None = None) -> None:
        top = self.stack[-1]
        if top.kind == "{" and top.call is not None:
            if top.key == "name" and string is not None and top.call.name is None:
                top.call.name = string
            elif top.key in ARGUMENT_KEYS and top.call.key == top.key and top.call.args_end is None:
                top.call.args_end = self.offset + at
        top.expects = "comma"


def candidates(text: str) -> list[tuple[int, str]]:
    """(offset, text) of each part of an answer that may hold calls: each <tool_call> tag's content (the last one
    possibly unclosed), or the answer itself without its leading whitespace."""
    tagged = [(m.start(1), m.group(1)) for m in _TAGGED.finditer(text)]
    if tagged:
        return tagged
    stripped = text.lstrip()
    return [(len(text) - len(stripped), stripped)]


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCallStream:
    """One choice's answer under tools, streamed: `feed` each text delta, `finish` at its end. Each returns
    (content text to send, tool_calls delta entries to send).

    tool_choice named: the answer is the function's arguments, streamed from the first character. required: the
    guided list of calls, each announced when its name is complete, its arguments streamed as they come. auto:
    an answer that starts like a call (`{`, `[`, `<tool_call>`) is read as calls the same way; any other is content,
    streamed as it comes, until a <tool_call> tag opens. An answer announced as a call that ends up not being one
    (auto only, the model is not guided there) keeps what was sent; its finish_reason is "stop"."""

    plan: "Plan"
    text: str = ""
    ids: list[str] = field(default_factory=list)  # per announced call
    sent: list[int] = field(default_factory=list)  # per announced call: characters of its arguments sent
    content_sent: int = 0  # characters of text sent as content
    content_mode: bool = False  # auto: the answer is text (until a tag opens)

    def feed(self, delta: str) -> tuple[str, list[dict[str, Any]]]:
        self.text += delta
        return self._step(final=False)

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        return self._step(final=True)

    @property
    def announced(self) -> bool:
        return bool(self.ids)

    def _step(self, final: bool) -> tuple[str, list[dict[str, Any]]]:
        p, text = self.plan, self.text
        if p.mode == "named":
            stripped = text.lstrip()
            return "", self._emit([(p.named, _Whole(len(text) - len(stripped)))], text)
        stripped = text.lstrip()
        if p.mode == "auto" and not self.ids:
            if not self.content_mode and stripped and not (stripped[0] in "{[" or stripped.startswith(OPEN_TAG)
                                                           or OPEN_TAG.startswith(stripped)):
                self.content_mode = True
            if self.content_mode:
                tag = text.find(OPEN_TAG, self.content_sent)
                if tag < 0:  # send the text, holding back what may be the start of a tag
                    hold = 0 if final else _partial_tag(text)
                    out = text[self.content_sent : len(text) - hold]
                    self.content_sent += len(out)
                    return out, []
                out = text[self.content_sent : tag]
                self.content_sent = tag
                return out, self._calls(text)
            if final and not self._calls_valid(text):  # it started like a call but is not one: it is the content
                out = text[self.content_sent :]
                self.content_sent = len(text)
                return out, []
        return "", self._calls(text)

    def _calls_valid(self, text: str) -> bool:
        return parse_tool_calls(self.plan, text) is not None

    def _calls(self, text: str) -> list[dict[str, Any]]:
        names = {t.function.name for t in self.plan.tools}
        found: list[tuple[str, Any]] = []
        for start, part in candidates(text[self.content_sent :] if self.content_mode else text):
            base = self.content_sent if self.content_mode else 0
            for span in scan(part, base + start):
                if span.name is None or span.name not in names:
                    break
                found.append((span.name, span))
            else:
                continue
            break
        return self._emit(found, text)

    def _emit(self, found: list[tuple[str, Any]], text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for n, (name, span) in enumerate(found):
            if n == len(self.ids):
                self.ids.append(call_id())
                self.sent.append(0)
                out.append({"index": n, "id": self.ids[n], "type": "function",
                            "function": {"name": name, "arguments": ""}})
            args = span.arguments(text)
            if args and len(args) > self.sent[n]:
                out.append({"index": n, "function": {"arguments": args[self.sent[n] :]}})
                self.sent[n] = len(args)
        return out


@dataclass
class _Whole:
    """tool_choice named: the whole answer (after leading whitespace) is the arguments."""

    start: int

    def arguments(self, text: str) -> str:
        return text[self.start :].rstrip() if text[self.start :].strip() else ""


def _partial_tag(text: str) -> int:
    """How many characters at the end of `text` may be the start of a <tool_call> tag."""
    for k in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if OPEN_TAG.startswith(text[-k:]):
            return k
    return 0


def _call(name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})
    return {"id": call_id(), "type": "function", "function": {"name": name, "arguments": args}}


def parse_tool_calls(p: Plan, text: str) -> list[dict[str, Any]] | None:
    """The tool calls the output holds (OpenAI's tool_calls), or None: the output is the message's content. Each
    call's arguments are the text the model wrote for them, as a streamed answer sends them
    (trtspec.openai.tool_calls)."""
    if p.mode == "named":
        return [_call(p.named, text.strip())]
    names = {t.function.name for t in p.tools}
    calls: list[dict[str, Any]] = []
    for _, part in candidates(text):
        try:
            value = json.loads(part)
        except ValueError:
            return None
        items = value if isinstance(value, list) else [value]
        spans = scan(part)
        if len(spans) != len(items):
            return None
        for item, span in zip(items, spans):
            if not isinstance(item, dict) or item.get("name") not in names:
                return None
            calls.append(_call(item["name"], span.arguments(part)))
    return calls or None
