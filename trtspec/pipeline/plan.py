"""The build plan: pure functions from a build config (+ machine, checkpoints) to the list of steps.

    preflight -> convert-target -> convert-draft | quantize-draft -> build-target -> build-draft -> repository

Every external step carries its exact argv, its environment additions, its inputs and outputs, and a cache
key over what determines its result (their command lines: `trtspec.pipeline.argv`). ``engine: reference`` has no
engines: preflight -> repository.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trtspec import __version__
from trtspec.pipeline.argv import (
    FP8_CALIB_SIZE,
    LLAMA_SCRIPT_ARCHS,
    Tools,
    api_convert_argv,
    build_argv,
    convert_argv,
    medusa_convert_argv,
    quantize_argv,
)
from trtspec.pipeline.preflight import Finding, PreflightResult, plan_placement, run_preflight
from trtspec.checkpoint import CheckpointError, CheckpointInfo, checkpoint_fingerprint, inspect_checkpoint
from trtspec.config import MAX_DRAFT_LEN, BuildConfig, EngineKind, ModelConfig, checkpoint_path
from trtspec.llmapi.model_yaml import ModelYamlError, load_controls, validate_installed
from trtspec.llmapi.repository import model_yamls
from trtspec.machine import Machine
from trtspec.medusa import DEFAULT_CHOICES, MedusaError, inspect_heads

PLAN_FORMAT = 1
STATE_DIR = ".steps"
LOG_DIR = "logs"


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
            s.cache_key = _key({"format": PLAN_FORMAT, "name": s.name, "argv": s.argv, "env": s.env,
                                "parts": s.key_parts, "upstream": upstream})
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


def paged_context_fmha_blockers(m: ModelConfig, sm: int | None) -> list[str]:
    """Reasons TensorRT-LLM's builder would silently turn off paged context FMHA (and KV-cache reuse) for a
    model built by this plan (trtllm-spec.md §1.3). Our argv never disables context FMHA, never uses an INT8
    KV cache and always pairs an FP8 KV cache with FP8 weights, so only the GPU can trigger it."""
    reasons = []
    if m.quantization == "fp8" and sm is not None and sm < 89:
        reasons.append(f"FP8 KV cache on SM {sm / 10:.1f} < 8.9")
    return reasons


# ------------------------------------------------------------------------------------------------ plan


def _engine_roles(cfg: BuildConfig) -> tuple[str, ...]:
    """The roles with an engine of their own: method medusa puts the heads into the target's checkpoint and engine
    (no draft engine)."""
    return ("target",) if cfg.speculative.method == "medusa" else ("target", "draft")


def _inspect_checkpoints(cfg: BuildConfig) -> tuple[dict[str, Path], dict[str, CheckpointInfo | None], dict[str, str]]:
    """(checkpoint per role, what it holds or None, why it could not be read) for the roles the config has."""
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
    return checkpoints, infos, problems


@dataclass
class _StepInputs:
    """What every step is laid out from: the config, where its outputs go, the tools, the checkpoints, the GPUs."""

    cfg: BuildConfig
    output_dir: Path
    tools: Tools
    trtllm_version: str | None
    checkpoints: dict[str, Path]
    infos: dict[str, CheckpointInfo | None]
    fingerprints: dict[str, str | None]
    placement: dict[str, list[int]]

    def gpus(self, role: str) -> dict[str, str]:
        """The environment that gives a step the role's GPUs."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.placement[role])}


def _preflight_step(src: _StepInputs) -> Step:
    return Step(
        name="preflight",
        description="check the pair, the machine and the memory estimate; derive placement and KV fractions",
        kind="in-process",
        argv=[],
        env={},
        inputs=[str(p) for p in src.checkpoints.values()],
        outputs=[src.output_dir / "preflight.json"],
        always_run=True,
    )


