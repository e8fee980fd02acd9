#!/usr/bin/env python
"""The demo Medusa heads at c requests in flight, in the reference engine in-process (its in-flight batcher,
trtspec.reference_engine.batching), on held-out chat prompts: tokens per second against the same engine without
heads, for the whole tree verified every step (`full`, the policy before the engine chose the size) and for the
size the engine chooses per step (`auto`, trtspec.reference_engine.tree_size); greedy output checked identical.

    python scripts/measure_medusa_load.py --limit 8 --tokens 64 --concurrency 1,4,8
    python scripts/measure_medusa_load.py --limit 0 --tokens 48 --policies auto --rounds 4 --threads 1 --linear-kernels compiled

`--rounds N` runs each cell's engines N times, in turn and in the reverse order every other round (target-only,
auto, auto, target-only, ...), and sums their times: this machine's drift between runs falls on both sides alike.

Prompts: trtspec/assets/eval/heldout_chat.jsonl (in no other prompt set of trtspec and not in training).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=Path, default=REPO / "trtspec" / "assets" / "demo_medusa")
    ap.add_argument("--prompts", type=Path, default=REPO / "trtspec" / "assets" / "eval" / "heldout_chat.jsonl")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=8, help="first N prompts (0: all)")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--policies", default="full,auto", help="full, auto, or a number of nodes: comma-separated")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each cell per engine, interleaved (see above)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--linear-kernels", default="auto")
    args = ap.parse_args()
    import torch
    from transformers import AutoTokenizer

    from trtspec.demo_pair import ensure_target
    from trtspec.medusa import DEFAULT_CHOICES
    from trtspec.reference_engine import EngineRequest, ReferenceEngine
    from trtspec.reference_engine.batching import BatchScheduler
    from trtspec.reference_engine.medusa import TreeWork

    torch.set_num_threads(args.threads)
    target = ensure_target()
    tok = AutoTokenizer.from_pretrained(target)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.startswith("{")]
    rows = rows[: args.limit] if args.limit else rows
    prompts = [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
    kw = dict(device="cpu", dtype="float32", cache_entries=4 * len(prompts), linear_kernels=args.linear_kernels)
    engines = {"target-only": ReferenceEngine(target, **kw)}
    for policy in args.policies.split(","):
        size = len(DEFAULT_CHOICES) if policy == "full" else policy if policy == "auto" else int(policy)
        engines[policy] = ReferenceEngine(target, medusa_heads=args.heads, **kw, medusa_tree_size=size)

    def run(engine: ReferenceEngine, c: int, prompts: list[list[int]] = prompts) -> tuple[list[list[int]], float]:
        engine.cache = type(engine.cache)(engine.cache.max_entries, engine.cache.max_bytes)  # no reuse across runs
        scheduler = BatchScheduler(engine, max_batch_size=c)
        try:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                outs = list(pool.map(lambda p: scheduler.run(EngineRequest(p, args.tokens, end_id=end)).new_tokens, prompts))
            return outs, time.perf_counter() - t0
        finally:
            scheduler.close()

    for engine in engines.values():  # warm-up on two prompts: kernels, and the tree size's first measurements
        run(engine, 1, prompts[:2])
    report = {"prompts": len(prompts), "max_tokens": args.tokens, "threads": args.threads, "rounds": args.rounds,
              "cells": []}
    for c in [int(x) for x in args.concurrency.split(",")]:
        seconds = dict.fromkeys(engines, 0.0)
        outs: dict[str, list] = {}
        for name in engines:
            if name != "target-only":
                engines[name].medusa_work = TreeWork()
        for r in range(args.rounds):
            for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
                got, s = run(engines[name], c)
                seconds[name] += s
                outs.setdefault(name, []).append(got)
        want = outs["target-only"][0]
        n = sum(len(o) for o in want) * args.rounds
        base_s = seconds["target-only"]
        cell = {"c": c, "tokens": n, "rounds": args.rounds, "target_only_tok_s": round(n / base_s, 1)}
        for name, engine in engines.items():
            if name == "target-only":
                continue
            w, s = engine.medusa_work, seconds[name]
            cell[name] = {"identical": all(o == want for o in outs[name] + outs["target-only"]),
                          "tok_s": round(n / s, 1), "vs_target_only": round(base_s / s, 3),
                          "tokens_per_call": round(n / (sum(w.sizes) + len(prompts) * args.rounds), 3),
                          "steps_by_size": w.sizes, "accepted_per_depth": [round(x, 3) for x in w.reached()]}
        report["cells"].append(cell)
        print(json.dumps(cell), flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
