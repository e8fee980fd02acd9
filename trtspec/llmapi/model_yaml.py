"""model.yaml for the llmapi flavour: every key an argument of TensorRT-LLM's `LLM()` (TorchLlmArgs), plus
the `triton_config` block NVIDIA's llmapi Triton model reads. Generated from the build config and validated
against the field lists of the pinned TensorRT-LLM version, so a misspelled key fails at build time with its
name instead of at model load on the GPU machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.pipeline.preflight import plan_max_num_tokens
from trtspec.config import BuildConfig, LlmapiConfig
from trtspec.llmapi.fields import version_fields

DRAFT_TARGET, NGRAM = "model", "ngram"


class ModelYamlError(ValueError):
    """A model.yaml that the pinned TensorRT-LLM version would refuse; names the key."""


def speculative_config(cfg: BuildConfig, draft_dir: Path | None, version: str | None = None) -> dict[str, Any]:
    spec, lim = cfg.speculative, cfg.llmapi or LlmapiConfig()
    kind = version_fields(version)["decoding_types"][spec.draft_source]
    out: dict[str, Any] = {"decoding_type": kind["decoding_type"], "max_draft_len": spec.max_draft_len}
    if spec.draft_source == DRAFT_TARGET:
        if draft_dir is None:
            raise ModelYamlError("speculative_config.speculative_model: the DraftTarget flavour needs the draft checkpoint")
        out["speculative_model"] = str(draft_dir)
    else:
        out["max_matching_ngram_size"] = spec.ngram_max
    optional = {
        "max_concurrency": lim.max_concurrency,
        "draft_len_schedule": lim.draft_len_schedule,
        "acceptance_window": lim.acceptance_window,
        "acceptance_length_threshold": lim.acceptance_length_threshold,
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    return out


def generate(
    cfg: BuildConfig,
    target_dir: Path,
    draft_dir: Path | None,
    *,
    version: str | None = None,
    kv_fraction: float | None = None,
    speculative: bool = True,
) -> dict[str, Any]:
    """The model.yaml mapping (validated). `speculative=False` gives the target-only baseline's."""
    lim = cfg.llmapi or LlmapiConfig()
    t = cfg.target
    fraction = kv_fraction if kv_fraction is not None else t.kv_cache_free_gpu_mem_fraction
    doc: dict[str, Any] = {
        "model": str(target_dir),
        "backend": "pytorch",
        "dtype": t.dtype,
        "tensor_parallel_size": t.tp_size,
        "pipeline_parallel_size": t.pp_size,
        "max_batch_size": cfg.limits.max_batch_size,
        "max_seq_len": cfg.limits.max_seq_len,
        "max_num_tokens": lim.max_num_tokens or plan_max_num_tokens(cfg),
        "kv_cache_config": {"enable_block_reuse": True, **({"free_gpu_memory_fraction": fraction} if fraction else {})},
        "return_perf_metrics": True,  # per-request acceptance figures in every response
        "triton_config": {"max_batch_size": cfg.limits.max_batch_size, "decoupled": True},
    }
    if speculative:
        doc["speculative_config"] = speculative_config(cfg, draft_dir, version)
        doc["disable_overlap_scheduler"] = lim.disable_overlap_scheduler
    validate(doc, version)
    return doc


def validate(doc: dict[str, Any], version: str | None = None) -> None:
    """Every key must be a field of that version's TorchLlmArgs (and nested configs); raises ModelYamlError."""
    f = version_fields(version)
    problems = []
    allowed = set(f["TorchLlmArgs"]) | {"triton_config"}
    problems += [f"{k}: not an LLM() argument of TensorRT-LLM {version or 'pinned'}" for k in doc if k not in allowed]
    for k in doc.get("kv_cache_config") or {}:
        if k not in f["KvCacheConfig"]:
            problems.append(f"kv_cache_config.{k}: not a KvCacheConfig field")
    for k in doc.get("triton_config") or {}:
        if k not in f["triton_config"]:
            problems.append(f"triton_config.{k}: not a triton_config key")
    sc = doc.get("speculative_config")
    if sc is not None:
        kinds = {d["decoding_type"]: d for d in f["decoding_types"].values()}
        dt = sc.get("decoding_type")
        if dt not in kinds:
            problems.append(f"speculative_config.decoding_type: {dt!r}; this version spells it one of {sorted(kinds)}")
        else:
            ok = set(f["DecodingBaseConfig"]) | set(kinds[dt]["fields"]) | set(f["speculative_model_aliases"]) | {"decoding_type"}
            problems += [f"speculative_config.{k}: not a field of {kinds[dt]['class']}" for k in sc if k not in ok]
    if problems:
        raise ModelYamlError("model.yaml does not match TensorRT-LLM's LLM API:\n  " + "\n  ".join(problems))
