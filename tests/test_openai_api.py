"""The OpenAI-compatible API through a real Triton on CPU (demo pair, reference engine), with the official
`openai` client: chat and completions, streamed and not, equal to the ensemble's own output; usage from
token ids; stop strings; speculation controls; errors in OpenAI's shape; a dropped stream stops in Triton."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from conftest import DEMO_PAIR_DEPLOYMENT
from trtspec.client import Client
from trtspec.openai.stop import StopMatcher

MAX_TOKENS = 12
MAX_INPUT_LEN = DEMO_PAIR_DEPLOYMENT["limits"]["max_input_len"]
MAX_DRAFT_LEN = DEMO_PAIR_DEPLOYMENT["speculative"]["max_draft_len"]
QUESTION = "What is the capital of France?"
COUNTING = "Count from one to one hundred: one, two, three, four,"
TOP = 3  # top_logprobs asked in the tests


# ------------------------------------------------------------------------------------------ fast, no server


def test_stop_matcher_holds_back_a_possible_stop_string() -> None:
    m = StopMatcher(["</end>"])
    assert m.feed("Hello </") == "Hello "  # "</" may start the stop string
    assert m.feed("b>") == "</b>"  # it did not
    assert m.feed(" then </en") == " then "
    assert m.feed("d> more") == "" and m.stopped
    assert m.feed("anything") == "" and m.flush() == ""


def test_stop_matcher_releases_held_text_at_the_end() -> None:
    m = StopMatcher(["STOP", "x"])
    assert m.feed("abcST") == "abc"
    assert m.flush() == "ST" and not m.stopped


def test_bad_request_errors_from_triton_are_400() -> None:
    from trtspec.contract import RequestError
    from trtspec.contract.errors import encode
    from trtspec.openai.backend import openai_error

    e = openai_error(f"in ensemble 'ensemble', {encode(RequestError('text_input is empty'))}")
    assert e.status == 400 and e.message == "text_input is empty"
    assert openai_error("speculative loop: engine died").status == 500


# ------------------------------------------------------------------------------------------ a real server


@pytest.fixture(scope="module")
def deployment(demo_pair_server):
    """The OpenAI front end on conftest's shared demo-pair Triton (DEMO_PAIR_DEPLOYMENT)."""
    from trtspec.openai.server import OpenAIServer

    with OpenAIServer(demo_pair_server.options.model_repository, demo_pair_server.endpoints.grpc_address,
                      host="127.0.0.1", port=0) as api:
        yield demo_pair_server, api


@pytest.fixture(scope="module")
def triton(deployment):
    return deployment[0]


@pytest.fixture(scope="module")
def api(deployment):
    return deployment[1]


