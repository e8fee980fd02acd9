"""How one replica of a deployment lands on Kubernetes nodes: GPUs per pod, pods per replica, GPU product.

The GPU count comes from the build's own placement (``trtspec.pipeline.preflight.plan_placement``): the target
on tp x pp GPUs, the draft on its own GPUs or sharing the target's (``gpu_device_ids`` that overlap). A pod
sees the GPUs it was given as 0..n-1, so the placement must number them without holes. A replica larger
than one node becomes one LeaderWorkerSet group of whole nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trtspec.pipeline.preflight import plan_placement
from trtspec.config import BuildConfig, EngineKind
from trtspec.machine import GPU


class K8sError(ValueError):
    """A combination Kubernetes cannot run; the message names the field and the fix, on one line."""


# NVIDIA GPU feature discovery labels nodes with the NVML device name, spaces turned into dashes.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"


def gpu_product(gpu_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'NVIDIA-H100-80GB-HBM3' (the value of nvidia.com/gpu.product)."""
    return "-".join(gpu_name.split())


@dataclass
class Topology:
    gpus_per_replica: int  # 0: a CPU deployment
    pods_per_replica: int  # > 1: one replica spans several nodes (LeaderWorkerSet)
    gpus_per_pod: int
    gpus_per_node: int | None  # None: unknown (no --gpus and no GPU here)
    product: str | None  # nvidia.com/gpu.product to select, None: any node
    placement: dict[str, list[int]] = field(default_factory=dict)
    draft_separate: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def multi_node(self) -> bool:
        return self.pods_per_replica > 1


def uses_gpus(cfg: BuildConfig) -> bool:
    """Every flavour runs on GPUs except where the config places it on the CPU (the reference engine, or the
    llmapi flavour's CPU stand-in)."""
    return not (cfg.engine is not EngineKind.tensorrt_llm and cfg.device == "cpu")


def plan_topology(cfg: BuildConfig, node_gpus: list[GPU], gpus_per_node: int | None = None) -> Topology:
    """Fit one replica of `cfg` onto nodes that carry `node_gpus` (a --gpus spec or this machine's GPUs)."""
    names = sorted({g.name for g in node_gpus})
    if len(names) > 1:
        raise K8sError(
            f"--gpus: one node pool has one GPU product, got {', '.join(names)}; describe one node, e.g. h100x8"
        )
    product = gpu_product(names[0]) if names else None
    gpn = gpus_per_node or (len(node_gpus) or None)
    if not uses_gpus(cfg):
        return Topology(0, 1, 0, gpn, None, notes=["device: cpu: the pods request no GPU and select no GPU node"])

    placement = plan_placement(cfg, gpn or 0)
    target = set(placement["target"])
    draft = set(placement.get("draft", []))
    separate = bool(draft - target)
    used = sorted(target | draft)
    topo = Topology(len(used), 1, len(used), gpn, product, placement, separate)
    if gpn is None:
        topo.notes.append(
            f"GPUs per node unknown (no --gpus, no GPU here): assumed one replica ({len(used)} GPU(s)) fits one node"
        )
    if gpn is not None and len(used) > gpn:
        return _multi_node(cfg, topo, gpn)
    if used != list(range(len(used))):
        role = "draft" if max(draft, default=-1) > max(target) else "target"
        ids = placement[role]
        raise K8sError(
            f"{role}.gpu_device_ids: {ids} leaves GPU(s) {sorted(set(range(max(used) + 1)) - set(used))} of the pod "
            f"unused; a pod sees its {len(used)} GPU(s) as 0..{len(used) - 1}: renumber gpu_device_ids from 0"
        )
    return topo


def _multi_node(cfg: BuildConfig, topo: Topology, gpn: int) -> Topology:
    world = cfg.target.world_size
    if world > gpn and world % gpn:
        raise K8sError(
            f"target.tp_size x target.pp_size = {world} does not fill whole {gpn}-GPU nodes: a replica that spans "
            f"nodes takes whole nodes; use a multiple of {gpn} (e.g. {(world // gpn + 1) * gpn}) or at most {gpn}"
        )
    if topo.draft_separate:
        raise K8sError(
            f"draft.gpu_device_ids: {topo.placement['draft']}: the target's {world} GPU(s) + the draft's own "
            f"{topo.gpus_per_replica - world} do not fit a {gpn}-GPU node; share the target's GPUs "
            "(e.g. draft.gpu_device_ids: [0]) or use larger nodes (--gpus)"
        )
    topo.pods_per_replica, topo.gpus_per_pod = world // gpn, gpn
    return topo
