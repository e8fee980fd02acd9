"""The engine's step against this machine's limit: weight-streaming bandwidth measured with a GEMV over the
model's own weights, the step time those bytes imply, and the engine's decode, verify and batched steps
(`trtspec bench-engine` prints them).

On a GPU every figure is wall-clock time with the device synchronized before each clock read (what a step costs its
caller, kernel launches included), and the limit is the GPU's: one GEMV per distinct input width over all the
weights of that width stacked, since a GEMV per matrix there measures kernel launches (~0.7 MB matrices read in
well under a microsecond at HBM speed), not bandwidth; the per-matrix sweep is reported beside it."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from trtspec.reference_engine.ragged import Segment
from trtspec.reference_engine import ReferenceEngine
from trtspec.reference_engine.compiled_linear import CompiledLinear
from trtspec.reference_engine.kv_cache import new_cache
from trtspec.reference_engine.packed_linear import PackedLinear

# What an engine that speculation pays on should reach, as ratios within one run: a decode step near the
# weight-streaming limit (memory-bound, not compute-bound), a verify of 4 tokens barely dearer than a step (so
# checking drafts is cheap), and 8 one-token rows well under 8 steps (so batching pays).
TARGET_STEP_OVER_LIMIT = 1.5
TARGET_VERIFY4_OVER_STEP = 1.25
TARGET_BATCH8_OVER_STEP = 2.0


@dataclass
class EngineLimits:
    dtype: str
    threads: int  # torch threads (a CPU's figures depend on them)
    context: int
    weight_bytes: int  # the matrices one decode step reads (every Linear and the LM head)
    bandwidth_gbs: float
    limit_ms: float  # weight_bytes / bandwidth: the step time the bytes alone imply
    step_ms: float
    verify_ms: dict[int, float] = field(default_factory=dict)  # tokens verified -> ms
    batch_ms: dict[int, float] = field(default_factory=dict)  # one-token rows -> ms
    device: str = "cpu"  # "cpu", or the GPU's name
    sweep_ms: float | None = None  # on a GPU: one GEMV per matrix, as the engine's products run (launch-bound)

    def marginal_row_ms(self) -> dict[tuple[int, int], float]:
        """(rows a, rows b) -> ms one more one-token row adds between two measured batch sizes (the loop's
        controller prices verify rows added at load)."""
        sizes = [1, *sorted(self.batch_ms)]
        ms = {1: self.step_ms, **self.batch_ms}
        return {(a, b): (ms[b] - ms[a]) / (b - a) for a, b in zip(sizes, sizes[1:])}

    def ratios(self) -> dict[str, tuple[float, float]]:
        """name -> (measured, target)."""
        out = {"step / limit": (self.step_ms / self.limit_ms, TARGET_STEP_OVER_LIMIT)}
        if 4 in self.verify_ms:
            out["verify 4 / step"] = (self.verify_ms[4] / self.step_ms, TARGET_VERIFY4_OVER_STEP)
        if 8 in self.batch_ms:
            out["batch 8 / step"] = (self.batch_ms[8] / self.step_ms, TARGET_BATCH8_OVER_STEP)
        return out


def _timed(fn: Callable[[], None], reps: int, after: Callable[[], None] = lambda: None,
           sync: Callable[[], None] = lambda: None) -> float:
    """Median milliseconds of `reps` calls after one warm-up (`after` runs after each call, untimed; `sync` waits
    for the device before each clock read: torch.cuda.synchronize on a GPU)."""
    fn()
    sync()
    after()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        after()
    return statistics.median(times) * 1e3


def _sync_for(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def _products(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every weight product of a decode step, once (a tied LM head is the embedding matrix: counted once)."""
    seen, out = set(), []
    for m in model.modules():
        key = id(m.weight) if isinstance(m, torch.nn.Linear) else id(m) if isinstance(m, (PackedLinear, CompiledLinear)) else None
        if key is not None and key not in seen:
            seen.add(key)
            out.append(m)
    return out


def _nbytes(m: torch.nn.Module) -> int:
    return m.nbytes if isinstance(m, (PackedLinear, CompiledLinear)) else m.weight.nbytes


def streaming_gemv_ms(model: torch.nn.Module, reps: int) -> tuple[int, float]:
    """(bytes, median ms) of one 1-row product with each of the model's weight matrices as stored: the fastest
    this machine reads those weights with the kernels the engine uses, nothing else in the way."""
    products = _products(model)
    param = next(model.parameters())
    xs = {m.in_features: torch.ones(1, m.in_features, dtype=param.dtype, device=param.device) for m in products}

    def sweep() -> None:
        for m in products:
            m(xs[m.in_features])

    with torch.inference_mode():
        return sum(_nbytes(m) for m in products), _timed(sweep, reps, sync=_sync_for(param.device))


