"""Preflight: everything that can be known to fail before hours of conversion and engine builds.

Each check yields a ``Finding`` whose message names the fix. The memory estimate also decides two things
the later steps use: where each model goes (``placement``, when the config leaves ``gpu_device_ids``
unset) and each model's ``kv_cache_free_gpu_mem_fraction`` (when the config leaves it unset), derived from
the estimate instead of NVIDIA's fixed 0.5 (`trtspec.pipeline.memory`).
"""

from __future__ import annotations

import re
from pathlib import Path

from trtspec.checkpoint import (
    CheckpointInfo,
    check_eagle3_head,
    check_medusa_heads,
    check_mtp_target,
    check_pair,
    format_bytes,
    format_params,
)
from trtspec.config import MAX_DRAFT_LEN, BuildConfig, EngineKind, plan_max_num_tokens
from trtspec.contract import NUM_DRAFT_TOKENS
from trtspec.contract.nvidia import ENGINE_FLOW_RANGE
from trtspec.machine import Machine, disk_free
from trtspec.pipeline.memory import check_memory, models_of
from trtspec.pipeline.result import Finding, PreflightResult
from trtspec.spec.methods import in_engine

FP8_MIN_SM = 89  # Ada (8.9) and Hopper (9.0) have FP8 tensor cores


def version_tuple(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", v)
    if not m:
        return None
    return tuple(int(x) for x in m.groups() if x is not None)


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
    on_gpu = cfg.device == "cuda" or (cfg.device == "auto" and bool(machine.gpus))
    llmapi_gpu = cfg.engine is EngineKind.llmapi and on_gpu
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
    check_memory(cfg, machine, infos, r)
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
    if s.default_k > s.max_k:
        r.add(
            "error",
            "draft-len",
            f"speculative.{NUM_DRAFT_TOKENS} ({s.default_k}) > speculative.{MAX_DRAFT_LEN} ({s.max_k}): "
            f"the target engine verifies at most {MAX_DRAFT_LEN} draft tokens per step and TensorRT-LLM asserts "
            f"'Number of draft tokens is larger than maximum number of draft tokens'. Lower {NUM_DRAFT_TOKENS} or "
            f"raise {MAX_DRAFT_LEN} (the target engine is then rebuilt).",
        )
    gap = L.max_seq_len - L.max_input_len
    if cfg.draft is not None and gap < s.max_k + 1:
        r.add(
            "warning",
            "seq-len-gap",
            f"limits.max_seq_len - limits.max_input_len = {gap} < {MAX_DRAFT_LEN} + 1 = {s.max_k + 1}: the "
            "speculative loop resends prompt + generated tokens as the input every step (so prompt + max_tokens "
            f"must fit max_input_len = {L.max_input_len}), and each step then asks for up to {MAX_DRAFT_LEN} + 1 more "
            f"tokens; set limits.max_seq_len >= {L.max_input_len + s.max_k + 1}.",
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
            f"spelled for {pinned}'s llm_args.py, which parses speculative_config differently "
            "(docs/llmapi-versions.md). "
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
            + ("that version" if not ENGINE_FLOW_RANGE.contains(installed)
               else "that version, or engine: tensorrt_llm (this version has the engine flow)"),
        )


def _layout(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _check_gpu_counts(cfg: BuildConfig, machine: Machine, r: PreflightResult) -> None:
    n = len(machine.gpus)
    for role, m in models_of(cfg):
        if m.world_size > n:
            r.add(
                "error",
                "not-enough-gpus",
                f"{role} needs tp_size x pp_size = {m.tp_size} x {m.pp_size} = {m.world_size} GPUs but this machine "
                f"has {n} ({machine.describe_gpus()}): lower {role}.tp_size/pp_size, or build on a machine with at "
                f"least {m.world_size} GPUs (plan for one with --gpus)",
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
    for role, m in models_of(cfg):
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


__all__ = [
    "Finding",
    "PreflightResult",
    "format_params",
    "plan_max_num_tokens",
    "plan_placement",
    "run_preflight",
    "version_tuple",
]
