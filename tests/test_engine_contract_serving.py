"""Through a real Triton: the reference engine's `tensorrt_llm` model takes every input NVIDIA's declares,
serves the ones it implements and refuses each one it cannot honour by name, and stays ready. The model is decoupled
(NVIDIA's decoupled_mode true): requests go over gRPC's stream (tests/engine_client.py)."""

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import engine_client

from trtspec.bench.metrics import scrape, value
from trtspec.config import parse_config
from trtspec.contract import nvidia
from trtspec.spec.metrics import (ENGINE_BUSY_COUNTER, ENGINE_KV_BYTES_GAUGE, ENGINE_REQUESTS_GAUGE, ENGINE_STEP_TOKENS_GAUGE,
                             ENGINE_STEPS_COUNTER)
from trtspec.reference_engine import DEFAULTS, UNSUPPORTED_INPUTS
from trtspec.repository import generate_repository

pytestmark = pytest.mark.slow

CONTRACT = nvidia.model_io(nvidia.supported_versions()[-1], "tensorrt_llm")
NP = {"TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_UINT64": np.uint64, "TYPE_UINT8": np.uint8,
      "TYPE_FP32": np.float32, "TYPE_FP16": np.float16, "TYPE_BOOL": np.bool_, "TYPE_STRING": np.object_}
BASE = {"input_ids": [[1, 2, 3, 2]], "input_lengths": [[4]], "request_output_len": [[3]]}
NON_DEFAULT = {"beam_width": 2, "num_return_sequences": 2, "runtime_top_p_min": 0.5, "runtime_top_p_decay": 0.5,
               "runtime_top_p_reset_ids": 3}
SERVED = {  # every implemented input, with a value that takes effect
    "end_id": [[11]], "pad_id": [[0]], "temperature": [[0.8]], "runtime_top_k": [[4]], "runtime_top_p": [[0.9]],
    "seed": [[7]], "min_tokens": [[1]], "repetition_penalty": [[1.2]], "presence_penalty": [[0.1]],
    "frequency_penalty": [[0.1]], "embedding_bias": [[0.0] * 12], "stop_words_list": [[[9], [1]]],
    "bad_words_list": [[[10], [1]]], "len_penalty": [[1.0]], "early_stopping": [[False]],
    "beam_search_diversity_rate": [[0.0]], "exclude_input_in_output": [[True]], "streaming": [[False]],
    "return_log_probs": [[True]], "return_context_logits": [[True]], "return_generation_logits": [[True]],
    "return_perf_metrics": [[True]], "return_num_input_tokens": [[True]], "return_num_output_tokens": [[True]],
    "retention_token_range_starts": [[0]], "retention_token_range_ends": [[2]],
    "retention_token_range_priorities": [[50]], "retention_token_range_durations_ms": [[10]],
    "retention_decode_priority": [[50]], "retention_decode_duration_ms": [[10]],
}


def _placeholder(t: nvidia.Tensor):
    shape = [1] + [1 if d < 0 else d for d in t.dims]
    if t.data_type == "TYPE_STRING":
        return np.full(shape, b"x", dtype=np.object_)
    return np.ones(shape, dtype=NP[t.data_type])


def _inputs(extra: dict):
    out = []
    for name, value in {**BASE, **extra}.items():
        t = CONTRACT.input(name)
        arr = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=NP[t.data_type])
        i = grpcclient.InferInput(name, list(arr.shape), t.data_type.removeprefix("TYPE_").replace("STRING", "BYTES"))
        i.set_data_from_numpy(arr)
        out.append(i)
    return out


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory, tiny_target):
    from trtspec.server import ServerOptions, create_server

    cfg = parse_config({
        "name": "contract", "engine": "reference", "device": "cpu", "target": {"checkpoint": str(tiny_target)},
        "speculative": {"draft_source": "ngram"},
        "limits": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 80},
    })
    repo = generate_repository(cfg, tmp_path_factory.mktemp("repo") / "model_repository")
    opts = ServerOptions(repo, http_port="auto", grpc_port="auto", metrics_port="auto",
                         model_control_mode="explicit", load_models=["tensorrt_llm"])  # the tiny model has no tokenizer
    with create_server(opts) as s:
        s.wait_ready(300)
        yield s.endpoints