def _conversion(src: _StepInputs, role: str, m: ModelConfig, out: Path) -> tuple[str, list[str], str, Path | None]:
    """(step name, argv, description, the script it runs) of the step that turns the role's Hugging Face checkpoint
    into a TensorRT-LLM one: FP8 quantization, Medusa's conversion with its heads, NVIDIA's Llama script, or
    TensorRT-LLM's Python API (no script: a module of trtspec)."""
    cfg, tools, ckpt, info = src.cfg, src.tools, src.checkpoints[role], src.infos.get(role)
    shape = f"{m.dtype}, tp {m.tp_size}, pp {m.pp_size}"
    if m.quantization == "fp8":
        return (f"quantize-{role}", quantize_argv(tools, ckpt, out, m),
                f"quantize the {role} to FP8 (weights + KV cache, ModelOpt PTQ, {FP8_CALIB_SIZE} calibration samples)",
                tools.quantize_script())
    if cfg.speculative.method == "medusa":
        heads = _medusa_heads(cfg, src.checkpoints["draft"])
        argv = medusa_convert_argv(tools, ckpt, src.checkpoints["draft"], out, m, heads, cfg.speculative.max_k)
        return (f"convert-{role}", argv, f"convert the target with its {heads} Medusa heads ({shape})",
                tools.medusa_convert_script())
    if info is None or info.architecture in LLAMA_SCRIPT_ARCHS or info.architecture is None:
        script = tools.convert_script(src.trtllm_version)
        return (f"convert-{role}", convert_argv(tools, script, ckpt, out, m),
                f"convert the {role} to a TensorRT-LLM checkpoint ({shape})", script)
    return (f"convert-{role}", api_convert_argv(tools, ckpt, out, m),
            f"convert the {role} ({info.architecture}) with TensorRT-LLM's Python API ({shape})", None)


def _checkpoint_step(src: _StepInputs, role: str, m: ModelConfig, software_checked: bool
                     ) -> tuple[Step, Finding | None]:
    """The role's conversion (or quantization) step, and an error where the script it runs is missing."""
    out = src.output_dir / "checkpoints" / role
    name, argv, description, script = _conversion(src, role, m, out)
    missing = None
    if script is not None and software_checked and not script.is_file():
        missing = Finding(
            "error",
            "converter-missing",
            f"{script} not found: {name} needs the examples/ directory of the TensorRT-LLM release "
            "you build with (NVIDIA's containers have it at /app/tensorrt_llm/examples or /app/examples; "
            "trtspec's Dockerfile fetches it when missing). Set TRTSPEC_TRTLLM_EXAMPLES to it, e.g. after "
            "`git clone --depth 1 --branch v<version> https://github.com/NVIDIA/TensorRT-LLM`.",
        )
    medusa = src.cfg.speculative.method == "medusa"
    step = Step(
        name=name,
        description=description,
        kind="process",
        argv=argv,
        env=src.gpus(role),
        inputs=[str(src.checkpoints[role])],
        outputs=[out],
        expect=["config.json", *[f"rank{r}.safetensors" for r in range(m.world_size)]],
        depends_on=["preflight"],
        key_parts={"checkpoint": src.fingerprints[role], "tensorrt_llm": src.trtllm_version,
                   **({"medusa_heads": src.fingerprints["draft"]} if medusa else {})},
        role=role,
    )
    return step, missing


def _build_step(src: _StepInputs, role: str, m: ModelConfig, checkpoint_step: str) -> Step:
    """trtllm-build of the role's engine from its converted checkpoint."""
    cfg = src.cfg
    ckpt = src.output_dir / "checkpoints" / role
    out = src.output_dir / "engines" / role
    if role == "target":
        mode = "medusa" if cfg.speculative.method == "medusa" else "draft_tokens_external"
        what = f"{mode}, {MAX_DRAFT_LEN} {cfg.speculative.max_k}"
    else:
        what = "gathers generation logits" if cfg.speculative.use_draft_logits else "plain engine"
    return Step(
        name=f"build-{role}",
        description=f"build the {role} engine ({what}, paged context FMHA for KV-cache reuse)",
        kind="process",
        argv=build_argv(src.tools, cfg, role, ckpt, out),  # type: ignore[arg-type]
        env=src.gpus(role),
        inputs=[str(ckpt)],
        outputs=[out],
        expect=["config.json", *[f"rank{r}.engine" for r in range(m.world_size)]],
        depends_on=[checkpoint_step],
        key_parts={"tensorrt_llm": src.trtllm_version},
        role=role,
    )


