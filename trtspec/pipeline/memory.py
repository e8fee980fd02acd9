"""The memory estimate: what each model needs on each of its GPUs (weights, activations, runtime, KV cache per
token), whether the models placed on a GPU fit there, and the KV-cache fractions derived from it.

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
from collections.abc import Sequence

from trtspec.checkpoint import DTYPE_BYTES, CheckpointInfo, format_bytes
from trtspec.config import BuildConfig, ModelConfig, plan_max_num_tokens
from trtspec.machine import GPU, Machine
from trtspec.pipeline.result import GpuMemory, ModelEstimate, PreflightResult

USABLE_MEMORY = 0.95  # of the total memory a GPU reports
RUNTIME_OVERHEAD = 1 << 30  # CUDA context, cuBLAS workspace, TensorRT-LLM runtime buffers, per model per GPU
KV_HEADROOM = 0.95
KV_FRACTION_MAX = 0.9  # TensorRT-LLM's own default when a model is alone on its GPUs
KV_FRACTION_MIN = 0.05
LOGITS_BYTES = 4  # logits are gathered as float32 (--logits_dtype float32)
DRAFT_KV_MARGIN = 1.25  # the draft holds the same sequences as the target (+ K tokens): a little more is plenty


def models_of(cfg: BuildConfig) -> list[tuple[str, ModelConfig]]:
    """The config's models by role: the target, and the draft where it has one."""
    out = [("target", cfg.target)]
    if cfg.draft is not None:
        out.append(("draft", cfg.draft))
    return out


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

    K = cfg.speculative.max_k
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


def check_memory(cfg: BuildConfig, machine: Machine, infos: dict[str, CheckpointInfo | None], r: PreflightResult
                 ) -> None:
    """Estimates each model, checks that the models placed on each GPU fit there, derives the KV fractions the
    config leaves unset, and warns where the fractions hold fewer sequences than the limits ask for."""
    _estimate_models(cfg, infos, r)
    by_gpu: dict[int, list[str]] = {}
    for role, est in r.estimates.items():
        for g in est.gpus:
            by_gpu.setdefault(g, []).append(role)
    fractions: dict[str, list[float]] = {}
    for gi in sorted(by_gpu):
        gpu = machine.gpu(gi)
        if gpu is None:
            continue
        for role, f in _fit_on_gpu(cfg, machine, gpu, gi, by_gpu[gi], r).items():
            fractions.setdefault(role, []).append(f)
    _set_kv_fractions(cfg, fractions, r)
    _cap_draft_kv(cfg, r)
    for gm in r.memory:
        _check_kv_capacity(cfg, gm, r)


def _estimate_models(cfg: BuildConfig, infos: dict[str, CheckpointInfo | None], r: PreflightResult) -> None:
    for role, m in models_of(cfg):
        info = infos.get(role)
        if info is None:
            continue
        est = estimate_model(role, m, info, cfg, r.placement.get(role, []))
        if est is None:
            r.notes.append(f"{role}: memory estimate skipped (parameter count unknown)")
            continue
        r.estimates[role] = est


def _fit_on_gpu(cfg: BuildConfig, machine: Machine, gpu: GPU, gi: int, roles: list[str], r: PreflightResult
                ) -> dict[str, float]:
    """GPU `gi`'s memory (recorded in r.memory), an error where its models do not fit; where they do, the KV
    fraction each model's share of the room left would take when it loads first."""
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
        _does_not_fit(cfg, gm, r)
        return {}
    total_tok = sum(r.estimates[x].kv_per_token for x in roles) or 1
    fractions = {}
    for x in roles:
        est = r.estimates[x]
        share = est.kv_per_token / total_tok
        fractions[x] = share * gm.kv_room * KV_HEADROOM / max(1, usable - est.own)
    return fractions


def _does_not_fit(cfg: BuildConfig, gm: GpuMemory, r: PreflightResult) -> None:
    """The error of a GPU its models do not fit on: what each needs, and the fixes that apply."""
    roles = gm.models
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
        f"GPU {gm.index} ({gm.name}) needs about {format_bytes(gm.own + gm.min_kv)} ({parts}) but has "
        f"{format_bytes(gm.usable)} usable: " + "; or ".join(fixes),
    )


def _set_kv_fractions(cfg: BuildConfig, fractions: dict[str, Sequence[float]], r: PreflightResult) -> None:
    """Each model's fraction: the config's, else the smallest over its GPUs, rounded down and clamped."""
    for role, m in models_of(cfg):
        if m.kv_cache_free_gpu_mem_fraction is not None:
            r.kv_fractions[role] = m.kv_cache_free_gpu_mem_fraction
            r.kv_derived[role] = False
        elif role in fractions:
            f = min(fractions[role])
            r.kv_fractions[role] = max(KV_FRACTION_MIN, min(KV_FRACTION_MAX, math.floor(f * 100) / 100))
            r.kv_derived[role] = True


def _check_kv_capacity(cfg: BuildConfig, gm: GpuMemory, r: PreflightResult) -> None:
    """What the fractions buy on one GPU: full-length sequences each model can hold, and over-commit by hand-set
    fractions."""
    L = cfg.limits
    worst: float = 0
    for x in gm.models:
        est = r.estimates[x]
        f = r.kv_fractions.get(x)
        if f is None:
            continue
        kv = f * max(0, gm.usable - est.own)
        worst += kv
        seq_bytes = est.kv_per_token * (L.max_seq_len + cfg.speculative.max_k)
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


def describe_estimates(r: PreflightResult) -> list[str]:
    """Human lines for the memory table (doctor, dry-run)."""
    lines = []
    for gm in r.memory:
        models = ", ".join(f"{x} {format_bytes(r.estimates[x].weights)} weights + "
                           f"{format_bytes(r.estimates[x].activations + r.estimates[x].runtime)} runtime"
                           for x in gm.models)
        lines.append(
            f"GPU {gm.index} {gm.name}: {format_bytes(gm.usable)} usable; {models}; "
            f"{format_bytes(gm.kv_room)} left for KV (minimum {format_bytes(gm.min_kv)})"
        )
    return lines
