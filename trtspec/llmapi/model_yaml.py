"""model.yaml for the llmapi flavour: every key an argument of TensorRT-LLM's `LLM()` (TorchLlmArgs), plus
the `triton_config` block NVIDIA's llmapi Triton model reads. Generated from the build config and validated
against the field lists of the pinned TensorRT-LLM version, so a misspelled key fails at build time with its
name instead of at model load on the GPU machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.config import BuildConfig, LlmapiConfig, plan_max_num_tokens
from trtspec.checkpoint import default_capture_layers, eagle3_capture_layers, inspect_checkpoint
from trtspec.llmapi.draft_floor import TWO_MODEL_FIELD, DraftFloorError, Floored, resolve
from trtspec.llmapi.fields import pinned_version, version_fields
from trtspec.llmapi.parser import MAX_DRAFT_LEN
from trtspec.spec.methods import METHODS


class ModelYamlError(ValueError):
    """A model.yaml that the pinned TensorRT-LLM version would refuse; names the key."""


def schedule_for_version(schedule: dict[int, int], keys: str, max_batch_size: int) -> dict[int, int]:
    """trtspec's draft_len_schedule (each key a batch size from which its length applies upward) in the key
    semantics a TensorRT-LLM version reads: "lower_bound" (the same map) or "upper_bound" (each key the largest
    batch size its length applies to; the last range ends at max_batch_size)."""
    items = sorted(schedule.items())
    if keys == "lower_bound":
        return dict(items)
    if keys == "upper_bound":
        out = {nxt - 1: k for (b, k), (nxt, _) in zip(items, items[1:]) if nxt - 1 >= b}
        if items[-1][0] <= max_batch_size:
            out[max_batch_size] = items[-1][1]
        return out
    raise ValueError(f"unknown draft_len_schedule key semantics {keys!r}")


def _canonical_schedule(cfg: BuildConfig) -> dict[int, int] | None:
    lim = cfg.llmapi or LlmapiConfig()
    return cfg.speculative.draft_len_schedule or lim.draft_len_schedule


def load_controls(cfg: BuildConfig, version: str | None = None) -> Floored:
    """The draft_len_schedule (trtspec's keys) and max_concurrency written for `cfg` on TensorRT-LLM `version`:
    as configured, except where a one-engine drafter would stop and silently fail to resume (draft_floor)."""
    lim = cfg.llmapi or LlmapiConfig()
    f = version_fields(version)
    try:
        return resolve(cfg.speculative.method or "draft_model", f, cfg.speculative.max_k, _canonical_schedule(cfg),
                       lim.max_concurrency, lim.eagle3_two_model, version or f"{pinned_version()} (pinned)")
    except DraftFloorError as e:
        raise ModelYamlError(str(e)) from None


def speculative_config(
    cfg: BuildConfig, draft_dir: Path | None, version: str | None = None, target_dir: Path | None = None
) -> dict[str, Any]:
    """speculative_config spelled as TensorRT-LLM `version` parses it (DecodingBaseConfig.from_dict)."""
    spec, lim = cfg.speculative, cfg.llmapi or LlmapiConfig()
    f = version_fields(version)
    v = version or f"{pinned_version()} (pinned)"
    method = spec.method or "draft_model"
    kind = f["decoding_types"][method]
    out: dict[str, Any] = {"decoding_type": kind["decoding_type"], MAX_DRAFT_LEN: spec.max_k}
    if METHODS[method].draft is not None:
        if draft_dir is None:
            raise ModelYamlError(f"speculative_config.{f['speculative_model_field']}: method {method} needs the draft checkpoint")
        out[f["speculative_model_field"]] = str(draft_dir)
    if method == "ngram":
        out["max_matching_ngram_size"] = spec.ngram_max
    if method == "mtp":
        # MTPDecodingConfig.from_dict overwrites the draft length with num_nextn_predict_layers (default 1)
        out[kind["draft_len_field"]] = spec.max_k
    if method == "eagle3" and draft_dir is not None and (Path(draft_dir) / "config.json").is_file():
        layers = eagle3_capture_layers(inspect_checkpoint(draft_dir))
        if layers is not None and "eagle3_layers_to_capture" not in kind["fields"]:
            target = inspect_checkpoint(target_dir) if target_dir and (Path(target_dir) / "config.json").is_file() else None
            if target is not None and target.num_layers and layers == default_capture_layers(target.num_layers):
                layers = None  # the release captures these by default
        if layers is not None:
            if "eagle3_layers_to_capture" not in kind["fields"]:
                raise ModelYamlError(
                    f"speculative_config.eagle3_layers_to_capture: the head pins capture layers {layers} but TensorRT-LLM "
                    f"{v} has no eagle3_layers_to_capture (it captures {{1, L//2-1, L-4}} of the target's L layers); pin "
                    "TensorRT-LLM 1.1 or later"
                )
            out["eagle3_layers_to_capture"] = layers
    if lim.max_concurrency is not None and f["max_concurrency"] is None:
        raise ModelYamlError(f"llmapi.max_concurrency: TensorRT-LLM {v} has no max_concurrency; remove it or pin 1.1 or later")
    sched = _canonical_schedule(cfg)
    if sched is not None and f["draft_len_schedule"] is None:
        which = "speculative" if spec.draft_len_schedule is not None else "llmapi"
        raise ModelYamlError(
            f"{which}.draft_len_schedule: TensorRT-LLM {v} has no draft_len_schedule; remove it (llmapi.max_concurrency "
            "turns speculation off above a batch size) or pin 1.2"
        )
    floored = load_controls(cfg, version)
    if floored.two_model:
        out[TWO_MODEL_FIELD] = False
    if floored.max_concurrency is not None:
        out[f["max_concurrency"]] = floored.max_concurrency
    if floored.schedule is not None:
        rules = f["draft_len_schedule"]
        out[rules["field"]] = schedule_for_version(floored.schedule, rules["keys"], cfg.limits.max_batch_size)
    if lim.acceptance_window is not None:
        gate = f["acceptance_gate"]
        if gate is None:
            raise ModelYamlError(
                f"llmapi.acceptance_window: TensorRT-LLM {v} has no acceptance gate; remove acceptance_window / "
                "acceptance_length_threshold or pin 1.2"
            )
        out[gate["window"]] = lim.acceptance_window
        out[gate["threshold"]] = lim.acceptance_length_threshold
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
        doc["speculative_config"] = speculative_config(cfg, draft_dir, version, target_dir)
        doc["disable_overlap_scheduler"] = lim.disable_overlap_scheduler
    if guided_refusal(cfg, version, speculative) is None:
        g = version_fields(version)["guided_decoding"]
        doc[g["backend_field"]] = g["backend"]
    validate(doc, version)
    return doc


def guided_method(cfg: BuildConfig, version: str | None = None) -> str:
    """The speculation method as the release's guided-decoding support names it (eagle3 or eagle3_two_model)."""
    method = cfg.speculative.method or "draft_model"
    return "eagle3_two_model" if method == "eagle3" and load_controls(cfg, version).two_model else method


def guided_refusal(cfg: BuildConfig, version: str | None = None, speculative: bool = True) -> str | None:
    """None where TensorRT-LLM `version` serves guided decoding with the deployment's speculation (model.yaml then
    sets guided_decoding_backend); otherwise why not, which the endpoint answers guided requests with."""
    g = version_fields(version)["guided_decoding"]
    if not speculative:
        return None
    method = guided_method(cfg, version)
    if method in g["methods"]:
        return None
    v = version or f"{pinned_version()} (pinned)"
    hint = "; set llmapi.eagle3_two_model: true" if method == "eagle3" and "eagle3_two_model" in g["methods"] else ""
    return (f"TensorRT-LLM {v} does not combine guided decoding with speculative.method {method}"
            f"{' (one-model)' if method == 'eagle3' else ''}: {g['refused'].get(method, 'not listed')}{hint}, or pin 1.2")


def validate(doc: dict[str, Any], version: str | None = None) -> None:
    """Load `doc` the way TensorRT-LLM `version` does (update_llm_args_with_extra_dict, as recorded) and check
    the top-level keys; raises ModelYamlError naming the key."""
    from trtspec.llmapi.parser import LlmArgsError, load_model_yaml

    f = version_fields(version)
    problems = [f"{k}: not an LLM() argument trtspec knows for TensorRT-LLM {version or 'pinned'}"
                for k in doc if k not in set(f["TorchLlmArgs"]) | {"triton_config"}]
    problems += [f"triton_config.{k}: not a triton_config key" for k in doc.get("triton_config") or {} if k not in f["triton_config"]]
    try:
        load_model_yaml(doc, version)
    except LlmArgsError as e:
        problems.append(str(e))
    if problems:
        raise ModelYamlError("model.yaml does not match TensorRT-LLM's LLM API:\n  " + "\n  ".join(problems))


def validate_installed(doc: dict[str, Any]) -> str | None:
    """Check `doc` with the installed tensorrt_llm's own classes; the installed version, or None (not installed)."""
    from trtspec.llmapi.parser import LlmArgsError, validate_installed as check

    try:
        return check(doc)
    except LlmArgsError as e:
        raise ModelYamlError(str(e)) from None
