"""Cost models for `trtspec simulate`: what a target step, a draft-model step and an in-engine head step cost.

A step of `rows` requests processing `tokens` tokens in all (a plain row 1, a verify row 1 + k, a prefill row its
prompt) over `context` cached tokens in all. Two kinds:

- `GpuCosts`: from first principles for a GPU of trtspec's table and a model's shape (its checkpoint's config):
  launch + max(weight bytes / bandwidth, tokens x FLOPs per token / peak) + KV bytes read / bandwidth, with the
  efficiencies it prints. Memory-bound at small batches, so draft rows are nearly free there; compute-bound at
  large ones, where every row costs.
- `MeasuredCosts`: from `trtspec bench-engine --json` of the target (and of the draft): a CPU's, or a GPU's where
  one was at hand; rows and tokens interpolated between the measured batch and verify steps.
- `GridCosts`: from `scripts/gpu_step_costs.py` on a GPU: the model shapes' steps as CUDA graphs measured over a
  grid of rows x tokens per row (and two contexts), the target, the draft model and an EAGLE-3 head in one file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from trtspec.bench.shapes import GPU_PEAKS, KNOWN_SHAPES
from trtspec.checkpoint import CheckpointInfo, _params_from_config

class Costs(Protocol):
    name: str

    def target_step(self, rows: int, tokens: int, context: int) -> float: ...

    def draft_step(self, rows: int, tokens: int, context: int) -> float: ...

    def head_step(self, rows: int) -> float: ...

    def assumptions(self) -> list[str]: ...


@dataclass(frozen=True)
class Shape:
    """What a step reads and computes: the engine's parameters (a tied LM head stored as its own matrix), layers,
    and KV-cache bytes per cached token."""

    name: str
    params: int
    layers: int
    kv_bytes_per_token: int
    hidden: int

    @classmethod
    def from_config(cls, name: str, config: dict[str, Any], dtype_bytes: int = 2) -> "Shape":
        heads = config["num_attention_heads"]
        kv = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        tied = bool(config.get("tie_word_embeddings"))
        params = _params_from_config(config, tied) or 0
        if tied:
            params += config["vocab_size"] * config["hidden_size"]
        return cls(name, params, config["num_hidden_layers"], 2 * config["num_hidden_layers"] * kv * head_dim * dtype_bytes,
                   config["hidden_size"])

    @classmethod
    def from_checkpoint(cls, info: CheckpointInfo, dtype_bytes: int = 2) -> "Shape":
        c = info.config if "hidden_size" in info.config else info.config.get("text_config", info.config)
        return cls.from_config(info.path.name, c, dtype_bytes)

    @classmethod
    def known(cls, name: str) -> "Shape":
        if name not in KNOWN_SHAPES:
            raise ValueError(f"unknown model shape {name!r}; known: {', '.join(KNOWN_SHAPES)} (or give a checkpoint)")
        return cls.from_config(name, KNOWN_SHAPES[name])


@dataclass(frozen=True)
class GpuCosts:
    """A GPU's step from first principles. `head`: an EAGLE-3 head's step as a share of the target's weights
    (one decoder layer and an LM head over its draft vocabulary: ~3-4% of an 8B target's bytes)."""

    gpu: str
    target: Shape
    draft: Shape | None
    bandwidth_efficiency: float = 0.8
    compute_efficiency: float = 0.6
    launch_s: float = 3e-4  # per step, plus per layer below
    launch_per_layer_s: float = 1.5e-5
    head_share: float = 0.035
    dtype_bytes: int = 2

    @property
    def name(self) -> str:
        return f"{self.gpu} first principles: {self.target.name}" + (f" + {self.draft.name}" if self.draft else "")

    def _step(self, shape: Shape, rows: int, tokens: int, context: int) -> float:
        bw, peak = GPU_PEAKS[self.gpu]
        bw, peak = bw * self.bandwidth_efficiency, peak * self.compute_efficiency
        weights = shape.params * self.dtype_bytes / bw
        flops = tokens * 2 * shape.params / peak
        kv = context * shape.kv_bytes_per_token / bw
        return self.launch_s + self.launch_per_layer_s * shape.layers + max(weights, flops) + kv

    def target_step(self, rows: int, tokens: int, context: int) -> float:
        return self._step(self.target, rows, tokens, context)

    def draft_step(self, rows: int, tokens: int, context: int) -> float:
        if self.draft is None:
            raise ValueError("this cost model has no draft model")
        return self._step(self.draft, rows, tokens, context)

    def head_step(self, rows: int) -> float:
        bw, peak = GPU_PEAKS[self.gpu]
        share = self.head_share * self.target.params
        return self.launch_s / 2 + max(share * self.dtype_bytes / (bw * self.bandwidth_efficiency),
                                       rows * 2 * share / (peak * self.compute_efficiency))

    def assumptions(self) -> list[str]:
        bw, peak = GPU_PEAKS[self.gpu]
        out = [
            f"{self.gpu}: {bw / 1e12:.2f} TB/s at {self.bandwidth_efficiency:.0%}, {peak / 1e12:.0f} TFLOP/s bf16 at "
            f"{self.compute_efficiency:.0%}; launch {self.launch_s * 1e3:.2f} ms + {self.launch_per_layer_s * 1e6:.0f} "
            "us per layer a step",
        ]
        for role, s in (("target", self.target), ("draft", self.draft)):
            if s is not None:
                out.append(f"{role} {s.name}: {s.params / 1e9:.2f}B parameters ({self.dtype_bytes} bytes each), "
                           f"{s.layers} layers, {s.kv_bytes_per_token / 1024:.0f} KiB of KV per token; a decode step "
                           f"of one row at 1k context {self._step(s, 1, 1, 1024) * 1e3:.2f} ms")
        out.append(f"an in-engine head step: {self.head_share:.1%} of the target's weights "
                   f"({self.head_step(1) * 1e3:.2f} ms at one row)")
        return out


def _interp(points: dict[int, float], x: float) -> float:
    """Piecewise-linear through the points, extended along the last segment."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    for a, b in zip(xs, xs[1:]):
        if x <= b or b == xs[-1]:
            return points[a] + (points[b] - points[a]) * (x - a) / (b - a)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class EngineCurve:
    """One engine's measured steps (bench-engine): seconds by one-token rows, and by tokens verified in one row."""

    label: str
    batch_s: dict[int, float]  # rows of one token -> s (1: the decode step)
    verify_s: dict[int, float]  # tokens in one row -> s (1: the decode step)

    @classmethod
    def from_bench_engine(cls, path: Path, dtype: str | None = None) -> "EngineCurve":
        data = json.loads(Path(path).read_text())
        runs = data if isinstance(data, list) else data.get("results", [data])
        run = next((r for r in runs if dtype in (None, r.get("dtype"), r.get("requested_dtype"))), None)
        if run is None:
            raise ValueError(f"{path}: no figures for dtype {dtype!r}")
        step = run["step_ms"] / 1e3
        return cls(
            f"{run.get('device', 'cpu')} {run['dtype']} ({path.name})",
            {1: step, **{int(m): v / 1e3 for m, v in run["batch_ms"].items()}},
            {1: step, **{int(n): v / 1e3 for n, v in run["verify_ms"].items()}},
        )

    def step(self, rows: int, tokens: int) -> float:
        # rows of one token each, then what the extra tokens of verify rows add as one row's verify does; at least
        # what as many one-token rows cost (a compute-bound step, a CPU's, prices a token alike in any row)
        extra = max(tokens - rows, 0)
        as_rows = _interp(self.batch_s, max(rows, 1)) + _interp(self.verify_s, 1 + extra) - self.verify_s[1]
        return max(as_rows, _interp(self.batch_s, max(tokens, 1)))


@dataclass(frozen=True)
class MeasuredCosts:
    """Steps measured by `trtspec bench-engine` (context as measured there: the KV term is in the figures)."""

    target: EngineCurve
    draft: EngineCurve | None
    head_share: float = 0.15  # an in-engine head step as a share of a decode step (the demo head's, measured)

    @property
    def name(self) -> str:
        return f"measured: {self.target.label}" + (f" + {self.draft.label}" if self.draft else "")

    def target_step(self, rows: int, tokens: int, context: int) -> float:
        return self.target.step(rows, tokens)

    def draft_step(self, rows: int, tokens: int, context: int) -> float:
        if self.draft is None:
            raise ValueError("no draft figures: give the draft's bench-engine JSON too")
        return self.draft.step(rows, tokens)

    def head_step(self, rows: int) -> float:
        return self.head_share * self.target.step(rows, rows)

    def assumptions(self) -> list[str]:
        out = []
        for role, c in (("target", self.target), ("draft", self.draft)):
            if c is not None:
                out.append(f"{role} {c.label}: step {c.batch_s[1] * 1e3:.1f} ms; rows " + ", ".join(
                    f"{m}: {s * 1e3:.1f}" for m, s in sorted(c.batch_s.items())) + " ms; verify " + ", ".join(
                    f"{n}: {s * 1e3:.1f}" for n, s in sorted(c.verify_s.items())) + " ms")
        return out


def _envelope(points: list[tuple[int, float]]) -> dict[int, float]:
    """The steps no step of more tokens undercuts (time by tokens, non-decreasing): between them a step of fewer
    tokens costs no more than the cheapest of more. A step dearer than one of more tokens is left out, so that it
    does not make a cliff between its neighbours."""
    best: dict[int, float] = {}
    for tokens, ms in points:
        best[tokens] = min(ms, best.get(tokens, ms))
    out, floor = {}, math.inf
    for tokens in sorted(best, reverse=True):
        if best[tokens] < floor:
            out[tokens] = floor = best[tokens]
    return out


@dataclass(frozen=True)
class StepGrid:
    """One model's measured steps (ms) by (rows, tokens per row) at `context` cached tokens per row, and what one
    more cached token of a row adds by (rows, tokens per row), from the cells measured at a longer context."""

    cells: dict[tuple[int, int], float]
    context: int
    per_cached_token: dict[tuple[int, int], float]

    @classmethod
    def from_steps(cls, steps: list[dict], model: str, attention: str = "unmasked") -> "StepGrid":
        """`attention`: which of a multi-token row's two timings to take where both were measured (masked:
        torch's memory-efficient kernel with the causal mask; unmasked: the flash kernel, the same FLOPs)."""
        mine = [s for s in steps if s["model"] == model and s.get("graph", True)]
        if any(s.get("attention") == attention for s in mine):
            mine = [s for s in mine if s["tokens"] == 1 or s.get("attention") == attention]
        if not mine:
            raise ValueError(f"no {model!r} steps in the file")
        base = min(s["context"] for s in mine)
        cells = {(s["rows"], s["tokens"]): s["ms"] for s in mine if s["context"] == base}
        per_token = {}
        for s in mine:
            key = (s["rows"], s["tokens"])
            if s["context"] > base and key in cells:
                per_token[key] = max(s["ms"] - cells[key], 0.0) / (s["rows"] * (s["context"] - base))
        return cls(cells, base, per_token)

    @cached_property
    def _by_rows(self) -> dict[int, dict[int, float]]:
        """Row count -> {tokens in all: ms}, the row counts ascending."""
        out: dict[int, dict[int, float]] = {}
        for (r, t), ms in sorted(self.cells.items()):
            out.setdefault(r, {})[r * t] = ms
        return out

    @cached_property
    def _envelope(self) -> dict[int, float]:
        return _envelope([(r * t, ms) for (r, t), ms in self.cells.items()])

    def _at_rows(self, rows: int, tokens: float) -> float:
        """Interpolated along the tokens measured at this row count (a measured count); past the most measured
        there, the most (what more tokens add comes from the envelope over every row count)."""
        points = self._by_rows[rows]
        return _interp(points, min(tokens, max(points)))

    def ms(self, rows: int, tokens: int, context: int) -> float:
        """A step of `rows` rows holding `tokens` tokens in all over `context` cached tokens in all."""
        measured = list(self._by_rows)
        rows = max(rows, 1)
        lo = max([r for r in measured if r <= rows], default=measured[0])
        hi = min([r for r in measured if r >= rows], default=measured[-1])
        tokens = max(tokens, rows)
        per_row = tokens / rows  # between measured row counts, at as many tokens a row
        at_lo, at_hi = self._at_rows(lo, lo * per_row), self._at_rows(hi, hi * per_row)
        grid = at_lo if lo == hi else at_lo + (at_hi - at_lo) * (rows - lo) / (hi - lo)
        if per_row > min(max(self._by_rows[lo]) / lo, max(self._by_rows[hi]) / hi):
            # a prefill chunk holds more tokens than the rows measured: at least what as many tokens cost anywhere,
            # and past the most measured, what each more token adds to a long row's step (compute-bound there)
            envelope = self._envelope
            most = max(envelope)
            grid = max(grid, _interp(envelope, tokens) if tokens <= most
                       else envelope[most] + self._per_token_ms * (tokens - most))
        return grid + self._kv(rows, tokens, context)

    @cached_property
    def _per_token_ms(self) -> float:
        """What one more token adds to a step where arithmetic bounds it: between the two longest one-row steps
        measured (a prompt's prefill), else the two heaviest steps by their tokens."""
        rows = sorted(((r * t, ms) for (r, t), ms in self.cells.items() if r == 1), reverse=True)
        if len(rows) < 2 or rows[0][0] < 128:
            rows = sorted(((r * t, ms) for (r, t), ms in self.cells.items()), reverse=True)
        (t1, m1), (t0, m0) = rows[0], next(p for p in rows[1:] if p[0] < rows[0][0])
        return max((m1 - m0) / (t1 - t0), 0.0)

    def _kv(self, rows: int, tokens: int, context: int) -> float:
        """What the cached tokens beyond (or short of) the measured context add: the measured per-token cost of
        the nearest measured row count and tokens per row (none measured: nothing)."""
        if not self.per_cached_token:
            return 0.0
        per_row = tokens / rows
        key = min(self.per_cached_token, key=lambda k: (abs(math.log2(k[0] / rows)), abs(k[1] - per_row)))
        return self.per_cached_token[key] * (context - rows * self.context)


@dataclass(frozen=True)
class GridCosts:
    """Steps measured on a GPU by `scripts/gpu_step_costs.py` (one JSON: the target, the draft model and an
    EAGLE-3 head, each as CUDA graphs)."""

    label: str
    target: StepGrid
    draft: StepGrid | None
    head: StepGrid | None
    ceilings: dict[str, float]

    @classmethod
    def from_file(cls, path: Path, attention: str = "unmasked") -> "GridCosts":
        """`attention`: a verify row's attention as the flash kernel ran it (unmasked, the default: what a kernel
        made for verify rows, TensorRT-LLM's, costs at least) or torch's masked kernel (masked: at most)."""
        data = json.loads(Path(path).read_text())
        models = {s["model"] for s in data["steps"]}
        grid = lambda name: StepGrid.from_steps(data["steps"], name, attention) if name in models else None  # noqa: E731
        return cls(f"{data['device']}, {data['dtype']}: {data['target']}" + (f" + {data['draft']}" if "draft" in models else "")
                   + f", verify attention {attention}", grid("target"), grid("draft"), grid("eagle3_head"), data.get("ceilings", {}))

    @staticmethod
    def is_grid(path: Path) -> bool:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and "steps" in data and "ceilings" in data

    @property
    def name(self) -> str:
        return f"measured on {self.label}"

    def target_step(self, rows: int, tokens: int, context: int) -> float:
        return self.target.ms(rows, tokens, context) / 1e3

    def draft_step(self, rows: int, tokens: int, context: int) -> float:
        if self.draft is None:
            raise ValueError("the file has no draft-model steps")
        return self.draft.ms(rows, tokens, context) / 1e3

    def head_step(self, rows: int) -> float:
        if self.head is None:
            raise ValueError("the file has no EAGLE-3 head steps")
        return self.head.ms(rows, rows, rows * self.head.context) / 1e3

    def assumptions(self) -> list[str]:
        c = self.ceilings
        out = [f"{self.label}; ceilings measured: copy {c.get('copy_tb_s', 0):.2f} TB/s, bf16 "
               f"{c.get('bf16_tflop_s', 0):.0f} TFLOP/s" if c else self.label]
        for role, g in (("target", self.target), ("draft", self.draft), ("EAGLE-3 head", self.head)):
            if g is not None:
                out.append(f"{role}: one row {g.cells[(1, 1)]:.2f} ms, " + ", ".join(
                    f"{r} rows {g.cells[(r, 1)]:.2f}" for r in (16, 64, 256) if (r, 1) in g.cells)
                    + f" ms (one token each, {g.context} cached per row)")
        if self.draft is not None and not self.draft.per_cached_token:
            out.append("the draft's steps at the measured context alone (its KV reads do not grow with context)")
        return out
