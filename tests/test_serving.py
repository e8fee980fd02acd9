"""End to end through a real Triton server on CPU: the demo pair on the reference engine.

Greedy speculative output must be token-identical to the target-only baseline endpoint, over HTTP and
gRPC, streaming and not, for several draft lengths; concurrent streams must not cross-talk; bad
requests get errors while the server stays up; an unloaded draft falls back to target-only.
"""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from trtspec.client import Client, ClientError
from trtspec.contract.errors import ErrorKind, decode

pytestmark = pytest.mark.slow

MAX_TOKENS = 16
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
PASSAGE = (
    "The Nile is the longest river in Africa. It flows north for about 6,650 km through eleven countries "
    "and drains into the Mediterranean Sea. Its two main tributaries are the White Nile and the Blue Nile, "
    "which meet at Khartoum in Sudan."
)
PROMPTS = [
    CHAT.format("What is the capital of France?"),
    CHAT.format("Give me three tips for staying focused while studying."),
    CHAT.format("Write a haiku about the sea."),
    CHAT.format("Explain what a hash table is in one paragraph."),
    CHAT.format("How do I boil an egg?"),
    CHAT.format("What causes the seasons on Earth?"),
    CHAT.format(f"Summarise this passage in one sentence:\n{PASSAGE}"),
    CHAT.format(f"Which two tributaries are named in this passage?\n{PASSAGE}"),
    CHAT.format(f"Rewrite this passage for a child:\n{PASSAGE}"),
    CHAT.format("Extract the email address from: 'Contact Jane at jane.doe@example.com before Friday.'"),
    CHAT.format("Translate 'good morning' into Spanish and French."),
    CHAT.format("List the planets of the solar system."),
    "def fibonacci(n):\n    ",
    "import numpy as np\n\ndef normalize(x):\n",
    "The history of the printing press begins",
    "Once upon a time, in a small village by the mountains,",
    "Q: What is 12 times 12?\nA:",
    "Les mathématiques sont",
    "Emoji test: 🚀🌍 are symbols for",
    "日本の首都は",
]


@pytest.fixture(scope="module")
def server(demo_pair_server):
    """conftest.DEMO_PAIR_DEPLOYMENT: max_draft_len 8, max_batch_size 8, max_input_len 256."""
    return demo_pair_server


def _client(server, protocol="http", model="ensemble"):
    addr = server.endpoints.http_address if protocol == "http" else server.endpoints.grpc_address
    return Client(addr, protocol, model)


@pytest.fixture(scope="module")
def baseline(server):
    """Target-only token ids per prompt, each request alone in the deployment (the reference every speculative
    and every concurrent run must reproduce)."""
    client = _client(server, model="baseline")
    gens = [client.generate(p, MAX_TOKENS) for p in PROMPTS]
    for g in gens:
        assert g.stats.total_draft_tokens == 0 and len(g.token_ids) > 0
    return [g.token_ids for g in gens]


# the shortest draft and max_draft_len; the deployment's own k (3) is every other test's: the draft-source batch
# (http), the log-probability tests (streamed, http and grpc) and the concurrent streams (grpc) each check it
# token for token against the baseline; the shipped deployment's controller, over both protocols, streamed and not,
# at 8 in flight for 256 tokens: tests/test_shipped_deployment.py
GREEDY_DRAFT_LENGTHS = (1, 8)
GREEDY_CASES = [(k, stream) for k in GREEDY_DRAFT_LENGTHS for stream in (False, True)]


