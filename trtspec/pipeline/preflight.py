"""Preflight: everything that can be known to fail before hours of conversion and engine builds.

Each check yields a ``Finding`` whose message names the fix. The memory estimate also decides two things
the later steps use: where each model goes (``placement``, when the config leaves ``gpu_device_ids``
unset) and each model's ``kv_cache_free_gpu_mem_fraction`` (when the config leaves it unset), derived from
the estimate instead of NVIDIA's fixed 0.5.

How the KV fraction is derived. TensorRT-LLM gives a model ``fraction x free memory`` for its KV cache,
measured when *that* model initializes, and Triton loads models in no fixed order. On a GPU shared by
models i, let M be the usable memory (95 % of the total), own_i the weights + activations + runtime of model i, and
K = M - sum(own_i) the memory left for KV caches. Model i should get the share s_i of K proportional to
its KV bytes per token (so both models can hold the same number of tokens). In the worst case model i
initializes first, when the free memory is M - own_i, hence ``f_i = s_i * K * 0.95 / (M - own_i)``. Loading
later, it sees less free memory and takes less, so no order over-commits the GPU. A model alone on its GPUs
gets TensorRT-LLM's default 0.9, except a draft: every sequence it caches is also in the target's cache, so
its fraction is cut to hold 1.25x the target's token capacity rather than 90 % of a whole GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from trtspec.checkpoint import (
    DTYPE_BYTES,
    CheckpointInfo,
    check_eagle3_head,
    check_medusa_heads,
    check_mtp_target,
    check_pair,
    format_bytes,
    format_params,
)
from trtspec.config import BuildConfig, EngineKind, ModelConfig, plan_max_num_tokens
from trtspec.contract.nvidia import ENGINE_FLOW_RANGE
from trtspec.machine import Machine, disk_free
from trtspec.spec.methods import in_engine

Level = Literal["error", "warning"]

FP8_MIN_SM = 89  # Ada (8.9) and Hopper (9.0) have FP8 tensor cores
USABLE_MEMORY = 0.95  # of the total memory a GPU reports
RUNTIME_OVERHEAD = 1 << 30  # CUDA context, cuBLAS workspace, TensorRT-LLM runtime buffers, per model per GPU
KV_HEADROOM = 0.95
KV_FRACTION_MAX = 0.9  # TensorRT-LLM's own default when a model is alone on its GPUs
KV_FRACTION_MIN = 0.05
LOGITS_BYTES = 4  # logits are gathered as float32 (--logits_dtype float32)


@dataclass(frozen=True)
class Finding:
    level: Level
    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"level": self.level, "code": self.code, "message": self.message}


@dataclass
class ModelEstimate:
    role: str
    gpus: list[int]
    weights: int  # bytes per GPU
    activations: int  # bytes per GPU
    runtime: int  # bytes per GPU
    kv_per_token: int  # bytes per token per GPU
    min_kv: int  # bytes per GPU for the minimal KV cache
    min_kv_sequences: int
    total_weights: int  # bytes over all ranks (≈ checkpoint size ≈ engine size)

    @property
    def own(self) -> int:
        return self.weights + self.activations + self.runtime


@dataclass
class GpuMemory:
    index: int
    name: str
    usable: int
    models: list[str]
    own: int  # weights + activations + runtime of every model on it
    min_kv: int
    kv_room: int  # usable - own

    @property
    def fits(self) -> bool:
        return self.kv_room >= self.min_kv


@dataclass
class PreflightResult:
    findings: list[Finding] = field(default_factory=list)
    placement: dict[str, list[int]] = field(default_factory=dict)
    kv_fractions: dict[str, float] = field(default_factory=dict)
    kv_derived: dict[str, bool] = field(default_factory=dict)
    estimates: dict[str, ModelEstimate] = field(default_factory=dict)
    memory: list[GpuMemory] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def add(self, level: Level, code: str, message: str) -> None:
        self.findings.append(Finding(level, code, message))

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def ignore(self, codes: list[str] | tuple[str, ...]) -> None:
        """Downgrade the listed error codes to warnings (--ignore-preflight)."""
        wanted = set(codes)
        self.findings = [
            Finding("warning", f.code, f"(ignored with --ignore-preflight) {f.message}")
            if f.level == "error" and f.code in wanted
            else f
            for f in self.findings
        ]

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
            "placement": self.placement,
            "kv_cache_free_gpu_mem_fraction": self.kv_fractions,
            "kv_fraction_derived": self.kv_derived,
            "memory": [
                {
                    "gpu": g.index,
                    "name": g.name,
                    "usable_bytes": g.usable,
                    "models": g.models,
                    "weights_activations_runtime_bytes": g.own,
                    "min_kv_bytes": g.min_kv,
                    "kv_room_bytes": g.kv_room,
                }
                for g in self.memory
            ],
            "notes": self.notes,
        }


def version_tuple(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", v)
    if not m:
        return None
    return tuple(int(x) for x in m.groups() if x is not None)


def _roles(cfg: BuildConfig) -> list[tuple[str, ModelConfig]]:
    out = [("target", cfg.target)]
    if cfg.draft is not None:
        out.append(("draft", cfg.draft))
    return out


# ------------------------------------------------------------------------------------------- placement


def plan_placement(cfg: BuildConfig, n_gpus: int) -> dict[str, list[int]]:
    """GPU ids per model: the config's gpu_device_ids, else target on 0..T-1 and the draft on the next
    free GPUs when there are enough, otherwise sharing the target's first GPU(s)."""
    t = cfg.target
    placement = {"target": list(t.gpu_device_ids) if t.gpu_device_ids is not None else list(range(t.world_size))}
    d = cfg.draft
    if d is not None and (cfg.engine is EngineKind.llmapi or in_engine(cfg.speculative.method)):
        # DraftTarget: the draft runs inside the target's LLM; Medusa: its heads are part of the target's engine
        placement["draft"] = placement["target"][:1]
    elif d is not None:
        if d.gpu_device_ids is not None:
            placement["draft"] = list(d.gpu_device_ids)
        else:
            free = [g for g in range(n_gpus) if g not in placement["target"]]
            if len(free) >= d.world_size:
                placement["draft"] = free[: d.world_size]
            elif d.world_size <= len(placement["target"]):
                placement["draft"] = placement["target"][: d.world_size]
            else:
                placement["draft"] = list(range(d.world_size))
    return placement


