"""GPU step costs of real model shapes, for `trtspec simulate --costs PATH` (torch only: runs on a bare GPU image).

    python3 scripts/gpu_step_costs.py --out steps.json            # on a GPU: llama-3.1-8b target, llama-3.2-1b
                                                                  # draft, an EAGLE-3 head and Medusa heads, bf16
    python3 scripts/gpu_step_costs.py --device cpu --small --out s.json   # the plumbing, here (tiny shapes)

What the simulator needs and a CPU cannot show: what one engine step costs on a GPU for `rows` requests of
`tokens` tokens each (1: a decode; 1 + k: a verify of k drafts) over `context` cached tokens per row, in the
model's own shapes. Each step is a Llama decoder stack written with torch's own kernels (fused QKV and gate-up
products, RMSNorm, rotary embedding, the KV cache written in place, attention through scaled_dot_product_attention,
the LM head over every token) and replayed as one CUDA graph, as TensorRT-LLM runs its generation steps; a few
cells are also timed eagerly (one launch per kernel), which is what a step without graphs pays. A target step of
several tokens a row is timed twice: with its causal mask (torch's memory-efficient kernel) and without one (the
flash kernel, the same FLOPs): the two bound what a verify row costs with a kernel made for it. Weights are random
(a step's cost does not depend on their values; METHOD.md: never zeros). Times are medians of CUDA-event timings.

Also measured: the copy bandwidth and bf16 matrix rate of the card (the two ceilings), an EAGLE-3 head's step
(fc over three captured hidden states, one decoder layer whose QKV reads the token embedding and the hidden
state, an LM head over its draft vocabulary) and Medusa heads' (a residual block each, the target's LM head
shared). The results are written after every section, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def _known_shapes() -> dict:
    # trtspec/bench/shapes.py is the one home of the shapes; loaded by path so that trtspec's package (pydantic,
    # tritonclient) need not be importable on a bare GPU image.
    path = Path(__file__).resolve().parents[1] / "trtspec" / "bench" / "shapes.py"
    spec = importlib.util.spec_from_file_location("_trtspec_shapes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.KNOWN_SHAPES


SMALL = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=512, vocab_size=1000, tie_word_embeddings=False)


class Stack:
    """Random weights of a Llama-shaped stack and its KV cache for up to `max_rows` rows of `max_len` tokens."""

    def __init__(self, cfg: dict, layers: int, dtype: torch.dtype, device: str, max_rows: int, max_len: int,
                 vocab: int | None = None, qkv_in: int | None = None, fc_in: int = 0):
        h, self.heads, self.kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or h // self.heads
        inter, vocab = cfg["intermediate_size"], vocab or cfg["vocab_size"]
        qkv_in = qkv_in or h

        def w(*shape):
            return torch.randn(*shape, dtype=dtype, device=device) * (1 / math.sqrt(shape[-1]))

        self.layers = [dict(
            ln1=torch.ones(qkv_in, dtype=dtype, device=device), ln2=torch.ones(h, dtype=dtype, device=device),
            qkv=w((self.heads + 2 * self.kv) * self.hd, qkv_in), o=w(h, self.heads * self.hd),
            gate_up=w(2 * inter, h), down=w(h, inter),
            k=torch.randn(max_rows, self.kv, max_len, self.hd, dtype=dtype, device=device),
            v=torch.randn(max_rows, self.kv, max_len, self.hd, dtype=dtype, device=device),
        ) for _ in range(layers)]
        self.norm = torch.ones(h, dtype=dtype, device=device)
        self.lm_head = w(vocab, h)
        self.fc = w(h, fc_in) if fc_in else None
        self.hidden, self.dtype, self.device = h, dtype, device
        inv = 1.0 / (500000 ** (torch.arange(0, self.hd, 2, device=device, dtype=torch.float32) / self.hd))
        ang = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv)
        self.cos, self.sin = torch.cat([ang.cos()] * 2, -1).to(dtype), torch.cat([ang.sin()] * 2, -1).to(dtype)

    def weight_bytes(self) -> int:
        ws = [t for layer in self.layers for n, t in layer.items() if n not in ("k", "v")]
        return sum(t.nbytes for t in ws + [self.lm_head] + ([self.fc] if self.fc is not None else []))

    @staticmethod
    def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, 1e-5)

    def _rope(self, x: torch.Tensor, pos: slice) -> torch.Tensor:  # x: [R, T, heads, hd]
        cos, sin = self.cos[pos][None, :, None], self.sin[pos][None, :, None]
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def attention(self, q, k_all, v_all, rows, tokens, ctx, mask):
        # query heads grouped under their KV head ([R, kv, group x T, hd]): GQA with no copy of the cache
        g = self.heads // self.kv
        q = q.view(rows, tokens, self.kv, g, self.hd).permute(0, 2, 3, 1, 4).reshape(rows, self.kv, g * tokens, self.hd)
        o = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
        return o.view(rows, self.kv, g, tokens, self.hd).permute(0, 3, 1, 2, 4).reshape(rows, tokens, self.heads * self.hd)

    def mask(self, tokens: int, ctx: int) -> torch.Tensor | None:
        """Token i of a row sees the context and tokens 0..i (None for one token: it sees everything)."""
        if tokens == 1:
            return None
        keys = ctx + tokens
        seen = torch.arange(keys, device=self.device)[None, :] <= (ctx + torch.arange(tokens, device=self.device))[:, None]
        # the last dimension's stride a multiple of 16, as the memory-efficient kernel needs (else it pads a copy)
        padded = torch.zeros(self.heads // self.kv * tokens, -(-keys // 16) * 16, dtype=torch.bool, device=self.device)
        padded[:, :keys] = seen.repeat(self.heads // self.kv, 1)
        return padded[None, None, :, :keys]

    def forward(self, x: torch.Tensor, ctx: int, mask, head_in: torch.Tensor | None = None) -> torch.Tensor:
        rows, tokens = x.shape[:2]
        pos = slice(ctx, ctx + tokens)
        if self.fc is not None:  # EAGLE-3: fc over the captured hidden states; QKV reads [embedding, hidden]
            x = head_in @ self.fc.T
        for layer in self.layers:
            inp = torch.cat([x, x], -1) if layer["qkv"].shape[1] != x.shape[-1] else x
            qkv = self._rms(inp, layer["ln1"]) @ layer["qkv"].T
            q, k, v = qkv.split([self.heads * self.hd, self.kv * self.hd, self.kv * self.hd], -1)
            q = self._rope(q.view(rows, tokens, self.heads, self.hd), pos)
            k = self._rope(k.view(rows, tokens, self.kv, self.hd), pos)
            layer["k"][:rows, :, pos] = k.transpose(1, 2)
            layer["v"][:rows, :, pos] = v.view(rows, tokens, self.kv, self.hd).transpose(1, 2)
            a = self.attention(q, layer["k"][:rows, :, :ctx + tokens], layer["v"][:rows, :, :ctx + tokens], rows, tokens, ctx, mask)
            x = x + a @ layer["o"].T
            gate, up = (self._rms(x, layer["ln2"]) @ layer["gate_up"].T).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ layer["down"].T
        return (self._rms(x, self.norm) @ self.lm_head.T).argmax(-1)


def medusa_forward(heads: list[torch.Tensor], lm_head: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Medusa: each head a residual block (x + SiLU(W x)), all heads' rows through the target's LM head in one
    product (it is read once); top token per head."""
    return (torch.cat([hidden + F.silu(hidden @ w.T) for w in heads]) @ lm_head.T).argmax(-1)


