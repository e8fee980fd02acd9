"""How TensorRT-LLM turns model.yaml into LLM() arguments, per supported version, for the CPU stand-in and for
checks before a build: `update_llm_args_with_extra_dict` and `DecodingBaseConfig.from_dict` as read from each
release's llm_args.py (sources in api_surface.json, docs/llmapi-versions.md).

Where `tensorrt_llm` is installed, `validate_installed` runs the installed version's own functions instead."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from trtspec.llmapi.fields import version_fields

MAX_DRAFT_LEN = "max_draft_len"  # DecodingBaseConfig's field: the most draft tokens one step verifies


class LlmArgsError(ValueError):
    """What TensorRT-LLM would raise at load, with the key that causes it."""


@dataclass
class DecodingConfig:
    """A parsed speculative_config: which class TensorRT-LLM builds and its field values."""

    cls: str
    method: str  # trtspec.spec.methods name the class serves
    values: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def decoding_config_from_dict(data: dict[str, Any], version: str | None = None) -> DecodingConfig:
    """DecodingBaseConfig.from_dict of `version`: dispatch on decoding_type, pop it, build the class strictly."""
    f = version_fields(version)
    data = dict(data)
    dt = data.get("decoding_type")
    if dt not in f["from_dict_keys"]:
        raise LlmArgsError(f"speculative_config.decoding_type: Invalid decoding type: {dt} (TensorRT-LLM {version or 'pinned'} "
                           f"reads one of {', '.join(f['from_dict_keys'])})")
    data.pop("decoding_type")
    kinds = {k["decoding_type"]: (m, k) for m, k in f["decoding_types"].items()}
    if dt not in kinds:
        raise LlmArgsError(f"speculative_config.decoding_type: {dt} is a TensorRT-LLM mode trtspec does not generate")
    method, kind = kinds[dt]
    base = set(f["DecodingBaseConfig"]) | set(f["speculative_model_aliases"])
    unknown = sorted(k for k in data if k not in base and k not in kind["fields"])
    if unknown:
        raise LlmArgsError(f"speculative_config.{unknown[0]}: extra inputs are not permitted in {kind['class']} "
                           f"(TensorRT-LLM {version or 'pinned'})")
    values = dict(data)
    for alias in f["speculative_model_aliases"]:
        if alias in values and alias != f["speculative_model_field"]:
            values[f["speculative_model_field"]] = values.pop(alias)
    _check_schedule(values, f)
    if method == "mtp":
        # MTPDecodingConfig.from_dict: max_draft_len = num_nextn_predict_layers (default 1), whatever the YAML says
        values[MAX_DRAFT_LEN] = int(values.get(kind["draft_len_field"], 1))
    if method == "eagle3":
        if values.get(MAX_DRAFT_LEN) is None:
            raise LlmArgsError("speculative_config.max_draft_len: max_draft_len is required for Eagle")
        if values.get(f["speculative_model_field"]) is None:
            raise LlmArgsError(f"speculative_config.{f['speculative_model_field']}: Draft model must be provided for EAGLE")
    return DecodingConfig(kind["class"], method, values)


def _check_schedule(values: dict[str, Any], f: dict[str, Any]) -> None:
    sched = values.get("draft_len_schedule")
    if sched is None:
        return
    rules = f["draft_len_schedule"]
    if rules is None:
        raise LlmArgsError("speculative_config.draft_len_schedule: not a field of this TensorRT-LLM version")
    sched = {int(b): int(k) for b, k in sched.items()}
    mdl = values.get(MAX_DRAFT_LEN)
    if 1 not in sched:
        raise LlmArgsError("speculative_config.draft_len_schedule must include batch_size=1")
    if rules["requires_key_1_equal_max_draft_len"] and mdl is not None and sched[1] != mdl:
        raise LlmArgsError(f"speculative_config.draft_len_schedule[1] must equal max_draft_len ({sched[1]} != {mdl})")
    if mdl is not None and any(k > mdl for k in sched.values()):
        raise LlmArgsError("speculative_config.draft_len_schedule: all draft lengths must be <= max_draft_len")
    values["draft_len_schedule"] = dict(sorted(sched.items()))


def update_llm_args_with_extra_dict(
    llm_args: dict[str, Any], llm_args_dict: dict[str, Any], extra_llm_api_options: str | None = None, *,
    version: str | None = None,
) -> dict[str, Any]:
    """The stand-in's `update_llm_args_with_extra_dict(llm_args, llm_args_dict, extra_llm_api_options=None)`:
    kv_cache_config merged over llm_args' (1.2), speculative_config through from_dict, other nested configs
    checked for unknown keys; returns llm_args | llm_args_dict."""
    f = version_fields(version)
    llm_args_dict = dict(llm_args_dict)
    if f["kv_cache_config_deep_merge"] and "kv_cache_config" in llm_args and "kv_cache_config" in llm_args_dict:
        llm_args_dict["kv_cache_config"] = dict(llm_args["kv_cache_config"]) | dict(llm_args_dict["kv_cache_config"])
    if "speculative_config" in llm_args_dict and isinstance(llm_args_dict["speculative_config"], dict):
        llm_args_dict["speculative_config"] = decoding_config_from_dict(llm_args_dict["speculative_config"], version)
    for k in llm_args_dict.get("kv_cache_config") or {}:
        if k not in f["KvCacheConfig"]:
            raise LlmArgsError(f"kv_cache_config.{k}: not a KvCacheConfig field trtspec knows for this version")
    return dict(llm_args) | llm_args_dict


def load_model_yaml(doc: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    """What NVIDIA's Triton LLM-API model does with model.yaml: drop triton_config, parse the rest into LLM() kwargs."""
    doc = copy.deepcopy(doc)
    doc.pop("triton_config", None)
    return update_llm_args_with_extra_dict({}, doc, version=version)


def validate_installed(doc: dict[str, Any]) -> str | None:
    """Parse `doc` with the installed tensorrt_llm's own update_llm_args_with_extra_dict and check the top-level
    keys against its TorchLlmArgs. Returns the installed version, or None where tensorrt_llm is not importable.
    Raises LlmArgsError with TensorRT-LLM's own message."""
    try:
        import tensorrt_llm
        from tensorrt_llm.llmapi import llm_args as trt_args
    except Exception:  # noqa: BLE001 - not installed, or installed without a GPU stack that imports
        return None
    parse = getattr(trt_args, "update_llm_args_with_extra_dict", None)
    if parse is None:
        from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict as parse  # older layouts
    doc = copy.deepcopy(doc)
    doc.pop("triton_config", None)
    try:
        args = parse({}, doc)
    except Exception as e:  # noqa: BLE001 - pydantic and plain ValueErrors alike
        raise LlmArgsError(f"TensorRT-LLM {tensorrt_llm.__version__} refuses model.yaml: {e}") from None
    fields = set(getattr(trt_args, "TorchLlmArgs").model_fields)
    unknown = sorted(k for k in args if k not in fields)
    if unknown:
        raise LlmArgsError(f"{unknown[0]}: not an LLM() argument of the installed TensorRT-LLM {tensorrt_llm.__version__}")
    return str(tensorrt_llm.__version__)
