#!/usr/bin/env python
"""The reference engine's decode step alone, in process (no Triton, no loop): how its cost grows with the
rows in the batch, for each weight layout and torch thread count. It bounds what batching can give through
Triton: total tok/s at M rows over tok/s at 1 row is the best c=M / c=1 any server can reach on this machine.

    HF_HUB_OFFLINE=1 python scripts/engine_step_scaling.py                     # demo target, M = 1, 8, 16
    HF_HUB_OFFLINE=1 python scripts/engine_step_scaling.py --rows 1,4,8 --threads 1 --checkpoint PATH

Each cell: M sequences with --context tokens of KV cache each, one-token decode rows, the best of --reps
runs of --steps steps. The engine stores Linear weights column-major when loaded with one torch thread
(trtspec.reference_engine.device.tune_for_cpu); "as stored" is the checkpoint's own layout, loaded with two.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

LAYOUTS = ("column-major", "as-stored")


def step_ms(engine, rows: int, context: int, steps: int) -> float:
    from transformers import DynamicCache

    from trtspec.ragged import Segment

    segs = [Segment(DynamicCache(), list(range(100 + i, 100 + i + context)), 0, 1) for i in range(rows)]
    engine.forward(segs)

    def step() -> None:
        for s in segs:
            s.start += len(s.tokens)
            s.tokens = [int(s.logits[-1].argmax())]
        engine.forward(segs)

    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="demo:target", help="a local HF checkpoint or demo:target / demo:draft")
    ap.add_argument("--rows", default="1,8,16", help="batch sizes (one-token rows per step)")
    ap.add_argument("--threads", default="1,2", help="torch thread counts to step with")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="weight layouts to load")
    ap.add_argument("--context", type=int, default=60)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()

    import torch

    import trtspec  # noqa: F401  (OMP_WAIT_POLICY before torch's OpenMP starts)
    from trtspec.demo_pair import resolve_checkpoint
    from trtspec.reference_engine import ReferenceEngine

    layouts = args.layouts.split(",")
    unknown = set(layouts) - set(LAYOUTS)
    if unknown:
        ap.error(f"--layouts: unknown {', '.join(sorted(unknown))}; use {', '.join(LAYOUTS)}")
    rows = [int(x) for x in args.rows.split(",")]
    threads = [int(x) for x in args.threads.split(",")]
    checkpoint = resolve_checkpoint(args.checkpoint)
    print(f"{checkpoint}: decode step, {args.context} tokens of context per row, best of {args.reps} x {args.steps} steps")
    for layout in layouts:
        torch.set_num_threads(1 if layout == "column-major" else 2)  # tune_for_cpu reads it at load
        engine = ReferenceEngine(checkpoint, device="cpu")
        best: dict[tuple[int, int], float] = {}
        for _ in range(args.reps):
            for m in rows:
                for t in threads:
                    torch.set_num_threads(t)
                    ms = step_ms(engine, m, args.context, args.steps)
                    best[m, t] = min(best.get((m, t), ms), ms)
        for t in threads:
            base = best[rows[0], t] / rows[0]
            cells = "  ".join(f"M={m}: {best[m, t]:.0f} ms ({m * 1000 / best[m, t]:.1f} tok/s, {base * m / best[m, t]:.1f}x)" for m in rows)
            print(f"{layout:13s} {t} thread(s)  {cells}")
        del engine


if __name__ == "__main__":
    main()
