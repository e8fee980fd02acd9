"""Speculation methods as configuration (trtspec/spec/methods.py), the model.yaml each supported TensorRT-LLM release
parses (recorded from its llm_args.py), the loading path through update_llm_args_with_extra_dict, the
gpu_device_ids and world-size rules, and doctor's refusal of a head or MTP target that cannot serve the target.
No Triton here: every test runs in milliseconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trtspec.checkpoint import check_eagle3_head, check_mtp_target, default_capture_layers, inspect_checkpoint
from trtspec.config import ConfigError, load_config, parse_config
from trtspec.llmapi import model_yaml
from trtspec.llmapi.fields import mtp_model_types, supported_versions, version_fields
from trtspec.llmapi.parser import LlmArgsError, decoding_config_from_dict, load_model_yaml, update_llm_args_with_extra_dict
from trtspec.spec.methods import METHODS

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "build_configs"
EAGLE3_EXAMPLE = EXAMPLES / "llama-3.1-8b_eagle3_h100_llmapi.yaml"
MTP_EXAMPLE = EXAMPLES / "deepseek-v3_mtp_h200_llmapi.yaml"
TAGS = ["1.0.0", "1.1.0", "1.2.0", "1.2.1"]
T, D = {"checkpoint": "demo:target"}, {"checkpoint": "demo:draft"}


def _cfg(engine="llmapi", draft=True, **spec):
    data = {"engine": engine, "target": dict(T), "speculative": {"max_draft_len": 4, **spec}}
    if draft:
        data["draft"] = dict(D)
    return parse_config(data)


# ------------------------------------------------------------------------------------------ methods


def test_existing_configs_keep_their_meaning():
    expected = {"demo.yaml": "draft_model", "demo-llmapi.yaml": "draft_model",
                "llama-3.1-8b_llama-3.2-1b_h100.yaml": "draft_model", "llama-3.1-8b_eagle3_h100_llmapi.yaml": "eagle3",
                "deepseek-v3_mtp_h200_llmapi.yaml": "mtp"}
    for name, method in expected.items():
        assert load_config(EXAMPLES / name, check_paths=False).speculative.method == method
    assert parse_config({"target": T, "speculative": {"draft_source": "ngram"}}).speculative.method == "ngram"
    assert parse_config({"target": T, "draft": D, "speculative": {"draft_source": "ngram"}}).speculative.method == "draft_model"
    # a dumped config parses back to the same method (bench and k8s re-parse model_dump())
    cfg = _cfg(engine="reference", draft=False, draft_source="ngram")
    assert cfg.speculative.method == "ngram"
    assert parse_config(cfg.model_dump(mode="json", exclude_none=True)).speculative.method == "ngram"


@pytest.mark.parametrize(
    "engine, draft, spec, words",
    [
        ("tensorrt_llm", True, {"method": "eagle3"}, "speculative.method: eagle3 with engine: tensorrt_llm"),
        ("tensorrt_llm", False, {"method": "mtp"}, "use engine: llmapi"),
        ("reference", False, {"method": "mtp"}, "speculative.method: mtp with engine: reference"),
        ("llmapi", True, {"method": "mtp"}, "draft: method mtp drafts with the target's own MTP layers"),
        ("llmapi", False, {"method": "eagle3"}, "draft is required with speculative.method: eagle3"),
        ("llmapi", False, {}, "draft is required with speculative.method: draft_model"),
        ("reference", False, {"method": "ngram", "draft_source": "model"}, "method ngram drafts by prompt lookup only"),
        ("llmapi", True, {"method": "eagle3", "draft_source": "ngram"}, "TensorRT-LLM speculates with one drafter"),
    ],
)
def test_a_method_an_engine_cannot_serve_is_refused_by_name(engine, draft, spec, words):
    with pytest.raises(ConfigError) as e:
        _cfg(engine=engine, draft=draft, **spec)
    assert words in str(e.value)


def test_methods_table_names_engines_and_checkpoints():
    assert set(METHODS) == {"draft_model", "eagle3", "mtp", "ngram", "medusa"}
    assert METHODS["mtp"].engines == ("llmapi",) and METHODS["mtp"].draft is None
    assert "tensorrt_llm" not in METHODS["eagle3"].engines and METHODS["eagle3"].draft == "eagle3_head"
    # Medusa: the LLM API parses its config, but the PyTorch backend has no Medusa worker (docs/medusa.md)
    assert all("llmapi" in m.engines for name, m in METHODS.items() if name != "medusa")
    assert "llmapi" not in METHODS["medusa"].engines


# ------------------------------------------------------------------------------------------ rules


def test_llmapi_honours_only_the_first_gpus_and_says_how_to_pick_others():
    with pytest.raises(ConfigError, match=r"target.gpu_device_ids: \[4, 5, 6, 7\].*CUDA_VISIBLE_DEVICES=4,5,6,7"):
        parse_config({"engine": "llmapi", "target": {**T, "tp_size": 4, "gpu_device_ids": [4, 5, 6, 7]}, "draft": D})
    assert parse_config({"engine": "llmapi", "target": {**T, "gpu_device_ids": [0]}, "draft": D})


def test_disable_spawn_processes_needs_exactly_one_plus_every_models_ranks(tmp_path: Path):
    from trtspec.server import ServerError
    from trtspec.server.launch import plan_launch

    names = ["tensorrt_llm", "tensorrt_llm_draft"]
    kw = dict(tensorrt_llm_model_names=names, disable_spawn_processes=True, triton_version="25.03", num_gpus=4)
    assert plan_launch(tmp_path, world_size=3, **kw).world_size == 3
    with pytest.raises(ServerError, match=r"world_size: with disable_spawn_processes it must be exactly 1 .* = 3, got 4"):
        plan_launch(tmp_path, world_size=4, **kw)
    ranks = {"tensorrt_llm": 2, "tensorrt_llm_draft": 1}
    assert plan_launch(tmp_path, world_size=4, model_ranks=ranks, **kw).world_size == 4
    with pytest.raises(ServerError, match=r"= 4, got 5"):
        plan_launch(tmp_path, world_size=5, model_ranks=ranks, **kw)


# ------------------------------------------------------------------------------------------ schedule


def test_schedule_key_semantics():
    # trtspec's meaning: each key is a batch size from which its length applies upward
    assert model_yaml.schedule_for_version({1: 4, 8: 2, 16: 1}, "lower_bound", 32) == {1: 4, 8: 2, 16: 1}
    # an upper-bound reader needs the same ranges as their last batch size: 1-7 -> 4, 8-15 -> 2, 16-32 -> 1
    assert model_yaml.schedule_for_version({1: 4, 8: 2, 16: 1}, "upper_bound", 32) == {7: 4, 15: 2, 32: 1}
    assert model_yaml.schedule_for_version({1: 4, 2: 3}, "upper_bound", 8) == {1: 4, 8: 3}


@pytest.mark.parametrize("tag", TAGS)
def test_canonical_schedule_per_version(tag):
    cfg = _cfg(draft_len_schedule={1: 4, 8: 2, 16: 1})
    rules = version_fields(tag)["draft_len_schedule"]
    if rules is None:
        with pytest.raises(model_yaml.ModelYamlError, match=rf"speculative.draft_len_schedule: TensorRT-LLM {tag} has no"):
            model_yaml.speculative_config(cfg, Path("/d"), tag)
        return
    assert rules["keys"] == "lower_bound"  # 1.2.0 and 1.2.1 as read: "batch_size >= k"
    sc = model_yaml.speculative_config(cfg, Path("/d"), tag)
    assert sc["draft_len_schedule"] == {1: 4, 8: 2, 16: 1}
    assert decoding_config_from_dict(sc, tag).get("draft_len_schedule") == {1: 4, 8: 2, 16: 1}


def test_schedule_set_twice_is_refused():
    with pytest.raises(ConfigError, match="set the schedule once, as speculative.draft_len_schedule"):
        parse_config({"engine": "llmapi", "target": T, "draft": D, "speculative": {"max_draft_len": 4, "draft_len_schedule": {1: 4}},
                      "llmapi": {"draft_len_schedule": {1: 4}}})


@pytest.mark.parametrize("tag", TAGS)
def test_acceptance_gate_and_max_concurrency_per_version(tag):
    cfg = parse_config({"engine": "llmapi", "target": T, "draft": D, "speculative": {"max_draft_len": 4},
                        "llmapi": {"acceptance_window": 32, "acceptance_length_threshold": 1.2}})
    gate = version_fields(tag)["acceptance_gate"]
    if gate is None:
        with pytest.raises(model_yaml.ModelYamlError, match=rf"llmapi.acceptance_window: TensorRT-LLM {tag} has no"):
            model_yaml.speculative_config(cfg, Path("/d"), tag)
    else:
        sc = model_yaml.speculative_config(cfg, Path("/d"), tag)
        assert sc[gate["window"]] == 32 and sc[gate["threshold"]] == 1.2
    cfg = parse_config({"engine": "llmapi", "target": T, "draft": D, "llmapi": {"max_concurrency": 8}})
    if version_fields(tag)["max_concurrency"] is None:
        with pytest.raises(model_yaml.ModelYamlError, match="llmapi.max_concurrency"):
            model_yaml.speculative_config(cfg, Path("/d"), tag)
    else:
        assert model_yaml.speculative_config(cfg, Path("/d"), tag)["max_concurrency"] == 8


# ------------------------------------------------------------------------------------------ one-engine floor


def _batch_ks(sc: dict, max_batch: int = 64) -> list[int]:
    """The draft length TensorRT-LLM 1.2's Drafter would use at batch sizes 1..max_batch for `sc` as written
    (lower-bound schedule keys as recorded; max_concurrency: 0 above it)."""
    from trtspec.llmapi.draft_floor import draft_len_at

    return [draft_len_at(sc.get("draft_len_schedule"), sc.get("max_concurrency"), sc["max_draft_len"], b)
            for b in range(1, max_batch + 1)]


@pytest.mark.parametrize("method", ["eagle3", "mtp"])
@pytest.mark.parametrize("tag", ["1.2.0", "1.2.1"])
@pytest.mark.parametrize("controls", [
    {"speculative": {"draft_len_schedule": {1: 4, 8: 2, 16: 0}}},
    {"llmapi": {"max_concurrency": 8}},
    {"llmapi": {"max_concurrency": 8, "draft_len_schedule": {1: 4, 4: 2, 6: 0}}},
])
def test_one_engine_drafters_never_resolve_to_0_on_releases_without_a_floor(method, tag, controls):
    """TensorRT-LLM 1.2.x has no min_runtime_draft_len (api_surface.json one_engine_k0, read in 1.2.1's llm_args.py):
    a one-engine drafter (EAGLE-3 one-model, MTP) stopped by a band of 0 or max_concurrency resumes with stale
    state and acceptance collapses (PR #16888). No batch size may resolve to 0 in what trtspec writes."""
    assert version_fields(tag)["one_engine_k0"]["floor"] is None
    spec = {"method": method, "max_draft_len": 4, **controls.get("speculative", {})}
    data = {"engine": "llmapi", "target": dict(T), "speculative": spec, "llmapi": controls.get("llmapi", {})}
    if method == "eagle3":
        data["draft"] = dict(D)
    cfg = parse_config(data)
    sc = model_yaml.speculative_config(cfg, Path("/d") if method == "eagle3" else None, tag)
    ks = _batch_ks(sc)
    assert min(ks) == 1 and ks[0] == 4 and "max_concurrency" not in sc
    # what TensorRT-LLM itself would load: the schedule passes its validators (schedule[1] == max_draft_len)
    assert decoding_config_from_dict(dict(sc), tag).get("draft_len_schedule") == sc["draft_len_schedule"]
    assert model_yaml.load_controls(cfg, tag).notes  # build, doctor and tune say why


def test_the_floor_keeps_the_bands_above_0_and_max_concurrency_becomes_a_band_of_1():
    from trtspec.llmapi.draft_floor import resolve

    f = version_fields("1.2.1")
    assert resolve("eagle3", f, 4, {1: 4, 8: 2, 16: 0}, None).schedule == {1: 4, 8: 2, 16: 1}
    assert resolve("mtp", f, 3, None, 4).schedule == {1: 3, 5: 1}
    assert resolve("eagle3", f, 4, {1: 4, 4: 2, 16: 3}, 8).schedule == {1: 4, 4: 2, 9: 1}
    # max_concurrency 0 is speculation off for good: it never resumes, so it stays
    assert resolve("eagle3", f, 4, None, 0).max_concurrency == 0
    # two-engine drafters re-read the sequence when they draft again: written as configured
    for method in ("draft_model", "ngram"):
        r = resolve(method, f, 4, {1: 4, 8: 0}, 16)
        assert (r.schedule, r.max_concurrency, r.notes) == ({1: 4, 8: 0}, 16, [])


@pytest.mark.parametrize("tag", TAGS)
def test_eagle3_two_model_stops_drafting_where_asked(tag):
    cfg = parse_config({"engine": "llmapi", "target": T, "draft": D, "speculative": {"method": "eagle3", "max_draft_len": 4},
                        "llmapi": {"max_concurrency": 8, "eagle3_two_model": True}})
    f = version_fields(tag)
    if f["max_concurrency"] is None:
        with pytest.raises(model_yaml.ModelYamlError, match="llmapi.max_concurrency"):
            model_yaml.speculative_config(cfg, Path("/d"), tag)
        return
    sc = model_yaml.speculative_config(cfg, Path("/d"), tag)
    assert sc["eagle3_one_model"] is False and sc["max_concurrency"] == 8
    assert decoding_config_from_dict(dict(sc), tag).method == "eagle3"
    with pytest.raises(model_yaml.ModelYamlError, match="only speculative.method eagle3 has a two-model path"):
        model_yaml.speculative_config(parse_config({"engine": "llmapi", "target": T, "speculative": {"method": "mtp"},
                                                    "llmapi": {"eagle3_two_model": True}}), None, tag)


def test_max_concurrency_on_a_release_without_a_schedule_is_refused_for_one_engine_drafters():
    cfg = parse_config({"engine": "llmapi", "target": T, "draft": D, "speculative": {"method": "eagle3", "max_draft_len": 4},
                        "llmapi": {"max_concurrency": 8}})
    with pytest.raises(model_yaml.ModelYamlError, match="no draft_len_schedule to draft 1 token above it instead; remove "
                       "max_concurrency, or set llmapi.eagle3_two_model: true"):
        model_yaml.speculative_config(cfg, Path("/d"), "1.1.0")


# ------------------------------------------------------------------------------------------ spellings


@pytest.mark.parametrize("tag", TAGS)
def test_eagle3_spelling_per_version(tag, tmp_path: Path):
    head = _head(tmp_path / "head", layers=[1, 3, 4])
    cfg = _cfg(method="eagle3")
    f = version_fields(tag)
    if "eagle3_layers_to_capture" not in f["decoding_types"]["eagle3"]["fields"]:
        with pytest.raises(model_yaml.ModelYamlError, match="eagle3_layers_to_capture: the head pins capture layers"):
            model_yaml.speculative_config(cfg, head, tag)
        # pinned layers that are the release's default for this target need no field
        target = _target(tmp_path / "target", layers=8)  # default {1, 3, 4}
        assert "eagle3_layers_to_capture" not in model_yaml.speculative_config(cfg, head, tag, target)
        return
    sc = model_yaml.speculative_config(cfg, head, tag)
    assert sc["decoding_type"] == "Eagle" and sc[f["speculative_model_field"]] == str(head)
    assert sc["eagle3_layers_to_capture"] == [1, 3, 4]
    parsed = decoding_config_from_dict(sc, tag)
    assert parsed.cls == "EagleDecodingConfig" and parsed.method == "eagle3"


@pytest.mark.parametrize("tag", TAGS)
def test_mtp_spelling_per_version(tag):
    cfg = _cfg(draft=False, method="mtp", max_draft_len=3)
    sc = model_yaml.speculative_config(cfg, None, tag)
    assert sc == {"decoding_type": "MTP", "max_draft_len": 3, "num_nextn_predict_layers": 3}
    assert decoding_config_from_dict(sc, tag).get("max_draft_len") == 3
    # MTPDecodingConfig.from_dict overwrites max_draft_len with num_nextn_predict_layers (default 1)
    assert decoding_config_from_dict({"decoding_type": "MTP", "max_draft_len": 3}, tag).get("max_draft_len") == 1


@pytest.mark.parametrize("example", [EAGLE3_EXAMPLE, MTP_EXAMPLE])
@pytest.mark.parametrize("tag", TAGS)
def test_examples_plan_a_valid_model_yaml_per_version(example, tag):
    cfg = load_config(example, check_paths=False)
    doc = model_yaml.generate(cfg, Path("/t"), Path("/d") if cfg.draft else None, version=tag)
    model_yaml.validate(doc, tag)
    args = load_model_yaml(doc, tag)
    assert args["speculative_config"].method == cfg.speculative.method
    assert "triton_config" not in args and args["model"] == "/t"


def test_eagle3_example_dry_run_prints_the_model_yaml(tmp_path: Path):
    from click.testing import CliRunner

    from trtspec.cli import cli

    res = CliRunner().invoke(cli, ["build", str(EAGLE3_EXAMPLE), "--dry-run", "--json", "--gpus", "h100x1", "-o", str(tmp_path)])
    steps = json.loads(res.output)
    sc = steps[-1]["model_yaml"]["ensemble"]["speculative_config"]
    assert sc == {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model": "/models/EAGLE3-LLaMA3.1-Instruct-8B"}


# ------------------------------------------------------------------------------------------ the parser


def test_update_llm_args_with_extra_dict_as_read():
    base = {"model": "/t", "kv_cache_config": {"enable_block_reuse": True, "free_gpu_memory_fraction": 0.9}}
    doc = {"kv_cache_config": {"free_gpu_memory_fraction": 0.5},
           "speculative_config": {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2}}
    out = update_llm_args_with_extra_dict(base, doc, version="1.2.1")
    assert out["kv_cache_config"] == {"enable_block_reuse": True, "free_gpu_memory_fraction": 0.5}  # merged (1.2)
    assert out["model"] == "/t" and out["speculative_config"].cls == "NGramDecodingConfig"
    assert update_llm_args_with_extra_dict(base, doc, version="1.1.0")["kv_cache_config"] == {"free_gpu_memory_fraction": 0.5}
    with pytest.raises(LlmArgsError, match="speculative_config.max_matching_ngram: extra inputs are not permitted"):
        decoding_config_from_dict({"decoding_type": "NGram", "max_matching_ngram": 2})
    with pytest.raises(LlmArgsError, match="Draft model must be provided for EAGLE"):
        decoding_config_from_dict({"decoding_type": "Eagle", "max_draft_len": 3})
    with pytest.raises(LlmArgsError, match=r"draft_len_schedule\[1\] must equal max_draft_len"):
        decoding_config_from_dict({"decoding_type": "NGram", "max_draft_len": 4, "draft_len_schedule": {1: 3}})
    # 1.1 has no speculative_model spelling; 1.2 accepts speculative_model_dir as an alias
    with pytest.raises(LlmArgsError, match="speculative_config.speculative_model: extra inputs"):
        decoding_config_from_dict({"decoding_type": "DraftTarget", "speculative_model": "/d"}, "1.1.0")
    assert decoding_config_from_dict({"decoding_type": "DraftTarget", "speculative_model_dir": "/d"}, "1.2.1").get("speculative_model") == "/d"


def test_installed_tensorrt_llm_check_is_skipped_where_it_is_not_installed():
    pytest.importorskip("yaml")
    try:
        import tensorrt_llm  # noqa: F401
    except ImportError:
        assert model_yaml.validate_installed({"model": "/t"}) is None
    else:  # pragma: no cover - GPU containers
        assert model_yaml.validate_installed({"model": "/t", "backend": "pytorch"})


# ------------------------------------------------------------------------------------------ doctor: heads


def _target(path: Path, layers: int = 8, vocab: int = 12) -> Path:
    from tests.conftest import make_tiny_llama

    return make_tiny_llama(path, vocab=vocab, layers=layers)


def _head(path: Path, *, hidden: int = 32, vocab: int = 12, dvs: int = 8, layers: list[int] | None = None,
          d2t: list[int] | None = None, arch: str = "LlamaForCausalLMEagle3", fc_in: int | None = None) -> Path:
    """A tiny EAGLE-3 head in the published layout (config.json + safetensors with fc, midlayer, lm_head, d2t)."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": [arch], "model_type": "llama", "hidden_size": hidden, "intermediate_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": vocab,
           "draft_vocab_size": dvs}
    if layers is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layers}
    (path / "config.json").write_text(json.dumps(cfg))
    n = len(layers) if layers else 3
    tensors = {"fc.weight": torch.zeros(hidden, fc_in or n * hidden), "lm_head.weight": torch.zeros(dvs, hidden),
               "midlayer.input_layernorm.weight": torch.ones(hidden)}
    if d2t is not None:
        tensors["d2t"] = torch.tensor(d2t, dtype=torch.int64)
    save_file(tensors, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return _target(tmp_path_factory.mktemp("tiny-target-8l"))


GOOD_D2T = [0, 0, 1, 1, 2, 2, 3, 4]  # draft ids 0..7 -> target ids 0,1,3,4,6,7,9,11 (target vocab 12)


@pytest.mark.parametrize(
    "head_kw, code, words",
    [
        ({"d2t": [0, 1, 2, 3, 5, 6, 7, 9]}, "head-d2t", "outside the target's vocabulary 0..11"),
        ({}, "head-d2t", "no d2t tensor"),
        ({"d2t": GOOD_D2T[:6]}, "head-d2t", "expected [8] (draft_vocab_size)"),
        ({"d2t": GOOD_D2T, "hidden": 48}, "head-hidden-size", "hidden_size 48 != the target's hidden_size 32"),
        ({"d2t": GOOD_D2T, "vocab": 16, "dvs": 8}, "head-vocab", "vocab_size 16 != the target's 12"),
        ({"d2t": GOOD_D2T, "dvs": 8, "vocab": 12, "layers": [1, 3, 9]}, "head-capture-layers", "layers [9] are outside"),
        ({"d2t": GOOD_D2T, "fc_in": 64}, "head-fc", "fc.weight is [32, 64]"),
        ({"d2t": GOOD_D2T, "arch": "MistralForCausalLM", "dvs": None}, "head-architecture", "not an EAGLE-3 head"),
    ],
)
def test_mismatched_head_is_refused_naming_the_field(target: Path, tmp_path: Path, head_kw, code, words):
    kw = dict(head_kw)
    if kw.get("dvs", 8) is None:
        kw.pop("dvs")
        head = _head(tmp_path / "head", dvs=12, **kw)
        data = json.loads((head / "config.json").read_text())
        del data["draft_vocab_size"]
        (head / "config.json").write_text(json.dumps(data))
    else:
        head = _head(tmp_path / "head", **kw)
    findings = check_eagle3_head(inspect_checkpoint(target), inspect_checkpoint(head))
    assert (code, True) in {(c, words in m) for level, c, m in findings if level == "error"}, findings


def test_matching_head_passes(target: Path, tmp_path: Path):
    head = _head(tmp_path / "head", d2t=GOOD_D2T)
    assert check_eagle3_head(inspect_checkpoint(target), inspect_checkpoint(head)) == []
    assert default_capture_layers(30) == [1, 14, 26]  # SmolLM2's 30 layers: outputs of 1, 14, 26


def test_doctor_refuses_a_head_with_a_bad_d2t(target: Path, tmp_path: Path):
    from click.testing import CliRunner

    from trtspec.cli import cli

    head = _head(tmp_path / "head", d2t=[0, 1, 2, 3, 5, 6, 7, 40])
    conf = tmp_path / "eagle3.yaml"
    conf.write_text(yaml.safe_dump({"engine": "llmapi", "device": "cpu", "target": {"checkpoint": str(target), "dtype": "float32"},
                                    "draft": {"checkpoint": str(head), "dtype": "float32"},
                                    "speculative": {"method": "eagle3", "max_draft_len": 3}}))
    res = CliRunner().invoke(cli, ["doctor", str(conf), "-o", str(tmp_path / "out")])
    assert res.exit_code == 1, res.output
    assert "[head-d2t]" in res.output and "d2t[i] must be target_id - i" in " ".join(res.output.split())


def test_mtp_target_checks(target: Path, tmp_path: Path):
    info = inspect_checkpoint(target)
    codes = {c for _, c, _ in check_mtp_target(info, mtp_model_types())}
    assert codes == {"mtp-layers", "mtp-architecture"}
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                                                 "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 12,
                                                 "num_attention_heads": 4, "num_nextn_predict_layers": 1}))
    assert check_mtp_target(inspect_checkpoint(ds), mtp_model_types()) == []


def test_supported_versions_are_the_recorded_releases():
    assert supported_versions() == ["1.0", "1.1", "1.2"]
    assert version_fields("1.2.1")["tags"] == ["1.2.0", "1.2.1"]


# ------------------------------------------------------------------------------------------ acceptance


def test_zero_engine_acceptance_is_derived_from_tokens_and_steps_and_marked():
    from trtspec.llmapi import serving, standin

    def output(tokens, first, last, proposed=0, accepted=0):
        sd = standin.SpeculativeDecodingMetrics(0.0, accepted, proposed)
        return standin.CompletionOutput(token_ids=list(range(tokens)),
                                        request_perf_metrics=standin.RequestPerfMetrics(first, last, last, sd))

    # the PyTorch path's zeros: 10 tokens in 4 steps (1 context + 3 generation steps) at max_draft_len 3
    st = serving.stats_of(output(10, 5, 8), max_k=3)
    assert (st.total_accepted_draft_tokens, st.total_draft_tokens, st.acceptance_derived) == (6, 9, 1)
    assert serving.response_tensors("x", [1], st)["acceptance_derived"].tolist() == [[1]]
    # figures the engine reported are kept as they are
    st = serving.stats_of(output(10, 5, 8, proposed=9, accepted=6), max_k=3)
    assert (st.total_accepted_draft_tokens, st.acceptance_derived) == (6, 0)
    # no speculation (as many tokens as steps) stays zero, not derived
    assert serving.stats_of(output(4, 5, 8), max_k=3).acceptance_derived == 0
