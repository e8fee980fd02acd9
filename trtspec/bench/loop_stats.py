"""Triton's per-model statistics as the loop benchmark reads them: snapshots, their differences and sums, the
engine time in them and the loop's overhead per iteration. Pure arithmetic on JSON (tested in
``tests/test_bench_loop.py``); ``trtspec.bench.loop_server`` takes the snapshots."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from trtspec.contract.models import ENGINE_MODELS

ENGINE_BUSY = "engine_busy"  # the reference engine's forward time (fetch_stats), beside Triton's parts
STAT_PARTS = ("success", "queue", "compute_input", "compute_infer", "compute_output", ENGINE_BUSY)
ENGINE_PARTS = ("compute_input", "compute_infer", "compute_output", ENGINE_BUSY)


def _empty_entry() -> dict[str, Any]:
    return {p: {"count": 0, "ns": 0} for p in STAT_PARTS} | {"execution_count": 0, "inference_count": 0}


def model_entries(stats: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Triton's ``/v2/models[/<name>]/stats`` JSON -> {model name: {part: {count, ns}, execution_count,
    inference_count}} (versions of one model summed)."""
    out: dict[str, dict[str, Any]] = {}
    for entry in stats.get("model_stats", []):
        name = entry["name"]
        acc = out.setdefault(name, _empty_entry())
        inf = entry.get("inference_stats", {})
        for part in STAT_PARTS:
            d = inf.get(part, {}) or {}
            acc[part]["count"] += int(d.get("count", 0))
            acc[part]["ns"] += int(d.get("ns", 0))
        acc["execution_count"] += int(entry.get("execution_count", 0))
        acc["inference_count"] += int(entry.get("inference_count", 0))
    return out


def stats_delta(
    before: Mapping[str, Any], after: Mapping[str, Any], models: Iterable[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per-model difference after - before of two stats snapshots (raw Triton JSON or already parsed by
    ``model_entries``). A model missing from ``before`` counts from zero; one missing from ``after`` is skipped."""
    b = before if "model_stats" not in before else model_entries(before)
    a = after if "model_stats" not in after else model_entries(after)
    names = list(models) if models is not None else sorted(a)
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        if name not in a:
            continue
        prev = b.get(name, _empty_entry())
        d: dict[str, Any] = {}
        for part in STAT_PARTS:
            d[part] = {f: _part(a[name], part)[f] - _part(prev, part)[f] for f in ("count", "ns")}
        for f in ("execution_count", "inference_count"):
            d[f] = a[name][f] - prev[f]
        out[name] = d
    return out


def _part(entry: Mapping[str, Any], part: str) -> Mapping[str, int]:
    """One part of a model's stats; records made without it (ENGINE_BUSY is newer than saved results) count 0."""
    return entry.get(part) or {"count": 0, "ns": 0}


def add_deltas(x: Mapping[str, Any], y: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Sum of two ``stats_delta`` results (used to accumulate per-request deltas)."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(x) | set(y)):
        a, b = x.get(name, _empty_entry()), y.get(name, _empty_entry())
        d: dict[str, Any] = {p: {f: _part(a, p)[f] + _part(b, p)[f] for f in ("count", "ns")} for p in STAT_PARTS}
        for f in ("execution_count", "inference_count"):
            d[f] = a[f] + b[f]
        out[name] = d
    return out


def engine_ns(
    delta: Mapping[str, Any], models: Iterable[str] = ENGINE_MODELS, parts: Iterable[str] = ENGINE_PARTS
) -> int:
    """Engine time in a stats delta: compute_input + compute_infer + compute_output of the engine models."""
    parts = tuple(parts)
    return sum(int(_part(delta[m], p)["ns"]) for m in models if m in delta for p in parts)


def engine_calls(delta: Mapping[str, Any], model: str) -> int:
    return int(delta[model]["compute_infer"]["count"]) if model in delta else 0


def overhead_per_iteration(wall_s: float, engine_time_ns: int, iterations: int) -> float | None:
    """(client wall time - engine time) / iterations, in seconds; None without iterations."""
    if iterations <= 0:
        return None
    return (wall_s - engine_time_ns / 1e9) / iterations


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None where either is missing or b is 0."""
    return None if a is None or b is None or b == 0 else a / b
