"""Structured output and tool calls of the chat API: `response_format` and `tools` / `tool_choice` as guides
(trtspec.guided: the deployment's guided decoding, exact under speculation), and tool calls parsed from the output.

As vLLM and Triton's OpenAI frontend handle them:
* response_format json_object -> an object; json_schema -> its schema (`strict` or not: the output always follows
  the schema, as vLLM's guided decoding), each sent as xgrammar's grammar for it (json_guide);
* tools are rendered by the chat template (`tools=`); a template that ignores them gets them in a system message;
* tool_choice none: no tool calls; auto: no guide, a call the output holds ({"name", "arguments"} JSON, alone, in a
  list, or in <tool_call> tags) is parsed into tool_calls; required: a guide for a non-empty list of
  {"name", "parameters"} of the given tools (vLLM's schema); a named function: a guide for that function's
  parameters, the output its arguments.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtspec.openai.tool_calls import OPEN_TAG


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format type json_schema needs json_schema: {name, schema}")
        return self


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice

# a function without parameters takes an object with anything in it (OpenAI's default)
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class PlanError(ValueError):
    """A request whose structured output cannot be served: a 400 naming `param`."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def json_guide(schema: dict[str, Any], param: str) -> tuple[str, str]:
    """A JSON schema as the guide sent to the deployment: xgrammar's grammar for it with single spaces between tokens
    (any_whitespace false), as an ebnf_grammar guide. The engines would compile a json_schema guide as TensorRT-LLM
    does, with any whitespace between tokens, where a small model can emit newlines until max_tokens; the grammar
    keeps the schema and leaves it no room for that. A schema that does not compile is refused here, by name."""
    import xgrammar as xgr

    try:
        return "ebnf_grammar", str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False))
    except Exception as e:  # xgrammar's errors for a schema it cannot convert
        why = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).strip())
        raise PlanError(f"{param}: the schema does not compile: {why}", param) from None


@dataclass
class Plan:
    """What a chat request asks for beyond text: the guide it sends, and how its output is read."""

    guide_type: str | None = None
    guide: str | None = None
    param: str = "response_format"  # what a guide that does not compile is reported as
    tools: list[Tool] = field(default_factory=list)
    mode: Literal["text", "auto", "required", "named"] = "text"
    named: str | None = None

    @property
    def calls_tools(self) -> bool:
        return self.mode in ("auto", "required", "named")


def plan(response_format: ResponseFormat | None, tools: list[Tool] | None, tool_choice: ToolChoice | None,
         parallel_tool_calls: bool | None = None) -> Plan:
    """Raises PlanError (a 400 naming the field) for what cannot be served."""
    tools = list(tools or [])
    choice = tool_choice if tool_choice is not None else ("auto" if tools else "none")
    if choice != "none" and not tools:
        raise PlanError("tool_choice needs tools", "tool_choice")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise PlanError("tools: function names must be unique", "tools")
    p = Plan(tools=tools)
    if response_format is not None and response_format.type != "text":
        if choice == "required" or isinstance(choice, NamedToolChoice):
            raise PlanError("response_format and a required or named tool_choice both constrain the output: send one",
                            "response_format")
        if response_format.type == "json_object":
            p.param = "response_format"
            p.guide_type, p.guide = json_guide(ANY_OBJECT, p.param)
        else:
            schema = response_format.json_schema.schema_
            p.param = "response_format.json_schema.schema"
            p.guide_type, p.guide = json_guide(schema if schema is not None else ANY_OBJECT, p.param)
        return p
    if isinstance(choice, NamedToolChoice):
        tool = next((t for t in tools if t.function.name == choice.function.name), None)
        if tool is None:
            raise PlanError(f"tool_choice names {choice.function.name!r}, which is not among tools ({', '.join(names)})",
                            "tool_choice")
        p.mode, p.named, p.param = "named", tool.function.name, "tools"
        p.guide_type, p.guide = json_guide(tool.function.parameters or ANY_OBJECT, f"tools.{tool.function.name}.parameters")
    elif choice == "required":
        p.mode, p.param = "required", "tools"
        p.guide_type, p.guide = json_guide(required_schema(tools, parallel_tool_calls is not False), "tools")
    elif choice == "auto":
        p.mode = "auto"
    return p


def required_schema(tools: list[Tool], parallel: bool = True) -> dict[str, Any]:
    """vLLM's guide for tool_choice required: one or more calls (one with parallel_tool_calls false), each a tool's
    name and its parameters."""
    return {
        "type": "array",
        "minItems": 1,
        **({} if parallel else {"maxItems": 1}),
        "items": {
            "type": "object",
            "anyOf": [
                {"properties": {"name": {"type": "string", "enum": [t.function.name]},
                                "parameters": t.function.parameters or ANY_OBJECT},
                 "required": ["name", "parameters"]}
                for t in tools
            ],
        },
    }


def tool_prompt(tools: list[Tool]) -> str:
    """The tools as a system message, for a chat template that does not render them (Hermes' wording)."""
    specs = "\n".join(json.dumps(t.function.model_dump(exclude_none=True), separators=(",", ":")) for t in tools)
    return ("You may call these functions:\n<tools>\n" + specs + "\n</tools>\n"
            'To call one, answer <tool_call>{"name": <function name>, "arguments": <arguments>}</tool_call>')


def with_tool_prompt(messages: list[dict[str, Any]], tools: list[Tool]) -> list[dict[str, Any]]:
    """The messages with the tools in the system message (one is added where there is none)."""
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{tool_prompt(tools)}")
        return [first, *messages[1:]]
    return [{"role": "system", "content": tool_prompt(tools)}, *messages]


def content_before_calls(text: str) -> str | None:
    """An answer's text before its first <tool_call> tag (the message's content beside its calls, as vLLM's
    Hermes parser returns it); None where there is none."""
    tag = text.find(OPEN_TAG)
    return (text[:tag].strip() or None) if tag > 0 else None
