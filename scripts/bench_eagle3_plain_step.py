#!/usr/bin/env python
"""A plain target step with the EAGLE-3 head loaded against the baseline's, side by side in one process, and what
the head's catch-up costs when drafting resumes after m plain steps.

Two engines on the demo target (same kernels, one torch thread): one without a head (the baseline) and one with
the shipped head (`demo-eagle3`'s target). Cells, interleaved round by round, medians of one-token calls:

* ``baseline``          no head: a call asking one token (what a streamed request, or the loop per token, sends)
* ``baseline run/tok``  no head: a 16-token run, per token (what the baseline loop sends a request that is not streamed)
* ``head asks 0``       head loaded, the call asks no draft (next_draft_len 0): must cost the baseline's step
* ``head asks 1``       head loaded, every call asks one draft token (the loop through a k = 0 stretch before)
* ``verify 1, asks k``  head loaded: a call verifying a 1-token draft of the head and asking k more (k = 1 drafting)
* ``resume after m``    head loaded: the call that asks a draft after m plain calls asked none (the catch-up);
                        its extra over ``head asks 0`` is the catch-up's cost, fitted as c0 + c1 * m

Times are the process's CPU time per call by default (--clock wall for wall time; on a GPU always wall time, the
engine's call ending when its tokens are on the host).

    python scripts/bench_eagle3_plain_step.py [--rounds 12] [--linear-kernels compiled] [--json out.json]
    python scripts/bench_eagle3_plain_step.py --device cuda --dtype bfloat16 --target DIR --warm   # any target of the demo's shapes
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# TRTSPEC_SOURCE: measure another checkout's engine (e.g. main, for a before/after) with this script
sys.path.insert(0, os.environ.get("TRTSPEC_SOURCE", str(Path(__file__).resolve().parent.parent)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from trtspec.demo_pair import EAGLE3_ASSET_DIR, resolve_checkpoint  # noqa: E402
from trtspec.reference_engine import EngineRequest, ReferenceEngine  # noqa: E402

GAPS = (1, 8, 32)
WARM_SPAN = 760  # the context lengths past the prompt the cells meet before a new prompt starts them again


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--linear-kernels", default="compiled")
    ap.add_argument("--context", type=int, default=96, help="prompt tokens before the measured calls")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu (default): the process's CPU time per call, which other work on a shared machine "
                         "disturbs far less than wall time (one torch thread: a call's compute is its CPU time)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: the engines' device")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--target", default="demo:target",
                    help="the target checkpoint (the shipped head needs the demo target's shapes: hidden 576, 49152 ids)")
    ap.add_argument("--warm", action="store_true",
                    help="first run both engines once at every context length the cells meet, one token and a "
                         "verified draft token each: on a GPU, bf16 attention (cuDNN) plans a graph for each new "
                         "shape, and the engine that meets a length first pays for it")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    on_cpu = args.device == "cpu"
    if not on_cpu:
        args.clock = "wall"
    torch.set_num_threads(1)
    target = resolve_checkpoint(args.target)
    kw = dict(device=args.device, dtype=args.dtype, cache_entries=64,
              linear_kernels=args.linear_kernels if on_cpu else "auto")
    base = ReferenceEngine(target, **kw)
    spec = ReferenceEngine(target, eagle3_head=EAGLE3_ASSET_DIR, **kw)
    prompt = list(range(1000, 1000 + args.context))

    clock = time.perf_counter if args.clock == "wall" else time.process_time

    def call(engine: ReferenceEngine, seq: list[int], n: int = 1, k: int = 0) -> tuple[float, list[int]]:
        t = clock()
        tokens = engine.run(EngineRequest(seq, n, next_draft_len=k)).tokens
        return clock() - t, tokens

    def verify(seq: list[int], k: int) -> tuple[float, list[int]]:
        """A call verifying the head's 1-token draft (asked for by a call just before) and asking k more."""
        r = spec.run(EngineRequest(seq, 1, next_draft_len=1))
        t = clock()
        tokens = spec.run(EngineRequest(r.tokens, 2, draft_ids=r.next_draft_ids[:1], next_draft_len=k)).tokens
        return clock() - t, tokens

    cells: dict[str, list[float]] = {name: [] for name in ("baseline", "baseline run/tok", "head asks 0", "head asks 1",
                                                           "verify 1, asks 0", "verify 1, asks 1")}
    cells.update({f"resume after {m}": [] for m in GAPS})
    if args.warm:
        started = time.perf_counter()
        span = min(WARM_SPAN, 60 * args.rounds)  # a round takes the head's sequence ~50 positions on
        filler = list(range(2000, 2000 + span))
        for engine in (base, spec):
            for length in range(args.context, args.context + span):
                seq = (prompt + filler)[:length]
                engine.run(EngineRequest(seq, 1))
                engine.run(EngineRequest(seq, 2, draft_ids=[7]))
                if engine is spec:  # the head's own attention, over its cache of each length
                    engine.run(EngineRequest(seq, 1, next_draft_len=1))
        print(f"warmed both engines over {span} context lengths in {time.perf_counter() - started:.0f} s",
              flush=True)
    seqs = {"base": call(base, prompt)[1], "spec": call(spec, prompt, k=1)[1]}
    def base_cells() -> None:
        t, seqs["base"] = call(base, seqs["base"])
        cells["baseline"].append(t)
        t, seqs["base"] = call(base, seqs["base"], 16)
        cells["baseline run/tok"].append(t / 16)

    def spec_cells() -> None:
        t, seqs["spec"] = call(spec, seqs["spec"], k=1)  # the head current: the next plain call leaves it behind
        t, seqs["spec"] = call(spec, seqs["spec"], k=0)
        cells["head asks 0"].append(t)
        t, seqs["spec"] = call(spec, seqs["spec"], k=1)
        t, seqs["spec"] = call(spec, seqs["spec"], k=1)
        cells["head asks 1"].append(t)
        for k in (0, 1):
            t, seqs["spec"] = verify(seqs["spec"], k)
            cells[f"verify 1, asks {k}"].append(t)
        for m in GAPS:
            for _ in range(m - 1):  # m plain positions since the head's last call: m - 1 here, + this call's own
                seqs["spec"] = call(spec, seqs["spec"], k=0)[1]
            t, seqs["spec"] = call(spec, seqs["spec"], k=1)
            cells[f"resume after {m}"].append(t)

    for r in range(args.rounds):
        # each cell goes on from where the last left its sequence (the prefix cache holds it), as a loop's calls do;
        # the two engines take turns going first, so neither always runs just after the other's long calls
        for cells_of in ((base_cells, spec_cells) if r % 2 == 0 else (spec_cells, base_cells)):
            cells_of()
        if len(seqs["spec"]) > args.context + 600 or len(seqs["base"]) > args.context + 700:
            # a new prompt: greedy decoding would replay the old sequence, whose head cache the store still holds
            prompt = [t + 1 for t in prompt]
            seqs = {"base": call(base, prompt)[1], "spec": call(spec, prompt, k=1)[1]}
    # medians, and minima: on a shared machine the minimum of a cell is the least disturbed sample of it
    med = {name: statistics.median(v) * 1e3 for name, v in cells.items()}
    low = {name: min(v) * 1e3 for name, v in cells.items()}
    out: dict = {}
    for label, st in (("median", med), ("min", low)):
        plain = st["head asks 0"]
        extra = {m: st[f"resume after {m}"] - plain for m in GAPS}
        c1, c0 = np.polyfit(np.array(GAPS, dtype=float), np.array([extra[m] for m in GAPS]), 1)
        out[label] = {
            "ms": {name: round(v, 2) for name, v in st.items()},
            "head_asks_0_over_baseline": round(plain / st["baseline"], 3),
            "head_asks_1_over_baseline": round(st["head asks 1"] / st["baseline"], 3),
            "verify_1_asks_1_over_asks_0_plain": round(st["verify 1, asks 1"] / plain, 3),
            "catchup_extra_ms": {m: round(v, 2) for m, v in extra.items()},
            "catchup_fit_ms": {"c0": round(float(c0), 2), "c1_per_position": round(float(c1), 3)},
        }
    out.update({
        "head_work": spec.eagle3.work.as_dict() if hasattr(spec.eagle3, "work") else None,
        "rounds": args.rounds, "clock": args.clock, "context": args.context, "threads": 1, "warmed": args.warm,
        "device": args.device if on_cpu else torch.cuda.get_device_name(), "dtype": args.dtype,
        "linear_kernels": args.linear_kernels if on_cpu else None, "target": str(target),
        "cpu": platform.processor() or platform.machine(),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    })
    for name in med:
        print(f"{name:20s} median {med[name]:7.1f} ms   min {low[name]:7.1f} ms")
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
