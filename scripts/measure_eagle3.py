#!/usr/bin/env python
"""The demo EAGLE-3 head in the reference engine, in process (no Triton): greedy, k draft tokens, per prompt set.

For each prompt it runs target-only decoding and the one-model loop (each target call verifies the previous
answer's ``next_draft_ids`` and returns the next draft), and reports per set: whether the outputs are identical,
acceptance by draft position, tokens per target step, and the wall time of both (one process, one thread).

Sets: a built-in bench kind (``chat``, ``code``, ``grounded``: in-distribution for the demo head, whose training
prompts were written in the bench's chat forms) or ``heldout`` (trtspec/assets/eval/heldout_chat.jsonl: chat prompts
in no other prompt set and disjoint from the training prompts in topic and form), side by side:

    python scripts/measure_eagle3.py --sets chat,heldout --max-tokens 48 --k 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from trtspec import demo_pair  # noqa: E402
from trtspec.bench.prompts import builtin_prompts, load_prompts  # noqa: E402
from trtspec.reference_engine import EngineRequest, ReferenceEngine  # noqa: E402


HELDOUT = REPO / "trtspec" / "assets" / "eval" / "heldout_chat.jsonl"


def prompt_set(name: str) -> list:
    if name == "heldout":
        return load_prompts(HELDOUT)
    return builtin_prompts([name])


def measure(engine: ReferenceEngine, tok, eos: int, prompts: list, K: int, N: int) -> dict:
    """Target-only and the one-model loop on each prompt (cold caches, like new requests)."""
    accepted, proposed = [0] * K, [0] * K
    steps = tokens = 0
    t_base = t_spec = 0.0
    same = []
    for p in prompts:
        ids = tok(p.text, add_special_tokens=False)["input_ids"]
        engine.cache = type(engine.cache)(engine.cache.max_entries, engine.cache.max_bytes)  # cold, like a new request
        t0 = time.perf_counter()
        seq = list(ids)
        while len(seq) - len(ids) < N:  # target-only, one call per token
            r = engine.run(EngineRequest(seq, 1, end_id=eos))
            if not r.new_tokens:
                break
            seq = r.tokens
        base = seq[len(ids):][:N]
        t1 = time.perf_counter()
        engine.cache = type(engine.cache)(engine.cache.max_entries, engine.cache.max_bytes)
        engine.eagle3.store = type(engine.eagle3.store)(engine.eagle3.store.max_entries)
        seq, draft = list(ids), []
        while len(seq) - len(ids) < N:
            remaining = N - (len(seq) - len(ids))
            draft = draft[: max(0, remaining - 1)]
            r = engine.run(EngineRequest(seq, len(draft) + 1, draft_ids=draft or None, end_id=eos, next_draft_len=K))
            steps += 1
            for i in range(len(draft)):
                proposed[i] += 1
                accepted[i] += r.num_accepted > i
            seq, draft = r.tokens, r.next_draft_ids
            if draft is None:  # the end token came: nothing to draft after it
                break
        spec = seq[len(ids):][:N]
        t2 = time.perf_counter()
        t_base += t1 - t0
        t_spec += t2 - t1
        tokens += len(spec)
        same.append(spec == base)
        print(f"{p.id:12s} {'identical' if spec == base else 'DIFFERENT'} {len(spec)} tokens, "
              f"target-only {t1 - t0:.2f}s, eagle3 {t2 - t1:.2f}s", flush=True)
    return {
        "prompts": len(prompts), "identical": f"{sum(same)}/{len(same)}",
        "acceptance_by_position": [round(a / max(n, 1), 3) for a, n in zip(accepted, proposed)],
        "accepted_by_position": accepted, "proposed_by_position": proposed,
        "tokens_per_target_step": round(tokens / max(steps, 1), 3),
        "seconds_target_only": round(t_base, 2), "seconds_eagle3": round(t_spec, 2),
        "speedup_in_process": round(t_base / max(t_spec, 1e-9), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", default=str(demo_pair.EAGLE3_ASSET_DIR))
    ap.add_argument("--sets", default="chat,heldout", help="comma-separated: chat, code, grounded, heldout")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--linear-kernels", default="auto")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target_dir = demo_pair.ensure_target()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    eos = tok.convert_tokens_to_ids(demo_pair.EOS_TOKEN)
    engine = ReferenceEngine(target_dir, device="cpu", eagle3_head=args.head, linear_kernels=args.linear_kernels)
    out = {"k": args.k, "max_tokens": args.max_tokens, "threads": args.threads, "head": args.head, "sets": {}}
    for name in args.sets.split(","):
        out["sets"][name] = measure(engine, tok, eos, prompt_set(name), args.k, args.max_tokens)
    out["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
