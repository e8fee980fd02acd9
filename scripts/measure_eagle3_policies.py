#!/usr/bin/env python
"""The EAGLE-3 loop's draft-length policies side by side, in process (no Triton): the shipped head in the reference
engine, each policy with its own engine and its own fresh controller estimates, request by request on the same
prompts (the order turns each request, so no policy always runs first), greedy, one torch thread.

It prints each policy's tokens per second against target-only's, and its tokens per target call; for the adaptive
policies, what the controller believes at the end (verify seconds by k, the deployment's acceptance by position).
The served equivalent is `trtspec bench --config build_configs/demo-eagle3.yaml --fixed-k 1,2,3 ...`; this one
takes a couple of minutes and isolates the controller's choices from Triton's round trips.

    python scripts/measure_eagle3_policies.py --requests 20 fixed:1 fixed:2 adaptive:3
    python scripts/measure_eagle3_policies.py adaptive:3 'adaptive:3:{"request_weight": 32}'

POLICY is fixed:K or adaptive:K, with an optional third part: JSON fields of `speculative.adaptive`.
Each policy has an engine of its own: one engine's prefix and head caches would carry one policy's answer for a
prompt into the next policy's run of it.
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
from transformers import AutoTokenizer  # noqa: E402

from trtspec.bench.prompts import KINDS, builtin_prompts, load_prompts  # noqa: E402
from trtspec.config import SpeculativeConfig  # noqa: E402
from trtspec.demo_pair import EAGLE3_ASSET_DIR, resolve_checkpoint  # noqa: E402
from trtspec.reference_engine import ReferenceEngine, run_tensors  # noqa: E402
from trtspec.spec.controller import GoodputController  # noqa: E402
from trtspec.spec.loop import LoopRequest, LoopSettings, SpeculativeLoop  # noqa: E402

HELDOUT = REPO / "trtspec" / "assets" / "eval" / "heldout_chat.jsonl"
TARGET_ONLY = "target-only"


def in_process(engine: ReferenceEngine):
    """The loop's engine call, served by `engine` in this process."""
    return lambda model, tensors, wanted: run_tensors(engine, tensors)


def settings(policy: str) -> LoopSettings:
    if policy == TARGET_ONLY:
        return LoopSettings(speculative=SpeculativeConfig(), max_input_len=2048, draft_disabled=True)
    kind, k, *fields = policy.split(":", 2)
    spec = dict(method="eagle3", max_draft_len=8, num_draft_tokens=int(k), draft_length_policy=kind)
    if fields:
        spec["adaptive"] = json.loads(fields[0])
    return LoopSettings(speculative=SpeculativeConfig(**spec), max_input_len=2048)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policies", nargs="+", metavar="POLICY")
    ap.add_argument("--requests", type=int, default=20, help="requests per policy (the prompts in turn)")
    ap.add_argument("--prompts", default=str(HELDOUT),
                    help="a prompt file (default: the held-out chat set), or a built-in kind (chat, code, grounded)")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = resolve_checkpoint("demo:target")
    tokenizer = AutoTokenizer.from_pretrained(target)
    loops = {}
    for policy in [*args.policies, TARGET_ONLY]:
        engine = ReferenceEngine(target, eagle3_head=EAGLE3_ASSET_DIR, device="cpu", dtype="float32",
                                 linear_kernels="compiled")
        loops[policy] = SpeculativeLoop(settings(policy), in_process(engine), in_flight=lambda: 1)
    chosen = builtin_prompts([args.prompts]) if args.prompts in KINDS else load_prompts(args.prompts)
    prompts = [p.text for p in chosen]
    seconds, tokens, calls, answers = dict.fromkeys(loops, 0.0), dict.fromkeys(loops, 0), dict.fromkeys(loops, 0), {}
    for i in range(args.requests):
        ids = tokenizer(prompts[i % len(prompts)])["input_ids"]
        for policy in (list(loops) if i % 2 == 0 else list(reversed(loops))):
            started, out, stats = time.perf_counter(), [], None
            for step in loops[policy].run(LoopRequest(prompt=ids, max_tokens=args.max_tokens,
                                                      end_id=tokenizer.eos_token_id)):
                out += step.new_tokens
                stats = step.stats
            seconds[policy] += time.perf_counter() - started
            tokens[policy] += len(out)
            calls[policy] += stats.num_iterations
            if answers.setdefault(i, out) != out:
                raise SystemExit(f"{policy}: request {i} differs from the other policies' greedy answer")
    base = tokens[TARGET_ONLY] / seconds[TARGET_ONLY]
    for policy in loops:
        rate = tokens[policy] / seconds[policy]
        print(f"{policy:44s} {rate:6.2f} tok/s  {rate / base:5.3f}x target-only  "
              f"{tokens[policy] / calls[policy]:5.2f} tokens per target call")
    for policy, loop in loops.items():
        if policy.startswith("adaptive"):
            ctl = GoodputController(loop.estimates, loop.settings.speculative.adaptive)
            verify = ctl.verify_costs(int(policy.split(":")[1]), 1) or []
            print(f"{policy}: verify ms by k {[round(v * 1e3, 1) for v in verify]}, acceptance by position "
                  f"{[round(a, 3) for a in ctl.acceptance('model', len(verify) - 1, shared=True)]}")


if __name__ == "__main__":
    main()
