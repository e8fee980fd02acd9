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


def test_the_repository_tells_the_endpoint_why_it_refuses_guided_requests(tmp_path):
    from trtspec.repository import generate_repository
    from tritonclient.grpc import model_config_pb2 as mc
    from google.protobuf import text_format

    # the pinned release combines every method: the endpoints serve guided requests and say nothing
    repo = generate_repository(parse_config({"engine": "llmapi", "target": dict(T), "draft": dict(D),
                                             "speculative": {"max_draft_len": 4}, "llmapi": {"baseline_endpoint": True}}),
                               tmp_path / "model_repository")
    for name in ("ensemble", "baseline"):
        c = text_format.Parse((repo / name / "config.pbtxt").read_text(), mc.ModelConfig())
        assert serving.GUIDED_REFUSAL not in c.parameters
        assert "guided_decoding_backend: xgrammar" in (repo / name / "1" / "model.yaml").read_text()


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