@pytest.fixture(scope="module")
def client(api):
    import openai

    return openai.OpenAI(base_url=api.url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer(api):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(api.deployment.tokenizer_dir)


@pytest.fixture(scope="module")
def name(api):
    return api.deployment.name


def _ensemble(triton, prompt: str, model: str = "ensemble", **params):
    return Client(triton.endpoints.grpc_address, "grpc", model).generate(prompt, MAX_TOKENS, **params)


def _chat_prompt(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def _post(api, path: str, body: bytes | dict) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(api.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
def test_models_are_the_deployment_and_its_baseline(client, triton, name) -> None:
    models = {m.id: m.model_extra["triton_model"] for m in client.models.list().data}
    # the repository's folder (conftest's mktemp("demo-pair")): a generated repository has no manifest
    assert name == Path(triton.options.model_repository).parent.name == "demo-pair0"
    assert models == {name: "ensemble", f"{name}-baseline": "baseline"}


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_chat_equals_the_ensemble_on_the_rendered_template(client, triton, tokenizer, name, stream) -> None:
    want = _ensemble(triton, _chat_prompt(tokenizer, QUESTION))
    kwargs = dict(model=name, messages=[{"role": "user", "content": QUESTION}], max_tokens=MAX_TOKENS,
                  temperature=0, extra_body={"return_token_ids": True})
    if not stream:
        r = client.chat.completions.create(**kwargs)
        text, ids, finish = r.choices[0].message.content, r.choices[0].model_extra["token_ids"], r.choices[0].finish_reason
        usage, spec = r.usage, r.model_extra["speculative"]
    else:
        chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        ids = [t for c in chunks if c.choices for t in c.choices[0].model_extra.get("token_ids", [])]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
        spec = next(c.model_extra["speculative"] for c in chunks if c.model_extra.get("speculative"))
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1  # really streamed
    assert text == want.text and ids == want.token_ids
    assert usage.completion_tokens == len(want.token_ids)
    assert usage.prompt_tokens == len(tokenizer.encode(_chat_prompt(tokenizer, QUESTION), add_special_tokens=False))
    assert finish == ("length" if len(ids) == MAX_TOKENS else "stop")
    assert spec["num_iterations"] > 0 and spec["total_draft_tokens"] > 0
    assert 0 <= spec["total_accepted_draft_tokens"] <= spec["total_draft_tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_completion_equals_the_ensemble_and_counts_usage_from_ids(client, triton, tokenizer, name, stream) -> None:
    want = _ensemble(triton, COUNTING)
    assert len(want.token_ids) == MAX_TOKENS  # counting goes on: the request ends at max_tokens
    kwargs = dict(model=name, prompt=COUNTING, max_tokens=MAX_TOKENS, temperature=0)
    if not stream:
        r = client.completions.create(**kwargs)
        text, finish, usage = r.choices[0].text, r.choices[0].finish_reason, r.usage
    else:
        chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
    assert text == want.text and finish == "length"
    assert usage.completion_tokens == MAX_TOKENS and usage.prompt_tokens == len(tokenizer.encode(COUNTING))


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_stop_ends_the_text_before_the_stop_string(client, triton, name, stream) -> None:
    full = _ensemble(triton, COUNTING).text
    stop = full[full.index(",", 3) : full.index(",", 3) + 3]  # a stop string in the middle of the output
    kwargs = dict(model=name, prompt=COUNTING, max_tokens=MAX_TOKENS, temperature=0, stop=[stop, "never-seen"])
    if not stream:
        r = client.completions.create(**kwargs)
        text, finish, usage = r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens
    else:
        chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage.completion_tokens
    assert text == full[: full.index(stop)] and finish == "stop"
    assert usage < MAX_TOKENS  # the request ended in Triton at the stop string, not at max_tokens


@pytest.mark.slow
def test_speculation_controls_and_the_baseline_model(client, triton, name) -> None:
    def run(model: str, **extra):
        r = client.completions.create(model=model, prompt=COUNTING, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body=extra)
        return r.choices[0].text, r.model_extra["speculative"]

    spec_text, spec = run(name, num_draft_tokens=4, draft_source="ngram", draft_length_policy="fixed")
    base_text, base = run(f"{name}-baseline")
    off_text, off = run(name, num_draft_tokens=0)
    assert spec_text == base_text == off_text  # greedy: speculation never changes the text
    assert spec["total_draft_tokens"] > 0 and spec["accepted_by_source"][0] == 0  # [model, ngram]: n-gram only
    assert base["total_draft_tokens"] == 0 and off["total_draft_tokens"] == 0


@pytest.mark.slow
def test_min_tokens_and_ignore_eos_fix_the_output_length(api, client, name) -> None:
    """What AIPerf and vLLM-style benchmarks send for a fixed output length: honoured, never ignored."""
    def tokens(**extra) -> int:
        r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=48, temperature=0, extra_body=extra)
        return r.usage.completion_tokens

    natural = tokens()
    assert natural < 48  # the answer ends at the end token on its own, so the fields below must act
    assert tokens(min_tokens=48) == 48
    assert tokens(ignore_eos=True) == 48
    _assert_error(api, 400, {"model": name, "messages": [{"role": "user", "content": "hi"}], "min_tokens": -1},
                  says="min_tokens")


def _assert_error(api, status: int, body, param: str | None = None, says: str = "", path: str = "/chat/completions") -> dict:
    code, reply = _post(api, path, body)
    assert code == status, reply
    assert set(reply) == {"error"} and set(reply["error"]) == {"message", "type", "param", "code"}, reply
    assert reply["error"]["type"] == ("invalid_request_error" if status < 500 else "server_error")
    if param is not None:
        assert reply["error"]["param"] == param, reply
    assert says in reply["error"]["message"], reply
    return reply["error"]


@pytest.mark.slow
def test_errors_have_the_openai_shape_and_the_server_stays_healthy(api, client, name) -> None:
    import openai

    ok = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    _assert_error(api, 400, b'{"model": "x", "messages": [', says="not valid JSON")
    _assert_error(api, 404, {**ok, "model": "nope"}, "model", says=f"{name}-baseline")
    long = {**ok, "messages": [{"role": "user", "content": "word " * 400}]}
    _assert_error(api, 400, long, "messages", says=f"limit of {MAX_INPUT_LEN} tokens")
    _assert_error(api, 400, {**ok, "max_tokens": MAX_INPUT_LEN}, "messages", says="max_input_len")
    for field, value in (("temperature", -1), ("top_p", 0), ("top_p", 1.5), ("max_tokens", 0), ("n", 0), ("n", 17),
                         ("num_draft_tokens", -1), ("draft_source", "oracle"), ("draft_length_policy", "x")):
        _assert_error(api, 400, {**ok, field: value}, field)
    _assert_error(api, 400, {**ok, "num_draft_tokens": 99}, "num_draft_tokens",
                  says=f"larger than max_draft_len {MAX_DRAFT_LEN}")
    _assert_error(api, 400, {**ok, "messages": [{"role": "wizard", "content": "x"}]}, says="messages.0.role")
    _assert_error(api, 400, {**ok, "messages": []}, "messages")
    _assert_error(api, 400, {**ok, "logprobs": True, "top_logprobs": 21}, "top_logprobs", says="less than or equal to 20")
    _assert_error(api, 400, {**ok, "top_logprobs": 2}, says="top_logprobs needs logprobs: true")
    text_ok = {"model": name, "prompt": "Hi", "max_tokens": 4}
    _assert_error(api, 400, {**text_ok, "logprobs": 6}, "logprobs", says="less than or equal to 5", path="/completions")
    _assert_error(api, 400, {**text_ok, "logprobs": 0, "echo": True}, says="echo with logprobs", path="/completions")
    _assert_error(api, 400, {**ok, "functions": [{"name": "f"}]}, says="functions is not supported")
    # non-finite numbers are not JSON, but Python's json writes them: still a 400
    _assert_error(api, 400, b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}'
                  % name.encode(), says="temperature")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=name, prompt="x", max_tokens=2, temperature=-0.5)
    r = client.chat.completions.create(**ok)  # still serving
    assert r.choices[0].message.content and r.usage.completion_tokens > 0


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_are_independent_requests_each_equal_to_one_alone(client, triton, tokenizer, name, stream) -> None:
    one = _ensemble(triton, _chat_prompt(tokenizer, QUESTION))
    want = one.text
    kwargs = dict(model=name, messages=[{"role": "user", "content": QUESTION}], max_tokens=MAX_TOKENS, temperature=0, n=2)
    if not stream:
        r = client.chat.completions.create(**kwargs)
        assert [c.index for c in r.choices] == [0, 1]
        assert [c.message.content for c in r.choices] == [want, want]  # greedy: both equal the ensemble's
        assert r.usage.completion_tokens == 2 * len(one.token_ids)
        assert all(c.model_extra["speculative"]["num_iterations"] > 0 for c in r.choices)
        assert r.model_extra["speculative"]["num_iterations"] == sum(c.model_extra["speculative"]["num_iterations"] for c in r.choices)
        return
    texts, finished = {0: "", 1: ""}, set()
    for chunk in client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
        if chunk.usage is not None:
            usage = chunk.usage
    assert texts == {0: want, 1: want} and finished == {0, 1}
    assert usage.completion_tokens == 2 * len(one.token_ids)


@pytest.mark.slow
def test_n_choices_sample_with_their_own_seeds(client, name) -> None:
    kwargs = dict(model=name, prompt="Once upon a time", max_tokens=MAX_TOKENS, temperature=1.0, seed=7)
    two = client.completions.create(**kwargs, n=2)
    again = client.completions.create(**kwargs, n=2)
    assert [c.text for c in two.choices] == [c.text for c in again.choices]  # reproducible
    assert two.choices[0].text == client.completions.create(**kwargs).choices[0].text  # choice 0 uses the seed
    assert two.choices[1].text == client.completions.create(**{**kwargs, "seed": 8}).choices[0].text  # choice 1: seed + 1


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_echo_returns_the_prompt_before_the_completion(client, name, stream) -> None:
    prompt = "The capital of France is"
    plain = client.completions.create(model=name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0).choices[0].text
    kwargs = dict(model=name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, echo=True)
    if stream:
        text = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True) if c.choices)
    else:
        text = client.completions.create(**kwargs).choices[0].text
    assert text == prompt + plain


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_are_the_targets_and_equal_the_baselines(client, name, stream) -> None:
    kwargs = dict(messages=[{"role": "user", "content": QUESTION}], max_tokens=MAX_TOKENS, temperature=0, logprobs=True,
                  top_logprobs=TOP)

    def run(model: str) -> tuple[str, list]:
        if not stream:
            c = client.chat.completions.create(model=model, **kwargs).choices[0]
            return c.message.content, c.logprobs.content
        text, content = "", []
        for chunk in client.chat.completions.create(model=model, stream=True, **kwargs):
            for c in chunk.choices:
                text += c.delta.content or ""
                content += c.logprobs.content if c.logprobs else []
        return text, content

    (text, spec), (base_text, base) = run(name), run(f"{name}-baseline")
    assert text == base_text and len(spec) == len(base) > 0
    assert [t.token for t in spec] == [t.token for t in base]
    assert "".join(t.token for t in spec).startswith(text) or text.startswith("".join(t.token for t in spec)[: len(text)])
    assert np.allclose([t.logprob for t in spec], [t.logprob for t in base], atol=1e-3)
    assert all(t.logprob <= 0 and bytes(t.bytes).decode() == t.token for t in spec)
    # the target's TOP most likely tokens at each position: the baseline's, and the emitted token among them
    assert [[a.token for a in t.top_logprobs] for t in spec] == [[a.token for a in t.top_logprobs] for t in base]
    assert np.allclose([[a.logprob for a in t.top_logprobs] for t in spec],
                       [[a.logprob for a in t.top_logprobs] for t in base], atol=1e-3)
    for t in spec:
        assert len(t.top_logprobs) == TOP and t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
        assert any(a.token == t.token and abs(a.logprob - t.logprob) < 1e-3 for a in t.top_logprobs), t