def test_greedy_speculative_identical_to_baseline(server, baseline):
    """Every (draft length, streaming) case reproduces target-only, in one batch of requests: a case takes every
    second prompt from its own offset, so for each draft length the two cases together cover every prompt; the
    protocol alternates by prompt (HTTP, gRPC), so each case runs over both."""
    jobs = [(case, i) for n, case in enumerate(GREEDY_CASES) for i in range(n % 2, len(PROMPTS), 2)]
    clients = {p: _client(server, p) for p in ("http", "grpc")}

    def run(job):
        (k, stream), i = job
        return clients[("http", "grpc")[i // 2 % 2]].generate(PROMPTS[i], MAX_TOKENS, stream=stream, num_draft_tokens=k)

    with ThreadPoolExecutor(8) as pool:
        gens = dict(zip(jobs, pool.map(run, jobs)))
    for case in GREEDY_CASES:
        mine = {i: g for (c, i), g in gens.items() if c == case}
        for i, g in mine.items():
            assert g.token_ids == baseline[i], f"k, stream = {case}: prompt {PROMPTS[i]!r}"
        drafted = sum(g.stats.total_draft_tokens for g in mine.values())
        accepted = sum(g.stats.total_accepted_draft_tokens for g in mine.values())
        assert drafted > 0 and 0 < accepted <= drafted, case  # the draft took part, and some of it was accepted
        if case[1]:
            assert any(len(g.chunks) > 1 for g in mine.values()), case  # tokens really arrived in pieces
    for k in GREEDY_DRAFT_LENGTHS:  # each draft length saw every prompt
        assert sorted(i for (c, i) in gens if c[0] == k) == list(range(len(PROMPTS)))


GROUNDED = [
    CHAT.format(f"Repeat this sentence exactly: {sentence}")
    for sentence in (
        "The quick brown fox jumps over the lazy dog near the river bank.",
        "Our meeting is moved to Thursday at 3 pm in room 204.",
    )
] + [
    f"Passage: {PASSAGE}\n\nQuestion: Where do the White Nile and the Blue Nile meet?\nAnswer:",
    f"Text: {PASSAGE}\n\nCopy the first sentence of the text:",
]


DRAFT_SOURCES = ["ngram", "hybrid", "model", "hybrid-adaptive"]


def test_every_draft_source_is_exact(server, baseline):
    """Greedy output equals target-only for every draft source, on chat and input-grounded prompts
    (hybrid-adaptive: the goodput controller, which picks k and the source every iteration), in one batch of
    requests: every source gets every grounded prompt and every fourth chat prompt from its own offset."""
    client = _client(server)
    base = _client(server, model="baseline")
    with ThreadPoolExecutor(8) as pool:
        want = baseline + list(pool.map(lambda p: base.generate(p, MAX_TOKENS).token_ids, GROUNDED))
        prompts = PROMPTS + GROUNDED
        jobs = [(name, i) for n, name in enumerate(DRAFT_SOURCES)
                for i in [*range(n, len(PROMPTS), 4), *range(len(PROMPTS), len(prompts))]]

        def run(job):
            source, _, policy = job[0].partition("-")
            return client.generate(prompts[job[1]], MAX_TOKENS, num_draft_tokens=3, draft_source=source,
                                   draft_length_policy=policy or None)

        # the controller on grounded prompts alone: there prompt lookup pays by far (1.4x on the demo); at 8 in flight
        # on 2 cores a lookup row costs about what one more request does, and whether it pays there is the machine's
        alone = [j for j in jobs if j[0] == "hybrid-adaptive" and j[1] >= len(PROMPTS)]
        together = [j for j in jobs if j not in alone]
        gens = dict(zip(together, pool.map(run, together)))
    gens.update((j, run(j)) for j in alone)
    for name in DRAFT_SOURCES:
        source, _, policy = name.partition("-")
        mine = {i: g for (n, i), g in gens.items() if n == name}
        for i, g in mine.items():
            assert g.token_ids == want[i], f"{name}: prompt {prompts[i]!r}"
        by_source = [sum(g.stats.accepted_by_source[j] for g in mine.values()) for j in range(2)]  # [model, ngram]
        accepted = sum(g.stats.total_accepted_draft_tokens for g in mine.values())
        assert sum(by_source) == accepted, name
        if source == "ngram":
            assert by_source[0] == 0 and by_source[1] > 0  # grounded prompts copy from the prompt
        if source == "model":
            assert by_source[1] == 0
        if source == "hybrid" and not policy:
            assert by_source[0] > 0 and by_source[1] > 0
        if policy:
            assert by_source[1] > 0


def test_streamed_text_concatenates_to_the_whole_text(server):
    client = _client(server)
    prompts = (PROMPTS[-1], PROMPTS[-2], PROMPTS[-3])  # multi-byte characters split across tokens
    with ThreadPoolExecutor(6) as pool:
        wholes = pool.map(lambda p: client.generate(p, 24), prompts)
        streams = pool.map(lambda p: client.generate(p, 24, stream=True, num_draft_tokens=1), prompts)
        pairs = list(zip(wholes, streams))
    for whole, streamed in pairs:
        assert streamed.token_ids == whole.token_ids
        assert "".join(c.text for c in streamed.chunks) == whole.text
        assert "\ufffd" not in whole.text


def _draft_engine_requests(server, model: str = "tensorrt_llm_draft") -> int:
    """Requests Triton's statistics count for the draft model (each draft call is one), or another `model`."""
    with urllib.request.urlopen(f"http://{server.endpoints.http_address}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"]
    return sum(int(m["inference_stats"]["success"]["count"]) for m in stats)


def test_a_streamed_plain_run_streams_from_the_engine_a_token_a_response(server, baseline):
    """Not drafting (the baseline endpoint, and num_draft_tokens 0 on the speculative one), a streamed request takes
    plain runs that the engine streams: a token a response as each step makes it, and target-only's answer, in
    fewer target calls than tokens (a call per token, each a round trip the engine waits for, is what target-only
    served by the engine alone does not pay)."""
    for model, extra in (("baseline", {}), ("ensemble", {"num_draft_tokens": 0})):
        before = _draft_engine_requests(server, "tensorrt_llm")
        g = _client(server, model=model).generate(PROMPTS[1], MAX_TOKENS, stream=True, **extra)
        assert g.token_ids == baseline[1], model
        assert [len(c.token_ids) for c in g.chunks if c.token_ids] == [1] * len(g.token_ids), model
        assert g.stats.num_iterations < len(g.token_ids) / 2, (model, g.stats.num_iterations, len(g.token_ids))
        assert _draft_engine_requests(server, "tensorrt_llm") - before == g.stats.num_iterations, model


def test_controller_is_exact_and_its_k0_iterations_make_no_draft_call(server, baseline):
    """Under the goodput controller greedy output is target-only's (at 8 in flight, on the shipped deployment, for
    256 tokens: tests/test_shipped_deployment.py), every iteration's draft length is in draft_len_counts, and the
    draft model is called exactly once per iteration that drafted from it."""
    client = _client(server)
    before = _draft_engine_requests(server)
    gens = [client.generate(PROMPTS[0], MAX_TOKENS, num_draft_tokens=3, draft_source="model",
                            draft_length_policy="adaptive")]
    assert [g.token_ids for g in gens] == baseline[:1]
    for g in gens:
        assert sum(g.stats.draft_len_counts) == g.stats.num_iterations
        assert len(g.stats.draft_len_counts) <= 4  # never past the request's num_draft_tokens
    assert _draft_engine_requests(server) - before == sum(g.stats.num_drafts for g in gens)
    assert _metric(server, "trtspec_controller_verify_seconds") > 0  # its estimates, on /metrics
    # num_draft_tokens 0: served like the baseline, no draft-engine work at all
    before = _draft_engine_requests(server)
    g = client.generate(PROMPTS[0], MAX_TOKENS, num_draft_tokens=0, draft_length_policy="adaptive")
    assert g.token_ids == baseline[0] and g.stats.draft_len_counts == [g.stats.num_iterations]
    assert _draft_engine_requests(server) == before


@pytest.mark.parametrize("model", ["ensemble", "baseline"])
def test_concurrent_streams_match_their_solo_output(server, baseline, model):
    """16 streams at once (twice the deployment's max_batch_size: a full batch runs and half of them queue in the
    engine) each equal their solo output, and they overlapped in time."""
    n = 16
    client = _client(server, "grpc", model)
    with ThreadPoolExecutor(n) as pool:
        together = list(pool.map(lambda p: client.generate(p, MAX_TOKENS, stream=True), PROMPTS[:n]))
    assert [g.token_ids for g in together] == baseline[:n]
    # they really overlapped in time: at some moment at least a full batch (8) was in flight at once (not every
    # one with every other: on a loaded machine a short answer may end before the last thread has sent)
    events = sorted([(g.start, 1) for g in together] + [(g.end, -1) for g in together])  # an end before a start
    in_flight = np.cumsum([step for _, step in events])
    assert in_flight.max() >= n // 2, f"at most {in_flight.max()} of {n} streams in flight at once"


def test_response_reports_acceptance(server):
    g = _client(server).generate(PROMPTS[6], MAX_TOKENS, num_draft_tokens=4)
    s = g.stats
    assert 0.0 <= s.acceptance_rate <= 1.0
    assert s.acceptance_rate == pytest.approx(s.total_accepted_draft_tokens / s.total_draft_tokens, abs=1e-6)
    assert len(s.proposed_per_position) == 4
    assert sum(s.accepted_per_position) == s.total_accepted_draft_tokens
    # every target call adds its accepted tokens plus one of its own
    assert len(g.token_ids) <= s.num_iterations + s.total_accepted_draft_tokens


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_log_probs_are_the_targets_with_and_without_speculation(server, protocol):
    got = _client(server, protocol).generate(PROMPTS[6], MAX_TOKENS, stream=True, num_draft_tokens=3, return_log_probs=True)
    want = _client(server, protocol, model="baseline").generate(PROMPTS[6], MAX_TOKENS, stream=True, return_log_probs=True)
    assert got.token_ids == want.token_ids and got.stats.total_draft_tokens > 0
    for g in (got, want):
        assert all(c.log_probs is not None and len(c.log_probs) == len(c.token_ids) for c in g.chunks if c.token_ids)
    lp = lambda g: [x for c in g.chunks for x in (c.log_probs or [])]  # noqa: E731
    assert len(lp(got)) == len(got.token_ids) and np.allclose(lp(got), lp(want), atol=1e-3)
    assert all(c.log_probs is None for c in _client(server, protocol).generate(PROMPTS[6], 4).chunks)  # only when asked


def test_every_metric_the_grafana_dashboard_queries_is_exported(server):
    from trtspec.k8s.dashboard import dashboard, queried_metrics

    def exported() -> set[str]:
        text = urllib.request.urlopen(server.endpoints.metrics, timeout=10).read().decode()
        return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}

    # the speculation counters exist from a request on; the controller's gauges once it has measured something,
    # which its own drafts and probes of the draft model (every few iterations) bring
    wanted = queried_metrics(dashboard())
    for prompt in PROMPTS[6:12]:
        _client(server).generate(prompt, 32, draft_source="hybrid", draft_length_policy="adaptive", num_draft_tokens=3)
        if wanted <= exported():
            break
    missing = wanted - exported()
    assert not missing, f"the dashboard queries metrics the server does not export: {sorted(missing)}"


def test_sampling_is_reproducible_with_a_seed(server):
    client = _client(server)
    a = client.generate(PROMPTS[2], MAX_TOKENS, temperature=0.8, top_p=0.95, seed=7, use_draft_logits=True, num_draft_tokens=3)
    b = client.generate(PROMPTS[2], MAX_TOKENS, temperature=0.8, top_p=0.95, seed=7, use_draft_logits=True, num_draft_tokens=3)
    assert a.token_ids == b.token_ids and len(a.token_ids) > 0


def _ready(server) -> bool:
    with urllib.request.urlopen(f"http://{server.endpoints.http_address}/v2/health/ready", timeout=5) as r:
        return r.status == 200


def _post(server, body):
    req = urllib.request.Request(
        f"http://{server.endpoints.http_address}/v2/models/ensemble/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    return urllib.request.urlopen(req, timeout=60)


@pytest.mark.parametrize(
    "body,code,expect",
    [
        ({"text_input": "", "max_tokens": 8}, 400, "text_input is empty"),
        ({"text_input": "hello", "max_tokens": 0}, 400, "max_tokens must be >= 1"),
        ({"text_input": "hello", "max_tokens": 8, "num_draft_tokens": 9}, 400, "larger than max_draft_len 8"),
        ({"text_input": "word " * 300, "max_tokens": 8}, 400, "exceeds max_input_len"),
        # wrong dtype: Triton's HTTP frontend rejects it before any model sees it, and answers that with 500
        ({"text_input": "hello", "max_tokens": "eight"}, 500, "Unable to parse"),
        ({"text_input": "hello", "max_tokens": 8, "draft_source": "psychic"}, 400, "draft_source must be one of"),
        ({"text_input": "hello", "max_tokens": 8, "draft_length_policy": "often"}, 400, "draft_length_policy must be one of"),
    ],
)
def test_bad_request_gets_error_and_server_stays_up(server, body, code, expect):
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as info:
        _post(server, body)
    assert info.value.code == code
    message = json.loads(info.value.read())["error"]
    assert expect in message
    # The status is Triton's: its HTTP frontend answers 400 for any error a model sends (a break that sent these as
    # INTERNAL still got 400), and 500 for JSON it cannot parse. What tells a client's mistake from a failure is
    # the loop's tag, which the OpenAI API answers with 400 (anything else: 500).
    assert (decode(message)[0] is ErrorKind.BAD_REQUEST) == (code == 400), message
    assert _ready(server)
    assert len(_client(server).generate("Hello", 4).token_ids) == 4


def test_wrong_dtype_over_grpc_is_rejected(server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    c = grpcclient.InferenceServerClient(server.endpoints.grpc_address)
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"hello"]], dtype=np.object_))
    bad = grpcclient.InferInput("max_tokens", [1, 1], "FP32")  # declared INT32
    bad.set_data_from_numpy(np.array([[8.0]], dtype=np.float32))
    with pytest.raises(InferenceServerException, match="(?i)data.?type|datatype|expected"):
        c.infer("preprocessing", [text, bad])
    assert _ready(server)
    with pytest.raises(ClientError, match="exceeds max_input_len"):
        _client(server, "grpc").generate("word " * 300, 8)
    assert _ready(server)


