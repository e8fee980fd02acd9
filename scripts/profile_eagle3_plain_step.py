#!/usr/bin/env python
"""Where a plain call's time goes with the EAGLE-3 head loaded against the baseline's, on one device and dtype:
each call's wall time in order (to show a bimodal cell), then torch.profiler's top operations for each engine.

    python scripts/profile_eagle3_plain_step.py --device cuda --dtype bfloat16 --target DIR
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from trtspec.demo_pair import EAGLE3_ASSET_DIR, resolve_checkpoint  # noqa: E402
from trtspec.reference_engine import EngineRequest, ReferenceEngine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--target", default="demo:target")
    ap.add_argument("--calls", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = resolve_checkpoint(args.target)
    kw = dict(device=args.device, dtype=args.dtype, cache_entries=64)
    engines = {"baseline": ReferenceEngine(target, **kw), "head": ReferenceEngine(target, eagle3_head=EAGLE3_ASSET_DIR, **kw)}
    prompt = list(range(1000, 1096))
    for name, engine in engines.items():
        seq = engine.run(EngineRequest(prompt, 1, next_draft_len=1 if name == "head" else 0)).tokens
        times = []

        def calls(n: int) -> None:
            nonlocal seq
            for i in range(n):
                ask = 1 if name == "head" and i % 2 == 0 else 0  # the head: every other call asks a draft
                t = time.perf_counter()
                seq = engine.run(EngineRequest(seq, 1, next_draft_len=ask)).tokens
                if not ask:
                    times.append((time.perf_counter() - t) * 1e3)

        calls(args.calls)
        print(f"{name}: plain calls, ms in order: {' '.join(f'{t:.1f}' for t in times)}")
        times.clear()
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if args.device != "cpu" else [])
        with torch.profiler.profile(activities=acts) as prof:
            calls(args.calls)
        print(f"{name}: profiled plain calls, ms: {' '.join(f'{t:.1f}' for t in times)}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=48))


if __name__ == "__main__":
    main()
