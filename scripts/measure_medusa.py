#!/usr/bin/env python
"""The demo Medusa heads on held-out chat prompts, in the reference engine, one request at a time (c = 1):
acceptance per head (the share of tree steps whose accepted path reached depth d), tokens per target call, and
time per request against the same engine without heads; greedy output is checked identical on every prompt.

    python scripts/measure_medusa.py --tokens 96 --trees default,chain

Prompts: trtspec/assets/eval/heldout_chat.jsonl (in no other prompt set of trtspec and not in training).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TREES = {
    "default": [[0], [0, 0], [1], [0, 0, 0], [0, 1]],
    "chain": [[0], [0, 0], [0, 0, 0]],
    "chain2": [[0], [0, 0]],
    "wide": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=Path, default=REPO / "trtspec" / "assets" / "demo_medusa")
    ap.add_argument("--prompts", type=Path, default=REPO / "trtspec" / "assets" / "eval" / "heldout_chat.jsonl")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--limit", type=int, default=0, help="first N prompts (0: all)")
    ap.add_argument("--trees", default="default,chain")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--linear-kernels", default="auto")
    args = ap.parse_args()
    import torch
    from transformers import AutoTokenizer

    from trtspec.demo_pair import ensure_target
    from trtspec.reference_engine import EngineRequest, ReferenceEngine

    torch.set_num_threads(args.threads)
    target = ensure_target()
    tok = AutoTokenizer.from_pretrained(target)
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.startswith("{")]
    rows = rows[: args.limit] if args.limit else rows
    prompts = [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]

    def run(engine) -> tuple[list[list[int]], float, int]:
        outs, t0 = [], time.perf_counter()
        for p in prompts:
            engine.cache = type(engine.cache)(engine.cache.max_entries, engine.cache.max_bytes)  # no reuse across prompts
            outs.append(engine.run(EngineRequest(p, args.tokens, end_id=tok.convert_tokens_to_ids("<|im_end|>"))).new_tokens)
        return outs, time.perf_counter() - t0, sum(len(o) for o in outs)

    kw = dict(device="cpu", dtype="float32", cache_entries=4, linear_kernels=args.linear_kernels)
    plain = ReferenceEngine(target, **kw)
    want, plain_s, n_tokens = run(plain)
    report = {"prompts": len(prompts), "tokens": n_tokens, "max_tokens": args.tokens, "threads": args.threads,
              "target_only_s": round(plain_s, 2), "trees": {}}
    for name in args.trees.split(","):
        engine = ReferenceEngine(target, medusa_heads=args.heads, medusa_choices=TREES[name], **kw)
        got, s, n = run(engine)
        w = engine.medusa_work
        report["trees"][name] = {
            "choices": TREES[name], "rows_per_step": 1 + len(TREES[name]),
            "identical": got == want,
            "tree_steps": w.steps,
            "tokens_per_call": round(n / (w.steps + len(prompts)), 3),  # a prefill step per prompt, then tree steps
            "accepted_per_depth": [round(x, 3) for x in w.reached()],
            "seconds": round(s, 2),
            "speedup": round(plain_s / s, 3),
        }
        print(json.dumps({name: report["trees"][name]}), flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
