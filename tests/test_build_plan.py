"""Golden plans (exact argv) for every example config, and every flag checked against TensorRT-LLM's parsers.

The flag sets below are transcribed from TensorRT-LLM 1.x sources (NVIDIA/TensorRT-LLM, files and commits
named next to each set). ``argparse`` parsers are built from them with ``allow_abbrev=False``, so a flag the
plan passes must exist verbatim and its value must be one the real parser accepts. The same sets drive the
stand-in tools of test_build_runner.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.pipeline.plan import Tools, make_plan
from trtspec.pipeline.preflight import plan_max_num_tokens
from trtspec.cli import cli
from trtspec.config import parse_config
from trtspec.machine import synthetic_machine

try:
    from tests.test_checkpoint import (
        LLAMA_31_8B, LLAMA_31_70B, LLAMA_32_1B, SMOLLM2_135M, SMOLLM2_DRAFT, example_config, make_checkpoint, squash,
        write_config,
    )  # fmt: skip
except ImportError:  # tests/ on sys.path instead of the repo root
    from test_checkpoint import (  # type: ignore[no-redef]
        LLAMA_31_8B, LLAMA_31_70B, LLAMA_32_1B, SMOLLM2_135M, SMOLLM2_DRAFT, example_config, make_checkpoint, squash,
        write_config,
    )  # fmt: skip

# ------------------------------------------------------------------------------- real flag sets (1.x)
# Each entry: flag -> {"type": int|float|str|flag, "choices": [...]} (flag = store_true).

_DTYPE_PLUGIN = ["auto", "float16", "float32", "bfloat16", "int32", "disable"]
_BOOL = ["enable", "disable"]

# Source: NVIDIA/TensorRT-LLM tensorrt_llm/commands/build.py@65f1d1536e18aea3380e6e270e00895a709333eb
# (parse_arguments; --kv_cache_type parses through KVCacheType.from_string: continuous|paged|disabled)
TRTLLM_BUILD_FLAGS: dict[str, dict] = {
    "--checkpoint_dir": {"type": "str"}, "--model_config": {"type": "str"}, "--build_config": {"type": "str"},
    "--model_cls_file": {"type": "str"}, "--model_cls_name": {"type": "str"}, "--output_dir": {"type": "str"},
    "--max_batch_size": {"type": "int"}, "--max_input_len": {"type": "int"}, "--max_seq_len": {"type": "int"},
    "--max_decoder_seq_len": {"type": "int"}, "--max_beam_width": {"type": "int"}, "--max_num_tokens": {"type": "int"},
    "--opt_num_tokens": {"type": "int"}, "--max_encoder_input_len": {"type": "int"},
    "--max_prompt_embedding_table_size": {"type": "int"}, "--max_multimodal_len": {"type": "int"},
    "--kv_cache_type": {"type": "str", "choices": ["continuous", "paged", "disabled"]},
    "--paged_kv_cache": {"type": "str"}, "--input_timing_cache": {"type": "str"}, "--output_timing_cache": {"type": "str"},
    "--profiling_verbosity": {"type": "str", "choices": ["layer_names_only", "detailed", "none"]},
    "--strip_plan": {"type": "flag"}, "--weight_sparsity": {"type": "flag"}, "--weight_streaming": {"type": "flag"},
    "--fast_build": {"type": "flag"}, "--workers": {"type": "int"},
    "--log_level": {"type": "str", "choices": ["internal_error", "error", "warning", "info", "verbose", "debug", "trace"]},
    "--enable_debug_output": {"type": "flag"}, "--visualize_network": {"type": "str"}, "--dry_run": {"type": "flag"},
    "--monitor_memory": {"type": "flag"},
    "--logits_dtype": {"type": "str", "choices": ["float16", "float32"]},
    "--gather_context_logits": {"type": "flag"}, "--gather_generation_logits": {"type": "flag"},
    "--gather_all_token_logits": {"type": "flag"},
    "--lora_dir": {"type": "str", "nargs": "+"}, "--lora_ckpt_source": {"type": "str", "choices": ["hf", "nemo"]},
    "--lora_target_modules": {"type": "str", "nargs": "+"}, "--max_lora_rank": {"type": "int"},
    "--speculative_decoding_mode": {
        "type": "str", "choices": ["draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"],
    },
    "--max_draft_len": {"type": "int"},
    # add_plugin_argument(): NVIDIA/TensorRT-LLM tensorrt_llm/plugin/plugin.py@c20322ffd3dc0740ca530c9fad989b22e64f6e06
    # (cli_plugin_args; Optional[Literal] fields -> their literals with None as "disable", bools -> enable|disable)
    "--bert_attention_plugin": {"type": "str", "choices": _DTYPE_PLUGIN},
    "--gpt_attention_plugin": {"type": "str", "choices": _DTYPE_PLUGIN},
    "--gemm_plugin": {"type": "str", "choices": ["auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"]},
    "--gemm_swiglu_plugin": {"type": "str", "choices": ["fp8", "disable"]},
    "--fp8_rowwise_gemm_plugin": {"type": "str", "choices": _DTYPE_PLUGIN},
    "--lora_plugin": {"type": "str", "choices": _DTYPE_PLUGIN},
    "--dora_plugin": {"type": "str", "choices": _BOOL},
    "--moe_plugin": {"type": "str", "choices": _DTYPE_PLUGIN},
    "--mamba_conv1d_plugin": {"type": "str", "choices": _DTYPE_PLUGIN},
    "--nccl_plugin": {"type": "str", "choices": _DTYPE_PLUGIN},
    "--low_latency_gemm_plugin": {"type": "str", "choices": ["fp8", "disable"]},
    "--low_latency_gemm_swiglu_plugin": {"type": "str", "choices": ["fp8", "disable"]},
    "--gemm_allreduce_plugin": {"type": "str", "choices": ["float16", "bfloat16", "disable"]},
    "--context_fmha": {"type": "str", "choices": _BOOL}, "--bert_context_fmha_fp32_acc": {"type": "str", "choices": _BOOL},
    "--remove_input_padding": {"type": "str", "choices": _BOOL}, "--tokens_per_block": {"type": "int"},
    "--use_paged_context_fmha": {"type": "str", "choices": _BOOL}, "--use_fp8_context_fmha": {"type": "str", "choices": _BOOL},
    "--fuse_fp4_quant": {"type": "str", "choices": _BOOL}, "--multiple_profiles": {"type": "str", "choices": _BOOL},
    "--paged_state": {"type": "str", "choices": _BOOL}, "--streamingllm": {"type": "str", "choices": _BOOL},
    "--norm_quant_fusion": {"type": "str", "choices": _BOOL}, "--reduce_fusion": {"type": "str", "choices": _BOOL},
    "--user_buffer": {"type": "str", "choices": _BOOL}, "--use_fused_mlp": {"type": "str", "choices": _BOOL},
    "--pp_reduce_scatter": {"type": "str", "choices": _BOOL},
}  # fmt: skip

# Source: NVIDIA/TensorRT-LLM examples/models/core/llama/convert_checkpoint.py@fd96a08bdc489f41f139b295935b10ed43652fa1
CONVERT_CHECKPOINT_FLAGS: dict[str, dict] = {
    "--model_dir": {"type": "str"}, "--meta_ckpt_dir": {"type": "str"}, "--tp_size": {"type": "int"},
    "--pp_size": {"type": "int"}, "--moe_tp_size": {"type": "int"}, "--cp_size": {"type": "int"},
    "--moe_ep_size": {"type": "int"}, "--dtype": {"type": "str", "choices": ["auto", "float16", "bfloat16", "float32"]},
    "--vocab_size": {"type": "int"}, "--n_positions": {"type": "int"}, "--n_layer": {"type": "int"},
    "--n_head": {"type": "int"}, "--n_kv_head": {"type": "int"}, "--n_embd": {"type": "int"},
    "--inter_size": {"type": "int"}, "--multiple_of": {"type": "int"}, "--ffn_dim_multiplier": {"type": "float"},
    "--rms_norm_eps": {"type": "float"}, "--use_weight_only": {"type": "flag"},
    "--disable_weight_only_quant_plugin": {"type": "flag"},
    "--weight_only_precision": {"type": "str", "choices": ["int8", "int4", "int8_gptq", "int4_gptq", "int4_awq"]},
    "--calib_dataset": {"type": "str"}, "--calib_size": {"type": "int"}, "--calib_max_seq_length": {"type": "int"},
    "--smoothquant": {"type": "float"}, "--use_qserve": {"type": "flag"}, "--per_channel": {"type": "flag"},
    "--per_token": {"type": "flag"}, "--int8_kv_cache": {"type": "flag"}, "--fp8_kv_cache": {"type": "flag"},
    "--quant_ckpt_path": {"type": "str"}, "--use_fp8": {"type": "flag"}, "--use_nvfp4": {"type": "flag"},
    "--use_fp8_rowwise": {"type": "flag"}, "--use_meta_fp8_rowwise_recipe": {"type": "flag"},
    "--per_group": {"type": "flag"}, "--load_by_shard": {"type": "flag"}, "--hidden_act": {"type": "str"},
    "--rotary_base": {"type": "float"}, "--group_size": {"type": "int"}, "--load_model_on_cpu": {"type": "flag"},
    "--use_parallel_embedding": {"type": "flag"}, "--embedding_sharding_dim": {"type": "int", "choices": [0, 1]},
    "--output_dir": {"type": "str"}, "--workers": {"type": "int"}, "--moe_num_experts": {"type": "int"},
    "--moe_top_k": {"type": "int"}, "--moe_renorm_mode": {"type": "int"}, "--save_config_only": {"type": "flag"},
    "--remove_duplicated_kv_heads": {"type": "flag"}, "--log_level": {"type": "str"},
}  # fmt: skip

# Source: NVIDIA/TensorRT-LLM examples/quantization/quantize.py@c8c6df08bd0ead54cd47f7973e1e425c28a174cd
QUANTIZE_FLAGS: dict[str, dict] = {
    "--model_dir": {"type": "str"}, "--nemo_ckpt_path": {"type": "str"},
    "--decoder_type": {"type": "str", "choices": ["gptnext", "llama"]},
    "--device": {"type": "str", "choices": ["cuda", "cpu"]},
    "--device_map": {"type": "str", "choices": ["auto", "sequential", "cpu", "gpu"]},
    "--calib_dataset": {"type": "str"}, "--calib_tp_size": {"type": "int"}, "--calib_pp_size": {"type": "int"},
    "--dtype": {"type": "str", "choices": ["auto", "float16", "bfloat16", "float32"]},
    "--qformat": {"type": "str", "choices": ["nvfp4", "fp8", "fp8_pc_pt", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "full_prec"]},
    "--seed": {"type": "int"}, "--tokenizer_max_seq_length": {"type": "int"}, "--batch_size": {"type": "int"},
    "--calib_size": {"type": "int"}, "--calib_max_seq_length": {"type": "int"}, "--output_dir": {"type": "str"},
    "--tp_size": {"type": "int"}, "--pp_size": {"type": "int"}, "--cp_size": {"type": "int"},
    "--awq_block_size": {"type": "int"}, "--kv_cache_dtype": {"type": "str", "choices": ["int8", "fp8", None]},
    "--quantize_lm_head": {"type": "flag"}, "--num_medusa_heads": {"type": "int"}, "--num_medusa_layers": {"type": "int"},
    "--max_draft_len": {"type": "int"}, "--medusa_hidden_act": {"type": "str"}, "--medusa_model_dir": {"type": "str"},
    "--quant_medusa_head": {"type": "flag"}, "--autoq_format": {"type": "str"}, "--auto_quantize_bits": {"type": "float"},
}  # fmt: skip

# trtspec's own converter (trtspec/pipeline/convert.py) -- checked against its real parser below.
FLAG_SETS = {"trtllm-build": TRTLLM_BUILD_FLAGS, "convert_checkpoint.py": CONVERT_CHECKPOINT_FLAGS, "quantize.py": QUANTIZE_FLAGS}


def make_parser(flags: dict[str, dict]) -> argparse.ArgumentParser:
    """An argparse parser equivalent (for flag names, arity and accepted values) to the real one."""
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False, add_help=False)
    types = {"int": int, "float": float, "str": str}
    for flag, spec in flags.items():
        if spec["type"] == "flag":
            p.add_argument(flag, action="store_true")
        else:
            kw: dict = {"type": types[spec["type"]]}
            if "choices" in spec:
                kw["choices"] = spec["choices"]
            if "nargs" in spec:
                kw["nargs"] = spec["nargs"]
            p.add_argument(flag, **kw)
    return p


def check_argv(flags: dict[str, dict], args: list[str]) -> argparse.Namespace:
    """Parse `args` (no program name) with the real flag set; raise on an unknown flag or a bad value."""
    parser = make_parser(flags)
    ns, unknown = parser.parse_known_args(args)
    assert not unknown, f"flags not accepted by the real parser: {unknown}"
    return ns


def tool_of(argv: list[str]) -> tuple[str, list[str]]:
    """(which real tool, its arguments) for a plan argv."""
    for i, a in enumerate(argv):
        if a.endswith("convert_checkpoint.py"):
            return "convert_checkpoint.py", argv[i + 1 :]
        if a.endswith("quantize.py"):
            return "quantize.py", argv[i + 1 :]
        if a.endswith("trtllm-build"):
            return "trtllm-build", argv[i + 1 :]
        if a in ("trtspec.pipeline.convert", "trtspec.reference_engine.compiled_linear"):
            return a, argv[i + 1 :]
    raise AssertionError(f"unknown tool in {argv}")


# -------------------------------------------------------------------------------------------- setup

TOOLS = Tools(python="python3", trtllm_build=["trtllm-build"], examples=Path("/app/tensorrt_llm/examples"))
EX = "/app/tensorrt_llm/examples"


@pytest.fixture()
def models(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "models"
    return {
        "70b": make_checkpoint(root / "Llama-3.1-70B-Instruct", LLAMA_31_70B),
        "8b": make_checkpoint(root / "Llama-3.1-8B-Instruct", LLAMA_31_8B),
        "1b": make_checkpoint(root / "Llama-3.2-1B-Instruct", LLAMA_32_1B),
        "smol": make_checkpoint(root / "smollm2-135m", {**SMOLLM2_135M, "torch_dtype": "float32"}),
        "smol-draft": make_checkpoint(root / "smollm2-draft", {**SMOLLM2_DRAFT, "torch_dtype": "float32"}),
    }


def plan_for(tmp_path: Path, name: str, checkpoints: dict, gpus: str | None, **overrides):
    data = example_config(name, checkpoints, **overrides)
    cfg = parse_config(data, source_dir=tmp_path)
    machine = synthetic_machine(gpus, tensorrt_llm_version=cfg.tensorrt_llm_version) if gpus else synthetic_machine("none")
    return make_plan(cfg, tmp_path / "out", machine, tools=TOOLS)


def argvs(plan) -> dict[str, list[str]]:
    return {s.name: s.argv for s in plan.steps}


# ------------------------------------------------------------------------------------------- goldens


def test_demo_reference_plan_is_preflight_then_repository(tmp_path: Path, models) -> None:
    plan = plan_for(tmp_path, "demo.yaml", {"target": models["smol"], "draft": models["smol-draft"]}, None)
    # the demo's float32 engines run on GEMM kernels compiled for this CPU (linear_kernels: compiled)
    assert [s.name for s in plan.steps] == ["preflight", "compile-kernels", "repository"]
    assert all(s.argv == [] and s.kind == "in-process" for s in plan.steps if s.name != "compile-kernels")
    assert plan.step("compile-kernels").outputs == [tmp_path / "out" / "kernels"]
    assert plan.step("repository").outputs == [tmp_path / "out" / "model_repository"]
    assert plan.step("repository").depends_on == ["compile-kernels"]
    plan = plan_for(tmp_path, "demo.yaml", {"target": models["smol"], "draft": models["smol-draft"]}, None,
                    target__linear_kernels="auto", draft__linear_kernels="auto")
    assert [s.name for s in plan.steps] == ["preflight", "repository"]
    assert plan.step("repository").depends_on == ["preflight"]
    assert plan.preflight.ok, plan.preflight.findings


def test_h100_golden_plan(tmp_path: Path, models) -> None:
    plan = plan_for(
        tmp_path, "llama-3.1-8b_llama-3.2-1b_h100.yaml", {"target": models["8b"], "draft": models["1b"]}, "h100x1"
    )
    out = tmp_path / "out"
    limits = ["--max_batch_size", "16", "--max_input_len", "4096", "--max_seq_len", "6144", "--max_num_tokens", "4096", "--max_beam_width", "1"]  # fmt: skip
    plugins = [
        "--gemm_plugin", "bfloat16", "--gpt_attention_plugin", "bfloat16", "--context_fmha", "enable",
        "--remove_input_padding", "enable", "--kv_cache_type", "paged", "--tokens_per_block", "32",
        "--use_paged_context_fmha", "enable", "--use_fp8_context_fmha", "disable", "--logits_dtype", "float32",
    ]  # fmt: skip
    assert argvs(plan) == {
        "preflight": [],
        "convert-target": [
            "python3", f"{EX}/models/core/llama/convert_checkpoint.py", "--model_dir", str(models["8b"]),
            "--output_dir", f"{out}/checkpoints/target", "--dtype", "bfloat16", "--tp_size", "1", "--pp_size", "1",
        ],
        "convert-draft": [
            "python3", f"{EX}/models/core/llama/convert_checkpoint.py", "--model_dir", str(models["1b"]),
            "--output_dir", f"{out}/checkpoints/draft", "--dtype", "bfloat16", "--tp_size", "1", "--pp_size", "1",
        ],
        "build-target": [
            "trtllm-build", "--checkpoint_dir", f"{out}/checkpoints/target", "--output_dir", f"{out}/engines/target",
            *limits, *plugins, "--workers", "1",
            "--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", "8",
        ],
        "build-draft": [
            "trtllm-build", "--checkpoint_dir", f"{out}/checkpoints/draft", "--output_dir", f"{out}/engines/draft",
            *limits, *plugins, "--workers", "1",
        ],
        "repository": [],
    }  # fmt: skip
    assert plan.step("build-target").env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert plan.step("build-draft").env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert plan.step("build-target").depends_on == ["convert-target"]
    assert plan.step("repository").depends_on == ["build-target", "build-draft"]
    # Both models share GPU 0: derived KV fractions, the target's larger (4x the KV bytes per token).
    pf = plan.preflight
    assert pf.placement == {"target": [0], "draft": [0]}
    assert pf.kv_derived == {"target": True, "draft": True}
    assert pf.kv_fractions["target"] > pf.kv_fractions["draft"] > 0
    assert pf.kv_fractions["target"] + pf.kv_fractions["draft"] <= 1.0
    assert pf.ok, pf.findings


def test_h200_fp8_golden_plan_tp4_target_fp8_draft(tmp_path: Path, models) -> None:
    plan = plan_for(
        tmp_path, "llama-3.1-70b_llama-3.2-1b_h200_fp8.yaml", {"target": models["70b"], "draft": models["1b"]}, "h200x8"
    )
    out = tmp_path / "out"
    limits = ["--max_batch_size", "32", "--max_input_len", "8192", "--max_seq_len", "10240", "--max_num_tokens", "8192", "--max_beam_width", "1"]  # fmt: skip
    common = ["--context_fmha", "enable", "--remove_input_padding", "enable", "--kv_cache_type", "paged", "--tokens_per_block", "32", "--use_paged_context_fmha", "enable"]  # fmt: skip
    assert [s.name for s in plan.steps] == [
        "preflight", "convert-target", "quantize-draft", "build-target", "build-draft", "repository",
    ]  # fmt: skip
    assert argvs(plan) == {
        "preflight": [],
        "convert-target": [
            "python3", f"{EX}/models/core/llama/convert_checkpoint.py", "--model_dir", str(models["70b"]),
            "--output_dir", f"{out}/checkpoints/target", "--dtype", "bfloat16", "--tp_size", "4", "--pp_size", "1",
        ],
        "quantize-draft": [
            "python3", f"{EX}/quantization/quantize.py", "--model_dir", str(models["1b"]),
            "--output_dir", f"{out}/checkpoints/draft", "--dtype", "bfloat16", "--qformat", "fp8",
            "--kv_cache_dtype", "fp8", "--calib_size", "512", "--tp_size", "1", "--pp_size", "1",
        ],
        "build-target": [
            "trtllm-build", "--checkpoint_dir", f"{out}/checkpoints/target", "--output_dir", f"{out}/engines/target",
            *limits, "--gemm_plugin", "bfloat16", "--gpt_attention_plugin", "bfloat16", *common,
            "--use_fp8_context_fmha", "disable", "--logits_dtype", "float32", "--workers", "4",
            "--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", "10",
        ],
        "build-draft": [
            "trtllm-build", "--checkpoint_dir", f"{out}/checkpoints/draft", "--output_dir", f"{out}/engines/draft",
            # batch 32 > 4: NVIDIA recommends the GEMM plugin off for FP8 (the FP8 plugin only helps at batch <= 4)
            *limits, "--gemm_plugin", "disable", "--gpt_attention_plugin", "bfloat16", *common,
            "--use_fp8_context_fmha", "enable", "--logits_dtype", "float32", "--workers", "1",
        ],
        "repository": [],
    }  # fmt: skip
    assert plan.step("convert-target").env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert plan.step("quantize-draft").env == {"CUDA_VISIBLE_DEVICES": "4"}
    assert plan.step("build-target").expect == ["config.json", "rank0.engine", "rank1.engine", "rank2.engine", "rank3.engine"]
    assert plan.step("convert-target").expect == ["config.json"] + [f"rank{r}.safetensors" for r in range(4)]
    assert plan.preflight.ok, plan.preflight.findings
    # The target alone on its GPUs gets TensorRT-LLM's 0.9; the draft, alone on GPU 4, only what it can use.
    assert plan.preflight.kv_fractions["target"] == 0.9
    assert 0.05 <= plan.preflight.kv_fractions["draft"] < 0.5


def test_tp_pp_draft_logits_and_small_batch_fp8_variants(tmp_path: Path, models) -> None:
    plan = plan_for(
        tmp_path, "llama-3.1-70b_llama-3.2-1b_h200_fp8.yaml", {"target": models["70b"], "draft": models["1b"]}, "h200x8",
        target__tp_size=2, target__pp_size=2, target__gpu_device_ids=[0, 1, 2, 3],
        speculative__use_draft_logits=True, limits__max_batch_size=4, triton__speculative_instance_count=4,
    )  # fmt: skip
    a = argvs(plan)
    conv = a["convert-target"]
    assert conv[conv.index("--tp_size") + 1] == "2" and conv[conv.index("--pp_size") + 1] == "2"
    assert "--gather_generation_logits" in a["build-draft"]  # draft logits are used
    assert "--gather_generation_logits" not in a["build-target"]
    assert a["build-draft"][a["build-draft"].index("--gemm_plugin") + 1] == "fp8"  # FP8 at batch <= 4
    # max_num_tokens covers both a whole prompt and batch x (K+1)
    assert a["build-target"][a["build-target"].index("--max_num_tokens") + 1] == "8192"


def test_max_num_tokens_covers_batch_times_k_plus_one(tmp_path: Path, models) -> None:
    plan = plan_for(
        tmp_path, "llama-3.1-8b_llama-3.2-1b_h100.yaml", {"target": models["8b"], "draft": models["1b"]}, "h100x1",
        limits__max_batch_size=512, limits__max_input_len=1024, limits__max_seq_len=2048,
    )  # fmt: skip
    for name in ("build-target", "build-draft"):
        argv = plan.step(name).argv
        assert int(argv[argv.index("--max_num_tokens") + 1]) == 512 * 9 == plan_max_num_tokens(plan.cfg)


def test_old_trtllm_uses_old_examples_layout_and_other_archs_use_the_python_api(tmp_path: Path, models) -> None:
    qwen = make_checkpoint(
        tmp_path / "qwen", {**LLAMA_31_8B, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    )
    plan = plan_for(
        tmp_path, "llama-3.1-8b_llama-3.2-1b_h100.yaml", {"target": qwen, "draft": models["1b"]}, "h100x1",
        tensorrt_llm_version="0.17.0",
    )  # fmt: skip
    a = argvs(plan)
    assert a["convert-target"][:3] == ["python3", "-m", "trtspec.pipeline.convert"]
    assert a["convert-draft"][1] == f"{EX}/llama/convert_checkpoint.py"  # before 0.18


def test_calibration_dataset_override(tmp_path: Path, models, monkeypatch) -> None:
    monkeypatch.setenv("TRTSPEC_CALIB_DATASET", "/data/cnn_dailymail")
    monkeypatch.setenv("TRTSPEC_PYTHON", "/usr/bin/python3")
    monkeypatch.setenv("TRTSPEC_TRTLLM_BUILD", "/opt/bin/trtllm-build --log_level info")
    monkeypatch.setenv("TRTSPEC_TRTLLM_EXAMPLES", "/opt/trtllm/examples")
    tools = Tools.from_env()
    cfg = parse_config(
        example_config("llama-3.1-70b_llama-3.2-1b_h200_fp8.yaml", {"target": models["70b"], "draft": models["1b"]}),
        source_dir=tmp_path,
    )
    plan = make_plan(cfg, tmp_path / "out", synthetic_machine("h200x8", tensorrt_llm_version="1.1.0"), tools=tools)
    q = plan.step("quantize-draft").argv
    assert q[:2] == ["/usr/bin/python3", "/opt/trtllm/examples/quantization/quantize.py"]
    assert q[-2:] == ["--calib_dataset", "/data/cnn_dailymail"]
    assert plan.step("build-target").argv[:3] == ["/opt/bin/trtllm-build", "--log_level", "info"]


# --------------------------------------------------------------------------------- flags vs real parsers


def all_example_plans(tmp_path: Path, models) -> list:
    pairs = {
        "demo.yaml": ({"target": models["smol"], "draft": models["smol-draft"]}, None),
        "llama-3.1-8b_llama-3.2-1b_h100.yaml": ({"target": models["8b"], "draft": models["1b"]}, "h100x1"),
        "llama-3.1-70b_llama-3.2-1b_h200_fp8.yaml": ({"target": models["70b"], "draft": models["1b"]}, "h200x8"),
    }
    plans = [plan_for(tmp_path / n, n, ck, g) for n, (ck, g) in pairs.items()]
    plans.append(
        plan_for(
            tmp_path / "variant", "llama-3.1-70b_llama-3.2-1b_h200_fp8.yaml", pairs["llama-3.1-70b_llama-3.2-1b_h200_fp8.yaml"][0],
            "h200x8", target__tp_size=8, target__gpu_device_ids=list(range(8)), draft__gpu_device_ids=[0],
            speculative__use_draft_logits=True, limits__max_batch_size=2, triton__speculative_instance_count=2,
        )
    )  # fmt: skip
    return plans


def test_every_flag_exists_in_the_real_parsers_with_a_valid_value(tmp_path: Path, models) -> None:
    from trtspec.pipeline.convert import parse_args as trtspec_convert_args

    seen = set()
    for plan in all_example_plans(tmp_path, models):
        for step in plan.steps:
            if not step.argv:
                continue
            tool, args = tool_of(step.argv)
            seen.add(tool)
            if tool == "trtspec.pipeline.convert":
                trtspec_convert_args(args)
                continue
            if tool == "trtspec.reference_engine.compiled_linear":  # OUT_DIR CHECKPOINT [CHECKPOINT ...]
                assert Path(args[0]) == plan.output_dir / "kernels" and args[1:] and all(Path(c).is_dir() for c in args[1:])
                continue
            ns = check_argv(FLAG_SETS[tool], args)
            if tool == "trtllm-build":
                assert ns.use_paged_context_fmha == "enable" and ns.context_fmha == "enable"
                assert ns.kv_cache_type == "paged" and ns.remove_input_padding == "enable"
                assert ns.max_num_tokens >= ns.max_input_len
                assert ns.max_num_tokens >= ns.max_batch_size * (plan.cfg.speculative.max_k + 1)
                assert not ns.gather_context_logits  # refused by trtllm-build together with max_draft_len > 0
                if step.role == "target":
                    assert ns.speculative_decoding_mode == "draft_tokens_external"
                    assert ns.max_draft_len == plan.cfg.speculative.max_k
                else:
                    assert ns.speculative_decoding_mode is None and ns.max_draft_len is None
            if tool == "quantize.py":
                assert ns.qformat == "fp8" and ns.kv_cache_dtype == "fp8"  # FP8 KV only with FP8 weights
    assert seen == {"trtllm-build", "convert_checkpoint.py", "quantize.py", "trtspec.reference_engine.compiled_linear"}


def test_engines_share_limits(tmp_path: Path, models) -> None:
    for plan in all_example_plans(tmp_path, models):
        if plan.cfg.engine.value != "tensorrt_llm":
            continue
        t = check_argv(TRTLLM_BUILD_FLAGS, tool_of(plan.step("build-target").argv)[1])
        d = check_argv(TRTLLM_BUILD_FLAGS, tool_of(plan.step("build-draft").argv)[1])
        for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tokens_per_block"):
            assert getattr(t, k) == getattr(d, k), k


def test_the_checker_rejects_what_the_real_parsers_reject() -> None:
    with pytest.raises(AssertionError):
        check_argv(TRTLLM_BUILD_FLAGS, ["--max_draft_length", "4"])
    with pytest.raises(argparse.ArgumentError):
        check_argv(TRTLLM_BUILD_FLAGS, ["--use_paged_context_fmha", "true"])
    with pytest.raises(AssertionError):
        check_argv(QUANTIZE_FLAGS, ["--kv_cache", "fp8"])  # no abbreviations
    with pytest.raises(argparse.ArgumentError):
        check_argv(CONVERT_CHECKPOINT_FLAGS, ["--dtype", "fp8"])


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_json_plan_is_a_stable_list_of_steps(tmp_path: Path, models) -> None:
    cfg = write_config(
        tmp_path / "h200.yaml",
        example_config("llama-3.1-70b_llama-3.2-1b_h200_fp8.yaml", {"target": models["70b"], "draft": models["1b"]}),
    )
    res = CliRunner().invoke(cli, ["build", str(cfg), "--json", "--gpus", "h200x8", "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    steps = json.loads(res.stdout)
    assert isinstance(steps, list)
    assert [s["name"] for s in steps] == ["preflight", "convert-target", "quantize-draft", "build-target", "build-draft", "repository"]  # fmt: skip
    for s in steps:
        assert {"name", "argv", "env", "outputs", "up_to_date"} <= set(s)
        assert isinstance(s["argv"], list) and isinstance(s["env"], dict) and isinstance(s["outputs"], list)
        assert s["up_to_date"] is False
    assert steps[0]["findings"] == []
    assert "--speculative_decoding_mode" in steps[3]["argv"]


def test_cli_dry_run_works_for_the_shipped_configs_without_their_checkpoints() -> None:
    root = Path(__file__).resolve().parent.parent / "build_configs"
    res = CliRunner().invoke(
        cli, ["build", str(root / "llama-3.1-70b_llama-3.2-1b_h200_fp8.yaml"), "--dry-run", "--gpus", "h200x8"]
    )
    assert res.exit_code == 0, res.output
    out = squash(res.output)
    assert "checkpoint-missing" in out and "/models/Llama-3.1-70B-Instruct" in out
    assert "preflight would refuse" in out
    assert "--speculative_decoding_mode draft_tokens_external" in out and "--qformat fp8" in out
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in out


def test_cli_bad_gpu_spec_and_bad_config_are_user_errors(tmp_path: Path, models) -> None:
    cfg = write_config(
        tmp_path / "h100.yaml",
        example_config("llama-3.1-8b_llama-3.2-1b_h100.yaml", {"target": models["8b"], "draft": models["1b"]}),
    )
    res = CliRunner().invoke(cli, ["build", str(cfg), "--dry-run", "--gpus", "v100x2"])
    assert res.exit_code == 1 and "known SKUs" in squash(res.output) and "Traceback" not in res.output
    bad = write_config(tmp_path / "bad.yaml", {**example_config("llama-3.1-8b_llama-3.2-1b_h100.yaml", {"target": models["8b"], "draft": models["1b"]}), "limitz": {}})  # fmt: skip
    res = CliRunner().invoke(cli, ["build", str(bad), "--dry-run"])
    assert res.exit_code == 1 and "limitz" in squash(res.output) and "unknown key" in squash(res.output)


def test_cli_help_documents_the_steps_and_env_overrides() -> None:
    res = CliRunner().invoke(cli, ["build", "--help"])
    assert res.exit_code == 0
    for word in ("--dry-run", "--json", "--force", "--only", "--gpus", "TRTSPEC_TRTLLM_BUILD", "TRTSPEC_TRTLLM_EXAMPLES", "draft_tokens_external", "quantize-draft"):  # fmt: skip
        assert word in res.output, word
