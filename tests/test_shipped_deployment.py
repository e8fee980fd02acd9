"""The demo deployment as shipped (build_configs/demo.yaml: compiled GEMM kernels, the goodput controller, hybrid
drafting) through a real Triton: long greedy answers under concurrency, streamed and not, are target-only's token
for token, and speculation pays in target calls where the text repeats its input."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from trtspec.client import Client

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 256
IN_FLIGHT = 8
# Tokens per target call the controller must reach on GROUNDED, one request at a time, streamed (target-only: 1.0).
# Measured 2026-11-27 on AMD EPYC Zen 4, 2 cores shared with other jobs (load 7-12): 1.91, 1.97 and 2.01 in three runs
# (docs/benchmarks/ci.md); the margin is for the controller's choices, which follow measured costs and so the load.
GROUNDED_TOKENS_PER_CALL = 1.6
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
PASSAGE = (
    "The Nile is the longest river in Africa. It flows north for about 6,650 km through eleven countries "
    "and drains into the Mediterranean Sea. Its two main tributaries are the White Nile and the Blue Nile, "
    "which meet at Khartoum in Sudan."
)
CODE = '''def merge_sorted(a, b):
    """Merge two sorted lists into one sorted list."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out + a[i:] + b[j:]
'''
GROUNDED = [
    CHAT.format(f"Repeat this passage exactly, twice:\n{PASSAGE}"),
    CHAT.format(f"Rewrite this function with type hints and keep everything else the same:\n{CODE}"),
    f"Text: {PASSAGE}\n\nCopy the text above word for word:\n",
    CHAT.format("Repeat this list exactly: apples, pears, plums, cherries, grapes, lemons, limes, oranges, "
                "peaches, apricots, figs, dates, melons, mangoes, kiwis, bananas."),
]
PROMPTS = GROUNDED + [
    CHAT.format("Write a short story about a lighthouse keeper who finds a message in a bottle."),
    CHAT.format("Explain how a hash table works, with an example in Python."),
    CHAT.format("Give me a detailed recipe for a vegetable soup."),
    CHAT.format("What causes the seasons on Earth? Explain it to a ten-year-old."),
    CHAT.format("Write a letter to a friend describing your last holiday by the sea."),
    CHAT.format("List ten tips for staying focused while studying, each with a sentence of explanation."),
    CHAT.format(f"Summarise this passage, then list every number in it:\n{PASSAGE}"),
    CHAT.format("Translate into French and then into Spanish: 'The weather is nice today, let us go for a walk.'"),
    "def fibonacci(n):\n    ",
    "The history of the printing press begins",
    "Once upon a time, in a small village by the mountains,",
    "import numpy as np\n\n\ndef normalize(x):\n",
]


@pytest.fixture(scope="module")
def server():
    """build_configs/demo.yaml with two loop and entry instances instead of eight (as test_demo and test_soak
    deploy it): a loop instance serves many requests at once, and Triton starts twelve fewer processes. Everything
    a request's tokens depend on (engines, kernels, controller, drafting, limits) is the shipped file's."""
    from trtspec.bench.local import local_deployment, prepare_checkpoints
    from trtspec.config import parse_config

    raw = yaml.safe_load((ROOT / "build_configs" / "demo.yaml").read_text())
    assert raw["target"]["linear_kernels"] == raw["draft"]["linear_kernels"] == "compiled"
    assert (raw["speculative"]["draft_length_policy"], raw["speculative"]["draft_source"]) == ("adaptive", "hybrid")
    raw["triton"]["speculative_instance_count"] = 2
    cfg = parse_config(raw)
    prepare_checkpoints(cfg, print)
    with local_deployment(cfg) as s:
        yield s


def _client(server, model: str = "ensemble", protocol: str = "http") -> Client:
    addr = server.endpoints.http_address if protocol == "http" else server.endpoints.grpc_address
    return Client(addr, protocol, model)


K0_PROMPTS = range(len(GROUNDED), len(GROUNDED) + 2)  # two chat prompts, asked again with num_draft_tokens 0


@pytest.fixture(scope="module")
def in_flight(server):
    """16 prompts x 256 tokens at 8 in flight, in one pool: target-only (not streamed), the speculative endpoint
    streamed and not (over HTTP and gRPC), and two chat prompts on it with num_draft_tokens 0. Answers by
    (model, stream, protocol, k, prompt index); k None: the deployment's own."""
    jobs = [("baseline", False, "http", None, i) for i in range(len(PROMPTS))]
    jobs += [("ensemble", stream, "grpc" if (i + stream) % 2 else "http", None, i)
             for stream in (False, True) for i in range(len(PROMPTS))]
    jobs += [("ensemble", False, "http", 0, i) for i in K0_PROMPTS]

    def run(job):
        model, stream, protocol, k, i = job
        return _client(server, model, protocol).generate(PROMPTS[i], MAX_TOKENS, stream=stream, num_draft_tokens=k)

    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        return dict(zip(jobs, pool.map(run, jobs)))


def _baseline(in_flight, i):
    return in_flight[("baseline", False, "http", None, i)]


def test_long_greedy_answers_in_flight_are_target_onlys(in_flight):
    """Every speculative answer of the in-flight pool is target-only's token for token. Long answers under
    concurrency are where a near-tie between batched fp32 products would flip a token."""
    want = {i: _baseline(in_flight, i).token_ids for i in range(len(PROMPTS))}
    assert sum(len(t) for t in want.values()) > len(PROMPTS) * MAX_TOKENS / 2  # long answers, most of them
    spec = {job: g for job, g in in_flight.items() if job[0] == "ensemble"}
    for (_, stream, protocol, k, i), g in spec.items():
        assert g.token_ids == want[i], f"stream={stream} {protocol} k={k}: prompt {i} {PROMPTS[i][:60]!r}"
    by_source = [sum(g.stats.accepted_by_source[j] for g in spec.values()) for j in range(2)]  # [model, ngram]
    print(f"accepted: {by_source[0]} from the draft model, {by_source[1]} from prompt lookup; target calls "
          f"{sum(g.stats.num_iterations for g in spec.values())} for {sum(len(g.token_ids) for g in spec.values())} tokens")
    assert sum(by_source) > 0  # the controller drafted, and some of it was accepted
    assert all(sum(g.stats.draft_len_counts) == g.stats.num_iterations for g in spec.values())
    assert any(len(g.chunks) > 1 for (_, stream, *_), g in spec.items() if stream)


def test_a_request_with_nothing_to_draft_makes_target_onlys_calls(in_flight):
    """num_draft_tokens 0 on the speculative endpoint, not streamed: the target steps runs of tokens in one call,
    exactly as many calls as target-only makes for the same answer, a fraction of one per token."""
    for i in K0_PROMPTS:
        got, want = in_flight[("ensemble", False, "http", 0, i)], _baseline(in_flight, i)
        assert got.token_ids == want.token_ids and got.stats.total_draft_tokens == 0
        assert got.stats.num_iterations == want.stats.num_iterations < len(want.token_ids) / 4, (
            got.stats.num_iterations, want.stats.num_iterations, len(want.token_ids))


def test_speculation_pays_in_target_calls_where_the_text_repeats_its_input(server, in_flight):
    """One grounded request at a time, streamed, where target-only makes one call per token (and one more that
    brings the end token): the controller makes at most 1 / GROUNDED_TOKENS_PER_CALL of those calls, for
    target-only's tokens (the pool's, cut to this length: greedy answers are prefixes of longer ones)."""
    spec, n = _client(server), MAX_TOKENS // 2
    gens = [spec.generate(prompt, n, stream=True) for prompt in GROUNDED]
    tokens, calls = sum(len(g.token_ids) for g in gens), sum(g.stats.num_iterations for g in gens)
    print(f"grounded, one at a time: {tokens} tokens in {calls} target calls ({tokens / calls:.2f} per call)")
    assert tokens / calls >= GROUNDED_TOKENS_PER_CALL, (tokens, calls)
    assert [g.token_ids for g in gens] == [_baseline(in_flight, i).token_ids[:n] for i in range(len(GROUNDED))]