def _metric(server, name, model="ensemble"):
    with urllib.request.urlopen(server.endpoints.metrics, timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{model={model!r}}} is not on {server.endpoints.metrics}")


def test_draft_unloaded_mid_run_falls_back_to_target_only(server, baseline):
    import tritonclient.http as httpclient

    admin = httpclient.InferenceServerClient(server.endpoints.http_address)
    before = _metric(server, "spec_decode_num_fallbacks")
    admin.unload_model("tensorrt_llm_draft")
    try:
        client = _client(server)
        for prompt, want in list(zip(PROMPTS, baseline))[:3]:
            g = client.generate(prompt, MAX_TOKENS, num_draft_tokens=3, stream=True)
            assert g.token_ids == want
            assert g.stats.draft_fallbacks == 1 and g.stats.total_draft_tokens == 0
        assert _metric(server, "spec_decode_num_fallbacks") == before + 3
    finally:
        admin.load_model("tensorrt_llm_draft")
    g = _client(server).generate(PROMPTS[0], MAX_TOKENS, num_draft_tokens=3)
    assert g.stats.draft_fallbacks == 0 and g.stats.total_draft_tokens > 0


# ---------------------------------------------------------------- NVIDIA's ensemble / BLS request interface


def _early_end(baseline) -> int:
    """A prompt whose greedy output ends at the end token before MAX_TOKENS (min_tokens must then change it)."""
    return next(i for i, ids in enumerate(baseline) if len(ids) < MAX_TOKENS)


