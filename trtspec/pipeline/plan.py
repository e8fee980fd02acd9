"""The build plan: pure functions from a build config (+ machine, checkpoints) to the list of steps.

    preflight -> convert-target -> convert-draft | quantize-draft -> build-target -> build-draft -> repository

Every external step carries its exact argv, its environment additions, its inputs and outputs, and a cache
key over what determines its result. ``engine: reference`` has no engines: preflight -> repository.

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

import hashlib
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trtspec import __version__
from trtspec.pipeline.preflight import (
    Finding,
    PreflightResult,
    plan_max_num_tokens,
    plan_placement,
    run_preflight,
    version_tuple,
)
from trtspec.checkpoint import CheckpointError, CheckpointInfo, checkpoint_fingerprint, inspect_checkpoint
from trtspec.config import BuildConfig, EngineKind, ModelConfig, checkpoint_path
from trtspec.llmapi.model_yaml import ModelYamlError, load_controls, validate_installed
from trtspec.llmapi.repository import model_yamls
from trtspec.machine import Machine
from trtspec.medusa import DEFAULT_CHOICES, MedusaError, inspect_heads

PLAN_FORMAT = 1
DEFAULT_EXAMPLES = Path("/app/tensorrt_llm/examples")
# Where NVIDIA's *-trtllm-python-py3 containers have had TensorRT-LLM's examples (the first that exists wins).
EXAMPLES_CANDIDATES = (DEFAULT_EXAMPLES, Path("/app/examples"))
# Architectures whose conversion uses examples/.../llama/convert_checkpoint.py.
LLAMA_SCRIPT_ARCHS = frozenset({"LlamaForCausalLM", "MistralForCausalLM"})
TOKENS_PER_BLOCK = 32  # the 1.x default (it was 128 before); small blocks reuse more of the resent sequence
FP8_CALIB_SIZE = 512
# NVIDIA's performance guide: the FP8 GEMM plugin helps at batch <= 4 and should be off for larger batches.
FP8_GEMM_PLUGIN_MAX_BATCH = 4

STATE_DIR = ".steps"
LOG_DIR = "logs"

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


@dataclass
class Step:
    name: str
    description: str
    kind: Literal["process", "in-process"]
    argv: list[str]
    env: dict[str, str]
    inputs: list[str]
    outputs: list[Path]
    expect: list[str] = field(default_factory=list)  # files the first output must contain on success
    depends_on: list[str] = field(default_factory=list)
    key_parts: dict[str, Any] = field(default_factory=dict)
    always_run: bool = False
    role: str | None = None
    cache_key: str = ""
    up_to_date: bool = False

    def command_line(self) -> str:
        return shlex.join(self.argv)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "argv": list(self.argv),
            "env": dict(self.env),
            "inputs": list(self.inputs),
            "outputs": [str(p) for p in self.outputs],
            "depends_on": list(self.depends_on),
            "cache_key": self.cache_key,
            "up_to_date": self.up_to_date,
        }


@dataclass
class Plan:
    cfg: BuildConfig
    output_dir: Path
    machine: Machine
    tools: Tools
    trtllm_version: str | None
    steps: list[Step]
    preflight: PreflightResult
    checkpoints: dict[str, Path]
    infos: dict[str, CheckpointInfo | None]
    config_path: Path | None = None
    model_yamls: dict[str, Any] = field(default_factory=dict)  # engine: llmapi: the model.yaml per endpoint

    @property
    def llmapi_draft_dir(self) -> Path | None:
        """The draft the llmapi model.yaml names: the FP8 export when the plan quantizes it."""
        if any(s.name == "quantize-draft" for s in self.steps) and self.cfg.engine is EngineKind.llmapi:
            return self.output_dir / "checkpoints" / "draft"
        return None

    @property
    def state_dir(self) -> Path:
        return self.output_dir / STATE_DIR

    @property
    def log_dir(self) -> Path:
        return self.output_dir / LOG_DIR

    @property
    def repository_dir(self) -> Path:
        return self.output_dir / "model_repository"

    def engine_dir(self, role: str) -> Path:
        return self.output_dir / "engines" / role

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step {name!r}; steps: {', '.join(s.name for s in self.steps)}")

    def done_file(self, name: str) -> Path:
        return self.state_dir / f"{name}.done.json"

    def done_record(self, name: str) -> dict[str, Any] | None:
        try:
            rec = json.loads(self.done_file(name).read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return rec if isinstance(rec, dict) else None

    def refresh(self) -> None:
        """Recompute every step's cache key (upstream steps enter through their last run id) and whether
        it is up to date: a done record with this key, its outputs present, and its upstream up to date."""
        status: dict[str, bool] = {}
        always = {s.name for s in self.steps if s.always_run}
        for s in self.steps:
            # Checks that run every time (preflight) gate their dependents but are not inputs to them.
            upstream = {d: (self.done_record(d) or {}).get("run_id") for d in s.depends_on if d not in always}
            s.cache_key = _key(
                {"format": PLAN_FORMAT, "name": s.name, "argv": s.argv, "env": s.env, "parts": s.key_parts, "upstream": upstream}
            )
            rec = self.done_record(s.name)
            s.up_to_date = (
                not s.always_run
                and rec is not None
                and rec.get("cache_key") == s.cache_key
                and all(p.exists() for p in s.outputs)
                and all(status.get(d, False) for d in s.depends_on)
            )
            status[s.name] = s.up_to_date or s.always_run

    def to_json(self) -> list[dict[str, Any]]:
        """The stable plan format: a list of steps with name, argv, env, outputs, up_to_date (and more)."""
        out = []
        for s in self.steps:
            d = s.to_dict()
            if s.name == "repository" and self.model_yamls:
                d["model_yaml"] = self.model_yamls
            if s.name == "preflight":
                d["findings"] = [f.to_dict() for f in self.preflight.findings]
                d["placement"] = self.preflight.placement
                d["kv_cache_free_gpu_mem_fraction"] = self.preflight.kv_fractions
            out.append(d)
        return out


def _medusa_heads(cfg: BuildConfig, heads_dir: Path) -> int:
    """The head set's number of heads (from its config.json; without it, as deep as the tree: a dry run)."""

    try:
        return inspect_heads(heads_dir).num_heads
    except (MedusaError, OSError, ValueError):
        return max(len(c) for c in (cfg.speculative.medusa_choices or DEFAULT_CHOICES))


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