# -------------------------------------------------------------------------------------------- estimate


def estimate_model(
    role: str, m: ModelConfig, info: CheckpointInfo, cfg: BuildConfig, gpus: list[int]
) -> ModelEstimate | None:
    if info.num_params is None or not info.hidden_size:
        return None
    tp, pp = m.tp_size, m.pp_size
    dbytes = DTYPE_BYTES[m.dtype]
    fp8 = m.quantization == "fp8"
    wbytes = 1 if fp8 else dbytes
    embed = info.embedding_params
    layers = max(0, info.num_params - embed - (0 if info.tie_word_embeddings else embed) - info.hidden_size)
    # Decoder layers split over all ranks; the embedding is replicated on every rank (conversion without
    # --use_parallel_embedding); the LM head (a tied one is materialized) is split over tp and stays in dtype.
    weights = layers * wbytes // (tp * pp) + embed * dbytes + (embed * dbytes) // tp
    total_weights = layers * wbytes + (embed * dbytes) * m.world_size + embed * dbytes

    K = cfg.speculative.max_draft_len
    L = cfg.limits
    max_num_tokens = plan_max_num_tokens(cfg)
    inter = info.intermediate_size or 4 * info.hidden_size
    heads = info.num_attention_heads or 1
    kvh = info.num_kv_heads or heads
    head_dim = info.head_dim or info.hidden_size // heads
    # Live activation buffers per batched token (hidden states, fused QKV, attention out, gate+up, down),
    # in 16-bit: deliberately on the high side, TensorRT reuses activation memory between layers.
    per_token_act = 4 * info.hidden_size + (3 * inter + 2 * (heads + 2 * kvh) * head_dim) // tp
    logits_rows = L.max_batch_size * (K + 1)
    activations = max_num_tokens * per_token_act * 2 + logits_rows * ((info.vocab_size or 0) // tp) * LOGITS_BYTES

    kv_dtype_bytes = 1 if fp8 else dbytes  # FP8 models get an FP8 KV cache (--kv_cache_dtype fp8)
    kv_tok = info.kv_bytes_per_token(kv_dtype_bytes, tp, pp) or 0
    seqs = min(L.max_batch_size, 4)
    min_kv = kv_tok * (L.max_seq_len + K) * seqs
    return ModelEstimate(role, gpus, weights, activations, RUNTIME_OVERHEAD, kv_tok, min_kv, seqs, total_weights)


# ---------------------------------------------------------------------------------------------- checks


def run_preflight(
    cfg: BuildConfig,
    machine: Machine,
    infos: dict[str, CheckpointInfo | None],
    *,
    trtllm_version: str | None = None,
    output_dir: Path | None = None,
    pending_outputs: dict[str, bool] | None = None,
    checkpoint_problems: dict[str, str] | None = None,
) -> PreflightResult:
    """All checks for building `cfg` on `machine`. `infos` holds the inspected checkpoints (None when they
    could not be read, explained in `checkpoint_problems`). `pending_outputs` says which models still need
    their checkpoint + engine written (for the disk check)."""
    r = PreflightResult()
    # llmapi on GPUs gets the engine flow's GPU checks; on CPU it runs trtspec's stand-in, like the reference engine
    llmapi_gpu = cfg.engine is EngineKind.llmapi and (cfg.device == "cuda" or (cfg.device == "auto" and bool(machine.gpus)))
    trt = cfg.engine is EngineKind.tensorrt_llm or llmapi_gpu

    for role, problem in (checkpoint_problems or {}).items():
        r.add(
            "error",
            "checkpoint-missing",
            f"{role}.checkpoint: {problem} (fix {role}.checkpoint, or run the build where the checkpoint is; "
            "the memory estimate needs its config.json)",
        )

    _check_pair(cfg, infos, r)
    _check_speculative(cfg, infos, r)

    if not trt:
        if cfg.device == "cuda" and not machine.gpus:
            r.add(
                "error",
                "no-gpu",
                f"device: cuda but no NVIDIA GPU is visible ({machine.nvml_error or 'no GPUs'}); "
                "set device: cpu (or auto) to run the reference engine on CPU",
            )
        return r

    if cfg.engine is EngineKind.tensorrt_llm:
        _check_software(cfg, machine, trtllm_version, r)
    elif cfg.engine is EngineKind.llmapi and machine.software_checked:
        _check_llmapi_software(cfg, machine, r)
    n = len(machine.gpus)
    r.placement = plan_placement(cfg, n)
    if not machine.gpus:
        r.add(
            "error",
            "no-gpu",
            f"engine: tensorrt_llm needs NVIDIA GPUs and this machine has none ({machine.nvml_error or 'no GPUs'}). "
            "Build on a GPU machine (NVIDIA's tritonserver *-trtllm-python-py3 container), use engine: reference "
            "to run on CPU, or plan for another machine with --dry-run --gpus h100x1",
        )
    else:
        _check_gpu_counts(cfg, machine, r)
        _check_fp8(cfg, machine, r)
    _check_memory(cfg, machine, infos, r)
    _check_disk(cfg, machine, output_dir, pending_outputs or {}, r)
    return r


def _check_pair(cfg: BuildConfig, infos: dict[str, CheckpointInfo | None], r: PreflightResult) -> None:
    """The drafter against its target, by method: a draft model's vocabulary and size, an EAGLE-3 head's shapes
    and vocabulary map, a target's own MTP layers."""
    t, d = infos.get("target"), infos.get("draft")
    method = cfg.speculative.method
    if t is None:
        return
    if method == "mtp":
        from trtspec.llmapi.fields import mtp_model_types

        findings = check_mtp_target(t, mtp_model_types())
    elif d is None:
        return
    elif method == "eagle3":
        findings = check_eagle3_head(t, d)
    elif method == "medusa":
        findings = check_medusa_heads(t, d, cfg.speculative.medusa_choices, cfg.engine.value)
    else:
        findings = check_pair(t, d, use_draft_logits=cfg.speculative.use_draft_logits).findings
    for level, code, message in findings:
        r.add(level, code, message)  # type: ignore[arg-type]


def _check_speculative(cfg: BuildConfig, infos: dict[str, CheckpointInfo | None], r: PreflightResult) -> None:
    s, L = cfg.speculative, cfg.limits
    if s.num_draft_tokens > s.max_draft_len:
        r.add(
            "error",
            "draft-len",
            f"speculative.num_draft_tokens ({s.num_draft_tokens}) > speculative.max_draft_len ({s.max_draft_len}): "
            "the target engine verifies at most max_draft_len draft tokens per step and TensorRT-LLM asserts "
            "'Number of draft tokens is larger than maximum number of draft tokens'. Lower num_draft_tokens or "
            "raise max_draft_len (the target engine is then rebuilt).",
        )
    gap = L.max_seq_len - L.max_input_len
    if cfg.draft is not None and gap < s.max_draft_len + 1:
        r.add(
            "warning",
            "seq-len-gap",
            f"limits.max_seq_len - limits.max_input_len = {gap} < max_draft_len + 1 = {s.max_draft_len + 1}: the "
            "speculative loop resends prompt + generated tokens as the input every step (so prompt + max_tokens "
            f"must fit max_input_len = {L.max_input_len}), and each step then asks for up to max_draft_len + 1 more "
            f"tokens; set limits.max_seq_len >= {L.max_input_len + s.max_draft_len + 1}.",
        )
    for role, info in infos.items():
        if info is not None and info.max_position_embeddings and L.max_seq_len > info.max_position_embeddings:
            r.add(
                "warning",
                "seq-beyond-positions",
                f"limits.max_seq_len {L.max_seq_len} exceeds the {role}'s max_position_embeddings "
                f"{info.max_position_embeddings}: quality degrades past the trained context; lower limits.max_seq_len.",
            )


def _check_software(cfg: BuildConfig, machine: Machine, trtllm_version: str | None, r: PreflightResult) -> None:
    installed = machine.tensorrt_llm_version
    if machine.software_checked:
        if not machine.trtllm_build.available:
            r.add(
                "error",
                "trtllm-build-missing",
                f"trtllm-build not found ({machine.trtllm_build.note or 'not on PATH'}). Run the build inside "
                f"nvcr.io/nvidia/tritonserver:{ENGINE_FLOW_RANGE.last_container}-trtllm-python-py3 or older "
                f"(TensorRT-LLM {ENGINE_FLOW_RANGE.label}; see docs/deploy-gpu.md), point TRTSPEC_TRTLLM_BUILD at it, "
                "or use engine: llmapi (no engine build).",
            )
        if installed is None:
            r.add(
                "error",
                "tensorrt-llm-missing",
                "the tensorrt_llm Python package is not installed (checkpoint conversion and FP8 quantization use "
                "it). Use NVIDIA's *-trtllm-python-py3 container, where it is preinstalled.",
            )
        pinned = cfg.tensorrt_llm_version
        if installed and pinned:
            want, have = version_tuple(pinned), version_tuple(installed)
            if want and have and have[: len(want)] != want:
                r.add(
                    "error",
                    "trtllm-version-mismatch",
                    f"tensorrt_llm_version: {pinned} in the config but TensorRT-LLM {installed} is installed: engines "
                    "only load in the TensorRT-LLM/TensorRT version that built them ('TensorRT version is not "
                    "compatible'). Build in the container you will serve from, or change tensorrt_llm_version.",
                )
    else:
        r.notes.append(
            "software checks skipped (planning for another machine with --gpus): trtllm-build, tensorrt_llm and "
            "disk space are checked when the build runs there"
        )
    v = version_tuple(trtllm_version)
    if v is not None:
        flow = ENGINE_FLOW_RANGE
        if v[:2] < version_tuple(flow.first)[:2]:
            r.add(
                "error",
                "trtllm-version-unsupported",
                f"TensorRT-LLM {trtllm_version} is older than {flow.first}, the oldest release trtspec supports "
                "(flags, plugin defaults and the Triton templates differ). Use tritonserver 25.01 (0.17) or newer, "
                f"up to {flow.last_container} ({flow.last}).",
            )
        elif v[:2] > version_tuple(flow.last)[:2]:
            r.add(
                "error",
                "trtllm-version-unsupported",
                f"TensorRT-LLM {trtllm_version} is newer than {flow.last}: the TensorRT engine backend and "
                f"trtllm-build were removed in {flow.removed_in} (PyTorch is the only backend). Use "
                f"nvcr.io/nvidia/tritonserver:{flow.last_container}-trtllm-python-py3 (TensorRT-LLM {flow.last}), "
                "or serve this version with engine: llmapi (its PyTorch backend, no engine build).",
            )
    elif trtllm_version is None:
        r.notes.append("TensorRT-LLM version unknown: assuming a 1.x layout (set tensorrt_llm_version to pin it)")


def _check_llmapi_software(cfg: BuildConfig, machine: Machine, r: PreflightResult) -> None:
    from trtspec.llmapi.fields import supported_versions, version_fields

    installed = machine.tensorrt_llm_version
    pinned = cfg.tensorrt_llm_version
    if installed and pinned and _layout(pinned) != _layout(installed):
        r.add(
            "error",
            "trtllm-version-mismatch",
            f"tensorrt_llm_version: {pinned} in the config but TensorRT-LLM {installed} is installed: model.yaml is "
            f"spelled for {pinned}'s llm_args.py, which parses speculative_config differently (docs/llmapi-versions.md). "
            f"Set tensorrt_llm_version: \"{installed}\" or use a container with {pinned}.",
        )
    if installed is None:
        r.add(
            "error",
            "tensorrt-llm-missing",
            "engine: llmapi on GPUs needs the tensorrt_llm package (NVIDIA's current *-trtllm-python-py3 container "
            "has it); without it only device: cpu runs (trtspec's CPU stand-in of the LLM API)",
        )
        return
    try:
        version_fields(installed)
    except KeyError:
        r.add(
            "error",
            "trtllm-version-unsupported",
            f"TensorRT-LLM {installed} is installed; engine: llmapi is validated against TensorRT-LLM "
            f"{', '.join(supported_versions())} (its LLM() and speculative_config fields): use a container with "
            + ("that version" if not ENGINE_FLOW_RANGE.contains(installed) else "that version, or engine: tensorrt_llm (this version has the engine flow)"),
        )


def _layout(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _check_gpu_counts(cfg: BuildConfig, machine: Machine, r: PreflightResult) -> None:
    n = len(machine.gpus)
    for role, m in _roles(cfg):
        if m.world_size > n:
            r.add(
                "error",
                "not-enough-gpus",
                f"{role} needs tp_size x pp_size = {m.tp_size} x {m.pp_size} = {m.world_size} GPUs but this machine has "
                f"{n} ({machine.describe_gpus()}): lower {role}.tp_size/pp_size, or build on a machine with at least "
                f"{m.world_size} GPUs (plan for one with --gpus)",
            )
        if m.gpu_device_ids is not None:
            missing = [g for g in m.gpu_device_ids if g >= n]
            if missing:
                r.add(
                    "error",
                    "gpu-missing",
                    f"{role}.gpu_device_ids lists GPU(s) {missing} but this machine has {n} GPU(s) "
                    f"(ids 0..{n - 1}): list existing GPUs or leave gpu_device_ids out to let trtspec place the model",
                )


def _check_fp8(cfg: BuildConfig, machine: Machine, r: PreflightResult) -> None:
    for role, m in _roles(cfg):
        gpus = [machine.gpu(i) for i in r.placement.get(role, [])]
        gpus = [g for g in gpus if g is not None]
        if m.quantization == "fp8":
            old = [g for g in gpus if g.sm < FP8_MIN_SM]
            if old:
                g = old[0]
                r.add(
                    "error",
                    "fp8-unsupported-gpu",
                    f"{role}.quantization: fp8 needs compute capability >= 8.9 (FP8 tensor cores: Ada, Hopper, "
                    f"Blackwell), but GPU {g.index} ({g.name}) is SM {g.cc}. There TensorRT-LLM writes an FP8 "
                    "checkpoint without FP8 acceleration, turns off FP8 context FMHA, and with the FP8 KV cache also "
                    "paged context FMHA, which disables KV-cache reuse (speculation then stops paying off). Use a bf16 "
                    f"{role} ({role}.quantization: none, {role}.dtype: bfloat16) or build on an H100/H200/L40S.",
                )
        if any(g.sm >= 100 for g in gpus):
            r.add(
                "warning",
                "blackwell-engine-path",
                f"{role} runs on a Blackwell GPU (SM >= 10.0): the TensorRT engine path is legacy there and NVIDIA "
                "steers users to the PyTorch backend (TRTLLM#6158); expect fewer optimized kernels.",
            )


def _check_memory(
    cfg: BuildConfig, machine: Machine, infos: dict[str, CheckpointInfo | None], r: PreflightResult
) -> None:
    for role, m in _roles(cfg):
        info = infos.get(role)
        if info is None:
            continue
        est = estimate_model(role, m, info, cfg, r.placement.get(role, []))
        if est is None:
            r.notes.append(f"{role}: memory estimate skipped (parameter count unknown)")
            continue
        r.estimates[role] = est

    by_gpu: dict[int, list[str]] = {}
    for role, est in r.estimates.items():
        for g in est.gpus:
            by_gpu.setdefault(g, []).append(role)

    fractions: dict[str, list[float]] = {}
    for gi in sorted(by_gpu):
        gpu = machine.gpu(gi)
        if gpu is None:
            continue
        roles = by_gpu[gi]
        # The engines run later, when serving: plan against the GPU's total memory (so the derived fractions
        # do not drift with whatever runs right now) and warn when something occupies it at the moment.
        usable = int(gpu.memory_total * USABLE_MEMORY)
        if not machine.synthetic and gpu.memory_free < 0.9 * gpu.memory_total:
            r.add(
                "warning",
                "gpu-busy",
                f"GPU {gi} ({gpu.name}) has {format_bytes(gpu.memory_free)} free of {format_bytes(gpu.memory_total)}: "
                "other processes use it now (a running server?). The estimate assumes the GPU is free when serving; "
                "engine builds need memory too, so stop them first if a build step runs out of memory.",
            )
        own = sum(r.estimates[x].own for x in roles)
        min_kv = sum(r.estimates[x].min_kv for x in roles)
        gm = GpuMemory(gi, gpu.name, usable, roles, own, min_kv, usable - own)
        r.memory.append(gm)
        if not gm.fits:
            parts = ", ".join(
                f"{x} weights {format_bytes(r.estimates[x].weights)} + runtime "
                f"{format_bytes(r.estimates[x].activations + r.estimates[x].runtime)} + minimal KV "
                f"{format_bytes(r.estimates[x].min_kv)} ({r.estimates[x].min_kv_sequences} x "
                f"{cfg.limits.max_seq_len} tokens)"
                for x in roles
            )
            fixes = []
            if "target" in roles:
                fixes.append("raise target.tp_size to spread the target's weights over more GPUs")
            if len(roles) > 1:
                fixes.append("place the draft on another GPU (draft.gpu_device_ids)")
            if "draft" in roles and cfg.draft is not None and cfg.draft.quantization != "fp8":
                fixes.append("quantize the draft (draft.quantization: fp8, on SM >= 8.9)")
            fixes.append("lower limits.max_seq_len / limits.max_batch_size")
            r.add(
                "error",
                "gpu-memory",
                f"GPU {gi} ({gpu.name}) needs about {format_bytes(own + min_kv)} ({parts}) but has "
                f"{format_bytes(usable)} usable: " + "; or ".join(fixes),
            )
            continue
        total_tok = sum(r.estimates[x].kv_per_token for x in roles) or 1
        for x in roles:
            est = r.estimates[x]
            share = est.kv_per_token / total_tok
            f = share * gm.kv_room * KV_HEADROOM / max(1, usable - est.own)
            fractions.setdefault(x, []).append(f)

    L = cfg.limits
    for role, m in _roles(cfg):
        if m.kv_cache_free_gpu_mem_fraction is not None:
            r.kv_fractions[role] = m.kv_cache_free_gpu_mem_fraction
            r.kv_derived[role] = False
        elif role in fractions:
            f = min(fractions[role])
            r.kv_fractions[role] = max(KV_FRACTION_MIN, min(KV_FRACTION_MAX, math.floor(f * 100) / 100))
            r.kv_derived[role] = True

    _cap_draft_kv(cfg, r)

    # What the fractions buy: full-length sequences each model can hold, and over-commit by hand-set fractions.
    for gm in r.memory:
        gpu = machine.gpu(gm.index)
        assert gpu is not None
        worst = 0
        for x in gm.models:
            est = r.estimates[x]
            f = r.kv_fractions.get(x)
            if f is None:
                continue
            kv = f * max(0, gm.usable - est.own)
            worst += kv
            seq_bytes = est.kv_per_token * (L.max_seq_len + cfg.speculative.max_draft_len)
            if seq_bytes and kv / seq_bytes < L.max_batch_size:
                held = int(kv // seq_bytes)
                r.add(
                    "warning",
                    "kv-capacity",
                    f"GPU {gm.index}: the {x}'s KV cache (~{format_bytes(kv)} at fraction {f}) holds about {held} "
                    f"full-length sequences ({L.max_seq_len} tokens) < limits.max_batch_size {L.max_batch_size}: "
                    "long requests will queue. Lower max_batch_size or max_seq_len, or give the model more GPUs.",
                )
        if len(gm.models) > 1 and worst > gm.kv_room and not all(r.kv_derived.get(x, False) for x in gm.models):
            r.add(
                "warning",
                "kv-overcommit",
                f"GPU {gm.index} is shared by {' and '.join(gm.models)} and their kv_cache_free_gpu_mem_fraction "
                f"values ({', '.join(str(r.kv_fractions.get(x)) for x in gm.models)}) can claim "
                f"{format_bytes(worst)} of KV cache when one model loads first, more than the "
                f"{format_bytes(gm.kv_room)} left after both engines: the second model may fail to load. Leave the "
                "fractions unset and trtspec derives safe ones.",
            )


DRAFT_KV_MARGIN = 1.25  # the draft holds the same sequences as the target (+ K tokens): a little more is plenty


def _kv_tokens(r: PreflightResult, role: str, fraction: float) -> float | None:
    """Tokens a model's KV cache holds at `fraction` (its tightest GPU)."""
    est = r.estimates.get(role)
    if est is None or not est.kv_per_token:
        return None
    caps = [fraction * max(0, g.usable - est.own) / est.kv_per_token for g in r.memory if g.index in est.gpus]
    return min(caps) if caps else None


def _cap_draft_kv(cfg: BuildConfig, r: PreflightResult) -> None:
    """A draft on its own GPU would take 90 % of it for KV blocks it can never fill: every sequence in the
    draft's cache is also in the target's. Derive the draft's fraction from the target's capacity instead."""
    if not (r.kv_derived.get("draft") and "target" in r.kv_fractions and "draft" in r.kv_fractions):
        return
    target_tokens = _kv_tokens(r, "target", r.kv_fractions["target"])
    draft_tokens = _kv_tokens(r, "draft", r.kv_fractions["draft"])
    if not target_tokens or not draft_tokens or draft_tokens <= target_tokens * DRAFT_KV_MARGIN:
        return
    scale = target_tokens * DRAFT_KV_MARGIN / draft_tokens
    capped = math.ceil(r.kv_fractions["draft"] * scale * 100) / 100
    r.kv_fractions["draft"] = max(KV_FRACTION_MIN, min(r.kv_fractions["draft"], capped))


def _check_disk(
    cfg: BuildConfig, machine: Machine, output_dir: Path | None, pending: dict[str, bool], r: PreflightResult
) -> None:
    if output_dir is None or not machine.software_checked:
        return
    need = 0
    for role, est in r.estimates.items():
        if pending.get(role, True):
            need += 2 * est.total_weights  # the TensorRT-LLM checkpoint and the engine, each about the weights
    if not need:
        return
    need = int(need * 1.05)
    free = disk_free(output_dir)
    if free is not None and free < need:
        r.add(
            "error",
            "disk-space",
            f"the checkpoints and engines need about {format_bytes(need)} under {output_dir} but only "
            f"{format_bytes(free)} is free there: free space or pass --output on a larger disk",
        )


def describe_estimates(r: PreflightResult) -> list[str]:
    """Human lines for the memory table (doctor, dry-run)."""
    lines = []
    for gm in r.memory:
        models = ", ".join(
            f"{x} {format_bytes(r.estimates[x].weights)} weights + {format_bytes(r.estimates[x].activations + r.estimates[x].runtime)} runtime"
            for x in gm.models
        )
        lines.append(
            f"GPU {gm.index} {gm.name}: {format_bytes(gm.usable)} usable; {models}; "
            f"{format_bytes(gm.kv_room)} left for KV (minimum {format_bytes(gm.min_kv)})"
        )
    return lines


__all__ = [
    "Finding",
    "GpuMemory",
    "ModelEstimate",
    "PreflightResult",
    "estimate_model",
    "format_params",
    "plan_max_num_tokens",
    "plan_placement",
    "run_preflight",
    "version_tuple",
]