def stacked_gemv_ms(model: torch.nn.Module, reps: int, inner: int = 20) -> tuple[int, float]:
    """(bytes, median ms) of reading every weight matrix once, as one GEMV per input width over those matrices
    stacked (a GPU's streaming limit for the model's bytes: no launch per matrix). Each timed call repeats the
    read `inner` times, so the clock reads and the synchronization are amortized."""
    groups: dict[int, list[torch.Tensor]] = {}
    for m in _products(model):
        groups.setdefault(m.in_features, []).append(m.weight.detach())
    stacked = [torch.cat(ws) for ws in groups.values()]
    xs = [torch.ones(w.shape[1], 1, dtype=w.dtype, device=w.device) for w in stacked]

    def read() -> None:
        for _ in range(inner):
            for w, x in zip(stacked, xs):
                torch.mm(w, x)

    with torch.inference_mode():
        ms = _timed(read, reps, sync=_sync_for(stacked[0].device)) / inner
    nbytes = sum(w.nbytes for w in stacked)
    del stacked
    return nbytes, ms


def measure(engine: ReferenceEngine, context: int = 64, verify: tuple[int, ...] = (2, 4, 8),
            batch: tuple[int, ...] = (4, 8, 16), reps: int = 7, cache: Callable[[Any], Any] = new_cache) -> EngineLimits:
    """`cache(model config)` makes an empty KV cache (the engine's own kind unless told)."""

    def prefilled(seed: int) -> Segment:
        seg = Segment(cache(engine.model.config), [(seed * 7919 + i * 31) % 20000 + 100 for i in range(context)], 0, 1)
        engine.forward([seg])
        return seg

    bases = [prefilled(i) for i in range(max((1, *batch)))]
    device = next(engine.model.parameters()).device
    sync = _sync_for(device)

    def step(rows: int, tokens: int) -> float:
        """Each row continues its own cache (as a request's steps do), cropped back after each timed step."""
        def run() -> None:
            engine.forward([Segment(b.cache, [500 + j for j in range(tokens)], context, tokens) for b in bases[:rows]])

        def crop() -> None:
            for b in bases[:rows]:
                b.cache.crop(-tokens)
        return _timed(run, reps, crop, sync)

    nbytes, limit_ms = streaming_gemv_ms(engine.model, reps)
    sweep_ms, name = None, "cpu"
    if device.type == "cuda":
        sweep_ms, name = limit_ms, torch.cuda.get_device_name(device)
        nbytes, limit_ms = stacked_gemv_ms(engine.model, reps)
    out = EngineLimits(
        dtype=str(next(engine.model.parameters()).dtype).removeprefix("torch."), threads=torch.get_num_threads(), context=context, weight_bytes=nbytes,
        bandwidth_gbs=nbytes / limit_ms / 1e6, limit_ms=limit_ms, step_ms=step(1, 1), device=name, sweep_ms=sweep_ms,
    )
    out.verify_ms = {n: step(1, n) for n in verify}
    out.batch_ms = {m: step(m, 1) for m in batch}
    return out


def report(r: EngineLimits) -> list[str]:
    on_gpu = r.sweep_ms is not None
    lines = [
        f"{r.dtype} on {r.device}, {r.context} tokens of context per row" if on_gpu else
        f"{r.dtype}, {r.threads} torch thread(s), {r.context} tokens of context per row",
        f"  weights read per step   {r.weight_bytes / 2**20:.0f} MiB; GEMV bandwidth {r.bandwidth_gbs:.1f} GB/s "
        + (f"(stacked) -> limit {r.limit_ms:.3f} ms/step" if on_gpu else f"-> limit {r.limit_ms:.1f} ms/step"),
        *([f"  one GEMV per matrix     {r.sweep_ms:.2f} ms ({r.weight_bytes / r.sweep_ms / 1e6:.1f} GB/s: kernel launches, "
           "as the engine's products run)"] if on_gpu else []),
        f"  decode step             {r.step_ms:.1f} ms",
        "  verify                  " + "  ".join(f"{n} tok {ms:.1f} ms ({ms / r.step_ms:.2f}x)" for n, ms in r.verify_ms.items()),
        "  batch of 1-token rows   " + "  ".join(f"{m} rows {ms:.1f} ms ({ms / r.step_ms:.2f}x)" for m, ms in r.batch_ms.items()),
        "  one more row            " + "  ".join(f"{a}->{b} rows {ms:.1f} ms/row ({ms / r.step_ms:.2f}x a step)" for (a, b), ms in r.marginal_row_ms().items()),
    ]
    for name, (value, target) in r.ratios().items():
        lines.append(f"  {name:22s}  {value:.2f} (target <= {target:g}: {'met' if value <= target else 'missed'})")
    return lines
