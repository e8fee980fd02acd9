"""The reference engine's decode, verify and batched steps with each Linear kernel choice, interleaved in one process.

    python scripts/bench_linear_kernels.py [--checkpoint PATH] [--kernels mkl,mkl+onednn,onednn,compiled] [--rounds 11]
        [--model-head] [--kernel-dir DIR] [--one-attention-call]

One engine per choice of device.LINEAR_KERNELS (float32, 1 torch thread, as the demo serves), each row with 64
tokens of its own KV cache; with --model-head, also each with its logits from the model's own LM head module
instead of engine.lm_head_product (the engine before the head followed the decoder's kernels). Every round
times each cell once on every engine in turn, so a load change on a shared machine hits all of them alike.
Medians over the rounds. "compiled" loads the kernels from --kernel-dir (default: the kernel cache,
compiled_linear.cache_dir(), compiling what is missing first); each engine's load time is printed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

CELLS = [(1, 1), (1, 4), (1, 5), (1, 8), (4, 1), (8, 1)]  # (rows, tokens per row); 5 tokens: 4 drafts + 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default=str(Path.home() / ".cache/trtspec/demo/target"))
    ap.add_argument("--kernels", default="mkl,mkl+onednn,onednn")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--model-head", action="store_true", help="also each engine with the model's own LM head")
    ap.add_argument("--kernel-dir", default=None, help="compiled kernels [default: compiled_linear.cache_dir()]")
    ap.add_argument("--one-attention-call", action="store_true",
                    help="also the compiled engine with a verify's rows in one SDPA call (not batch-invariant)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from trtspec.ragged import Segment
    from trtspec.reference_engine import ReferenceEngine, compiled_linear, device
    from trtspec.reference_engine.kv_cache import new_cache

    if "compiled" in a.kernels.split(","):
        compiled_linear.compile_kernels(compiled_linear.checkpoint_shapes(a.checkpoint), Path(a.kernel_dir) if a.kernel_dir else compiled_linear.cache_dir())
    engines = {}
    for k in a.kernels.split(","):
        device.LINEAR_KERNELS = k
        t = time.perf_counter()
        engines[k] = ReferenceEngine(a.checkpoint, dtype="float32", kernel_dir=a.kernel_dir)
        print(f"{k}: engine loaded in {time.perf_counter() - t:.1f} s", flush=True)
        if k == "compiled" and a.one_attention_call:
            engines[f"{k}, one attention call"] = e = ReferenceEngine(a.checkpoint, dtype="float32", kernel_dir=a.kernel_dir)
            e.batch_invariant = False
        if a.model_head:
            engines[f"{k}, model's head"] = e = ReferenceEngine(a.checkpoint, dtype="float32")
            e._head = None
    ctx = a.context
    bases = {}
    for k, e in engines.items():
        bases[k] = []
        for i in range(max(r for r, _ in CELLS)):
            s = Segment(new_cache(e.model.config), [(i * 7919 + j * 31) % 20000 + 100 for j in range(ctx)], 0, 1)
            e.forward([s])
            bases[k].append(s)

    def once(k: str, rows: int, toks: int) -> float:
        segs = [Segment(b.cache, [500 + j for j in range(toks)], ctx, toks) for b in bases[k][:rows]]
        t = time.perf_counter()
        engines[k].forward(segs)
        dt = time.perf_counter() - t
        for b in bases[k][:rows]:
            b.cache.crop(-toks)
        return dt * 1e3

    times = {(k, c): [] for k in engines for c in CELLS}
    with torch.inference_mode():
        for k in engines:  # warm-up
            for c in CELLS:
                once(k, *c)
        for _ in range(a.rounds):
            for c in CELLS:
                for k in engines:
                    times[k, c].append(once(k, *c))
    print(f"float32, 1 thread, {ctx} tokens of context per row, median of {a.rounds} interleaved rounds")
    for k in engines:
        med = {c: statistics.median(times[k, c]) for c in CELLS}
        st = med[1, 1]
        cells = "  ".join(f"{name} {med[c]:.1f} ms ({med[c] / st:.2f}x)" for name, c in
                          [("verify 4 tok", (1, 4)), ("verify 5 tok", (1, 5)), ("verify 8 tok", (1, 8)), ("4 rows", (4, 1)), ("8 rows", (8, 1))])
        print(f"  {k:24s} step {st:.1f} ms  {cells}", flush=True)


if __name__ == "__main__":
    main()
