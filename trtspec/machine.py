"""What this machine offers for a build: GPUs (NVML), tritonserver, trtllm-build, TensorRT-LLM, TensorRT, disk.

Nothing here imports TensorRT-LLM or TensorRT (importing tensorrt_llm takes seconds and initializes CUDA);
versions come from package metadata. "No NVIDIA driver" is an ordinary answer, not an error.

``parse_gpu_spec("h200x8")`` describes another machine (``--gpus``) so a build can be planned and
checked anywhere: known SKUs carry their memory and compute capability.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MiB = 1 << 20

# name, memory as NVML reports it (MiB), compute capability
KNOWN_GPUS: dict[str, tuple[str, int, tuple[int, int]]] = {
    "h100": ("NVIDIA H100 80GB HBM3", 81559, (9, 0)),
    "h200": ("NVIDIA H200", 143771, (9, 0)),
    "a100": ("NVIDIA A100-SXM4-80GB", 81920, (8, 0)),
    "l40s": ("NVIDIA L40S", 46068, (8, 9)),
    "a10g": ("NVIDIA A10G", 23028, (8, 6)),
    "b200": ("NVIDIA B200", 183359, (10, 0)),
    "rtx4090": ("NVIDIA GeForce RTX 4090", 24564, (8, 9)),
}



class GpuSpecError(ValueError):
    """A --gpus value that cannot be parsed; the message lists what is accepted."""


@dataclass
class GPU:
    index: int
    name: str
    compute_capability: tuple[int, int]
    memory_total: int  # bytes
    memory_free: int  # bytes

    @property
    def sm(self) -> int:
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def cc(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


@dataclass
class Tool:
    path: str | None = None
    version: str | None = None
    note: str | None = None

    @property
    def available(self) -> bool:
        return self.path is not None


@dataclass
class Machine:
    gpus: list[GPU] = field(default_factory=list)
    driver_version: str | None = None
    nvml_error: str | None = None  # why there is no GPU list ("no NVIDIA driver", ...)
    synthetic: bool = False  # GPUs from --gpus, not from NVML
    gpu_spec: str | None = None
    software_checked: bool = True  # False: planning for another machine, software unknown
    tritonserver: Tool = field(default_factory=Tool)
    trtllm_build: Tool = field(default_factory=Tool)
    tensorrt_llm_version: str | None = None
    tensorrt_version: str | None = None
    triton_container: str | None = None  # NGC container release, e.g. 25.12
    disk_free: dict[str, int] = field(default_factory=dict)  # path -> free bytes

    def gpu(self, index: int) -> GPU | None:
        return next((g for g in self.gpus if g.index == index), None)

    def describe_gpus(self) -> str:
        if not self.gpus:
            return self.nvml_error or "no GPUs"
        names: dict[str, int] = {}
        for g in self.gpus:
            names[g.name] = names.get(g.name, 0) + 1
        text = ", ".join(f"{n}x {name}" for name, n in names.items())
        return text + (" (synthetic, --gpus)" if self.synthetic else "")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for g, src in zip(d["gpus"], self.gpus):
            g["compute_capability"] = src.cc
        return d


# ------------------------------------------------------------------------------------------------ NVML


def nvml_gpus() -> tuple[list[GPU], str | None, str | None]:
    """(gpus, driver version, error). Every NVML failure becomes an explanation, never an exception."""
    try:
        import pynvml
    except ImportError:
        return [], None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return [], None, "no NVIDIA driver (libnvidia-ml not found)"
    except pynvml.NVMLError_DriverNotLoaded:
        return [], None, "no NVIDIA driver (driver not loaded)"
    except pynvml.NVMLError as e:
        return [], None, f"NVML unavailable: {e}"
    try:
        driver = _s(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            gpus.append(GPU(i, _s(pynvml.nvmlDeviceGetName(h)), (int(major), int(minor)), int(mem.total),
                            int(mem.free)))
        return gpus, driver, None
    except pynvml.NVMLError as e:
        return [], None, f"NVML error: {e}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a half-initialized NVML is best effort
            pass


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# ------------------------------------------------------------------------------------------- software


def dist_version(*names: str) -> str | None:
    """Version of the first installed distribution among `names` (package metadata; nothing imported)."""
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def tensorrt_llm_version() -> str | None:
    return dist_version("tensorrt_llm", "tensorrt-llm")


def tensorrt_version() -> str | None:
    return dist_version("tensorrt", "tensorrt-cu12", "tensorrt_cu12", "tensorrt-cu13", "tensorrt_cu13",
                        "tensorrt-libs") or (os.environ.get("TRT_VERSION") or None)


def find_tritonserver() -> Tool:
    """The tritonserver `trtspec serve` would run (trtspec.server.installation.find_tritonserver), without preparing
    it."""
    from trtspec.server.installation import TritonNotFoundError, find_tritonserver as locate

    try:
        found = locate(prepare=False)
    except TritonNotFoundError:
        return Tool(None, None, "not found (NVIDIA's tritonserver containers have it; or pip install nvidia-pytriton)")
    version = found.version if found.kind == "system" else None  # the bundled one's is the wheel's, not Triton's
    vf = found.executable.parent.parent / "TRITON_VERSION"
    if not version and found.kind == "system" and vf.is_file():
        version = vf.read_text().strip() or None
    return Tool(str(found.executable), version, found.kind if found.kind == "system" else f"bundled ({found.source})")


def find_trtllm_build() -> Tool:
    override = os.environ.get("TRTSPEC_TRTLLM_BUILD")
    if override:
        first = override.split()[0]
        path = shutil.which(first) or (first if Path(first).is_file() else None)
        return Tool(override if path else None, tensorrt_llm_version(),
                    "from TRTSPEC_TRTLLM_BUILD" if path else f"TRTSPEC_TRTLLM_BUILD={override!r} not found")
    path = shutil.which("trtllm-build")
    if path:
        return Tool(path, tensorrt_llm_version())
    from trtspec.contract.nvidia import ENGINE_FLOW_RANGE as flow

    return Tool(
        None, None, f"not on PATH (comes with TensorRT-LLM {flow.first} - {flow.last}; use NVIDIA's "
        f"tritonserver:{flow.last_container}-trtllm-python-py3 container or older)"
    )


def disk_free(path: str | Path) -> int | None:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def triton_container_version() -> str | None:
    return os.environ.get("NVIDIA_TRITON_SERVER_VERSION") or None


def machine_inventory(*, gpus: str | None = None, disk_paths: list[str | Path] | None = None) -> Machine:
    """This machine. `gpus` (a --gpus spec) replaces the NVML answer with synthetic GPUs."""
    if gpus:
        gpu_list, driver, err = parse_gpu_spec(gpus), None, None
    else:
        gpu_list, driver, err = nvml_gpus()
    m = Machine(
        gpus=gpu_list,
        driver_version=driver,
        nvml_error=err,
        synthetic=bool(gpus),
        gpu_spec=gpus,
        tritonserver=find_tritonserver(),
        trtllm_build=find_trtllm_build(),
        tensorrt_llm_version=tensorrt_llm_version(),
        tensorrt_version=tensorrt_version(),
        triton_container=triton_container_version(),
    )
    for p in disk_paths or []:
        free = disk_free(p)
        if free is not None:
            m.disk_free[str(p)] = free
    return m


def synthetic_machine(spec: str, *, tensorrt_llm_version: str | None = None) -> Machine:
    """Another machine, for planning (--dry-run --gpus): its GPUs from `spec`, its software unknown."""
    return Machine(
        gpus=parse_gpu_spec(spec),
        synthetic=True,
        gpu_spec=spec,
        software_checked=False,
        tensorrt_llm_version=tensorrt_llm_version,
        trtllm_build=Tool("trtllm-build", tensorrt_llm_version, "assumed (planning for another machine)"),
    )


def parse_gpu_spec(spec: str) -> list[GPU]:
    """'h200x8', '8xh200', 'h100', 'h100x4,l40s' (comma-separated groups), 'none' -> GPUs 0..N-1."""
    spec = spec.strip().lower()
    if spec in ("none", "cpu", "0"):
        return []
    gpus: list[GPU] = []
    for part in (p.strip() for p in spec.split(",")):
        sku, n = _parse_group(part)
        if sku is None:
            known = ", ".join(sorted(KNOWN_GPUS))
            raise GpuSpecError(
                f"--gpus {spec!r}: cannot read {part!r}; write SKUxCOUNT such as h200x8 or h100x2,l40s "
                f"(known SKUs: {known}; 'none' for no GPU)"
            )
        if not 1 <= n <= 64:
            raise GpuSpecError(f"--gpus {spec!r}: count {n} out of range 1..64")
        name, mib, cc = KNOWN_GPUS[sku]
        for _ in range(n):
            gpus.append(GPU(len(gpus), name, cc, mib * MiB, mib * MiB))
    return gpus


def _parse_group(part: str) -> tuple[str | None, int]:
    """'h200x8' / '8xh200' / 'h200' -> ('h200', 8|1); unknown -> (None, 0)."""
    for sku in sorted(KNOWN_GPUS, key=len, reverse=True):
        if part == sku:
            return sku, 1
        m = re.fullmatch(rf"{sku}\s*[x*:]\s*(\d+)", part) or re.fullmatch(rf"(\d+)\s*[x*]\s*{sku}", part)
        if m:
            return sku, int(m.group(1))
    return None, 0
