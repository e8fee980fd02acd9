"""Structured output and tool calls through the OpenAI API on a real Triton (demo pair, reference engine), with the
official `openai` client: response_format json_schema (streamed and not, `parse` with a pydantic model) valid and
identical to the target-only baseline; tools with each tool_choice; a schema that does not compile is a 400."""

from __future__ import annotations

import json

import pytest

from conftest import DEMO_PAIR_DEPLOYMENT  # noqa: F401  (the deployment the shared server runs)

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "population": {"type": "integer"}, "capital": {"type": "boolean"}},
        "required": ["city", "population", "capital"], "additionalProperties": False}
ASK = "Give the city, population and whether it is a capital for Paris as JSON."
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
TOOLS = [WEATHER, TIME]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def api(demo_pair_server):
    from trtspec.openai.server import OpenAIServer

    with OpenAIServer(demo_pair_server.options.model_repository, demo_pair_server.endpoints.grpc_address,
                      host="127.0.0.1", port=0) as api:
        yield api


@pytest.fixture(scope="module")
def client(api):
    import openai

    return openai.OpenAI(base_url=api.url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def name(api):
    return api.deployment.name


# ------------------------------------------------------------------------------------------ fast, no server


def test_plans_and_tool_call_parsing() -> None:
    from trtspec.openai.structured import NamedToolChoice, PlanError, Tool, plan
    from trtspec.openai.tool_calls import parse_tool_calls

    tools = [Tool(**t) for t in TOOLS]
    p = plan(None, tools, "required", parallel_tool_calls=False)
    assert p.mode == "required" and p.guide_type == "ebnf_grammar"
    calls = parse_tool_calls(p, '[{"name": "get_time", "parameters": {"city": "Oslo"}}]')
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("get_time", {"city": "Oslo"})]
    auto = plan(None, tools, None)
    assert auto.mode == "auto" and auto.guide_type is None
    tagged = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome", "unit": "C"}}</tool_call>'
    assert parse_tool_calls(auto, tagged)[0]["function"]["name"] == "get_weather"
    assert parse_tool_calls(auto, "It is sunny.") is None
    assert parse_tool_calls(auto, '{"name": "unknown", "arguments": {}}') is None
    named = plan(None, tools, NamedToolChoice(type="function", function={"name": "get_time"}))
    assert parse_tool_calls(named, '{"city": "Lima"}')[0]["function"] == {"name": "get_time", "arguments": '{"city": "Lima"}'}
    assert plan(None, tools, "none").mode == "text"
    nope = NamedToolChoice(type="function", function={"name": "nope"})
    for args in ((None, [], "required"), (None, tools, nope)):
        with pytest.raises(PlanError) as e:
            plan(*args)
        assert e.value.param == "tool_choice"


def test_tool_calls_stream_as_openai_streams_them() -> None:
    """Each call announced with its id and name once the name is complete, its arguments in pieces as they are
    written, adding up to the arguments of the same answer not streamed; text that is not a call is content."""
    from trtspec.openai.structured import NamedToolChoice, Tool, plan
    from trtspec.openai.tool_calls import ToolCallStream, parse_tool_calls

    tools = [Tool(**t) for t in TOOLS]
    required = '[{"name": "get_time", "parameters": {"city": "Oslo"}}, {"name": "get_weather", "parameters": {"city": "Rome", "unit": "C"}}]'
    named = '{"city": "Lima"}'
    cases = [
        (plan(None, tools, "required"), required, "", 2),
        (plan(None, tools, NamedToolChoice(type="function", function={"name": "get_time"})), named, "", 1),
        (plan(None, tools, None), 'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Rome", '
                                  '"unit": "F"}}</tool_call>', "Let me check. ", 1),
        (plan(None, tools, None), "It is sunny <b>in</b> Rome.", "It is sunny <b>in</b> Rome.", 0),
        (plan(None, tools, None), '{"name": "unknown", "arguments": {}}', '{"name": "unknown", "arguments": {}}', 0),
        # the name written last: the arguments wait for it, then come in one piece
        (plan(None, tools, None), '{"arguments": {"city": "Bern"}, "name": "get_time"}', "", 1),
    ]
    for p, answer, want_content, n_calls in cases:
        stream, content, calls = ToolCallStream(p), "", {}
        for k in range(0, len(answer), 3):  # three characters a delta
            c, deltas = stream.feed(answer[k : k + 3])
            content += c
            for d in deltas:
                _add_tool_delta(calls, d)
        c, deltas = stream.finish()
        content += c
        for d in deltas:
            _add_tool_delta(calls, d)
        assert content == want_content, answer
        whole = parse_tool_calls(p, answer) or []
        assert [(c["name"], c["arguments"]) for c in calls.values()] == [
            (w["function"]["name"], w["function"]["arguments"]) for w in whole], answer
        assert len(calls) == n_calls and all(json.loads(c["arguments"]) is not None for c in calls.values())
        # streamed as they are written: each call's arguments in pieces
        assert all(c["pieces"] > 1 for c in calls.values()) or answer.endswith('"get_time"}'), answer


