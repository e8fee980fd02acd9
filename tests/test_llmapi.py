"""engine: llmapi — config, model.yaml against the pinned TensorRT-LLM field lists, the plan, the CPU
stand-in's API surface, and the flavour served by real Triton (demo pair, one module-scoped server)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trtspec.config import ConfigError, load_config, parse_config
from trtspec.llmapi import model_yaml, standin
from trtspec.llmapi.fields import runtime_names, supported_versions, version_fields
from trtspec.llmapi.parser import load_model_yaml

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "build_configs" / "demo-llmapi.yaml"
GPU_EXAMPLES = ["llama-3.1-8b_llama-3.2-1b_h100_llmapi.yaml", "llama-3.1-70b_llama-3.2-1b_h200_fp8_llmapi.yaml"]


def _cfg(**spec):
    return parse_config(
        {
            "engine": "llmapi",
            "target": {"checkpoint": "demo:target"},
            "draft": {"checkpoint": "demo:draft"},
            "speculative": {"max_draft_len": 4, **spec},
        }
    )


# ------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    "spec, words",
    [
        ({"draft_source": "hybrid"}, "draft_source: hybrid"),
        ({"num_draft_tokens": 2}, "speculative.num_draft_tokens"),
        ({"use_draft_logits": True}, "speculative.use_draft_logits"),
        ({"draft_length_policy": "adaptive"}, "speculative.draft_length_policy"),
        ({"max_concurrency": 4}, "llmapi.max_concurrency"),
    ],
)
def test_unsupported_settings_are_refused_with_the_reason(spec, words):
    with pytest.raises(ConfigError) as e:
        _cfg(**spec)
    assert words in str(e.value) and "engine: llmapi cannot honour" in str(e.value)


def test_draft_len_schedule_must_start_at_max_draft_len():
    with pytest.raises(ConfigError, match=r"draft_len_schedule must map batch size 1 to max_draft_len \(4\)"):
        parse_config({"engine": "llmapi", "target": {"checkpoint": "demo:target"}, "draft": {"checkpoint": "demo:draft"},
                      "speculative": {"max_draft_len": 4}, "llmapi": {"draft_len_schedule": {1: 3}}})


def test_llmapi_section_only_with_llmapi_engine():
    with pytest.raises(ConfigError, match="llmapi: applies to engine: llmapi only"):
        parse_config({"target": {"checkpoint": "demo:target"}, "draft": {"checkpoint": "demo:draft"}, "llmapi": {}})


def test_unknown_llmapi_key_names_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"llmapi.max_concurency: unknown key; allowed keys here: .*max_concurrency"):
        parse_config({"engine": "llmapi", "target": {"checkpoint": "demo:target"}, "draft": {"checkpoint": "demo:draft"},
                      "llmapi": {"max_concurency": 4}})


# ------------------------------------------------------------------------------------------ model.yaml


def test_generated_yaml_uses_the_pinned_spelling():
    cfg = load_config(ROOT / "build_configs" / GPU_EXAMPLES[0], check_paths=False)
    doc = model_yaml.generate(cfg, Path("/t"), Path("/d"))
    sc = doc["speculative_config"]
    # 1.2.x DecodingBaseConfig.from_dict dispatches on "DraftTarget"; the class's ClassVar "Draft_Target" is refused
    assert sc["decoding_type"] == "DraftTarget"
    assert sc["speculative_model"] == "/d" and sc["draft_len_schedule"] == {1: 4, 8: 2, 16: 1}
    ngram = model_yaml.speculative_config(_cfg(method="ngram", ngram_max=5), None)
    assert ngram["decoding_type"] == "NGram" and ngram["max_matching_ngram_size"] == 5


def test_decoding_types_match_the_release_sources():
    """The spellings the generator writes are the from_dict keys read from each release's llm_args.py (issue 30):
    checked against the recorded source data, not against the generator's own table."""
    read_from_source = {  # gh-pages <tag>/_modules/tensorrt_llm/llmapi/llm_args.html, DecodingBaseConfig.from_dict
        "1.0": {"MTP", "Medusa", "Eagle", "Lookahead", "NGram", "DraftTarget", "UserProvided", "AUTO"},
        "1.1": {"MTP", "Medusa", "Eagle", "Lookahead", "NGram", "DraftTarget", "UserProvided", "AUTO"},
        "1.2": {"MTP", "Medusa", "Eagle", "Lookahead", "NGram", "DraftTarget", "SaveState", "UserProvided", "AUTO"},
    }
    assert set(supported_versions()) == set(read_from_source)
    for version, keys in read_from_source.items():
        f = version_fields(version)
        assert set(f["from_dict_keys"]) == keys
        assert {m: k["decoding_type"] for m, k in f["decoding_types"].items()} == {
            "draft_model": "DraftTarget", "ngram": "NGram", "eagle3": "Eagle", "mtp": "MTP"}
        assert all(s["commit"] and s["path"].startswith(s["tag"] + "/") for s in f["source"])
    assert version_fields("1.2.1")["speculative_model_field"] == "speculative_model"
    assert version_fields("1.1.0")["speculative_model_field"] == "speculative_model_dir"


