"""What preflight found: its findings (each naming its fix), where each model goes, the KV-cache fractions, and the
memory estimate behind them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Level = Literal["error", "warning"]


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