class Client:
    """The engine model's requests (decoupled: gRPC's stream), and the server's health over HTTP."""

    def __init__(self, endpoints):
        self.url = endpoints.grpc_address
        self.health = grpcclient.InferenceServerClient(self.url)

    def infer(self, model, inputs, outputs=None):
        return engine_client.infer(self.url, model, inputs, outputs)

    def responses(self, model, inputs, outputs=None):
        return engine_client.responses(self.url, model, inputs, outputs)

    def is_server_ready(self):
        return self.health.is_server_ready()

    def is_model_ready(self, name):
        return self.health.is_model_ready(name)


@pytest.fixture(scope="module")
def client(endpoints):
    return Client(endpoints)


def test_every_served_input_at_once(client):
    # every declared input is served or refused here; the guide (trtspec.guided) is served by a target with a fast
    # tokenizer, which this tiny one is not: tests/test_guided.py serves it
    guide = {"guided_decoding_guide_type", "guided_decoding_guide"}
    assert set(SERVED) | set(BASE) | set(UNSUPPORTED_INPUTS) | set(DEFAULTS) | {"draft_input_ids", "draft_logits", "stop"} \
        | guide == {t.name for t in CONTRACT.inputs}
    wanted = [t.name for t in CONTRACT.outputs if t.name not in ("batch_index", "sequence_index", "context_phase_params")]
    r = client.infer("tensorrt_llm", _inputs(SERVED), outputs=wanted)
    ids, n = r.as_numpy("output_ids"), int(r.as_numpy("sequence_length")[0, 0])
    assert ids.shape[:2] == (1, 1) and n == ids.shape[-1] and 1 <= n <= 3  # exclude_input_in_output: new tokens only
    assert r.as_numpy("output_log_probs").shape == (1, 1, n) and r.as_numpy("cum_log_probs").shape == (1, 1)
    assert r.as_numpy("context_logits").shape == (1, 4, 12) and r.as_numpy("generation_logits").shape[-1] == 12
    assert int(r.as_numpy("num_input_tokens")[0, 0]) == 4 and int(r.as_numpy("num_output_tokens")[0, 0]) == n
    assert int(r.as_numpy("kv_cache_alloc_total_blocks")[0, 0]) == 1
    assert 0 < r.as_numpy("arrival_time_ns")[0, 0] <= r.as_numpy("last_token_time_ns")[0, 0]


def test_verify_with_draft_tokens(client):
    r = client.infer("tensorrt_llm", _inputs({"draft_input_ids": [[5, 6]], "request_output_len": [[3]],
                                              "return_perf_metrics": [[True]]}))
    assert int(r.as_numpy("total_draft_tokens")[0, 0]) == 2
    assert r.as_numpy("output_ids")[0, 0, :4].tolist() == [1, 2, 3, 2]


@pytest.mark.parametrize("name", sorted(set(UNSUPPORTED_INPUTS) | set(NON_DEFAULT)))
def test_unsupported_input_is_refused_by_name(client, name):
    t = CONTRACT.input(name)
    value = None
    if name in NON_DEFAULT:
        value = np.full([1] + [1] * len(t.dims), NON_DEFAULT[name], dtype=NP[t.data_type])
    with pytest.raises(InferenceServerException, match=name):
        client.infer("tensorrt_llm", _inputs({name: value if value is not None else _placeholder(t)}))
    assert client.is_server_ready() and client.is_model_ready("tensorrt_llm")


def test_a_streamed_answer_comes_a_step_at_a_time_as_the_executor_sends_it(client):
    """streaming=true: each response carries the tokens of the step that made them and no earlier one (never the
    input, whatever exclude_input_in_output says), sequence_length counts them, and the final response carries the
    finishing step's token with the perf metrics; the tokens are the answer that is not streamed."""
    ask = {"input_ids": [[1, 2, 3, 2]], "input_lengths": [[4]], "request_output_len": [[6]],
           "exclude_input_in_output": [[False]], "return_perf_metrics": [[True]]}
    whole = client.infer("tensorrt_llm", _inputs(ask)).as_numpy("output_ids")[0, 0].tolist()
    parts = client.responses("tensorrt_llm", _inputs({**ask, "streaming": [[True]]}))
    assert len(parts) == 6
    tokens = []
    for r in parts:
        n = int(r.as_numpy("sequence_length")[0, 0])
        assert r.as_numpy("output_ids").shape == (1, 1, n) and n == 1
        tokens += r.as_numpy("output_ids")[0, 0].tolist()
    assert [1, 2, 3, 2] + tokens == whole
    assert parts[-1].as_numpy("last_token_time_ns") is not None and parts[0].as_numpy("last_token_time_ns") is None