@pytest.mark.slow
def test_chat_logprobs_without_top_logprobs_have_no_alternatives(client, name) -> None:
    c = client.chat.completions.create(model=name, messages=[{"role": "user", "content": QUESTION}], max_tokens=3,
                                       temperature=0, logprobs=True).choices[0]
    assert c.logprobs.content and all(t.top_logprobs == [] for t in c.logprobs.content)


@pytest.mark.slow
def test_completion_logprobs_line_up_with_the_text(client, name) -> None:
    c = client.completions.create(model=name, prompt="The capital of France is", max_tokens=MAX_TOKENS, temperature=0,
                                  logprobs=0).choices[0]
    lp = c.logprobs
    assert "".join(lp.tokens) == c.text and len(lp.token_logprobs) == len(lp.tokens) > 0
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(x <= 0 for x in lp.token_logprobs) and lp.top_logprobs is None


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_completion_top_logprobs_equal_the_baselines(client, name, stream) -> None:
    kwargs = dict(prompt="The capital of France is", max_tokens=MAX_TOKENS, temperature=0, logprobs=TOP)

    def run(model: str) -> tuple[list[str], list[float], list[dict[str, float]]]:
        parts = ([client.completions.create(model=model, **kwargs)] if not stream else
                 list(client.completions.create(model=model, stream=True, **kwargs)))
        lps = [c.choices[0].logprobs for c in parts if c.choices and c.choices[0].logprobs]
        return ([t for lp in lps for t in lp.tokens], [x for lp in lps for x in lp.token_logprobs],
                [d for lp in lps for d in lp.top_logprobs])

    (tokens, lps, tops), (base_tokens, _, base_tops) = run(name), run(f"{name}-baseline")
    assert tokens == base_tokens and len(tops) == len(tokens) > 0
    for token, lp, top, base in zip(tokens, lps, tops, base_tops):
        assert list(top) == list(base) and np.allclose(list(top.values()), list(base.values()), atol=1e-3)
        assert 0 < len(top) <= TOP and abs(top[token] - lp) < 1e-3  # the emitted (greedy) token among them