def _fmt(schema=CITY, strict=True):
    return {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": strict}}


def _chat(client, model, stream=False, **kw):
    kw = dict(model=model, messages=[{"role": "user", "content": ASK}], max_tokens=MAX_TOKENS, temperature=0) | kw
    if not stream:
        r = client.chat.completions.create(**kw)
        return r.choices[0].message, r.choices[0].finish_reason, r
    text, calls, finish = "", {}, None
    for c in client.chat.completions.create(stream=True, **kw):
        if not c.choices:
            continue
        d = c.choices[0].delta
        text += d.content or ""
        for tc in d.tool_calls or []:
            _add_tool_delta(calls, tc.model_dump(exclude_none=True))
        finish = c.choices[0].finish_reason or finish
    return {"content": text, "tool_calls": [calls[i] for i in sorted(calls)]}, finish, None


def _add_tool_delta(calls, tc):
    """One delta.tool_calls entry, checked to be shaped as OpenAI streams them: a call's first entry has its index,
    id, type and function name (arguments ""), the ones after it only arguments, in pieces."""
    fn = tc["function"]
    if tc["index"] not in calls:
        assert tc["index"] == len(calls) and tc["id"].startswith("call_") and tc["type"] == "function", tc
        assert fn["name"] and fn.get("arguments", "") == "", tc
        calls[tc["index"]] = {"name": fn["name"], "arguments": "", "pieces": 0}
    else:
        assert "id" not in tc and "name" not in fn and fn["arguments"], tc
        calls[tc["index"]]["arguments"] += fn["arguments"]
        calls[tc["index"]]["pieces"] += 1


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_is_valid_and_identical_to_target_only(client, name, stream) -> None:
    got, finish, r = _chat(client, name, stream, response_format=_fmt())
    want, _, _ = _chat(client, f"{name}-baseline", stream, response_format=_fmt())
    text = got.content if not stream else got["content"]
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), CITY)
    assert text == (want.content if not stream else want["content"])
    if r is not None:  # speculation ran under the guide
        assert r.model_extra["speculative"]["num_iterations"] < r.usage.completion_tokens
        assert r.model_extra["speculative"]["guided_without_drafting"] == 0


@pytest.mark.slow
def test_json_object_is_json(client, name) -> None:
    msg, finish, _ = _chat(client, name, response_format={"type": "json_object"}, max_tokens=200)
    if finish == "stop":
        json.loads(msg.content)


