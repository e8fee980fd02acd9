"""NVIDIA's Triton TensorRT-LLM tensor contract, per supported TensorRT-LLM version, as data.

One JSON file per version that changed the contract (`data/<version>.json`), each recording the declared
inputs/outputs of NVIDIA's `tensorrt_llm`, `preprocessing`, `postprocessing`, `ensemble` and
`tensorrt_llm_bls` models with the repository, path and ref they were read from, and what NVIDIA's own
clients send (the BLS, genai-perf, pre/postprocessing). A file covers its version up to the next file's.
`scripts/nvidia_contract.py` extracts the model I/O from a git checkout of NVIDIA's repositories.

ENGINE_FLOW_RANGE is the one home of the range of TensorRT-LLM releases that still ship the engine flow
(trtllm-build, the C++ `tensorrtllm` Triton backend, `tensorrt_llm_bls`); preflight and doctor import it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"

MODELS = ("tensorrt_llm", "preprocessing", "postprocessing", "ensemble", "tensorrt_llm_bls")

# Data types NVIDIA's templates leave as ${...}: the value trtspec deploys with (README: logits TYPE_FP32).
TYPE_PARAMS = {
    "logits_datatype": "TYPE_FP32",
    "prompt_embedding_table_data_type": "TYPE_FP16",
    "encoder_input_features_data_type": "TYPE_FP16",
}


def _vt(v: str) -> tuple[int, ...]:
    """'1.2.1' / '1.2.0rc8' / '0.17.0.post1' -> the numeric release (1, 2, 1); () when it is not a version."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", v.strip())
    return tuple(int(x) for x in m.groups() if x is not None) if m else ()


@dataclass(frozen=True)
class EngineFlowRange:
    """TensorRT-LLM releases whose engine flow trtspec supports (both ends inclusive, by major.minor)."""

    first: str  # oldest release trtspec supports (flags, plugin defaults and templates differ before it)
    last: str  # the last release that ships trtllm-build and the C++ tensorrtllm Triton backend
    last_container: str  # the last NGC tritonserver:<yy.mm>-trtllm-python-py3 with `last`
    removed_in: str  # the first release without the engine flow
    sources: tuple[str, ...]

    def contains(self, version: str) -> bool:
        return _vt(self.first)[:2] <= _vt(version)[:2] <= _vt(self.last)[:2]

    @property
    def label(self) -> str:
        return f"TensorRT-LLM {self.first} - {self.last} (last container tritonserver:{self.last_container}-trtllm-python-py3)"


ENGINE_FLOW_RANGE = EngineFlowRange(
    first="0.17.0",
    last="1.2.1",
    last_container="26.07",
    removed_in="1.3.0",
    sources=(
        "triton-inference-server/tensorrtllm_backend branches r26.04..r26.07: "
        "dockerfile/Dockerfile.triton.trt_llm_backend TENSORRTLLM_REPO_TAG=release/1.2.1, TENSORRTLLM_VER=1.2.1 "
        "(r26.03: 1.2.0rc8, r25.12..r26.02: 1.1.0); PR #853 'upgrade TensorRT-LLM to v1.2.1' (2026-04-16)",
        "NVIDIA/TensorRT-LLM PRs #15763, #15767 (2026-07-02), #15907 (C++ Triton backend removed, 2026-07-03), "
        "#15918 (Python TensorRT modules removed) on main during 1.3.0rc2x; 1.3.0 ships without the engine flow",
        "triton-inference-server/tensorrtllm_backend PR #858 (2026-07-07): README drops the TensorRT engine backend",
    ),
)


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str  # Triton's TYPE_* name
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None
    ragged: bool = False
    type_param: str | None = None  # the template's ${...} for the data type, when it had one

    def to_pb(self, message: Any) -> Any:
        """Fill a ModelInput/ModelOutput protobuf message from this entry and return it."""
        from tritonclient.grpc import model_config_pb2 as mc

        message.name = self.name
        message.data_type = mc.DataType.Value(self.data_type)
        message.dims.extend(self.dims)
        if self.reshape is not None:
            message.reshape.shape.extend(self.reshape)
        if hasattr(message, "optional") and self.optional:
            message.optional = True
        if hasattr(message, "allow_ragged_batch") and self.ragged:
            message.allow_ragged_batch = True
        return message


@dataclass(frozen=True)
class ModelIO:
    source: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    def input(self, name: str) -> Tensor:
        return _by_name(self.inputs, name, "input", self.source)

    def output(self, name: str) -> Tensor:
        return _by_name(self.outputs, name, "output", self.source)


def _by_name(tensors: tuple[Tensor, ...], name: str, kind: str, source: str) -> Tensor:
    for t in tensors:
        if t.name == name:
            return t
    raise KeyError(f"{source} declares no {kind} named {name!r}")


def tensor_entry(t: Any, type_param: str | None = None) -> dict:
    """A ModelInput/ModelOutput protobuf as a data-file entry (what scripts/nvidia_contract.py writes)."""
    from tritonclient.grpc import model_config_pb2 as mc

    e: dict[str, Any] = {"name": t.name, "data_type": mc.DataType.Name(t.data_type), "dims": list(t.dims)}
    if getattr(t, "optional", False):
        e["optional"] = True
    if t.HasField("reshape"):
        e["reshape"] = list(t.reshape.shape)
    if getattr(t, "allow_ragged_batch", False):
        e["ragged"] = True
    if type_param:
        e["type_param"] = type_param
    return e


@lru_cache(maxsize=None)
def _load(version: str) -> dict:
    path = DATA / f"{version}.json"
    if not path.is_file():
        raise KeyError(f"no NVIDIA contract data for TensorRT-LLM {version}; supported: {', '.join(supported_versions())}")
    return json.loads(path.read_text())


def supported_versions() -> list[str]:
    """Versions with their own contract file, oldest first ('0.17', '0.19', ...)."""
    return sorted((p.stem for p in DATA.glob("*.json")), key=_vt)


def version_for(installed: str | None) -> str:
    """The contract version in effect for TensorRT-LLM `installed` (None: the newest supported).

    Raises ValueError, naming the supported range, for a version outside ENGINE_FLOW_RANGE."""
    versions = supported_versions()
    if installed is None:
        return versions[-1]
    if not _vt(installed) or not ENGINE_FLOW_RANGE.contains(installed):
        raise ValueError(f"TensorRT-LLM {installed} is outside the engine flow trtspec supports ({ENGINE_FLOW_RANGE.label})")
    return [v for v in versions if _vt(v) <= _vt(installed)][-1]


def model_io(version: str, model: str) -> ModelIO:
    """Declared inputs/outputs of NVIDIA's `model` in contract `version` (a key of supported_versions())."""
    m = _load(version)["models"].get(model)
    if m is None:
        raise KeyError(f"unknown NVIDIA model {model!r}; known: {', '.join(MODELS)}")

    def tensors(entries: list[dict]) -> tuple[Tensor, ...]:
        return tuple(
            Tensor(**{**e, "dims": tuple(e["dims"]), "reshape": tuple(e["reshape"]) if "reshape" in e else None})
            for e in entries
        )

    return ModelIO(f"{_load(version)['repository']}:{m['source']}", tensors(m["inputs"]), tensors(m["outputs"]))


def clients(version: str) -> dict:
    """What NVIDIA's own clients send to / request from these models in `version` (with sources)."""
    return _load(version).get("clients", {})


def info(version: str) -> dict:
    """The file's header: version, the releases it covers, repository and notes."""
    return {k: v for k, v in _load(version).items() if k not in ("models", "clients")}
