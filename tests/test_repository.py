"""Generated repositories: every config parses with Triton's ModelConfig, nothing is left unfilled,
and both engine flavours declare the same tensors."""

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.contract import REQUEST_FIELDS, RESPONSE_OUTPUTS, RESPONSE_STATS, nvidia
from trtspec.spec.loop import LoopSettings
from trtspec.config import parse_config
from trtspec.contract import nvidia
from trtspec.repository import RepositoryError, generate_repository, list_models


def _cfg(target, draft, engine="reference", **spec):
    return parse_config(
        {
            "name": "t",
            "engine": engine,
            "target": {"checkpoint": str(target), "dtype": "float16", "gpu_device_ids": [0]},
            "draft": {"checkpoint": str(draft), "dtype": "float16", "gpu_device_ids": [1]},
            "speculative": {"max_draft_len": 6, "num_draft_tokens": 2, **spec},
            "limits": {"max_batch_size": 4, "max_input_len": 100, "max_seq_len": 120},
        }
    )


@pytest.fixture
def repos(tmp_path, tiny_target, tiny_draft):
    ref = generate_repository(_cfg(tiny_target, tiny_draft), tmp_path / "ref")
    trt = generate_repository(
        _cfg(tiny_target, tiny_draft, engine="tensorrt_llm"),
        tmp_path / "trt",
        target_engine_dir=tmp_path / "engines/target",
        draft_engine_dir=tmp_path / "engines/draft",
        trtllm_version="1.1.0",
        kv_cache_fractions={"target": 0.6, "draft": 0.2},
    )
    return ref, trt


def _parse_all(repo: Path):
    out = {}
    for p in sorted(repo.glob("*/config.pbtxt")):
        text = p.read_text()
        assert "${" not in text, f"{p}: unfilled placeholder"
        out[p.parent.name] = text_format.Parse(text, mc.ModelConfig())  # raises on anything malformed
        assert out[p.parent.name].name == p.parent.name
    return out


def _io(config):
    return (
        [(t.name, t.data_type, list(t.dims)) for t in config.input],
        [(t.name, t.data_type, list(t.dims)) for t in config.output],
    )


def test_every_config_parses_and_is_filled(repos):
    for repo in repos:
        models = _parse_all(repo)
        assert set(models) >= {
            "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_draft",
            "speculative", "baseline_loop", "ensemble", "baseline",
        }
        for name, cfg in models.items():
            if cfg.platform != "ensemble":
                assert (repo / name / "1").is_dir()
            assert cfg.max_batch_size == 4


def test_both_flavours_declare_the_same_engine_tensors(repos):
    ref, trt = (_parse_all(r) for r in repos)
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        assert _io(ref[name]) == _io(trt[name])
    assert ref["tensorrt_llm"].backend == "python" and (repos[0] / "tensorrt_llm/1/model.py").is_file()
    assert trt["tensorrt_llm"].backend == "tensorrtllm" and not (repos[1] / "tensorrt_llm/1/model.py").exists()
    # exactly NVIDIA's tensorrt_llm model of the newest supported version (tests/test_contract.py: every version)
    want = nvidia.model_io(nvidia.supported_versions()[-1], "tensorrt_llm")
    assert [t.name for t in ref["tensorrt_llm"].input] == [t.name for t in want.inputs]
    assert [t.name for t in ref["tensorrt_llm"].output] == [t.name for t in want.outputs]


