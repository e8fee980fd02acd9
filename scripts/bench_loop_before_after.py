"""The loop benchmark on an earlier revision and on this checkout, side by side, in one run.

    python scripts/bench_loop_before_after.py [--before c490b5b] [--sources model,ngram] [--output DIR]
                                              [-- extra options for both benchmarks]

For each draft source it runs the earlier revision's loop benchmark (its code exported with `git archive`
into DIR/before-src, so the working tree is untouched) and then this checkout's `trtspec bench-loop`,
back to back, each on a fresh throwaway Triton server, and prints one table: loop overhead per
iteration, one BLS round trip, the overhead in round trips against the target for that source,
end-to-end tok/s and token identity. The earlier revision chose the draft source in the build config
(`speculative.draft_source`); later ones take it per request (`--draft-source`), and are run with the same
command as this checkout (e.g. `--before 8699db6`, the serial reference engine, against the in-flight batcher).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BEFORE_MODULE = "trtspec.benchmarks.loop"  # revisions before `trtspec bench-loop` (draft source in the config)
CLI_MODULE_FILE = "trtspec/bench/loop.py"


def bench_loop_cmd(source: str, output: Path, common: list[str]) -> list[str]:
    return [sys.executable, "-m", "trtspec.cli", "bench-loop", "--draft-source", source, "--output", str(output), *common]


def export_revision(rev: str, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as tar:
        subprocess.run(["git", "-C", str(REPO), "archive", rev], stdout=tar, check=True)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as t:
            t.extractall(dest, filter="data")


def before_config(src_tree: Path, source: str, out: Path) -> Path:
    data = yaml.safe_load((src_tree / "build_configs" / "demo.yaml").read_text())
    data.setdefault("speculative", {})["draft_source"] = source
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def run(cmd: list[str], tree: Path, env: dict[str, str], log: Path) -> None:
    """`cmd` with `tree`'s trtspec first on the path (`python -m` puts the working directory first)."""
    print(f"$ {' '.join(cmd)}  (in {tree}, log: {log})", file=sys.stderr, flush=True)
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=tree, env=dict(env, PYTHONPATH=str(tree)), stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise SystemExit(f"{cmd[2] if len(cmd) > 2 else cmd[0]} exited {rc}; last lines of {log}:\n{tail}")


def summary(results_json: Path) -> dict:
    r = json.loads(results_json.read_text())
    server = r.get("server", {})
    ov = server.get("overhead", {})
    every = server.get("summary", {}).get("per_kind", {}).get("all", {})
    spec, base = every.get("speculative", {}), every.get("baseline", {})
    return {
        "overhead_ms": None if ov.get("speculative_per_iteration_s") is None else 1e3 * ov["speculative_per_iteration_s"],
        "round_trip_ms": None if ov.get("bls_exec_s") is None else 1e3 * ov["bls_exec_s"],
        "round_trips": ov.get("in_bls_execs"),
        "spec_tok_s": spec.get("tokens_per_s"),
        "base_tok_s": base.get("tokens_per_s"),
        "identical": f"{every.get('identical', '?')}/{every.get('compared', '?')}",
    }


def fmt(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec) if isinstance(v, (int, float)) else str(v)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="c490b5b", help="git revision to compare with (default: c490b5b)")
    p.add_argument("--sources", default="model,ngram", help="draft sources, comma-separated")
    p.add_argument("--output", type=Path, default=REPO / "bench-results" / "loop-before-after")
    p.add_argument("extra", nargs="*", help="options for both benchmarks, after --")
    args = p.parse_args()
    from trtspec.bench.loop_derive import TARGET_OVERHEAD_ROUND_TRIPS

    out = args.output.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tree = out / "before-src"
    if not tree.is_dir():
        export_revision(args.before, tree)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), HF_HUB_OFFLINE="1")
    common = ["--skip-hf", *args.extra]
    rows = []
    for source in [s.strip() for s in args.sources.split(",") if s.strip()]:
        b_dir, a_dir = out / f"before-{source}", out / f"after-{source}"
        if (tree / CLI_MODULE_FILE).is_file():  # a revision with `trtspec bench-loop --draft-source`
            before_cmd = bench_loop_cmd(source, b_dir, common)
        else:
            cfg = before_config(tree, source, out / f"before-{source}.yaml")
            before_cmd = [sys.executable, "-m", BEFORE_MODULE, "--config", str(cfg), "--output", str(b_dir), *common]
        run(before_cmd, tree, env, out / f"before-{source}.log")
        run(bench_loop_cmd(source, a_dir, common), REPO, env, out / f"after-{source}.log")
        rows.append((source, summary(b_dir / "results.json"), summary(a_dir / "results.json")))

    lines = [
        f"Loop overhead per speculative iteration, {args.before} (before) vs this checkout (after), one run",
        "",
        "| draft source | | overhead / iteration | one BLS round trip | overhead in round trips | target | speculative tok/s | baseline tok/s | identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for source, b, a in rows:
        for label, s in (("before", b), ("after", a)):
            lines.append(
                f"| {source} | {label} | {fmt(s['overhead_ms'])} ms | {fmt(s['round_trip_ms'], '.3f')} ms | {fmt(s['round_trips'])} | "
                f"<= {TARGET_OVERHEAD_ROUND_TRIPS[source]} | {fmt(s['spec_tok_s'], '.1f')} | {fmt(s['base_tok_s'], '.1f')} | {s['identical']} |"
            )
    report = "\n".join(lines)
    (out / "report.md").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
