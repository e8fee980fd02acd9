"""The demo target's LM head (49,152 x 576, tied to the embedding) at 1 .. 16 rows with each kernel and layout the
engine could use, float32, 1 torch thread; interleaved rounds, medians; and whether a row's logits are bitwise the
same at every row count.

    python scripts/bench_linear_head.py [--checkpoint PATH] [--rounds 7]

engine.lm_head_product picks from these: column-major weight (tune_for_cpu's layout) for 1 row, oneDNN packed for
2+ (docs/benchmarks/engine.md)."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

ROWS = [1, 2, 4, 5, 8, 9, 16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default=str(Path.home() / ".cache/trtspec/demo/target"))
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=torch.float32)
    row_major = model.get_output_embeddings().weight.detach().contiguous()
    col_major = row_major.t().contiguous().t()
    packed = {r: torch.ops.mkldnn._reorder_linear_weight(row_major, r) for r in (1, 4, 8)}
    F = torch.nn.functional
    kernels = {
        "MKL, column-major (h W^T)": lambda h: F.linear(h, col_major),
        "MKL, row-major (W h^T)": lambda h: torch.mm(row_major, h.t()),
        "MKL, row-major (h W^T)": lambda h: F.linear(h, row_major),
        **{f"oneDNN packed for {r}": (lambda h, p=p: torch.ops.mkldnn._linear_pointwise(h, p, None, "none", [], ""))
           for r, p in packed.items()},
    }
    hidden = torch.randn(max(ROWS), row_major.shape[1])
    times = {(k, n): [] for k in kernels for n in ROWS}
    with torch.inference_mode():
        for f in kernels.values():
            for n in ROWS:
                f(hidden[:n])
        for _ in range(a.rounds):
            for n in ROWS:
                for k, f in kernels.items():
                    t = time.perf_counter()
                    f(hidden[:n])
                    times[k, n].append((time.perf_counter() - t) * 1e3)
        print(f"LM head {tuple(row_major.shape)}, float32, 1 thread, ms (median of {a.rounds} interleaved rounds) at rows " + " ".join(map(str, ROWS)))
        for k, f in kernels.items():
            one = f(hidden[:1])[:1]
            invariant = all(torch.equal(f(hidden[:n])[:1], one) for n in ROWS)
            print(f"  {k:28s} " + " ".join(f"{statistics.median(times[k, n]):6.1f}" for n in ROWS) + f"   row bitwise the same at every count: {invariant}")


if __name__ == "__main__":
    main()
