"""Ahead-of-time compiled Inductor CPP GEMM kernels (reference_engine.compiled_linear) against the engine's kernels
(MKL on column-major weights for 1 row, oneDNN packed for 4 rows for 2+) for the demo target's decoder products,
float32, 1 torch thread: compile time, library size, load time in a fresh process, ms per 30 layers' products at
each row count, and whether a row is bitwise the same at every row count.

    python scripts/bench_linear_aoti.py [--kernels DIR] [--layers 10] [--rows 1,2,5,8,16,64] [--rounds 7] [--head]
        [--fused]

Random weights of the demo's shapes (q 576x576, k/v 192x576, o 576x576, gate/up 1536x576, down 576x1536) per
layer; 10 layers (140 MB, past the 32 MB L3: the sweep streams from memory as a step does), times scaled to 30.
Kernels missing from DIR are compiled first (timed). --head: also the 49,152 x 576 LM head, one product per
sweep, reported on its own line. --fused: also the compiled kernels with q/k/v and gate/up fused into one
product each (960x576 and 3072x576: 4 products per layer instead of 7; the same weights, concatenated).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # (out, in)
HEAD = (49152, 576)
FUSED = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # q+k+v, o, gate+up, down

LOAD_CHILD = """
import time, sys
t0 = time.perf_counter()
import torch
from trtspec.reference_engine import compiled_linear as cl
torch.set_num_threads(1)
t1 = time.perf_counter()
kernels = cl.load_manifest(sys.argv[1])
lins = [torch.nn.Linear(i, o, bias=False) for _ in range(30) for o, i in %r]
t2 = time.perf_counter()
done = [cl.CompiledLinear(l, kernels[l.out_features, l.in_features]) for l in lins]
t3 = time.perf_counter()
print(f"import torch {t1 - t0:.2f} s; load {len(done)} layers' kernels and block their weights {t3 - t2:.2f} s")
""" % (SHAPES,)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", default="/tmp/trtspec-aoti-kernels")
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--rows", default="1,2,5,8,16,64")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--head", action="store_true")
    ap.add_argument("--fused", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from trtspec.reference_engine import compiled_linear as cl

    shapes = sorted(set(SHAPES) | ({HEAD} if a.head else set()) | (set(FUSED) if a.fused else set()))
    t = time.perf_counter()
    cl.compile_kernels(shapes, Path(a.kernels))
    print(f"compile (missing kernels only): {time.perf_counter() - t:.1f} s", flush=True)
    kernels = cl.load_manifest(Path(a.kernels))
    for s in shapes:
        print(f"  {s[0]}x{s[1]}: {kernels[s].library.stat().st_size / 1e6:.1f} MB, blocked {kernels[s].blocked_shape}")
    print(subprocess.run([sys.executable, "-c", LOAD_CHILD, a.kernels], capture_output=True, text=True).stdout.strip(), flush=True)

    torch.manual_seed(0)
    lins = [torch.nn.Linear(i, o, bias=False) for _ in range(a.layers) for o, i in SHAPES]
    for lin in lins:
        lin.weight.data.mul_(0.05)
    sweeps = {"MKL column-major": [(lambda x, w=lin.weight.detach().t().contiguous().t(): torch.nn.functional.linear(x, w)) for lin in lins],
              "oneDNN packed for 4": [(lambda x, p=torch.ops.mkldnn._reorder_linear_weight(lin.weight.detach(), 4):
                                       torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")) for lin in lins],
              "compiled (AOT)": [cl.CompiledLinear(lin, kernels[lin.out_features, lin.in_features]) for lin in lins]}
    if a.fused:  # per layer: cat(q, k, v), o, cat(gate, up), down of the same weights
        fused = []
        for layer in range(a.layers):
            q, k, v, o, g, u, d = lins[7 * layer : 7 * layer + 7]
            for parts in ((q, k, v), (o,), (g, u), (d,)):
                lin = torch.nn.Linear(parts[0].in_features, sum(p.out_features for p in parts), bias=False)
                lin.weight.data = torch.cat([p.weight.detach() for p in parts])
                fused.append(cl.CompiledLinear(lin, kernels[lin.out_features, lin.in_features]))
        sweeps["compiled, fused qkv + gate/up"] = fused
    head = torch.nn.Linear(HEAD[1], HEAD[0], bias=False)
    heads = {"MKL column-major": (lambda x, w=head.weight.detach().t().contiguous().t(): torch.nn.functional.linear(x, w)),
             "oneDNN packed for 4": (lambda x, p=torch.ops.mkldnn._reorder_linear_weight(head.weight.detach(), 4):
                                     torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")),
             "compiled (AOT)": cl.CompiledLinear(head, kernels[HEAD]) if a.head else None}
    rows = [int(r) for r in a.rows.split(",")]
    inputs = {n: (torch.randn(n, 576), torch.randn(n, 1536)) for n in rows}

    def sweep(fs, n):
        x, y = inputs[n]
        return [f(y if f_in(f, lin) == 1536 else x) for f, lin in zip(fs, lins)]

    def f_in(f, lin):
        return f.in_features if isinstance(f, cl.CompiledLinear) else lin.in_features

    times = {(k, n): [] for k in sweeps for n in rows}
    htimes = {(k, n): [] for k in heads for n in rows}
    with torch.inference_mode():
        for k in sweeps:
            for n in rows:
                sweep(sweeps[k], n)
        for _ in range(a.rounds):
            for n in rows:
                for k, fs in sweeps.items():
                    t = time.perf_counter()
                    sweep(fs, n)
                    times[k, n].append((time.perf_counter() - t) * 1e3)
                    if a.head and k in heads:
                        t = time.perf_counter()
                        heads[k](inputs[n][0])
                        htimes[k, n].append((time.perf_counter() - t) * 1e3)
        scale = 30 / a.layers
        print(f"ms per 30 layers' products ({a.layers} timed, median of {a.rounds} interleaved rounds) at rows " + " ".join(map(str, rows)))
        for k in sweeps:
            print(f"  {k:20s} " + " ".join(f"{statistics.median(times[k, n]) * scale:7.1f}" for n in rows))
        if a.head:
            print("ms per LM head product (49152 x 576)")
            for k in heads:
                print(f"  {k:20s} " + " ".join(f"{statistics.median(htimes[k, n]):7.1f}" for n in rows))
        big = max(rows)
        eager = [torch.nn.functional.linear(inputs[big][1] if lin.in_features == 1536 else inputs[big][0], lin.weight) for lin in lins]
        print("max |compiled - eager|:", max((c - e).abs().max().item() for c, e in zip(sweep(sweeps["compiled (AOT)"], big), eager)))
        for name, fs in sweeps.items():
            if name.startswith("compiled, fused"):
                continue
            full = sweep(fs, big)
            same = True
            for n in range(1, big + 1):
                part = [f(v[:n]) for f, v in zip(fs, [inputs[big][1] if lin.in_features == 1536 else inputs[big][0] for lin in lins])]
                same &= all(torch.equal(p, o[:n]) for p, o in zip(part, full))
            print(f"  {name:20s} rows bitwise the same at every row count 1 .. {big}: {same}")


if __name__ == "__main__":
    main()