def test_tensorrt_llm_flavour_parameters(repos, tmp_path):
    trt = _parse_all(repos[1])
    p = {k: v.string_value for k, v in trt["tensorrt_llm"].parameters.items()}
    assert p["gpt_model_path"] == str((tmp_path / "engines/target").resolve())
    assert p["gpu_device_ids"] == "0"
    assert p["kv_cache_free_gpu_mem_fraction"] == "0.6"
    assert p["enable_kv_cache_reuse"] == "true" and p["exclude_input_in_output"] == "false"
    assert p["gpt_model_type"] == "inflight_fused_batching"
    d = {k: v.string_value for k, v in trt["tensorrt_llm_draft"].parameters.items()}
    assert d["gpt_model_path"].endswith("engines/draft") and d["gpu_device_ids"] == "1"
    assert d["kv_cache_free_gpu_mem_fraction"] == "0.2"
    loop = _loop_settings(trt["speculative"])
    assert loop.speculative.max_k == 6 and loop.speculative.default_k == 2
    assert loop.draft_model == "tensorrt_llm_draft" and not loop.draft_disabled
    assert _loop_settings(trt["baseline_loop"]).draft_disabled
    # the text endpoints run the same loop in-process, with the target's tokenizer
    assert _loop_settings(trt["ensemble"]) == loop and _loop_settings(trt["baseline"]).draft_disabled
    for name in ("ensemble", "baseline"):
        assert trt[name].model_transaction_policy.decoupled and trt[name].backend == "python"
        assert trt[name].parameters["tokenizer_dir"].string_value == trt["preprocessing"].parameters["tokenizer_dir"].string_value


def test_legacy_tensor_names_before_0_20(tmp_path, tiny_target, tiny_draft):
    repo = generate_repository(
        _cfg(tiny_target, tiny_draft, engine="tensorrt_llm"),
        tmp_path / "old",
        target_engine_dir=tmp_path / "e/t",
        draft_engine_dir=tmp_path / "e/d",
        trtllm_version="0.19.0",
    )
    models = list_models(repo)
    names = {t.name for t in models["tensorrt_llm"].input}
    assert {"min_length", "random_seed"} <= names and not {"min_tokens", "seed"} & names
    loop = _loop_settings(models["speculative"])
    assert loop.engine_name("min_tokens") == "min_length" and loop.engine_name("seed") == "random_seed"


def test_ngram_only_deployment_has_no_draft_model(tmp_path, tiny_target):
    cfg = parse_config({"target": {"checkpoint": str(tiny_target)}, "speculative": {"draft_source": "ngram"}})
    models = list_models(generate_repository(cfg, tmp_path / "n"))
    assert "tensorrt_llm_draft" not in models and _loop_settings(models["speculative"]).draft_model is None


def test_loop_and_ensemble_interfaces_come_from_the_contract(repos):
    """Every request field and statistic is declared where it flows, under its one name (or alias)."""
    models = _parse_all(repos[0])
    ens_in = {t.name for t in models["ensemble"].input}
    loop_in = {t.name for t in models["speculative"].input}
    assert ens_in == {n for f in REQUEST_FIELDS for n in (f.name, *f.aliases)}
    assert {n for f in REQUEST_FIELDS for n in f.names} <= loop_in
    stats = {s.name for s in RESPONSE_STATS}
    outputs = {o.name for o in RESPONSE_OUTPUTS}
    for name in ("ensemble", "baseline", "speculative", "baseline_loop"):
        assert stats | outputs <= {t.name for t in models[name].output}
    assert _io(models["baseline"]) == _io(models["ensemble"])
    nvidia_out = {t.name for t in nvidia.model_io(nvidia.supported_versions()[-1], "ensemble").outputs}
    assert {t.name for t in models["ensemble"].output} == stats | outputs | nvidia_out | {"output_ids", "sequence_length"}


def _loop_settings(config):
    return LoopSettings.model_validate_json(config.parameters["loop_settings"].string_value)


def test_tensorrt_llm_flavour_needs_engines(tmp_path, tiny_target, tiny_draft):
    with pytest.raises(RepositoryError, match="engine directory"):
        generate_repository(_cfg(tiny_target, tiny_draft, engine="tensorrt_llm"), tmp_path / "x")
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob("*.partial"))


def test_regeneration_replaces_atomically(tmp_path, tiny_target, tiny_draft):
    out = tmp_path / "repo"
    generate_repository(_cfg(tiny_target, tiny_draft), out)
    (out / "stale_model").mkdir()
    generate_repository(_cfg(tiny_target, tiny_draft), out)
    assert not (out / "stale_model").exists()
    assert not list(tmp_path.glob("*.partial"))
