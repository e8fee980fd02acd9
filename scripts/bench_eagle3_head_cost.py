"""What the EAGLE-3 head inside the reference engine adds to a target call: a decode call asking the head for
0, 1 or 3 draft tokens for the next call, and a verify of 3 drafts asking 0 or 3; demo target, float32, 1 torch
thread, interleaved rounds, medians. (Why the loop asks for one token through a k = 0 stretch: docs/benchmarks/eagle3.md.)

    python scripts/bench_eagle3_head_cost.py [--rounds 12]
"""

import argparse
import statistics
import time

import torch

from trtspec.demo_pair import EAGLE3_ASSET_DIR, resolve_checkpoint
from trtspec.reference_engine import EngineRequest, ReferenceEngine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine = ReferenceEngine(resolve_checkpoint("demo:target"), device="cpu", dtype="float32",
                             eagle3_head=EAGLE3_ASSET_DIR, cache_entries=64)
    seq = engine.run(EngineRequest(list(range(1000, 1064)), 1, next_draft_len=3)).tokens

    def timed(req: EngineRequest) -> tuple[float, list[int]]:
        t = time.perf_counter()
        tokens = engine.run(req).tokens
        return time.perf_counter() - t, tokens

    decode: dict[int, list[float]] = {0: [], 1: [], 3: []}
    verify: dict[int, list[float]] = {0: [], 3: []}
    for _ in range(args.rounds):
        for cells, drafts in ((decode, None), (verify, [5, 6, 7])):
            for n in cells:
                # a one-token call first: each timed call then finds the head one token behind, as in a loop
                seq = engine.run(EngineRequest(seq, 1, next_draft_len=1)).tokens
                seconds, seq = timed(EngineRequest(seq, 1, draft_ids=drafts, next_draft_len=n))
                cells[n].append(seconds)
    ms = lambda v: f"{statistics.median(v) * 1e3:.1f} ms"  # noqa: E731
    print("decode call, next draft 0 / 1 / 3 tokens:", " / ".join(ms(decode[n]) for n in (0, 1, 3)))
    print("verify of 3 drafts, next draft 0 / 3 tokens:", " / ".join(ms(verify[n]) for n in (0, 3)),
          f"(context {len(seq)} tokens at the end)")


if __name__ == "__main__":
    main()