def test_the_openapi_document_lists_the_errors_the_server_sends() -> None:
    from fastapi import FastAPI

    from trtspec.openai.app import create_app

    class _Backend:  # create_app only reads the deployment's name to build the routes
        deployment = type("D", (), {"name": "x"})()

    app: FastAPI = create_app(_Backend())  # type: ignore[arg-type]
    doc = app.openapi()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = doc["paths"][path]["post"]["responses"]
        assert {"400", "404", "500", "503"} <= set(responses), (path, sorted(responses))
        assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert "422" not in doc["paths"]["/v1/completions"]["post"]["responses"]  # validation errors are answered as 400


def _counters(triton) -> tuple[float, float, float, float, float]:
    from trtspec.bench.metrics import scrape, value
    from trtspec.spec.metrics import AFTER_CANCEL_COUNTER

    s = scrape(triton.endpoints.metrics)
    return (value(s, "spec_decode_num_requests", model="speculative"),
            value(s, "spec_decode_num_emitted_tokens", model="speculative"),
            value(s, "nv_inference_pending_request_count"),
            value(s, "spec_decode_num_cancelled_requests", model="speculative"),
            value(s, AFTER_CANCEL_COUNTER, model="speculative"))


@pytest.mark.slow
def test_a_dropped_stream_stops_its_request_in_triton(client, triton, name) -> None:
    """An SSE client that leaves costs at most one more target call: the draft length plus the target's token."""
    requests_before, emitted_before, _, cancelled_before, after_cancel_before = _counters(triton)
    stream = client.completions.create(model=name, prompt=COUNTING, max_tokens=200, temperature=0, stream=True)
    for i, _chunk in enumerate(stream):
        if i == 2:
            break
    stream.close()  # the client goes away mid-stream
    dropped = time.monotonic()
    while _counters(triton)[3] == cancelled_before:  # the loop counts the request, then its cancel, when it ends
        assert time.monotonic() - dropped < 60, "the request still runs in Triton after its client left"
        time.sleep(0.2)
    requests, emitted, pending, cancelled, after_cancel = _counters(triton)
    assert cancelled == cancelled_before + 1  # it ended because its client left, not by finishing
    assert requests == requests_before + 1 and pending == 0
    assert after_cancel - after_cancel_before <= DEMO_PAIR_DEPLOYMENT["speculative"]["num_draft_tokens"] + 1
    assert emitted - emitted_before < 40  # the prompt counts on for 100+ tokens: cancelled, not finished



