"""Guided decoding with engine: llmapi: model.yaml sets guided_decoding_backend where the release combines it with the
deployment's speculation (api_surface.json guided_decoding, per release), the endpoint refuses guided requests by
name elsewhere, the Triton guide inputs map to the LLM API's GuidedDecodingParams, and the CPU stand-in (NVIDIA's
documented behaviour: the bitmask on every verified position) gives the target-only tokens under a guide."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from trtspec.config import parse_config
from trtspec.contract import RequestError
from trtspec.llmapi import model_yaml, serving, standin
from trtspec.llmapi.fields import version_fields

TAGS = ["1.0.0", "1.1.0", "1.2.0", "1.2.1"]
T, D = {"checkpoint": "demo:target"}, {"checkpoint": "demo:draft"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "population": {"type": "integer"}},
          "required": ["city", "population"]}


def _cfg(method, two_model=False):
    data = {"engine": "llmapi", "target": dict(T), "speculative": {"max_draft_len": 4, "method": method}}
    if method != "mtp":
        data["draft"] = dict(D)
    if two_model:
        data["llmapi"] = {"eagle3_two_model": True}
    return parse_config(data)


# the release line -> the methods whose speculation combines with guided decoding there (each release's Feature
# Combination Matrix and py_executor_creator's dedicated-drafter check; sources in api_surface.json)
COMBINES = {"1.0": {"draft_model", "ngram", "eagle3_two_model"}, "1.1": {"draft_model", "ngram", "eagle3_two_model"},
            "1.2": {"draft_model", "ngram", "eagle3", "eagle3_two_model", "mtp"}}


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("method,two_model", [("draft_model", False), ("ngram", False), ("eagle3", False),
                                              ("eagle3", True), ("mtp", False)])
def test_model_yaml_sets_the_guided_backend_where_the_release_combines_it(tag, method, two_model):
    cfg = _cfg(method, two_model)
    doc = model_yaml.generate(cfg, Path("/t"), None if method == "mtp" else Path("/d"), version=tag)
    key = "eagle3_two_model" if two_model else method
    why = model_yaml.guided_refusal(cfg, tag)
    if key in COMBINES[tag[:3]]:
        assert doc["guided_decoding_backend"] == "xgrammar" and why is None
    else:
        assert "guided_decoding_backend" not in doc
        assert f"TensorRT-LLM {tag} does not combine guided decoding with speculative.method {method}" in why
        assert "dedicated drafter" in why and "pin 1.2" in why
        assert ("llmapi.eagle3_two_model: true" in why) == (method == "eagle3")
    # the target-only baseline always has it
    base = model_yaml.generate(cfg, Path("/t"), None, version=tag, speculative=False)
    assert base["guided_decoding_backend"] == "xgrammar"
    assert "guided_decoding_backend" in version_fields(tag)["TorchLlmArgs"]


def test_triton_guide_inputs_map_to_guided_decoding_params():
    def parse(fields, refused=None):
        return serving.parse(lambda n: fields.get(n), 4, refused)

    base = {"text_input": "Answer:", "max_tokens": 8}
    for guide_type, guide, want in (("json", None, {"json_object": True}),
                                    ("json_schema", json.dumps(SCHEMA), {"json": json.dumps(SCHEMA)}),
                                    ("regex", r"\d+", {"regex": r"\d+"}),
                                    ("ebnf_grammar", 'root ::= "a"', {"grammar": 'root ::= "a"'})):
        fields = base | {"guided_decoding_guide_type": guide_type, "guided_decoding_guide": guide}
        assert parse(fields).sampling["guided_decoding"] == want
        p = standin.GuidedDecodingParams(**want)
        assert p.guide() == (guide_type, guide)  # and back: the executor's guide type
    assert "guided_decoding" not in parse(base).sampling
    with pytest.raises(RequestError, match="guided_decoding_guide_type must be one of"):
        parse(base | {"guided_decoding_guide_type": "xml"})
    why = model_yaml.guided_refusal(_cfg("mtp"), "1.1.0")
    with pytest.raises(RequestError, match=r"not available on this endpoint \(engine: llmapi\): TensorRT-LLM 1.1.0 does "
                                           r"not combine guided decoding with speculative.method mtp"):
        parse(base | {"guided_decoding_guide_type": "json"}, why)


@pytest.mark.parametrize("tag,refused", [("1.2.1", False), ("1.1.0", True)])
def test_the_repository_tells_the_endpoint_why_it_refuses_guided_requests(tmp_path, tag, refused):
    """EAGLE-3 one-model: on 1.2 both endpoints serve guided requests (guided_decoding_backend in model.yaml); on 1.1
    the speculative endpoint's config says why it refuses them, and its baseline still serves them."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from trtspec.repository import generate_repository

    cfg = parse_config({"engine": "llmapi", "target": dict(T), "draft": dict(D),
                        "speculative": {"max_draft_len": 4, "method": "eagle3"}, "llmapi": {"baseline_endpoint": True}})
    repo = generate_repository(cfg, tmp_path / "model_repository", trtllm_version=tag)
    for name in ("ensemble", "baseline"):
        c = text_format.Parse((repo / name / "config.pbtxt").read_text(), mc.ModelConfig())
        serves = name == "baseline" or not refused
        assert (serving.GUIDED_REFUSAL not in c.parameters) == serves, name
        assert ("guided_decoding_backend: xgrammar" in (repo / name / "1" / "model.yaml").read_text()) == serves, name
        if not serves:
            assert "does not combine guided decoding with speculative.method eagle3 (one-model)" in \
                c.parameters[serving.GUIDED_REFUSAL].string_value


