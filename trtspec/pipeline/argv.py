"""The external steps' command lines: NVIDIA's conversion scripts, ModelOpt's quantize.py and trtllm-build, and
where those tools are (`Tools`).

Conversion: NVIDIA's ``convert_checkpoint.py`` from the TensorRT-LLM examples shipped in the container
(``examples/models/core/llama/`` from 0.18, ``examples/llama/`` before) for Llama-architecture checkpoints.
It is the path NVIDIA's draft-target README uses, and its command line is stable across 0.17-1.2 and can
be checked against the real parser in tests, unlike the Python API whose signatures (QuantConfig, Mapping,
``from_hugging_face`` kwargs) moved between releases. Other architectures go through
``python -m trtspec.pipeline.convert`` (``AutoModelForCausalLM.from_hugging_face`` + ``save_checkpoint`` per
rank, in a child process so its memory is returned). FP8 goes through ``examples/quantization/quantize.py``
(ModelOpt PTQ, FP8 weights *and* FP8 KV cache: an FP8 KV cache without FP8 weights silently turns off paged
context FMHA and with it KV-cache reuse).

Tool locations come from the environment so a build can use a non-standard install (or test stand-ins):

    TRTSPEC_TRTLLM_BUILD     trtllm-build command (default: trtllm-build on PATH)
    TRTSPEC_TRTLLM_EXAMPLES  TensorRT-LLM examples dir (default: /app/tensorrt_llm/examples or /app/examples)
    TRTSPEC_PYTHON           Python that runs the conversion scripts (default: this interpreter)
    TRTSPEC_CALIB_DATASET    FP8 calibration dataset, a local dir for offline machines (default: quantize.py's)
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trtspec.config import BuildConfig, ModelConfig, plan_max_num_tokens
from trtspec.pipeline.preflight import version_tuple

DEFAULT_EXAMPLES = Path("/app/tensorrt_llm/examples")
# Where NVIDIA's *-trtllm-python-py3 containers have had TensorRT-LLM's examples (the first that exists wins).
EXAMPLES_CANDIDATES = (DEFAULT_EXAMPLES, Path("/app/examples"))
# Architectures whose conversion uses examples/.../llama/convert_checkpoint.py.
LLAMA_SCRIPT_ARCHS = frozenset({"LlamaForCausalLM", "MistralForCausalLM"})
TOKENS_PER_BLOCK = 32  # the 1.x default (it was 128 before); small blocks reuse more of the resent sequence
FP8_CALIB_SIZE = 512
# NVIDIA's performance guide: the FP8 GEMM plugin helps at batch <= 4 and should be off for larger batches.
FP8_GEMM_PLUGIN_MAX_BATCH = 4

ENV_DOC = {
    "TRTSPEC_TRTLLM_BUILD": "trtllm-build command (default: trtllm-build on PATH)",
    "TRTSPEC_TRTLLM_EXAMPLES": "TensorRT-LLM examples directory (default: /app/tensorrt_llm/examples or /app/examples)",
    "TRTSPEC_PYTHON": "Python interpreter for convert_checkpoint.py / quantize.py (default: the one running trtspec)",
    "TRTSPEC_CALIB_DATASET": "FP8 calibration dataset for quantize.py, e.g. a local dir on offline machines",
}


@dataclass
class Tools:
    python: str
    trtllm_build: list[str]
    examples: Path
    calib_dataset: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Tools":
        env = dict(os.environ if env is None else env)
        return cls(
            python=env.get("TRTSPEC_PYTHON") or sys.executable or "python3",
            trtllm_build=shlex.split(env.get("TRTSPEC_TRTLLM_BUILD") or "trtllm-build"),
            examples=Path(env.get("TRTSPEC_TRTLLM_EXAMPLES") or default_examples_dir()),
            calib_dataset=env.get("TRTSPEC_CALIB_DATASET") or None,
        )

    def convert_script(self, trtllm_version: str | None) -> Path:
        new = self.examples / "models" / "core" / "llama" / "convert_checkpoint.py"
        old = self.examples / "llama" / "convert_checkpoint.py"
        if new.is_file() or not old.is_file() and _at_least(trtllm_version, (0, 18), default=True):
            return new
        return old

    def medusa_convert_script(self) -> Path:
        """examples/medusa/convert_checkpoint.py: the target with its Medusa heads in one checkpoint (the same path
        in 0.17-1.2; docs/medusa.md has where it was read)."""
        return self.examples / "medusa" / "convert_checkpoint.py"

    def quantize_script(self) -> Path:
        return self.examples / "quantization" / "quantize.py"


def default_examples_dir() -> Path:
    return next((p for p in EXAMPLES_CANDIDATES if p.is_dir()), DEFAULT_EXAMPLES)


def _at_least(version: str | None, floor: tuple[int, int], *, default: bool) -> bool:
    v = version_tuple(version)
    return default if v is None else v[:2] >= floor


def convert_argv(
    tools: Tools, script: Path, model_dir: Path, out: Path, m: ModelConfig
) -> list[str]:
    """HF -> TensorRT-LLM checkpoint with NVIDIA's convert_checkpoint.py (weights in m.dtype, m's mapping)."""
    return [tools.python, str(script), *_conversion_args(model_dir, out, m)]


def _conversion_args(model_dir: Path, out: Path, m: ModelConfig) -> list[str]:
    """The arguments convert_checkpoint.py and trtspec.pipeline.convert share."""
    return [
        "--model_dir", str(model_dir),
        "--output_dir", str(out),
        "--dtype", m.dtype,
        "--tp_size", str(m.tp_size),
        "--pp_size", str(m.pp_size),
    ]  # fmt: skip


def medusa_convert_argv(tools: Tools, model_dir: Path, heads_dir: Path, out: Path, m: ModelConfig,
                        num_heads: int, max_k: int) -> list[str]:
    """Target + Medusa heads -> one TensorRT-LLM checkpoint (MedusaForCausalLM) with NVIDIA's
    examples/medusa/convert_checkpoint.py (its --dtype has no auto: the model's dtype is written out)."""
    return [
        tools.python, str(tools.medusa_convert_script()), *_conversion_args(model_dir, out, m),
        "--medusa_model_dir", str(heads_dir),
        "--num_medusa_heads", str(num_heads),
        "--max_medusa_token_len", str(max_k),
    ]  # fmt: skip


def api_convert_argv(tools: Tools, model_dir: Path, out: Path, m: ModelConfig) -> list[str]:
    """HF -> TensorRT-LLM checkpoint through TensorRT-LLM's Python API (trtspec.pipeline.convert)."""
    return [tools.python, "-m", "trtspec.pipeline.convert", *_conversion_args(model_dir, out, m)]


def quantize_argv(tools: Tools, model_dir: Path, out: Path, m: ModelConfig, export_format: str | None = None
                  ) -> list[str]:
    """HF -> FP8 checkpoint (ModelOpt PTQ): FP8 weights and FP8 KV cache together. `export_format="hf"` writes
    a Hugging Face checkpoint (what the PyTorch backend loads) instead of a TensorRT-LLM one."""
    argv = [
        tools.python, str(tools.quantize_script()),
        "--model_dir", str(model_dir),
        "--output_dir", str(out),
        "--dtype", m.dtype,
        "--qformat", "fp8",
        "--kv_cache_dtype", "fp8",
        "--calib_size", str(FP8_CALIB_SIZE),
        "--tp_size", str(m.tp_size),
        "--pp_size", str(m.pp_size),
    ]  # fmt: skip
    if export_format:
        argv += ["--export_format", export_format]
    if tools.calib_dataset:
        argv += ["--calib_dataset", tools.calib_dataset]
    return argv


def build_argv(
    tools: Tools, cfg: BuildConfig, role: Literal["target", "draft"], ckpt: Path, out: Path
) -> list[str]:
    """trtllm-build for one engine. Limits are identical on both engines; plugins and features are passed
    explicitly because their defaults changed between releases (tokens_per_block 128 -> 32,
    use_paged_context_fmha off -> on, gpt_attention_plugin float16 -> auto)."""
    m: ModelConfig = getattr(cfg, role)
    L, K = cfg.limits, cfg.speculative.max_k
    fp8 = m.quantization == "fp8"
    if fp8:
        gemm = "fp8" if L.max_batch_size <= FP8_GEMM_PLUGIN_MAX_BATCH else "disable"
    else:
        gemm = m.dtype
    argv = [
        *tools.trtllm_build,
        "--checkpoint_dir", str(ckpt),
        "--output_dir", str(out),
        "--max_batch_size", str(L.max_batch_size),
        "--max_input_len", str(L.max_input_len),
        "--max_seq_len", str(L.max_seq_len),
        "--max_num_tokens", str(plan_max_num_tokens(cfg)),
        "--max_beam_width", "1",
        "--gemm_plugin", gemm,
        "--gpt_attention_plugin", m.dtype,
        "--context_fmha", "enable",
        "--remove_input_padding", "enable",
        "--kv_cache_type", "paged",
        "--tokens_per_block", str(TOKENS_PER_BLOCK),
        "--use_paged_context_fmha", "enable",
        "--use_fp8_context_fmha", "enable" if fp8 else "disable",
        "--logits_dtype", "float32",
        "--workers", str(m.world_size),
    ]  # fmt: skip
    if role == "target":
        mode = "medusa" if cfg.speculative.method == "medusa" else "draft_tokens_external"
        argv += ["--speculative_decoding_mode", mode, "--max_draft_len", str(K)]
    elif cfg.speculative.use_draft_logits:
        argv += ["--gather_generation_logits"]
    return argv