@pytest.mark.parametrize("name", ["min_tokens", "min_length"])  # min_length: genai-perf --output-tokens-mean-deterministic
def test_min_tokens_holds_off_the_end_token_exactly_in_both_endpoints(server, baseline, name):
    i = _early_end(baseline)
    spec = _client(server).generate(PROMPTS[i], MAX_TOKENS, num_draft_tokens=3, **{name: MAX_TOKENS})
    base = _client(server, model="baseline").generate(PROMPTS[i], MAX_TOKENS, **{name: MAX_TOKENS})
    assert len(base.token_ids) == MAX_TOKENS and spec.token_ids == base.token_ids
    assert base.token_ids[: len(baseline[i])] == baseline[i]
    short = _client(server).generate(PROMPTS[i], MAX_TOKENS, **{name: len(baseline[i]) + 2})
    assert len(short.token_ids) >= len(baseline[i]) + 2


def test_exclude_input_in_output_false_starts_the_output_with_the_prompt(server):
    prompt = "The history of the printing press begins"
    default = _client(server).generate(prompt, 8)
    whole = _client(server).generate(prompt, 8, exclude_input_in_output=False)
    excluded = _client(server).generate(prompt, 8, exclude_input_in_output=True)
    assert excluded.text == default.text and whole.text == prompt + default.text