@pytest.mark.parametrize("version", ["1.0.0", "1.1.0", "1.2.0", "1.2.1"])
def test_h100_example_per_version_loads_or_is_refused_by_name(version):
    cfg = load_config(ROOT / "build_configs" / GPU_EXAMPLES[0], check_paths=False)
    if version_fields(version)["draft_len_schedule"] is None:
        with pytest.raises(model_yaml.ModelYamlError, match=rf"llmapi.draft_len_schedule: TensorRT-LLM {version} has no"):
            model_yaml.generate(cfg, Path("/t"), Path("/d"), version=version)
        return
    doc = model_yaml.generate(cfg, Path("/t"), Path("/d"), version=version)
    args = load_model_yaml(doc, version)
    assert args["speculative_config"].cls == "DraftTargetDecodingConfig"
    assert args["speculative_config"].get("acceptance_window") == 64


def test_prerelease_line_without_field_lists_is_refused_with_the_reason():
    with pytest.raises(KeyError, match="pre-releases only"):
        version_fields("1.3.0rc29")


@pytest.mark.parametrize(
    "mutate, name",
    [
        (lambda d: d.update(max_batch_sise=8), "max_batch_sise"),
        (lambda d: d["kv_cache_config"].update(free_gpu_mem_fraction=0.5), "kv_cache_config.free_gpu_mem_fraction"),
        (lambda d: d["speculative_config"].update(decoding_type="Draft_Target"), "Invalid decoding type: Draft_Target"),
        (lambda d: d["speculative_config"].update(decoding_type="Eagle3"), "Invalid decoding type: Eagle3"),
        (lambda d: d["speculative_config"].update(num_draft_tokens=3), "speculative_config.num_draft_tokens"),
    ],
)
def test_misspelled_key_fails_with_its_name(mutate, name):
    doc = model_yaml.generate(_cfg(), Path("/t"), Path("/d"))
    mutate(doc)
    with pytest.raises(model_yaml.ModelYamlError, match=name):
        model_yaml.validate(doc)


@pytest.mark.parametrize("example", GPU_EXAMPLES)
def test_dry_run_json_prints_a_valid_model_yaml(example, tmp_path):
    from click.testing import CliRunner

    from trtspec.cli import cli

    gpus = "h200x4" if "h200" in example else "h100x1"
    res = CliRunner().invoke(cli, ["build", str(ROOT / "build_configs" / example), "--dry-run", "--json", "--gpus", gpus, "-o", str(tmp_path)])
    steps = json.loads(res.output)
    names = [s["name"] for s in steps]
    assert not any(n.startswith(("convert-", "build-")) for n in names)  # no engine build
    doc = steps[-1]["model_yaml"]["ensemble"]
    model_yaml.validate(doc)
    if "fp8" in example:
        q = next(s for s in steps if s["name"] == "quantize-draft")
        assert q["argv"][q["argv"].index("--export_format") + 1] == "hf"
        assert doc["speculative_config"]["speculative_model"] == q["outputs"][0]


# ------------------------------------------------------------------------------------------ stand-in surface


def test_standin_has_the_recorded_api_surface():
    fields = {f.name for f in dataclasses.fields(standin.SamplingParams)}
    assert set(runtime_names("SamplingParams")) == fields
    assert set(runtime_names("GuidedDecodingParams")) == {f.name for f in dataclasses.fields(standin.GuidedDecodingParams)}
    assert set(runtime_names("LLM.generate_async")) <= set(inspect.signature(standin.LLM.generate_async).parameters)
    out = standin.CompletionOutput()
    assert all(hasattr(out, n) for n in runtime_names("CompletionOutput"))
    assert all(hasattr(standin.RequestOutput, n) or n in ("request_id", "prompt", "prompt_token_ids", "outputs", "finished")
               for n in runtime_names("RequestOutput"))
    pm = standin.RequestPerfMetrics()
    assert all(hasattr(pm, n) for n in runtime_names("RequestPerfMetrics"))
    assert {f.name for f in dataclasses.fields(standin.SpeculativeDecodingMetrics)} == set(runtime_names("SpeculativeDecodingMetrics"))


