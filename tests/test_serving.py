"""End to end through a real Triton server on CPU: the demo pair on the reference engine.

Greedy speculative output must be token-identical to the target-only baseline endpoint, over HTTP and
gRPC, streaming and not, for several draft lengths; concurrent streams must not cross-talk; bad
requests get errors while the server stays up; an unloaded draft falls back to target-only.
"""

from __future__ import annotations

import json
import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from trtspec.client import Client, ClientError
from trtspec.config import parse_config
from trtspec.repository import generate_repository

pytestmark = pytest.mark.slow

# the trained demo draft; TRTSPEC_TEST_DRAFT points the suite at another draft checkpoint
DRAFT = os.environ.get("TRTSPEC_TEST_DRAFT", "demo:draft")
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
def server(tmp_path_factory):
    from trtspec.server import ServerOptions, create_server

    cfg = parse_config(
        {
            "name": "test",
            "engine": "reference",
            "device": "cpu",
            "target": {"checkpoint": "demo:target", "dtype": "float32"},
            "draft": {"checkpoint": DRAFT, "dtype": "float32"},
            "speculative": {"max_draft_len": 8, "num_draft_tokens": 3},
            "limits": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 320},
            "triton": {"speculative_instance_count": 1},
        }
    )
    repo = generate_repository(cfg, tmp_path_factory.mktemp("repo") / "model_repository")
    # explicit model control, so a test can unload the draft mid-run
    opts = ServerOptions(
        repo, http_port="auto", grpc_port="auto", metrics_port="auto", model_control_mode="explicit", load_models=["*"]
    )
    with create_server(opts) as s:
        s.wait_ready(300)
        yield s


def _client(server, protocol="http", model="ensemble"):
    addr = server.endpoints.http_address if protocol == "http" else server.endpoints.grpc_address
    return Client(addr, protocol, model)


@pytest.fixture(scope="module")
def baseline(server):
    """Target-only token ids per prompt (the reference every speculative run must reproduce)."""
    client = _client(server, model="baseline")
    with ThreadPoolExecutor(4) as pool:
        gens = list(pool.map(lambda p: client.generate(p, MAX_TOKENS), PROMPTS))
    for g in gens:
        assert g.stats.total_draft_tokens == 0 and len(g.token_ids) > 0
    return [g.token_ids for g in gens]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_speculative_identical_to_baseline(server, baseline, protocol, stream, k):
    client = _client(server, protocol)
    with ThreadPoolExecutor(4) as pool:
        gens = list(pool.map(lambda p: client.generate(p, MAX_TOKENS, stream=stream, num_draft_tokens=k), PROMPTS))
    for prompt, want, g in zip(PROMPTS, baseline, gens):
        assert g.token_ids == want, f"prompt {prompt!r}"
    drafted = sum(g.stats.total_draft_tokens for g in gens)
    accepted = sum(g.stats.total_accepted_draft_tokens for g in gens)
    assert drafted > 0 and 0 < accepted <= drafted  # the draft took part, and some of it was accepted
    if stream:
        assert any(len(g.chunks) > 1 for g in gens)  # tokens really arrived in pieces


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


@pytest.mark.parametrize("source", ["ngram", "hybrid", "model", "hybrid-adaptive"])
def test_every_draft_source_is_exact(server, baseline, source):
    """Greedy output equals target-only for every draft source, on chat and input-grounded prompts
    (hybrid-adaptive: the per-request adaptive policy, which times the sources and skips one that does not pay)."""
    source, _, policy = source.partition("-")
    client = _client(server)
    base = _client(server, model="baseline")
    prompts = PROMPTS + GROUNDED
    with ThreadPoolExecutor(4) as pool:
        want = baseline + list(pool.map(lambda p: base.generate(p, MAX_TOKENS).token_ids, GROUNDED))
        gens = list(pool.map(lambda p: client.generate(p, MAX_TOKENS, num_draft_tokens=3, draft_source=source,
                                                       draft_length_policy=policy or None), prompts))
    assert [g.token_ids for g in gens] == want
    by_source = [sum(g.stats.accepted_by_source[i] for g in gens) for i in range(2)]  # [model, ngram]
    accepted = sum(g.stats.total_accepted_draft_tokens for g in gens)
    assert sum(by_source) == accepted
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
    for prompt in (PROMPTS[-1], PROMPTS[-2], PROMPTS[-3]):  # multi-byte characters split across tokens
        whole = client.generate(prompt, 24)
        streamed = client.generate(prompt, 24, stream=True, num_draft_tokens=1)
        assert streamed.token_ids == whole.token_ids
        assert "".join(c.text for c in streamed.chunks) == whole.text
        assert "\ufffd" not in whole.text


def test_eight_concurrent_streams_match_their_solo_output(server):
    client = _client(server, "grpc")
    prompts = PROMPTS[:8]
    solo = [client.generate(p, MAX_TOKENS, stream=True, num_draft_tokens=3).token_ids for p in prompts]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda p: client.generate(p, MAX_TOKENS, stream=True, num_draft_tokens=3), prompts))
    assert [g.token_ids for g in together] == solo
    # they really overlapped in time: the latest start comes before the earliest end
    assert max(g.start for g in together) < min(g.end for g in together)


def test_response_reports_acceptance(server):
    g = _client(server).generate(PROMPTS[6], MAX_TOKENS, num_draft_tokens=4)
    s = g.stats
    assert 0.0 <= s.acceptance_rate <= 1.0
    assert s.acceptance_rate == pytest.approx(s.total_accepted_draft_tokens / s.total_draft_tokens, abs=1e-6)
    assert len(s.proposed_per_position) == 4
    assert sum(s.accepted_per_position) == s.total_accepted_draft_tokens
    # every target call adds its accepted tokens plus one of its own
    assert len(g.token_ids) <= s.num_iterations + s.total_accepted_draft_tokens


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
    "body,expect",
    [
        ({"text_input": "", "max_tokens": 8}, "text_input is empty"),
        ({"text_input": "hello", "max_tokens": 0}, "max_tokens must be >= 1"),
        ({"text_input": "hello", "max_tokens": 8, "num_draft_tokens": 9}, "larger than max_draft_len 8"),
        ({"text_input": "word " * 300, "max_tokens": 8}, "exceeds max_input_len"),
        ({"text_input": "hello", "max_tokens": "eight"}, "Unable to parse"),  # wrong dtype: Triton rejects it first
        ({"text_input": "hello", "max_tokens": 8, "draft_source": "psychic"}, "draft_source must be one of"),
        ({"text_input": "hello", "max_tokens": 8, "draft_length_policy": "often"}, "draft_length_policy must be one of"),
    ],
)
def test_bad_request_gets_error_and_server_stays_up(server, body, expect):
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as info:
        _post(server, body)
    assert info.value.code in (400, 500)  # Triton answers a JSON value it cannot convert with 500
    message = json.loads(info.value.read())["error"]
    assert expect in message
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


def _metric(server, name, model="speculative"):
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