@pytest.mark.parametrize("field,value,changes", [
    ("repetition_penalty", 2.0, True), ("presence_penalty", 20.0, True), ("frequency_penalty", 20.0, True),
    ("length_penalty", 2.0, False),  # beam search only: nothing at beam width 1, as in TensorRT-LLM
])
def test_penalties_reach_the_engines_and_speculation_stays_exact(server, baseline, field, value, changes):
    i = 1
    with ThreadPoolExecutor(2) as pool:
        spec = pool.submit(_client(server).generate, PROMPTS[i], MAX_TOKENS, num_draft_tokens=3, **{field: value})
        base = _client(server, model="baseline").generate(PROMPTS[i], MAX_TOKENS, **{field: value})
        spec = spec.result()
    assert spec.token_ids == base.token_ids
    assert (base.token_ids != baseline[i]) is changes


def test_embedding_bias_words_steer_the_output(server):
    out = _client(server).generate("My favourite fruit is", 6, embedding_bias_words=[" banana"], embedding_bias_weights=[50.0])
    assert out.text.count("banana") >= 3
    base = _client(server, model="baseline").generate("My favourite fruit is", 6, embedding_bias_words=[" banana"],
                                                        embedding_bias_weights=[50.0])
    assert base.token_ids == out.token_ids