# ------------------------------------------------------------------------------------------ the CPU stand-in


def _generate(llm, prompt, **sp):
    async def run():
        out = await llm.generate_async(prompt, standin.SamplingParams(**sp), streaming=True).aresult()
        return out.outputs[0]

    return asyncio.run(run())


@pytest.mark.slow
def test_standin_guided_speculation_gives_the_target_only_tokens(demo_pair):
    """DraftTarget with guided_decoding_backend xgrammar: the same tokens as a target-only LLM under the same guide,
    valid against the schema."""
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("xgrammar")
    prompt = "<|im_start|>user\nDescribe Paris as JSON with its city name and population.<|im_end|>\n<|im_start|>assistant\n"
    guide = standin.GuidedDecodingParams(json=SCHEMA)
    spec = {"decoding_type": "DraftTarget", "max_draft_len": 4, "speculative_model": str(demo_pair.draft)}
    llm = standin.LLM(demo_pair.target, speculative_config=spec, guided_decoding_backend="xgrammar", max_batch_size=2)
    base = standin.LLM(demo_pair.target, guided_decoding_backend="xgrammar", max_batch_size=2)
    try:
        got = _generate(llm, prompt, max_tokens=48, guided_decoding=guide, return_perf_metrics=True)
        want = _generate(base, prompt, max_tokens=48, guided_decoding=guide)
        assert got.token_ids == want.token_ids and got.finish_reason == "stop", got.text
        jsonschema.validate(json.loads(got.text), SCHEMA)
        assert got.request_perf_metrics.speculative_decoding.total_draft_tokens > 0  # it speculated under the guide
    finally:
        for x in (llm, base):
            x.shutdown()


def test_standin_refuses_what_the_pinned_release_refuses(monkeypatch):
    """The stand-in follows the pinned release's table: a method it does not list is refused at LLM() by name."""
    from trtspec.llmapi import fields

    surface = json.loads(json.dumps(fields.surface()))
    surface["versions"][surface["pinned"]]["guided_decoding"]["methods"] = ["draft_model"]
    surface["versions"][surface["pinned"]]["guided_decoding"]["refused"] = {"ngram": "no dedicated drafter (test)"}
    monkeypatch.setattr(fields, "surface", lambda: surface)
    with pytest.raises(ValueError, match=r"Guided decoding with speculative_config ngram: no dedicated drafter \(test\)"):
        standin.LLM("unused", speculative_config={"decoding_type": "NGram", "max_draft_len": 2},
                    guided_decoding_backend="xgrammar")
