"""The CPU's feature flags: what the engine's precision and its compiled kernels depend on."""

from __future__ import annotations

from pathlib import Path


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The first CPU's feature flags; empty where /proc/cpuinfo is not readable (not Linux)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()