def test_standin_refuses_unknown_llm_arguments():
    with pytest.raises(TypeError, match="max_batch_sise"):
        standin.LLM("unused", max_batch_sise=4)


@pytest.mark.slow
def test_standin_batches_requests_in_flight_and_each_equals_its_solo_output(demo_pair):
    """The stand-in's requests share the engines' forward passes (trtspec.reference_engine.batching), as on the executor."""
    import asyncio

    spec = {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model": str(demo_pair.draft)}
    llm = standin.LLM(demo_pair.target, speculative_config=spec, max_batch_size=4)
    sp = standin.SamplingParams(max_tokens=10)

    async def run(prompts):
        outs = await asyncio.gather(*(llm.generate_async(p, sp, streaming=True).aresult() for p in prompts))
        return [o.outputs[0].token_ids for o in outs]

    try:
        solo = [asyncio.run(run([p]))[0] for p in PROMPTS[:4]]
        assert llm.engines["target"].stats.max_active == 1
        assert asyncio.run(run(PROMPTS[:4])) == solo
        assert min(e.stats.max_active for e in llm.engines.values()) > 1  # requests shared steps
    finally:
        llm.shutdown()


# ------------------------------------------------------------------------------------------ real Triton

MAX_TOKENS = 12
PROMPTS = ["The capital of France is", "def add(a, b):\n    return", "Once upon a time, there was a",
           "List three colors:", "The quick brown fox", "Water boils at", "import numpy as np\n", "Summer is"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from trtspec.repository import generate_repository
    from trtspec.server import ServerOptions, create_server

    repo = generate_repository(load_config(DEMO), tmp_path_factory.mktemp("llmapi") / "model_repository")
    with create_server(ServerOptions(repo, http_port="auto", grpc_port="auto", metrics_port="auto")) as s:
        s.wait_ready(300)
        yield s


def _client(server, model="ensemble", protocol="http"):
    from trtspec.client import Client

    addr = server.endpoints.http_address if protocol == "http" else server.endpoints.grpc_address
    return Client(addr, protocol, model)


def _metric(server, name, model="ensemble"):  # endpoints count their own requests
    text = urllib.request.urlopen(server.endpoints.metrics, timeout=10).read().decode()
    line = next(ln for ln in text.splitlines() if ln.startswith(f'{name}{{model="{model}"}}'))
    return float(line.split()[-1])


@pytest.fixture(scope="module")
def target_only():
    """Target-only greedy output per prompt, computed with the reference engine directly."""
    from transformers import AutoTokenizer

    from trtspec.config import checkpoint_path
    from trtspec.reference_engine import EngineRequest, ReferenceEngine

    cfg = load_config(DEMO)
    path = checkpoint_path(cfg, "target")
    tok, engine = AutoTokenizer.from_pretrained(str(path)), ReferenceEngine(path, device="cpu")
    out = []
    for p in PROMPTS:
        ids = tok.encode(p)
        r = engine.run(EngineRequest(ids, MAX_TOKENS, end_id=tok.eos_token_id))
        new = r.tokens[len(ids):]
        out.append(new[: new.index(tok.eos_token_id)] if tok.eos_token_id in new else new)
    return out


@pytest.mark.slow
def test_greedy_output_equals_target_only(server, target_only):
    client, base = _client(server), _client(server, "baseline")
    for prompt, expected in zip(PROMPTS[:3], target_only):
        g = client.generate(prompt, MAX_TOKENS)
        assert g.token_ids == expected
        assert base.generate(prompt, MAX_TOKENS).token_ids == expected
        assert g.stats.total_draft_tokens > 0 and g.stats.num_iterations >= 1


@pytest.mark.slow
def test_guided_requests_speculate_and_give_the_target_only_tokens(server):
    """NVIDIA's guide inputs on the llmapi endpoint: model.yaml sets guided_decoding_backend (the pinned release
    combines it with DraftTarget), the request's GuidedDecodingParams constrain the output, and the speculative
    answer is the target-only endpoint's."""
    pytest.importorskip("xgrammar")
    prompt = "<|im_start|>user\nWhat is the year after 2024? Answer:<|im_end|>\n<|im_start|>assistant\n"
    schema = json.dumps({"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]})
    for guide_type, guide in (("regex", r"\d{4}"), ("json_schema", schema)):
        g = _client(server).generate(prompt, 24, guided_decoding_guide_type=guide_type, guided_decoding_guide=guide)
        base = _client(server, "baseline").generate(prompt, 24, guided_decoding_guide_type=guide_type,
                                                    guided_decoding_guide=guide)
        assert g.token_ids == base.token_ids, guide_type
        if guide_type == "json_schema":
            assert isinstance(json.loads(g.text)["answer"], int), g.text
        else:
            assert g.text.strip().isdigit() and len(g.text.strip()) == 4, g.text
    assert g.stats.total_draft_tokens > 0  # it speculated under the guide


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_streaming_gives_the_same_tokens_in_pieces(server, target_only, protocol):
    chunks = list(_client(server, protocol=protocol).stream(PROMPTS[0], MAX_TOKENS))
    assert len([c for c in chunks if c.token_ids]) > 1
    assert [t for c in chunks for t in c.token_ids] == target_only[0]
    assert "".join(c.text for c in chunks).strip()


@pytest.mark.slow
def test_acceptance_in_response_and_prometheus(server):
    before = {n: _metric(server, n) for n in ("spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens", "spec_decode_num_requests")}
    g = _client(server).generate(PROMPTS[4], MAX_TOKENS)
    st = g.stats
    assert 0 <= st.total_accepted_draft_tokens <= st.total_draft_tokens and st.total_draft_tokens > 0
    assert abs(st.acceptance_rate - st.total_accepted_draft_tokens / st.total_draft_tokens) < 1e-6
    assert _metric(server, "spec_decode_num_requests") - before["spec_decode_num_requests"] == 1
    assert _metric(server, "spec_decode_num_draft_tokens") - before["spec_decode_num_draft_tokens"] == st.total_draft_tokens
    assert _metric(server, "spec_decode_num_accepted_tokens") - before["spec_decode_num_accepted_tokens"] == st.total_accepted_draft_tokens


@pytest.mark.slow
def test_cancelled_stream_stops_generation(server):
    requests0 = _metric(server, "spec_decode_num_requests")
    emitted0 = _metric(server, "spec_decode_num_emitted_tokens")
    long = 400
    body = json.dumps({"text_input": PROMPTS[2], "max_tokens": long, "stream": True}).encode()
    url = f"http://{server.endpoints.http_address}/v2/models/ensemble/generate_stream"
    resp = urllib.request.urlopen(urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}))
    first = next(line for line in resp if line.startswith(b"data:"))
    assert b"text_output" in first
    resp.close()  # the client goes away
    deadline = time.time() + 120
    while _metric(server, "spec_decode_num_requests") == requests0 and time.time() < deadline:
        time.sleep(0.5)
    assert _metric(server, "spec_decode_num_requests") == requests0 + 1, "the aborted request never finished"
    assert _metric(server, "spec_decode_num_emitted_tokens") - emitted0 < long / 2


@pytest.mark.slow
def test_concurrent_streams_equal_target_only(server, target_only):
    """8 streams at once (batched by the engine) give each prompt's target-only tokens, as a request alone does
    (test_greedy_output_equals_target_only)."""
    client = _client(server)
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda p: [t for c in client.stream(p, MAX_TOKENS) for t in c.token_ids], PROMPTS))
    assert together == target_only