def _engine_steps(src: _StepInputs, software_checked: bool) -> tuple[list[Step], list[Finding]]:
    """engine: tensorrt_llm: each engine role's checkpoint step, then each one's engine build; and the errors of
    scripts that are missing."""
    roles = [(role, m) for role in _engine_roles(src.cfg) if (m := getattr(src.cfg, role)) is not None]
    converted = [_checkpoint_step(src, role, m, software_checked) for role, m in roles]
    builds = [_build_step(src, role, m, step.name) for (role, m), (step, _) in zip(roles, converted)]
    return [step for step, _ in converted] + builds, [f for _, f in converted if f is not None]


def _llmapi_quantize_step(src: _StepInputs) -> Step:
    """engine: llmapi with an FP8 draft: its FP8 export, a Hugging Face checkpoint the PyTorch backend loads."""
    draft = src.cfg.draft
    assert draft is not None
    out = src.output_dir / "checkpoints" / "draft"
    return Step(
        name="quantize-draft",
        description=f"quantize the draft to FP8 (ModelOpt PTQ, {FP8_CALIB_SIZE} calibration samples), "
        "exported as a Hugging Face checkpoint for the PyTorch backend",
        kind="process",
        argv=quantize_argv(src.tools, src.checkpoints["draft"], out, draft, export_format="hf"),
        env=src.gpus("draft"),
        inputs=[str(src.checkpoints["draft"])],
        outputs=[out],
        expect=["config.json"],
        depends_on=["preflight"],
        key_parts={"checkpoint": src.fingerprints["draft"], "tensorrt_llm": src.trtllm_version},
        role="draft",
    )


def _compile_kernels_step(src: _StepInputs) -> Step | None:
    """linear_kernels: compiled: the GEMM kernels of the roles that use them, compiled for this CPU; None where no
    role does."""
    cfg = src.cfg
    if not any(m is not None and m.linear_kernels == "compiled" for m in (cfg.target, cfg.draft)):
        return None
    # torch only where a role compiles its kernels
    from trtspec.reference_engine.compiled_linear import environment_key
    from trtspec.reference_engine.device import roles_to_compile

    compiled = [r for r in roles_to_compile(cfg) if r in src.checkpoints]
    if not compiled:
        return None
    return Step(
        name="compile-kernels",
        description=f"compile the {' and '.join(compiled)}'s GEMM kernels for this CPU (Inductor CPP template, "
        "AOTInductor; about 15 s per weight shape, shapes already in the kernel cache reused)",
        kind="process",
        argv=[sys.executable, "-m", "trtspec.reference_engine.compiled_linear", str(src.output_dir / "kernels"),
              *[str(src.checkpoints[r]) for r in compiled]],
        env={},
        inputs=[str(src.checkpoints[r]) for r in compiled],
        outputs=[src.output_dir / "kernels"],
        expect=["kernels.json"],
        depends_on=["preflight"],
        key_parts={"checkpoints": {r: src.fingerprints[r] for r in compiled}, "environment": environment_key()},
    )


def _repository_step(src: _StepInputs, before: list[Step]) -> Step:
    """The model repository, after the steps whose outputs it names (`before`: the steps laid out so far)."""
    cfg = src.cfg
    engines = [str(src.output_dir / "engines" / r) for r in src.checkpoints if cfg.engine is EngineKind.tensorrt_llm]
    depends_on = [s.name for s in before if s.name.startswith(("build-", "quantize-draft", "compile-kernels"))]
    return Step(
        name="repository",
        description="generate the Triton model repository (trtspec.repository.generate_repository, in-process)",
        kind="in-process",
        argv=[],
        env={},
        inputs=[str(p) for p in src.checkpoints.values()] + engines,
        outputs=[src.output_dir / "model_repository"],
        depends_on=depends_on or ["preflight"],
        key_parts={
            "config": cfg.model_dump(mode="json"),
            "checkpoints": src.fingerprints,
            "tensorrt_llm": src.trtllm_version,
            "trtspec": __version__,
            "templates": _tree_digest(Path(__file__).resolve().parent.parent / "model_repository"),
        },
    )


