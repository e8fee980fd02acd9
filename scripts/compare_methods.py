#!/usr/bin/env python
"""The demo's speculation methods side by side, in one run: each build config served by its own Triton (`trtspec
bench --config`), on the same prompts and concurrency, its speculative endpoint against its own target-only
endpoint (the same target), then one table of throughput ratios, tokens per target call and acceptance.

    python scripts/compare_methods.py --out compare/ [--concurrency 1] [--requests 10] [--rounds 2]

Default configs: the draft model (`build_configs/demo.yaml`), EAGLE-3 (`demo-eagle3.yaml`) and Medusa
(`demo-medusa.yaml`); default prompts: the held-out chat set (trtspec/assets/eval/heldout_chat.jsonl), which no
shipped draft, head or test prompt was made from. Greedy identity is the tests' (tests/test_medusa.py,
test_eagle3.py, test_shipped_deployment.py); this script measures speed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = {
    "draft model": "build_configs/demo.yaml",
    "EAGLE-3": "build_configs/demo-eagle3.yaml",
    "Medusa": "build_configs/demo-medusa.yaml",
}


def bench(config: str, out: Path, args) -> dict:
    if args.reuse and (out / "results.json").exists():
        return json.loads((out / "results.json").read_text())
    cmd = [sys.executable, "-m", "trtspec.cli", "bench", "--config", str(REPO / config), "--prompts", str(args.prompts),
           "--concurrency", args.concurrency, "--requests", str(args.requests), "--rounds", str(args.rounds),
           "--warmup", "1", "--max-tokens", str(args.max_tokens), "--output", str(out)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads((out / "results.json").read_text())


def rows(method: str, result: dict) -> list[str]:
    base = {c["concurrency"]: c for c in result["cells"] if c["endpoint"] == "baseline"}
    out = []
    for c in result["cells"]:
        if c["endpoint"] == "baseline" or not c["speculative"]:
            continue
        b = base.get(c["concurrency"])
        acc = c.get("acceptance") or {}
        ratio = c["output_tokens_per_s"] / b["output_tokens_per_s"] if b else float("nan")
        tpc = acc.get("tokens_per_target_call")
        rate = acc.get("rate")
        cells = f"{tpc:.2f} | {rate:.0%}" if tpc is not None and rate is not None else "- | -"
        out.append(f"| {method} | {c['label']} | {b['output_tokens_per_s']:.1f} | {c['output_tokens_per_s']:.1f} | "
                   f"**{ratio:.2f}x** | {cells} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--methods", default=",".join(CONFIGS), help=f"comma-separated, of: {', '.join(CONFIGS)}")
    ap.add_argument("--prompts", type=Path, default=REPO / "trtspec" / "assets" / "eval" / "heldout_chat.jsonl")
    ap.add_argument("--concurrency", default="1")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--reuse", action="store_true", help="tabulate a method's results.json already under --out")
    args = ap.parse_args()
    table = ["| method | cell | target-only tok/s | speculative tok/s | speculative / target-only | tokens per target "
             "call | acceptance |", "|---|---:|---:|---:|---:|---:|---:|"]
    for method in args.methods.split(","):
        if method not in CONFIGS:
            ap.error(f"unknown method {method!r}; choose from {', '.join(CONFIGS)}")
        slug = method.lower().replace(" ", "-")
        table += rows(method, bench(CONFIGS[method], args.out / slug, args))
    (args.out / "compare.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