def check_attention(device: str) -> float:
    """Max |difference| of the grouped, masked attention from the textbook one (float32, cache expanded per head)."""
    s = Stack(SMALL, 1, torch.float32, device, 3, 40)
    rows, tokens, ctx = 3, 5, 20
    q = torch.randn(rows, tokens, s.heads, s.hd, device=device)
    k, v = (torch.randn(rows, s.kv, ctx + tokens, s.hd, device=device) for _ in range(2))
    got = s.attention(q, k, v, rows, tokens, ctx, s.mask(tokens, ctx))
    g = s.heads // s.kv
    scores = q.transpose(1, 2) @ k.repeat_interleave(g, 1).transpose(-1, -2) / s.hd**0.5
    seen = torch.arange(ctx + tokens, device=device)[None] <= (ctx + torch.arange(tokens, device=device))[:, None]
    want = (scores.masked_fill(~seen, float("-inf")).softmax(-1) @ v.repeat_interleave(g, 1)).transpose(1, 2)
    return (got - want.reshape(rows, tokens, -1)).abs().max().item()


def timed(fn, device: str, reps: int, graph: bool) -> float:
    """Median ms of `fn` (replayed as one CUDA graph when `graph`); on a CPU, wall time."""
    if device != "cuda":
        fn()
        times = []
        for _ in range(max(3, reps // 4)):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    run = fn
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    for _ in range(3):
        run()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    del run
    if graph:
        del g
    return statistics.median(times)


def ceilings(device: str) -> dict:
    if device != "cuda":
        return {}
    x = torch.randn(2**28, dtype=torch.bfloat16, device=device)  # 512 MiB, ten times the L2
    y = torch.empty_like(x)
    copy_ms = timed(lambda: y.copy_(x), device, 20, graph=False)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    mm_ms = timed(lambda: a @ b, device, 20, graph=False)
    del x, y, a, b
    return {"copy_tb_s": 2 * 2**29 / copy_ms / 1e9, "bf16_tflop_s": 2 * 8192**3 / mm_ms / 1e9}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="tiny shapes and few cells (the plumbing check on a CPU)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--target", default="llama-3.1-8b")
    p.add_argument("--draft", default="llama-3.2-1b")
    p.add_argument("--sections", default="all", help="all, or some of grid,prefill,heads (comma-separated)")
    args = p.parse_args()
    device, dtype = args.device, torch.bfloat16
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: use --device cpu --small", file=sys.stderr)
        return 2
    shapes = _known_shapes()
    tcfg = SMALL if args.small else shapes[args.target]
    dcfg = SMALL if args.small else shapes[args.draft]
    rows_all = [1, 2, 4, 8] if args.small else [1, 2, 4, 8, 16, 32, 64, 128, 256]
    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "dtype": "bfloat16", "target": "small" if args.small else args.target,
           "draft": "small" if args.small else args.draft, "ceilings": ceilings(device), "steps": []}
    started = time.perf_counter()
    out["attention_check_max_abs"] = check_attention(device)
    if out["attention_check_max_abs"] > 1e-4:
        print(f"the grouped attention is wrong: {out['attention_check_max_abs']}", file=sys.stderr)
        return 1

    def save():
        out["seconds"] = round(time.perf_counter() - started, 1)
        args.out.write_text(json.dumps(out, indent=1) + "\n")

    def cell(model: str, stack: Stack, rows: int, tokens: int, ctx: int, graph: bool = True, head_in_width: int = 0,
             masked: bool = True):
        x = torch.randn(rows, tokens, stack.hidden, dtype=dtype, device=device)
        head_in = torch.randn(rows, tokens, head_in_width, dtype=dtype, device=device) if head_in_width else None
        mask = stack.mask(tokens, ctx) if masked else None
        with torch.inference_mode():
            ms = timed(lambda: stack.forward(x, ctx, mask, head_in), device, args.reps, graph)
        row = dict(model=model, rows=rows, tokens=tokens, context=ctx, graph=graph, ms=round(ms, 4),
                   attention="masked" if masked else "unmasked")
        out["steps"].append(row)
        print(f"  {model:14s} rows {rows:4d} x {tokens:2d} tokens, context {ctx:5d}{'' if graph else ' eager'}"
              f"{'' if masked else ' unmasked'}: {ms:8.3f} ms", flush=True)

    print(f"{out['device']}  torch {torch.__version__}  ceilings {out['ceilings']}", flush=True)
    ctx_short, ctx_long = (32, 128) if args.small else (512, 2048)
    prefill = [16, 64] if args.small else [64, 128, 256, 512]
    plans = [  # (section, model, cfg, context, [(rows, tokens per row)])
        ("grid", "target", tcfg, ctx_short, [(r, t) for r in rows_all for t in (1, 2, 3, 5, 9)]
         + [(r, t) for r in rows_all if r <= 16 for t in (17, 33)]),
        ("grid", "target", tcfg, ctx_long, [(r, t) for r in rows_all if r <= 64 and r in (1, 4, 16, 64) for t in (1, 5)]),
        ("grid", "draft", dcfg, ctx_short, [(r, t) for r in rows_all for t in (1, 2, 5)]),
        # prefill chunks: one long row (a prompt), which the grid's rows of few tokens do not show
        ("prefill", "target", tcfg, ctx_short, [(1, t) for t in prefill] + [(4, prefill[-2])]),
        ("prefill", "draft", dcfg, ctx_short, [(1, t) for t in prefill] + [(4, prefill[-2])]),
    ]
    wanted = {"grid", "prefill", "heads"} if args.sections == "all" else set(args.sections.split(","))
    for section, model, cfg, ctx, cells in plans:
        if section not in wanted:
            continue
        max_rows, max_len = max(r for r, _ in cells), ctx + max(t for _, t in cells)
        stack = Stack(cfg, cfg["num_hidden_layers"], dtype, device, max_rows, max_len)
        out.setdefault("weight_bytes", {})[model] = stack.weight_bytes()
        print(f"{model}: {stack.weight_bytes() / 2**30:.2f} GiB of weights, context {ctx}", flush=True)
        for rows, tokens in cells:
            cell(model, stack, rows, tokens, ctx)
            if model == "target" and tokens > 1:
                # the same FLOPs through the flash kernel (no mask): what a verify row costs with an attention
                # kernel made for it (TensorRT-LLM's), against torch's masked memory-efficient kernel above
                cell(model, stack, rows, tokens, ctx, masked=False)
        if device == "cuda" and model == "target" and ctx == ctx_short and len(cells) > 20:
            for rows in (1, 16, 64):  # what a step without CUDA graphs pays: a launch per kernel
                cell(model, stack, rows, 1, ctx, graph=False)
        del stack
        if device == "cuda":
            torch.cuda.empty_cache()
        save()

    if "heads" not in wanted:
        print(f"written {args.out} in {out['seconds']} s")
        return 0
    # EAGLE-3 head on the target's shapes: fc 3h -> h, one layer whose QKV reads 2h, LM head over 32k draft tokens
    h = tcfg["hidden_size"]
    head = Stack(tcfg, 1, dtype, device, max(rows_all), ctx_short + 5, vocab=32000 if not args.small else 500,
                 qkv_in=2 * h, fc_in=3 * h)
    out["weight_bytes"]["eagle3_head"] = head.weight_bytes()
    for rows in rows_all:
        for tokens in (1, 3):
            cell("eagle3_head", head, rows, tokens, ctx_short, head_in_width=3 * h)
    del head
    # Medusa: 4 residual heads of h x h, each into the target's LM head (read again: the heads run after the step)
    heads = [torch.randn(h, h, dtype=dtype, device=device) / math.sqrt(h) for _ in range(4)]
    lm = torch.randn(tcfg["vocab_size"], h, dtype=dtype, device=device) / math.sqrt(h)
    out["weight_bytes"]["medusa_heads"] = sum(w.nbytes for w in heads) + lm.nbytes
    for rows in rows_all:
        hid = torch.randn(rows, h, dtype=dtype, device=device)
        with torch.inference_mode():
            ms = timed(lambda: medusa_forward(heads, lm, hid), device, args.reps, True)
        out["steps"].append(dict(model="medusa_heads", rows=rows, tokens=1, context=0, graph=True, ms=round(ms, 4)))
        print(f"  medusa_heads   rows {rows:4d}: {ms:8.3f} ms", flush=True)
    save()

    print("==== summary (ms, CUDA graphs; context %d per row)" % ctx_short)
    by = {(s["model"], s["rows"], s["tokens"], s["context"], s["graph"]): s["ms"] for s in out["steps"]}
    print("rows  " + "  ".join(f"{'T' + str(t):>7s}" for t in (1, 2, 3, 5, 9)) + "   draft T1  head T1  medusa")
    for r in rows_all:
        print(f"{r:4d}  " + "  ".join(f"{by.get(('target', r, t, ctx_short, True), float('nan')):7.2f}" for t in (1, 2, 3, 5, 9))
              + f"   {by.get(('draft', r, 1, ctx_short, True), float('nan')):7.2f}  {by.get(('eagle3_head', r, 1, ctx_short, True), float('nan')):7.2f}"
              + f"  {by.get(('medusa_heads', r, 1, 0, True), float('nan')):7.2f}")
    print(f"written {args.out} in {out['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
