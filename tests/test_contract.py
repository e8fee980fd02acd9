"""trtspec declares NVIDIA's Triton TensorRT-LLM contract, per supported TensorRT-LLM version (data in
trtspec/contract/nvidia/data), and the engine-flow range preflight and doctor report comes from there."""

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.spec.loop import LoopSettings
from trtspec.config import parse_config
from trtspec.contract import nvidia
from trtspec.repository import TEMPLATES, generate_repository, list_models

# one TensorRT-LLM release per contract file
RELEASES = {"0.17": "0.18.2", "0.19": "0.19.0", "0.20": "0.21.0", "1.0": "1.2.1"}


def _entry(t) -> tuple:
    return (t.name, mc.DataType.Name(t.data_type), list(t.dims), bool(getattr(t, "optional", False)),
            list(t.reshape.shape) if t.HasField("reshape") else None, bool(getattr(t, "allow_ragged_batch", False)))


def _want(t: nvidia.Tensor) -> tuple:
    return (t.name, t.data_type, list(t.dims), t.optional, None if t.reshape is None else list(t.reshape), t.ragged)


def _repo(tmp_path, tiny_target, version, engine="reference"):
    cfg = parse_config({
        "name": "c", "engine": engine, "device": "cpu", "tensorrt_llm_version": version,
        "target": {"checkpoint": str(tiny_target)}, "draft": {"checkpoint": str(tiny_target)},
        "limits": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 80},
    })
    kw = {} if engine == "reference" else {"target_engine_dir": tmp_path / "t", "draft_engine_dir": tmp_path / "d"}
    return list_models(generate_repository(cfg, tmp_path / f"repo-{version}", **kw))


def test_every_supported_version_has_the_five_models_with_sources():
    assert nvidia.supported_versions() == list(RELEASES)
    for v in nvidia.supported_versions():
        for m in nvidia.MODELS:
            io = nvidia.model_io(v, m)
            assert "@" in io.source and io.inputs and io.outputs
        assert nvidia.clients(v)["tensorrt_llm_bls"]["requests_outputs"][:2] == ["output_ids", "sequence_length"]


def test_renames_and_additions_between_versions():
    names = {v: {t.name for t in nvidia.model_io(v, "tensorrt_llm").inputs} for v in RELEASES}
    assert {"min_length", "random_seed"} <= names["0.19"] and not {"min_tokens", "seed"} & names["0.19"]
    assert {"min_tokens", "seed"} <= names["0.20"] and not {"min_length", "random_seed"} & names["0.20"]
    assert "return_perf_metrics" not in names["0.17"] and "return_perf_metrics" in names["0.19"]
    assert "return_num_input_tokens" in names["1.0"] and "return_num_input_tokens" not in names["0.20"]


@pytest.mark.parametrize("installed,want", [("0.17.0", "0.17"), ("0.18.2", "0.17"), ("0.19.0", "0.19"),
                                            ("0.21.0", "0.20"), ("1.0.0", "1.0"), ("1.2.0rc8", "1.0"),
                                            ("1.2.1", "1.0"), (None, "1.0")])
def test_version_for(installed, want):
    assert nvidia.version_for(installed) == want


@pytest.mark.parametrize("installed", ["0.16.0", "1.3.0", "1.3.0rc20", "2.0", "latest"])
def test_versions_outside_the_engine_flow_are_refused(installed):
    with pytest.raises(ValueError, match="0.17.0 - 1.2.1"):
        nvidia.version_for(installed)


def test_template_declares_the_newest_contract():
    cfg = text_format.Parse((TEMPLATES / "tensorrt_llm" / "config.pbtxt").read_text(), mc.ModelConfig())
    io = nvidia.model_io(nvidia.supported_versions()[-1], "tensorrt_llm")
    assert [_entry(t) for t in cfg.input] == [_want(t) for t in io.inputs]
    assert [_entry(t) for t in cfg.output] == [_want(t) for t in io.outputs]


@pytest.mark.parametrize("contract", list(RELEASES))
@pytest.mark.parametrize("engine", ["reference", "tensorrt_llm"])
def test_engine_models_declare_exactly_nvidias_tensorrt_llm(tmp_path, tiny_target, contract, engine):
    models = _repo(tmp_path, tiny_target, RELEASES[contract], engine)
    io = nvidia.model_io(contract, "tensorrt_llm")
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        assert [_entry(t) for t in models[name].input] == [_want(t) for t in io.inputs], name
        assert [_entry(t) for t in models[name].output] == [_want(t) for t in io.outputs], name
    loop = LoopSettings.model_validate_json(models["speculative"].parameters["loop_settings"].string_value)
    assert {loop.engine_name("min_tokens"), loop.engine_name("seed")} <= {t.name for t in io.inputs}


# our model -> NVIDIA's model whose clients it serves
DROP_INS = {"ensemble": "ensemble", "baseline": "ensemble", "preprocessing": "preprocessing",
            "postprocessing": "postprocessing", "speculative": "tensorrt_llm_bls"}


@pytest.mark.parametrize("contract", list(RELEASES))
@pytest.mark.parametrize("model", list(DROP_INS))
def test_drop_ins_declare_every_nvidia_tensor_with_its_type_and_dims(tmp_path, tiny_target, contract, model):
    """Ours may add tensors, never lack one; each of NVIDIA's has the same data type and dims, and an input
    NVIDIA's model takes as optional is optional here too."""
    ours = _repo(tmp_path, tiny_target, RELEASES[contract])[model]
    io = nvidia.model_io(contract, DROP_INS[model])
    for kind, theirs, declared in (("input", io.inputs, ours.input), ("output", io.outputs, ours.output)):
        by_name = {t.name: t for t in declared}
        for t in theirs:
            assert t.name in by_name, f"{model} lacks NVIDIA's {kind} {t.name}"
            mine = by_name[t.name]
            assert (mc.DataType.Name(mine.data_type), list(mine.dims)) == (t.data_type, list(t.dims)), (model, t.name)
            if kind == "input" and t.optional:
                assert mine.optional, (model, t.name)


def test_postprocessing_takes_nvidias_3d_tokens_batch_and_keeps_prefix_ids_optional(tmp_path, tiny_target):
    post = _repo(tmp_path, tiny_target, None)["postprocessing"]
    by_name = {t.name: t for t in post.input}
    assert list(by_name["TOKENS_BATCH"].dims) == [-1, -1] and not by_name["TOKENS_BATCH"].optional
    assert by_name["PREFIX_IDS"].optional and not by_name["SEQUENCE_LENGTH"].optional
