"""torch.compile's Inductor CPP GEMM template (max-autotune, CPP backend, frozen weights) against the engine's
kernels (MKL on column-major weights, oneDNN packed for 4 rows) for the demo target's decoder products, float32,
1 torch thread: compile time, time per sweep of 30 layers at 1 .. 16 rows, and whether a row is bitwise the same
at every row count.

    python scripts/bench_linear_inductor.py [--layers 10] [--rows 1,2,5,8,16] [--rounds 7] [--static]

Random weights of the demo's shapes (q 576x576, k/v 192x576, o 576x576, gate/up 1536x576, down 576x1536) per
layer (10 layers: 140 MB, past the 32 MB L3, so the sweep streams from memory as a step does; times are scaled
to the target's 30 layers). The module is compiled with a dynamic row count (after
the first call torch.compile recompiles dynamic anyway); --static compiles each row count on its own."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # (out, in)


class Sweep(torch.nn.Module):
    """Every decoder product of `layers` layers, each on the input of its width."""

    def __init__(self, layers: int):
        super().__init__()
        self.lins = torch.nn.ModuleList(torch.nn.Linear(i, o, bias=False) for _ in range(layers) for o, i in SHAPES)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
        return [lin(b if lin.in_features == 1536 else a) for lin in self.lins]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--rows", default="1,2,5,8,16")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--static", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    import torch._inductor.config as inductor

    inductor.freezing = True
    inductor.max_autotune = True
    inductor.max_autotune_gemm_backends = "CPP"
    torch.manual_seed(0)
    model = Sweep(a.layers).eval()
    packed = [(torch.ops.mkldnn._reorder_linear_weight(lin.weight.detach(), 4), lin.in_features) for lin in model.lins]
    col_major = [lin.weight.detach().t().contiguous().t() for lin in model.lins]

    def onednn(x, y):
        return [torch.ops.mkldnn._linear_pointwise(y if n == 1536 else x, p, None, "none", [], "") for p, n in packed]

    def mkl(x, y):
        return [torch.nn.functional.linear(y if w.shape[1] == 1536 else x, w) for w in col_major]

    rows = [int(r) for r in a.rows.split(",")]
    inputs = {n: (torch.randn(n, 576), torch.randn(n, 1536)) for n in rows}
    with torch.no_grad():
        compiled = torch.compile(model, dynamic=not a.static)
        for n in rows:
            t = time.perf_counter()
            compiled(*inputs[n])
            print(f"first call at {n} rows (compiles where needed): {time.perf_counter() - t:.1f} s", flush=True)
        kernels = {"MKL column-major": mkl, "oneDNN packed for 4": onednn, "Inductor CPP GEMM": compiled}
        times = {(k, n): [] for k in kernels for n in rows}
        for _ in range(a.rounds):
            for n in rows:
                for k, f in kernels.items():
                    t = time.perf_counter()
                    f(*inputs[n])
                    times[k, n].append((time.perf_counter() - t) * 1e3)
        scale = 30 / a.layers
        print(f"ms per 30 layers' products ({a.layers} timed, median of {a.rounds} interleaved rounds) at rows " + " ".join(map(str, rows)))
        for k in kernels:
            print(f"  {k:20s} " + " ".join(f"{statistics.median(times[k, n]) * scale:6.1f}" for n in rows))
        big = inputs[rows[-1]]
        eager = model(*big)
        print("max |Inductor - eager|:", max((c - e).abs().max().item() for c, e in zip(compiled(*big), eager)))
        for name, f in kernels.items():
            one = [o[:1] for o in f(big[0][:1], big[1][:1])]
            same = all(all(torch.equal(o[:1], r) for o, r in zip(f(big[0][:n], big[1][:n]), one)) for n in rows)
            print(f"  {name:20s} row 0 bitwise the same at every row count: {same}")


if __name__ == "__main__":
    main()
