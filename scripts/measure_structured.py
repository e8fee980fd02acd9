"""Structured output on a running deployment, through its OpenAI API (the official client), greedy:

1. N JSON schemas (generated here, none of them in the tests): every answer parses and validates against its
   schema, and the speculative answer is identical to the target-only one (`<name>-baseline`);
2. json_schema throughput, speculative against target-only, at each concurrency (requests interleaved per cell);
3. tool calls with tool_choice required and a named function: parseable, valid against the tool's parameters.

    trtspec serve demo-out/model_repository --openai-port 9000 &
    python scripts/measure_structured.py --url http://localhost:9000/v1 --schemas 50 --concurrency 1,4,8
"""

from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

SUBJECTS = ["Paris", "a red bicycle", "the planet Mars", "a chess club", "a bakery", "the Nile", "a laptop",
            "a football team", "a rainforest", "a jazz album", "a hospital", "a mountain village", "a train",
            "a library", "a volcano", "a coffee shop", "a museum", "a submarine", "a garden", "a violin"]
FIELDS = [("name", {"type": "string", "maxLength": 24}), ("year", {"type": "integer", "minimum": 0, "maximum": 3000}),
          ("rating", {"type": "number"}), ("open", {"type": "boolean"}), ("color", {"enum": ["red", "green", "blue"]}),
          ("tags", {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}),
          ("size", {"enum": ["small", "medium", "large"]}), ("count", {"type": "integer", "minimum": 0}),
          ("city", {"type": "string", "maxLength": 20}), ("price", {"type": "number", "minimum": 0}),
          ("owner", {"type": "object", "properties": {"first": {"type": "string", "maxLength": 12},
                                                      "age": {"type": "integer"}}, "required": ["first", "age"],
                     "additionalProperties": False}),
          ("active", {"type": "boolean"}), ("code", {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"})]


def schemas(n: int, seed: int = 7) -> list[tuple[str, dict]]:
    """(prompt, schema): 2 to 5 fields each, drawn with a fixed seed."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        fields = rng.sample(FIELDS, rng.randint(2, 5))
        schema = {"type": "object", "properties": dict(fields), "required": [f for f, _ in fields],
                  "additionalProperties": False}
        subject = SUBJECTS[i % len(SUBJECTS)]
        out.append((f"Describe {subject} as JSON with the fields {', '.join(f for f, _ in fields)}.", schema))
    return out


def ask(client, model, prompt, schema, max_tokens):
    t0 = time.perf_counter()
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}})
    return r, time.perf_counter() - t0


def validity(client, name, cases, max_tokens):
    valid = same = ended = 0
    for i, (prompt, schema) in enumerate(cases):
        spec, _ = ask(client, name, prompt, schema, max_tokens)
        base, _ = ask(client, f"{name}-baseline", prompt, schema, max_tokens)
        text = spec.choices[0].message.content
        ok = spec.choices[0].finish_reason == "stop"
        ended += ok
        try:
            jsonschema.validate(json.loads(text), schema)
            valid += 1
        except (ValueError, jsonschema.ValidationError) as e:
            print(f"  schema {i}: not valid ({'ended' if ok else 'cut at max_tokens'}): {e}")
        same += text == base.choices[0].message.content
    print(f"schemas: {len(cases)}; ended within max_tokens {ended}; valid {valid}; speculative == target-only {same}")
    return valid, same


def throughput(client, name, cases, concurrency, max_tokens, requests):
    for c in concurrency:
        row = {}
        for model in (name, f"{name}-baseline") * 2:  # interleaved, twice
            work = [cases[i % len(cases)] for i in range(requests)]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                rs = list(pool.map(lambda pc: ask(client, model, pc[0], pc[1], max_tokens)[0], work))
            wall = time.perf_counter() - t0
            tokens = sum(r.usage.completion_tokens for r in rs)
            row.setdefault(model, []).append(tokens / wall)
        spec, base = (sum(row[m]) / 2 for m in (name, f"{name}-baseline"))
        print(f"c={c}: speculative {spec:.1f} tok/s, target-only {base:.1f} tok/s: {spec / base:.2f}x")


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "time in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def tool_calls(client, name, n):
    questions = [f"What is the weather in {c}?" for c in ("Paris", "Tokyo", "Lima", "Oslo", "Cairo")] + \
                [f"What time is it in {c}?" for c in ("Rome", "Delhi", "Quito", "Perth", "Accra")]
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        ok = 0
        for q in (questions * n)[:n]:
            r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": q}], tools=TOOLS,
                                               tool_choice=choice, parallel_tool_calls=False, max_tokens=96,
                                               temperature=0)
            calls = r.choices[0].message.tool_calls or []
            try:
                assert calls
                for c in calls:
                    jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])
                ok += 1
            except (AssertionError, ValueError, KeyError, jsonschema.ValidationError) as e:
                print(f"  {q!r}: no valid call: {e!r}")
        label = choice if isinstance(choice, str) else f"named {choice['function']['name']}"
        print(f"tool_choice {label}: {ok}/{n} parseable and valid")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://localhost:9000/v1")
    ap.add_argument("--model", default=None, help="the deployment's name (default: the first model listed)")
    ap.add_argument("--schemas", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--requests", type=int, default=8, help="requests per throughput cell")
    ap.add_argument("--tool-requests", type=int, default=10)
    ap.add_argument("--skip", default="", help="comma-separated: validity, throughput, tools")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.url, api_key="unused", max_retries=0, timeout=600)
    name = a.model or client.models.list().data[0].id
    cases = schemas(a.schemas)
    skip = set(a.skip.split(","))
    if "validity" not in skip:
        validity(client, name, cases, a.max_tokens)
    if "throughput" not in skip:
        throughput(client, name, cases, [int(c) for c in a.concurrency.split(",")], a.max_tokens, a.requests)
    if "tools" not in skip:
        tool_calls(client, name, a.tool_requests)


if __name__ == "__main__":
    main()