def _run_preflight(plan: Plan, machine: Machine, problems: dict[str, str], layout_findings: list[Finding],
                   ignore: tuple[str, ...] | list[str]) -> PreflightResult:
    """Preflight over the laid-out plan (an engine already built needs no memory to build it again), with the
    plan's own findings and the findings the user ignores dropped."""
    cfg, output_dir = plan.cfg, plan.output_dir
    engine_flow = cfg.engine is EngineKind.tensorrt_llm
    pending = {
        role: not (plan.step(f"build-{role}").up_to_date and (output_dir / "checkpoints" / role).exists())
        for role in plan.checkpoints
        if engine_flow and role in _engine_roles(cfg)
    }
    pf = run_preflight(
        cfg,
        machine,
        plan.infos,
        trtllm_version=plan.trtllm_version,
        output_dir=output_dir,
        pending_outputs=pending,
        checkpoint_problems=problems,
    )
    pf.findings.extend(layout_findings)
    if engine_flow:  # llmapi has no engine builder
        _check_paged_context_fmha(pf, cfg, machine)
    pf.ignore(tuple(ignore))
    return pf


def _check_paged_context_fmha(pf: PreflightResult, cfg: BuildConfig, machine: Machine) -> None:
    """An error for each engine the builder would build without paged context FMHA on the GPUs it is placed on."""
    for role, m in (("target", cfg.target), ("draft", cfg.draft)):
        if m is None or role not in _engine_roles(cfg):
            continue
        for g in pf.placement.get(role, []):
            gpu = machine.gpu(g)
            for reason in paged_context_fmha_blockers(m, gpu.sm if gpu else None):
                if "fp8-unsupported-gpu" not in pf.codes():
                    pf.add(
                        "error",
                        "paged-context-fmha-off",
                        f"{role}: TensorRT-LLM would silently disable paged context FMHA ({reason}), and with it "
                        "the KV-cache reuse speculation depends on; build this model without FP8 or on SM >= 8.9",
                    )


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
    checkpoints, infos, problems = _inspect_checkpoints(cfg)
    src = _StepInputs(cfg, output_dir, tools, trtllm_version, checkpoints, infos,
                      placement=plan_placement(cfg, len(machine.gpus)),
                      fingerprints={role: _fingerprint(p) for role, p in checkpoints.items()})

    steps = [_preflight_step(src)]
    layout_findings: list[Finding] = []
    if cfg.engine is EngineKind.tensorrt_llm:
        engine_steps, layout_findings = _engine_steps(src, machine.software_checked)
        steps += engine_steps
    if cfg.engine is EngineKind.llmapi and cfg.draft is not None and cfg.draft.quantization == "fp8":
        steps.append(_llmapi_quantize_step(src))
    if (kernels := _compile_kernels_step(src)) is not None:
        steps.append(kernels)
    steps.append(_repository_step(src, steps))

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
    plan.refresh()  # preflight asks which engines are built already
    plan.preflight = _run_preflight(plan, machine, problems, layout_findings, ignore)
    if cfg.engine is EngineKind.llmapi:
        plan.model_yamls = _llmapi_yamls(plan, plan.preflight.kv_fractions.get("target"))
    repo = plan.step("repository")
    repo.key_parts["placement"] = plan.preflight.placement
    repo.key_parts["kv_fractions"] = plan.preflight.kv_fractions
    plan.refresh()
    return plan


def _llmapi_yamls(plan: Plan, kv_fraction: float | None) -> dict[str, Any]:
    """The generated model.yaml per endpoint, or the reason it cannot be generated (a preflight error)."""
    try:
        docs = model_yamls(plan.cfg, draft_dir=plan.llmapi_draft_dir, version=plan.trtllm_version,
                           kv_fraction=kv_fraction)
        # the installed TensorRT-LLM's own classes where it is importable; the recorded layouts otherwise
        installed = {validate_installed(doc) for doc in docs.values()} - {None}
    except (ModelYamlError, KeyError) as e:
        plan.preflight.add("error", "llmapi-model-yaml", str(e).strip("'\""))
        return {}
    how = (f"the installed TensorRT-LLM {installed.pop()}'s own classes" if installed
           else "the recorded llm_args.py layout")
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