def _target_calls(triton) -> int:
    """Requests the target engine has answered (each target call of a loop is one)."""
    url = f"http://{triton.endpoints.http_address}/v2/models/tensorrt_llm/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        return sum(int(m["inference_stats"]["success"]["count"]) for m in json.load(r)["model_stats"])


@pytest.mark.slow
def test_a_client_that_leaves_before_its_answer_that_is_not_streamed_stops_it_in_triton(api, triton, name) -> None:
    """A response that is not streamed is written only at its end, so nothing fails when its client leaves: the API
    asks, and cancels the request in Triton; the loop stops within one target call of seeing it, within seconds."""
    import http.client
    import socket
    from urllib.parse import urlsplit

    requests_before, _, _, cancelled_before, after_cancel_before = _counters(triton)
    calls = _target_calls(triton)
    url = urlsplit(api.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    body = {"model": name, "prompt": COUNTING, "max_tokens": 200, "temperature": 0}
    conn.request("POST", f"{url.path}/completions", json.dumps(body), {"Content-Type": "application/json"})
    deadline = time.monotonic() + 60
    while _target_calls(triton) < calls + 2:  # it is generating in Triton
        assert time.monotonic() < deadline, "the request made no target calls"
        time.sleep(0.05)
    conn.sock.shutdown(socket.SHUT_RDWR)  # the client goes away before its answer
    conn.close()
    left = time.monotonic()
    while _counters(triton)[0] == requests_before:  # the loop counts the request when it ends, cancelled or not
        assert time.monotonic() - left < 60, "the request still runs in Triton after its client left"
        time.sleep(0.05)
    ended_after = time.monotonic() - left
    while (counts := _counters(triton))[3] == cancelled_before:  # its cancel is counted just after it
        assert time.monotonic() - left < ended_after + 1, f"it ran to its end ({ended_after:.1f} s): not cancelled"
        time.sleep(0.05)
    requests, _, pending, cancelled, after_cancel = counts
    assert requests == requests_before + 1 and cancelled == cancelled_before + 1 and pending == 0
    assert after_cancel - after_cancel_before <= DEMO_PAIR_DEPLOYMENT["speculative"]["num_draft_tokens"] + 1
    assert ended_after < 5.0, f"stopped {ended_after:.2f} s after the client left"  # test_reliability's bound


@pytest.mark.slow
def test_bench_through_the_openai_api(api, triton) -> None:
    from trtspec.bench import BenchSettings, run_bench
    from trtspec.bench.prompts import builtin_prompts

    settings = BenchSettings(url=api.url.removesuffix("/v1"), api="openai", max_tokens=8, concurrency=(1,),
                             draft_tokens=(0, 2), requests_per_cell=2, warmup=0, metrics_url=triton.endpoints.metrics)
    run = run_bench(settings, builtin_prompts(["chat"])[:2])
    records = [r for c in run.cells for r in c.records]
    assert len(records) == 4 and not [r.error for r in records if r.error]
    assert all(r.output_tokens > 0 and r.ttft_s is not None for r in records)
    spec = [r for r in records if r.cell.speculative]
    assert spec and all(r.stats.total_draft_tokens > 0 for r in spec)
    assert run.metrics_check["status"] == "ok", run.metrics_check  # counts equal the loop's own counters


@pytest.mark.slow
def test_infer_chat_goes_through_the_openai_api(api) -> None:
    from click.testing import CliRunner

    from trtspec.commands import infer

    result = CliRunner().invoke(infer.command, [QUESTION, "--chat", "--openai-url", api.url.removesuffix("/v1"),
                                                "-n", str(MAX_TOKENS), "--stream", "-k", "2"])
    assert result.exit_code == 0, result.output
    assert "Paris" in result.output and "target calls" in result.output
    result = CliRunner().invoke(infer.command, [QUESTION, "--chat", "--openai-url", "127.0.0.1:9"])
    assert result.exit_code != 0 and "cannot reach the OpenAI API" in result.output
