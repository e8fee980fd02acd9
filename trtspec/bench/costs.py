"""Cost models for `trtspec simulate`: what a target step, a draft-model step and an in-engine head step cost.

A step of `rows` requests processing `tokens` tokens in all (a plain row 1, a verify row 1 + k, a prefill row its
prompt) over `context` cached tokens in all. Two kinds:

- `GpuCosts`: from first principles for a GPU of trtspec's table and a model's shape (its checkpoint's config):
  launch + max(weight bytes / bandwidth, tokens x FLOPs per token / peak) + KV bytes read / bandwidth, with the
  efficiencies it prints. Memory-bound at small batches, so draft rows are nearly free there; compute-bound at
  large ones, where every row costs.
- `MeasuredCosts`: from `trtspec bench-engine --json` of the target (and of the draft): a CPU's, or a GPU's where
  one was at hand; rows and tokens interpolated between the measured batch and verify steps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trtspec.checkpoint import CheckpointInfo, _params_from_config

# Memory bandwidth (bytes/s) and dense bf16 peak (FLOP/s) of the GPUs trtspec knows (trtspec.machine.KNOWN_GPUS),
# from NVIDIA's data sheets (SXM parts).
GPU_PEAKS: dict[str, tuple[float, float]] = {
    "h100": (3.35e12, 989e12),
    "h200": (4.8e12, 989e12),
    "a100": (2.04e12, 312e12),
    "l40s": (0.864e12, 362e12),
    "a10g": (0.6e12, 70e12),
    "b200": (8.0e12, 2250e12),
    "rtx4090": (1.008e12, 165e12),
}

# Public configs (config.json fields) of models the example build configs name, for a simulation without the
# checkpoints at hand.
KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False),
    "llama-3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True),
    "llama-3.1-70b": dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                          intermediate_size=28672, vocab_size=128256, tie_word_embeddings=False),
    "smollm2-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True),
}


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