def test_doctor_names_the_flavours_the_installed_tensorrt_llm_runs():
    from trtspec.commands.doctor import runnable_flavours
    from trtspec.contract.nvidia import ENGINE_FLOW_RANGE

    assert runnable_flavours(None) == ["reference", "llmapi (CPU stand-in only: no tensorrt_llm installed)"]
    last = runnable_flavours(ENGINE_FLOW_RANGE.last)
    assert any(f.startswith("tensorrt_llm") for f in last)
    after = runnable_flavours(ENGINE_FLOW_RANGE.removed_in)
    assert any(f.startswith("not tensorrt_llm") and "PyTorch backend only" in f for f in after)


def test_llmapi_build_refuses_an_installed_version_without_field_lists(tmp_path):
    from trtspec.machine import Machine
    from trtspec.pipeline.preflight import PreflightResult, _check_llmapi_software

    cfg = _cfg()
    r = PreflightResult()
    _check_llmapi_software(cfg, Machine(tensorrt_llm_version="0.9.0"), r)
    assert [f.code for f in r.findings] == ["trtllm-version-unsupported"] and "engine: llmapi" in r.findings[0].message
    r = PreflightResult()
    _check_llmapi_software(cfg, Machine(tensorrt_llm_version=None), r)
    assert [f.code for f in r.findings] == ["tensorrt-llm-missing"]
    # model.yaml is spelled for the pinned release: another installed layout is refused by name
    r = PreflightResult()
    _check_llmapi_software(load_config(ROOT / "build_configs" / GPU_EXAMPLES[0], check_paths=False), Machine(tensorrt_llm_version="1.1.0"), r)
    assert [f.code for f in r.findings] == ["trtllm-version-mismatch"] and "tensorrt_llm_version: 1.2.1" in r.findings[0].message