def test_random_seed_is_seed_and_token_counts_are_returned(server):
    body = {"text_input": PROMPTS[2], "max_tokens": 8, "temperature": 0.8, "stream": False,
            "return_num_input_tokens": True, "return_num_output_tokens": True}
    a = json.loads(_post(server, {**body, "seed": 11}).read())
    b = json.loads(_post(server, {**body, "random_seed": 11}).read())
    assert a["output_ids"] == b["output_ids"] and a["text_output"] == b["text_output"]
    assert a["num_output_tokens"] == 8 and a["num_input_tokens"] > 5


@pytest.mark.parametrize("field,value", [
    ("beam_width", 2), ("num_return_sequences", 2), ("return_context_logits", True),
    ("return_generation_logits", True), ("decoder_text_input", "x"), ("guided_decoding_guide_type", "xml"),
    ("lora_task_id", 1), ("prompt_vocab_size", 4), ("image_url_input", "http://example.com/a.png"),
    ("min_tokens", -1), ("repetition_penalty", 0.0),
])
def test_inputs_it_cannot_honour_are_refused_by_name(server, field, value):
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as info:
        _post(server, {"text_input": "hello", "max_tokens": 4, field: value})
    assert info.value.code == 400 and field in json.loads(info.value.read())["error"]


def test_a_tensorrt_llm_bls_client_switches_by_model_name(server, baseline):
    """A request exactly as a client of NVIDIA's tensorrt_llm_bls sends it (names, dtypes, shapes from the contract
    data of the pinned version), to `speculative`: the same text as the ensemble."""
    import tritonclient.grpc as grpcclient

    from trtspec.contract import nvidia

    bls = nvidia.model_io(nvidia.supported_versions()[-1], "tensorrt_llm_bls")
    values = {"text_input": PROMPTS[0], "max_tokens": MAX_TOKENS, "bad_words": "", "stop_words": "",
              "num_draft_tokens": 3, "use_draft_logits": False, "stream": False, "return_perf_metrics": True}
    inputs = []
    for name, v in values.items():
        t = bls.input(name)
        dtype = {"TYPE_STRING": np.object_, "TYPE_INT32": np.int32, "TYPE_BOOL": np.bool_}[t.data_type]
        a = np.array([[v.encode() if isinstance(v, str) else v]], dtype=dtype)
        inputs.append(grpcclient.InferInput(name, list(a.shape), "BYTES" if dtype is np.object_ else t.data_type[5:]))
        inputs[-1].set_data_from_numpy(a)
    c = grpcclient.InferenceServerClient(server.endpoints.grpc_address)
    results = []
    c.start_stream(callback=lambda result, error: results.append((result, error)))
    c.async_stream_infer("speculative", inputs, outputs=[grpcclient.InferRequestedOutput("text_output")])
    c.stop_stream()
    (result, error), = results
    assert error is None
    assert result.as_numpy("text_output").reshape(-1)[0].decode() == _client(server).generate(PROMPTS[0], MAX_TOKENS).text
    http = json.loads(urllib.request.urlopen(urllib.request.Request(
        f"http://{server.endpoints.http_address}/v2/models/speculative/generate",
        data=json.dumps({k: v for k, v in values.items() if k not in ("bad_words", "stop_words")}).encode()), timeout=60).read())
    assert http["output_ids"] == baseline[0]


