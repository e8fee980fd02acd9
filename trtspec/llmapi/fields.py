"""The LLM API surface trtspec relies on, per supported TensorRT-LLM version (data in api_surface.json)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

SURFACE_FILE = Path(__file__).with_name("api_surface.json")


@lru_cache(maxsize=1)
def surface() -> dict[str, Any]:
    return json.loads(SURFACE_FILE.read_text())


def pinned_version() -> str:
    return surface()["pinned"]


def supported_versions() -> list[str]:
    return sorted(surface()["versions"])


def version_fields(version: str | None = None) -> dict[str, Any]:
    """The field lists of `version` (major.minor; default: the pinned one). KeyError names the supported ones."""
    versions = surface()["versions"]
    key = ".".join((version or pinned_version()).split(".")[:2])
    if key not in versions:
        why = surface().get("unsupported_versions", {}).get(key, "no field lists recorded for it")
        raise KeyError(f"TensorRT-LLM {version}: not supported by engine: llmapi ({why}); supported: {', '.join(versions)}")
    return versions[key]


def runtime_names(kind: str) -> list[str]:
    """Names of one runtime class or call of the LLM API the Triton model uses (SamplingParams, ...)."""
    return list(surface()["runtime"][kind])


def mtp_model_types() -> dict[str, str]:
    """model_type -> family of the targets TensorRT-LLM runs MTP for (api_surface.json mtp_model_types)."""
    return {k: v for k, v in surface()["mtp_model_types"].items() if not k.startswith("_")}