# ------------------------------------------------------------------------------------------------ argv


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
                        num_heads: int, max_draft_len: int) -> list[str]:
    """Target + Medusa heads -> one TensorRT-LLM checkpoint (MedusaForCausalLM) with NVIDIA's
    examples/medusa/convert_checkpoint.py (its --dtype has no auto: the model's dtype is written out)."""
    return [
        tools.python, str(tools.medusa_convert_script()), *_conversion_args(model_dir, out, m),
        "--medusa_model_dir", str(heads_dir),
        "--num_medusa_heads", str(num_heads),
        "--max_medusa_token_len", str(max_draft_len),
    ]  # fmt: skip


def api_convert_argv(tools: Tools, model_dir: Path, out: Path, m: ModelConfig) -> list[str]:
    """HF -> TensorRT-LLM checkpoint through TensorRT-LLM's Python API (trtspec.pipeline.convert)."""
    return [tools.python, "-m", "trtspec.pipeline.convert", *_conversion_args(model_dir, out, m)]


def quantize_argv(tools: Tools, model_dir: Path, out: Path, m: ModelConfig, export_format: str | None = None) -> list[str]:
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
    L, K = cfg.limits, cfg.speculative.max_draft_len
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


def paged_context_fmha_blockers(m: ModelConfig, sm: int | None) -> list[str]:
    """Reasons TensorRT-LLM's builder would silently turn off paged context FMHA (and KV-cache reuse) for a
    model built by this plan (trtllm-spec.md §1.3). Our argv never disables context FMHA, never uses an INT8
    KV cache and always pairs an FP8 KV cache with FP8 weights, so only the GPU can trigger it."""
    reasons = []
    if m.quantization == "fp8" and sm is not None and sm < 89:
        reasons.append(f"FP8 KV cache on SM {sm / 10:.1f} < 8.9")
    return reasons


