"""What the loop benchmark (`trtspec bench-loop`) runs with: its settings and its prompts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from trtspec.bench.runner import BenchError

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "build_configs" / "demo.yaml"
DEFAULT_KINDS = ("chat", "grounded")


@dataclass
class LoopBenchArgs:
    """The benchmark's settings (the options of `trtspec bench-loop`)."""

    config: Path = DEFAULT_CONFIG
    draft: str | None = None
    k: int = 3
    draft_source: str = "model"
    max_tokens: int = 128
    prompts_per_kind: int = 4
    kinds: Sequence[str] = DEFAULT_KINDS
    output: Path | None = None
    protocol: str = "http"
    stream: bool = False
    warmup: int = 1
    bls_execs: int = 300
    hf_defaults: bool = True
    skip_hf: bool = False
    skip_server: bool = False
    cost_tokens: int = 24
    cost_reps: int = 3
    verify_reps: int = 9
    ready_timeout: float = 600


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    kind: str
    text: str


def select_prompts(kinds: Sequence[str], per_kind: int) -> list[BenchPrompt]:
    """The first ``per_kind`` built-in prompts of each kind (trtspec.bench.prompts: held out of the draft's
    training seeds), interleaved."""
    from trtspec.bench.prompts import builtin_prompts

    out: list[BenchPrompt] = []
    counts = {k: 0 for k in kinds}
    for p in builtin_prompts(kinds):
        if counts[p.kind] < per_kind:
            counts[p.kind] += 1
            out.append(BenchPrompt(p.id, p.kind, p.text))
    short = [k for k, n in counts.items() if n < per_kind]
    if short:
        raise BenchError(
            f"only {min(counts.values())} built-in prompts for kind(s) {', '.join(short)}; lower --prompts-per-kind"
        )
    return out
