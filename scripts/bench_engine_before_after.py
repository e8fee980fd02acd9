"""The reference engine's step on an earlier revision and on this checkout, side by side, in one run.

    python scripts/bench_engine_before_after.py [--before main] [--threads 1,2] [--contexts 64,512] [--reps 7]

The earlier revision's trtspec is exported with `git archive` (the working tree is untouched). Each cell runs in
its own process, before and after back to back, with the same measuring code (this checkout's
trtspec/reference_engine/limits.py: the GEMV limit, decode, verify of 2/4/8 tokens, 4/8/16 one-token rows,
each row continuing its own KV cache) and the same torch thread count, set before the engine loads. Then one
decode step and one verify of 4 under torch.profiler: the share of its CPU time in weight products (aten::mm),
attention (SDPA), KV-cache concatenation or writes (aten::cat, aten::copy_) and everything else.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMITS = REPO / "trtspec" / "reference_engine" / "limits.py"
KINDS = {"weights (mm)": ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise"), "attention (SDPA)": ("aten::_scaled_dot_product",),
         "KV cat / copy": ("aten::cat", "aten::copy_")}


def export_revision(rev: str, dest: Path) -> None:
    with tempfile.TemporaryFile() as tar:
        subprocess.run(["git", "-C", str(REPO), "archive", rev, "trtspec"], stdout=tar, check=True)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as t:
            t.extractall(dest, filter="data")


def _load_limits():
    """This checkout's limits.py, whichever trtspec is imported (an older one lacks kv_cache: transformers' cache)."""
    try:
        import trtspec.reference_engine.kv_cache  # noqa: F401
    except ImportError:
        from transformers import DynamicCache

        stub = types.ModuleType("trtspec.reference_engine.kv_cache")
        stub.new_cache = lambda config: DynamicCache(config=config)
        sys.modules[stub.__name__] = stub
    spec = importlib.util.spec_from_file_location("limits_under_test", LIMITS)
    limits = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = limits  # dataclasses look their module up there
    spec.loader.exec_module(limits)
    return limits


def profile_shares(engine, limits, context: int, tokens: int, steps: int = 5) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from trtspec.ragged import Segment

    seg = Segment(limits.new_cache(engine.model.config), [100 + i for i in range(context)], 0, 1)
    engine.forward([seg])

    def step() -> None:
        engine.forward([Segment(seg.cache, [500 + j for j in range(tokens)], context, tokens)])
        seg.cache.crop(-tokens)

    step()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(steps):
            step()
    events = p.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    parts = {k: sum(e.self_cpu_time_total for e in events if e.key.startswith(prefixes)) for k, prefixes in KINDS.items()}
    parts["rest (Python, dispatch, small ops)"] = total - sum(parts.values())
    calls = sum(e.count for e in events) // steps
    return f"{total / steps / 1e3:.1f} ms of CPU per step, {calls} ops: " + ", ".join(
        f"{k} {v / total:.0%}" for k, v in parts.items())


def row_major(engine) -> None:
    """Undo tune_for_cpu's column-major Linear weights (it stores them so with 1 thread): the layout as stored."""
    import torch

    from trtspec.reference_engine.engine import lm_head_product

    for m in engine.model.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight.data = m.weight.data.contiguous()
    engine._head = lm_head_product(engine.model)


def cell(label: str, threads: int, context: int, reps: int) -> None:
    import torch

    torch.set_num_threads(threads)  # before load: tune_for_cpu reads it
    import trtspec
    from trtspec.demo_pair import resolve_checkpoint
    from trtspec.reference_engine import ReferenceEngine

    limits = _load_limits()
    engine = ReferenceEngine(resolve_checkpoint("demo:target"), device="cpu", dtype="float32")
    if "row-major" in label:
        row_major(engine)
    print(f"== {label} ({Path(trtspec.__file__).parent.parent}), {threads} thread(s), context {context}", flush=True)
    for line in limits.report(limits.measure(engine, context=context, reps=reps)):
        print(line, flush=True)
    for name, tokens in (("decode", 1), ("verify 4", 4)):
        print(f"  profile {name:9s} {profile_shares(engine, limits, context, tokens)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="main", help="git revision to compare against")
    ap.add_argument("--threads", default="1", help="comma-separated torch thread counts (the demo serves with 1)")
    ap.add_argument("--contexts", default="64,512", help="comma-separated tokens of KV cache per row")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--row-major", action="store_true", help="also this checkout with Linear weights as stored (row-major)")
    ap.add_argument("--cell", nargs=4, help=argparse.SUPPRESS)  # internal: label threads context reps
    args = ap.parse_args()
    if args.cell:
        label, threads, context, reps = args.cell
        cell(label, int(threads), int(context), int(reps))
        return
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp)
        export_revision(args.before, before)
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.before], capture_output=True, text=True).stdout.strip()
        here = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        for threads in args.threads.split(","):
            for context in args.contexts.split(","):
                cells = [(f"before ({args.before} {rev})", before), (f"after ({here} + working tree)", REPO)]
                if args.row_major:
                    cells.append((f"after, row-major weights ({here} + working tree)", REPO))
                for label, tree in cells:
                    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
                    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--cell", label, threads, context, str(args.reps)],
                                   env=env, check=True, cwd=tree)


if __name__ == "__main__":
    main()