def test_postprocessing_decodes_nvidias_3d_tokens_batch(server, baseline):
    import tritonclient.grpc as grpcclient

    ids = np.array([[baseline[0] + [0, 0]]], dtype=np.int32)  # [batch, beam, tokens], padded past the length
    tokens = grpcclient.InferInput("TOKENS_BATCH", list(ids.shape), "INT32")
    tokens.set_data_from_numpy(ids)
    length = grpcclient.InferInput("SEQUENCE_LENGTH", [1, 1], "INT32")
    length.set_data_from_numpy(np.array([[len(baseline[0])]], dtype=np.int32))
    out = grpcclient.InferenceServerClient(server.endpoints.grpc_address).infer("postprocessing", [tokens, length])
    assert out.as_numpy("OUTPUT").shape == (1, 1)
    assert out.as_numpy("OUTPUT")[0, 0].decode() == _client(server).generate(PROMPTS[0], MAX_TOKENS).text


def _engine_generate(server, prompt: list[int], n: int) -> tuple[int, int, int]:
    """One request straight to the target engine: (arrival, first token, last token) times in ns."""
    import engine_client

    r = engine_client.infer(server.endpoints.grpc_address, "tensorrt_llm", engine_client.inputs({
        "input_ids": np.array([prompt], np.int32), "input_lengths": np.array([[len(prompt)]], np.int32),
        "request_output_len": np.array([[n]], np.int32), "return_perf_metrics": np.array([[True]])}))
    return tuple(int(r.as_numpy(k)[0, 0]) for k in ("arrival_time_ns", "first_token_time_ns", "last_token_time_ns"))


def test_a_request_arriving_mid_run_joins_the_batch_and_finishes_first(server):
    """A short engine request sent while a long one runs joins the running batch: it is answered before the long
    one ends (an engine serving one request at a time would answer it after)."""
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(_engine_generate, server, list(range(100, 120)), 80)
        time.sleep(1.5)
        assert not long.done(), "the long request ended before the short one was sent: make it longer"
        short_arrival, _, short_last = _engine_generate(server, list(range(200, 210)), 4)
        _, long_first, long_last = long.result(120)
    assert long_first < short_arrival and short_last < long_last