@pytest.mark.parametrize("name", ["return_log_probs", "return_generation_logits", "return_context_logits"])
def test_streaming_with_an_output_given_whole_only_is_refused_by_name(client, name):
    with pytest.raises(InferenceServerException, match=name):
        client.responses("tensorrt_llm", _inputs({"streaming": [[True]], name: [[True]]}))
    assert client.is_model_ready("tensorrt_llm")


def test_stop_is_an_empty_answer(client):
    assert client.infer("tensorrt_llm", _inputs({"stop": [[True]], "request_output_len": [[0]]}), outputs=[]) is None


def _generate(client, prompt, n=8):
    r = client.infer("tensorrt_llm", _inputs({"input_ids": [prompt], "input_lengths": [[len(prompt)]],
                                              "request_output_len": [[n]], "return_perf_metrics": [[True]]}))
    times = tuple(int(r.as_numpy(name)[0, 0]) for name in ("first_token_time_ns", "last_token_time_ns"))
    return r.as_numpy("output_ids")[0, 0].tolist(), times


def test_concurrent_requests_share_steps_and_queue_beyond_max_batch_size(client, endpoints):
    """max_batch_size is 2 here: 8 concurrent requests run two at a time (the rest queue, none fails), each
    one's tokens equal its solo run, and requests running together share forward steps: the engine runs fewer
    steps than the requests' tokens, and never fewer than half of them."""
    from concurrent.futures import ThreadPoolExecutor

    n, prompts = 12, [[1 + i % 5, 2, 3 + i % 7, 4 + i % 3] for i in range(8)]
    solo = [_generate(client, p, n)[0] for p in prompts]
    assert all(len(tokens) == len(p) + n for tokens, p in zip(solo, prompts))  # no end token: n steps each
    _drained(endpoints)
    steps_before = value(scrape(endpoints.metrics), ENGINE_STEPS_COUNTER, model="tensorrt_llm")
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda p: _generate(client, p, n), prompts))  # a stream per request
    assert [tokens for tokens, _ in together] == solo
    assert client.is_server_ready()
    samples = _drained(endpoints)
    steps = value(samples, ENGINE_STEPS_COUNTER, model="tensorrt_llm") - steps_before
    alone = n * len(prompts)  # one step per token of each request, had none shared a step
    print(f"{len(prompts)} requests of {n} tokens at max_batch_size 2: {steps:g} steps ({alone} alone)")
    # at least a whole request's steps ran two requests at once; never more than two (max_batch_size)
    assert alone / 2 <= steps <= alone - n, steps
    assert value(samples, ENGINE_STEP_TOKENS_GAUGE, model="tensorrt_llm") > 0
    assert value(samples, ENGINE_REQUESTS_GAUGE, model="tensorrt_llm", state="queued") == 0
    assert value(samples, ENGINE_KV_BYTES_GAUGE, model="tensorrt_llm") == 0


def _drained(endpoints):
    """/metrics once the batcher has reported itself drained: its gauges say so and its step count has stood still
    for a second (the report comes batching.DRAINED_REPORT_S after the last step; the step count with it)."""
    deadline, last = time.monotonic() + 30, None
    while True:
        samples = scrape(endpoints.metrics)
        now = (value(samples, ENGINE_REQUESTS_GAUGE, model="tensorrt_llm", state="active"),
               value(samples, ENGINE_STEPS_COUNTER, model="tensorrt_llm"))
        if now[0] == 0 and now == last:
            return samples
        assert time.monotonic() < deadline, "the engine's gauges never showed it drained"
        last = now
        time.sleep(1.0)


def test_engine_compute_time_is_counted_before_the_answer(client, endpoints):
    """Triton's compute_infer no longer holds the engine's work (execute() only queues), so the engine counts its
    forward time itself, before answering: read right after a response, the counter holds that request's steps."""
    busy = lambda: value(scrape(endpoints.metrics), ENGINE_BUSY_COUNTER, model="tensorrt_llm")  # noqa: E731
    _generate(client, [1, 2, 3], 2)  # the counter exists once the engine has stepped
    before, t0 = busy(), time.monotonic_ns()
    _generate(client, [3, 2, 1, 4], 12)
    wall, spent = time.monotonic_ns() - t0, busy() - before
    assert 0 < spent < wall