@pytest.mark.slow
def test_the_official_parse_helper_with_a_pydantic_model(client, name) -> None:
    from pydantic import BaseModel

    class City(BaseModel):
        city: str
        population: int
        capital: bool

    r = client.chat.completions.parse(model=name, messages=[{"role": "user", "content": ASK}], response_format=City,
                                      max_tokens=MAX_TOKENS, temperature=0)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, City), r.choices[0].message.content


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_required_gives_valid_calls(client, name, stream) -> None:
    # one call (parallel_tool_calls false): the demo model otherwise calls both tools and runs past max_tokens
    msg, finish, _ = _chat(client, name, stream, messages=WEATHER_Q, tools=TOOLS, tool_choice="required",
                           parallel_tool_calls=False, max_tokens=80)
    calls = msg.tool_calls if not stream else msg["tool_calls"]
    assert calls and len(calls) == 1 and finish == "tool_calls"
    for c in calls:
        fn_name, args = (c.function.name, c.function.arguments) if not stream else (c["name"], c["arguments"])
        jsonschema.validate(json.loads(args), PARAMS[fn_name])
        assert not stream or c["pieces"] > 1  # the arguments streamed as they were written
    if not stream:
        assert msg.content is None and all(c.id.startswith("call_") and c.type == "function" for c in calls)


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_choice_calls_that_function(client, name, stream) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    msg, finish, _ = _chat(client, name, stream, messages=WEATHER_Q, tools=TOOLS, tool_choice=choice)
    calls = msg.tool_calls if not stream else msg["tool_calls"]
    assert len(calls) == 1 and finish == "stop"
    fn_name, args = (calls[0].function.name, calls[0].function.arguments) if not stream else (calls[0]["name"], calls[0]["arguments"])
    assert fn_name == "get_time"
    jsonschema.validate(json.loads(args), PARAMS["get_time"])
    want, _, _ = _chat(client, f"{name}-baseline", stream, messages=WEATHER_Q, tools=TOOLS, tool_choice=choice)
    want_args = want.tool_calls[0].function.arguments if not stream else want["tool_calls"][0]["arguments"]
    assert args == want_args  # speculative and target-only, the same call


@pytest.mark.slow
def test_tool_choice_none_and_auto(client, name) -> None:
    msg, finish, _ = _chat(client, name, messages=WEATHER_Q, tools=TOOLS, tool_choice="none", max_tokens=24)
    assert msg.tool_calls is None and isinstance(msg.content, str)
    msg, finish, _ = _chat(client, name, messages=WEATHER_Q, tools=TOOLS, tool_choice="auto", max_tokens=48)
    if msg.tool_calls:  # the model chose to call: every call is one of the tools, its arguments JSON
        assert finish == "tool_calls"
        assert all(c.function.name in PARAMS and json.loads(c.function.arguments) is not None for c in msg.tool_calls)
    else:
        assert isinstance(msg.content, str)


@pytest.mark.slow
def test_a_schema_that_does_not_compile_is_a_400_naming_it(client, name) -> None:
    import openai

    bad = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}}
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, name, response_format=_fmt(bad))
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "does not compile" in e.value.body["message"] and "minimum" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, name, messages=WEATHER_Q, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "nope" in e.value.body["message"]
    msg, finish, _ = _chat(client, name, response_format=_fmt())  # the server is still up
    jsonschema.validate(json.loads(msg.content), CITY)


@pytest.mark.slow
def test_the_text_endpoints_take_nvidias_guide_inputs(demo_pair_server) -> None:
    """guided_decoding_guide_type / guided_decoding_guide on the ensemble, as NVIDIA's clients send them."""
    from trtspec.client import Client

    url = demo_pair_server.endpoints.grpc_address
    prompt = "<|im_start|>user\nWhat is the year after 2024? Answer:<|im_end|>\n<|im_start|>assistant\n"
    for guide_type, guide in (("regex", r"\d{4}"), ("ebnf_grammar", "root ::= [0-9]+"),
                              ("json_schema", json.dumps({"type": "object", "properties": {"answer": {"type": "integer"}},
                                                          "required": ["answer"]}))):
        spec = Client(url, "grpc", "ensemble").generate(prompt, 24, guided_decoding_guide_type=guide_type,
                                                        guided_decoding_guide=guide)
        base = Client(url, "grpc", "baseline").generate(prompt, 24, guided_decoding_guide_type=guide_type,
                                                        guided_decoding_guide=guide)
        assert spec.token_ids == base.token_ids, guide_type
        if guide_type == "json_schema":
            assert isinstance(json.loads(spec.text)["answer"], int)
        else:
            assert spec.text.strip().isdigit(), spec.text