# ------------------------------------------------------------------------------------------------ plan


def make_plan(
    cfg: BuildConfig,
    output_dir: str | Path,
    machine: Machine,
    *,
    config_path: str | Path | None = None,
    tools: Tools | None = None,
    ignore: tuple[str, ...] | list[str] = (),
) -> Plan:
    """Inspect the checkpoints, run preflight, and lay out the steps with their argv and cache state."""
    output_dir = Path(output_dir).absolute()
    tools = tools or Tools.from_env()
    trtllm_version = cfg.tensorrt_llm_version or machine.tensorrt_llm_version

    checkpoints: dict[str, Path] = {}
    infos: dict[str, CheckpointInfo | None] = {}
    problems: dict[str, str] = {}
    for role in ("target", "draft"):
        if getattr(cfg, role) is None:
            continue
        checkpoints[role] = p = checkpoint_path(cfg, role)  # type: ignore[arg-type]
        try:
            infos[role] = inspect_checkpoint(p)
        except CheckpointError as e:
            infos[role] = None
            problems[role] = str(e)

    placement = plan_placement(cfg, len(machine.gpus))
    steps: list[Step] = []
    layout_findings: list[Finding] = []
    steps.append(
        Step(
            name="preflight",
            description="check the pair, the machine and the memory estimate; derive placement and KV fractions",
            kind="in-process",
            argv=[],
            env={},
            inputs=[str(p) for p in checkpoints.values()],
            outputs=[output_dir / "preflight.json"],
            always_run=True,
        )
    )
    fps = {role: _fingerprint(p) for role, p in checkpoints.items()}

    # method medusa: the heads go into the target's checkpoint and engine (no draft engine)
    medusa = cfg.speculative.method == "medusa"
    engine_roles = ("target",) if medusa else ("target", "draft")
    if cfg.engine is EngineKind.tensorrt_llm:
        ckpt_steps: dict[str, str] = {}
        for role in engine_roles:
            m: ModelConfig | None = getattr(cfg, role)
            if m is None:
                continue
            out = output_dir / "checkpoints" / role
            info = infos.get(role)
            env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in placement[role])}
            if m.quantization == "fp8":
                name, argv = f"quantize-{role}", quantize_argv(tools, checkpoints[role], out, m)
                desc = f"quantize the {role} to FP8 (weights + KV cache, ModelOpt PTQ, {FP8_CALIB_SIZE} calibration samples)"
                script = tools.quantize_script()
            elif medusa:
                heads = _medusa_heads(cfg, checkpoints["draft"])
                name, argv = f"convert-{role}", medusa_convert_argv(
                    tools, checkpoints[role], checkpoints["draft"], out, m, heads, cfg.speculative.max_draft_len
                )
                desc = f"convert the target with its {heads} Medusa heads ({m.dtype}, tp {m.tp_size}, pp {m.pp_size})"
                script = tools.medusa_convert_script()
            elif info is None or info.architecture in LLAMA_SCRIPT_ARCHS or info.architecture is None:
                name, argv = f"convert-{role}", convert_argv(
                    tools, tools.convert_script(trtllm_version), checkpoints[role], out, m
                )
                desc = f"convert the {role} to a TensorRT-LLM checkpoint ({m.dtype}, tp {m.tp_size}, pp {m.pp_size})"
                script = tools.convert_script(trtllm_version)
            else:
                name, argv = f"convert-{role}", api_convert_argv(tools, checkpoints[role], out, m)
                desc = (
                    f"convert the {role} ({info.architecture}) with TensorRT-LLM's Python API "
                    f"({m.dtype}, tp {m.tp_size}, pp {m.pp_size})"
                )
                script = None
            if script is not None and machine.software_checked and not script.is_file():
                layout_findings.append(
                    Finding(
                        "error",
                        "converter-missing",
                        f"{script} not found: {name} needs the examples/ directory of the TensorRT-LLM release "
                        "you build with (NVIDIA's containers have it at /app/tensorrt_llm/examples or /app/examples; "
                        "trtspec's Dockerfile fetches it when missing). Set TRTSPEC_TRTLLM_EXAMPLES to it, e.g. after "
                        "`git clone --depth 1 --branch v<version> https://github.com/NVIDIA/TensorRT-LLM`.",
                    )
                )
            ranks = [f"rank{r}.safetensors" for r in range(m.world_size)]
            steps.append(
                Step(
                    name=name,
                    description=desc,
                    kind="process",
                    argv=argv,
                    env=env,
                    inputs=[str(checkpoints[role])],
                    outputs=[out],
                    expect=["config.json", *ranks],
                    depends_on=["preflight"],
                    key_parts={"checkpoint": fps[role], "tensorrt_llm": trtllm_version,
                               **({"medusa_heads": fps["draft"]} if medusa else {})},
                    role=role,
                )
            )
            ckpt_steps[role] = name
        for role in engine_roles:
            m = getattr(cfg, role)
            if m is None:
                continue
            ckpt = output_dir / "checkpoints" / role
            out = output_dir / "engines" / role
            what = (
                f"{'medusa' if medusa else 'draft_tokens_external'}, max_draft_len {cfg.speculative.max_draft_len}"
                if role == "target"
                else ("gathers generation logits" if cfg.speculative.use_draft_logits else "plain engine")
            )
            steps.append(
                Step(
                    name=f"build-{role}",
                    description=f"build the {role} engine ({what}, paged context FMHA for KV-cache reuse)",
                    kind="process",
                    argv=build_argv(tools, cfg, role, ckpt, out),  # type: ignore[arg-type]
                    env={"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in placement[role])},
                    inputs=[str(ckpt)],
                    outputs=[out],
                    expect=["config.json", *[f"rank{r}.engine" for r in range(m.world_size)]],
                    depends_on=[ckpt_steps[role]],
                    key_parts={"tensorrt_llm": trtllm_version},
                    role=role,
                )
            )

    if cfg.engine is EngineKind.llmapi and cfg.draft is not None and cfg.draft.quantization == "fp8":
        out = output_dir / "checkpoints" / "draft"
        steps.append(
            Step(
                name="quantize-draft",
                description=f"quantize the draft to FP8 (ModelOpt PTQ, {FP8_CALIB_SIZE} calibration samples), "
                "exported as a Hugging Face checkpoint for the PyTorch backend",
                kind="process",
                argv=quantize_argv(tools, checkpoints["draft"], out, cfg.draft, export_format="hf"),
                env={"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in placement["draft"])},
                inputs=[str(checkpoints["draft"])],
                outputs=[out],
                expect=["config.json"],
                depends_on=["preflight"],
                key_parts={"checkpoint": fps["draft"], "tensorrt_llm": trtllm_version},
                role="draft",
            )
        )
    compiled = []
    if any(m is not None and m.linear_kernels == "compiled" for m in (cfg.target, cfg.draft)):  # torch only then
        from trtspec.reference_engine.compiled_linear import environment_key
        from trtspec.reference_engine.device import roles_to_compile

        compiled = [r for r in roles_to_compile(cfg) if r in checkpoints]
    if compiled:
        steps.append(
            Step(
                name="compile-kernels",
                description=f"compile the {' and '.join(compiled)}'s GEMM kernels for this CPU (Inductor CPP template, "
                "AOTInductor; about 15 s per weight shape, shapes already in the kernel cache reused)",
                kind="process",
                argv=[sys.executable, "-m", "trtspec.reference_engine.compiled_linear", str(output_dir / "kernels"),
                      *[str(checkpoints[r]) for r in compiled]],
                env={},
                inputs=[str(checkpoints[r]) for r in compiled],
                outputs=[output_dir / "kernels"],
                expect=["kernels.json"],
                depends_on=["preflight"],
                key_parts={"checkpoints": {r: fps[r] for r in compiled}, "environment": environment_key()},
            )
        )
    repo_deps = [s.name for s in steps if s.name.startswith(("build-", "quantize-draft", "compile-kernels"))] or ["preflight"]
    steps.append(
        Step(
            name="repository",
            description="generate the Triton model repository (trtspec.repository.generate_repository, in-process)",
            kind="in-process",
            argv=[],
            env={},
            inputs=[str(p) for p in checkpoints.values()]
            + [str(output_dir / "engines" / r) for r in checkpoints if cfg.engine is EngineKind.tensorrt_llm],
            outputs=[output_dir / "model_repository"],
            depends_on=repo_deps,
            key_parts={
                "config": cfg.model_dump(mode="json"),
                "checkpoints": fps,
                "tensorrt_llm": trtllm_version,
                "trtspec": __version__,
                "templates": _tree_digest(Path(__file__).resolve().parent.parent / "model_repository"),
            },
        )
    )

    plan = Plan(
        cfg=cfg,
        output_dir=output_dir,
        machine=machine,
        tools=tools,
        trtllm_version=trtllm_version,
        steps=steps,
        preflight=PreflightResult(),
        checkpoints=checkpoints,
        infos=infos,
        config_path=Path(config_path) if config_path else None,
    )
    plan.refresh()
    pending = {
        role: not (plan.step(f"build-{role}").up_to_date and (output_dir / "checkpoints" / role).exists())
        for role in checkpoints
        if cfg.engine is EngineKind.tensorrt_llm and role in engine_roles
    }
    pf = run_preflight(
        cfg,
        machine,
        infos,
        trtllm_version=trtllm_version,
        output_dir=output_dir,
        pending_outputs=pending,
        checkpoint_problems=problems,
    )
    pf.findings.extend(layout_findings)
    if cfg.engine is EngineKind.tensorrt_llm:
        for role, m in (("target", cfg.target), ("draft", cfg.draft)):
            if m is None or role not in engine_roles:
                continue
            for g in pf.placement.get(role, []):  # engine flow only: llmapi has no engine builder
                gpu = machine.gpu(g)
                for reason in paged_context_fmha_blockers(m, gpu.sm if gpu else None):
                    if "fp8-unsupported-gpu" not in pf.codes():
                        pf.add(
                            "error",
                            "paged-context-fmha-off",
                            f"{role}: TensorRT-LLM would silently disable paged context FMHA ({reason}), and with it "
                            "the KV-cache reuse speculation depends on; build this model without FP8 or on SM >= 8.9",
                        )
    pf.ignore(tuple(ignore))
    plan.preflight = pf
    if cfg.engine is EngineKind.llmapi:
        plan.model_yamls = _llmapi_yamls(plan, pf.kv_fractions.get("target"))
    repo = plan.step("repository")
    repo.key_parts["placement"] = pf.placement
    repo.key_parts["kv_fractions"] = pf.kv_fractions
    plan.refresh()
    return plan


def _llmapi_yamls(plan: Plan, kv_fraction: float | None) -> dict[str, Any]:
    """The generated model.yaml per endpoint, or the reason it cannot be generated (a preflight error)."""
    try:
        docs = model_yamls(plan.cfg, draft_dir=plan.llmapi_draft_dir, version=plan.trtllm_version, kv_fraction=kv_fraction)
        # the installed TensorRT-LLM's own classes where it is importable; the recorded layouts otherwise
        installed = {validate_installed(doc) for doc in docs.values()} - {None}
    except (ModelYamlError, KeyError) as e:
        plan.preflight.add("error", "llmapi-model-yaml", str(e).strip("'\""))
        return {}
    how = f"the installed TensorRT-LLM {installed.pop()}'s own classes" if installed else "the recorded llm_args.py layout"
    plan.preflight.notes.append(f"model.yaml checked against {how}")
    # what a one-engine drafter's draft length of 0 became, and why (trtspec.llmapi.draft_floor)
    plan.preflight.notes += [f"draft length 0: {n}" for n in load_controls(plan.cfg, plan.trtllm_version).notes]
    return docs


def _tree_digest(root: Path) -> str | None:
    """Contents of the repository templates: editing them makes the repository step out of date."""
    root = root.resolve()
    if not root.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(f.relative_to(root)).encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def _fingerprint(p: Path) -> str | None:
    try:
        return checkpoint_fingerprint(p)
    except OSError:
        return None
