"""`trtspec bench-loop`: the speculative loop's efficiency, measured in one run (trtspec.bench.loop)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from trtspec.bench import loop as loop_bench
from trtspec.bench.loop import DEFAULT_CONFIG, DEFAULT_KINDS, LoopBenchArgs
from trtspec.bench.runner import BenchError
from trtspec.commands._common import friendly_errors
from trtspec.contract import field_by_name

_HELP = """Measure the speculative loop itself: speed-up against the bound, loop overhead, verify cost.

\b
Greedy, one request at a time, built-in chat and input-grounded prompts. Through a real
Triton server (the config's repository in a temp dir): the baseline and ensemble endpoints
interleaved per prompt, Triton's per-model statistics around every request (engine time,
hence the loop's overhead per iteration, in BLS round trips timed by a probe model), then
in-process: Hugging Face assisted generation, the draft/target cost ratio c, and the
verify cost at 1,024 vs 64 tokens of context. Prints a markdown report; writes
results.json and report.md to --output (default bench-results/loop-<timestamp>).

\b
Examples:
  OMP_NUM_THREADS=1 trtspec bench-loop --prompts-per-kind 2 --max-tokens 64 --no-hf-defaults
  trtspec bench-loop --draft-source ngram --skip-hf      # overhead of in-process drafting
  trtspec bench-loop --rerender bench-results/loop-X/results.json
"""


@click.command("bench-loop", help=_HELP, short_help="Measure the loop's efficiency and overhead (one run).")
@click.option("--config", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=DEFAULT_CONFIG,
              show_default="build_configs/demo.yaml", help="Build config (reference engine).")
@click.option("--draft", default=None, help="Draft checkpoint: demo:draft, demo:draft-untrained or an HF directory (default: the config's).")
@click.option("-k", "--k", type=click.IntRange(1), default=3, show_default=True, help="Draft tokens per iteration.")
@click.option("--draft-source", type=click.Choice(field_by_name("draft_source").choices), default="model", show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=128, show_default=True)
@click.option("--prompts-per-kind", type=click.IntRange(1), default=4, show_default=True)
@click.option("--kinds", default=",".join(DEFAULT_KINDS), show_default=True, help="Prompt kinds (built-in sets), comma-separated.")
@click.option("--output", "-o", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", show_default=True)
@click.option("--stream", is_flag=True, help="Streaming requests (default: one response per request).")
@click.option("--warmup", type=click.IntRange(0), default=1, show_default=True, help="Warm-up rounds.")
@click.option("--bls-execs", type=click.IntRange(1), default=300, show_default=True, help="BLS round trips timed by the probe.")
@click.option("--hf-defaults/--no-hf-defaults", default=True, show_default=True, help="Also run HF assisted generation with HF's defaults.")
@click.option("--skip-hf", is_flag=True, help="Skip Hugging Face generate entirely.")
@click.option("--skip-server", is_flag=True, help="In-process measurements only.")
@click.option("--cost-tokens", type=click.IntRange(1), default=24, show_default=True)
@click.option("--cost-reps", type=click.IntRange(1), default=3, show_default=True)
@click.option("--verify-reps", type=click.IntRange(1), default=9, show_default=True)
@click.option("--ready-timeout", type=float, default=600, show_default=True)
@click.option("--rerender", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              metavar="RESULTS_JSON", help="Print the report of an earlier run's results.json and exit.")
@friendly_errors(BenchError)
def command(rerender: Path | None, kinds: str, **options) -> None:
    if rerender is not None:
        click.echo(loop_bench.rerender(rerender))
        return
    args = LoopBenchArgs(kinds=[k.strip() for k in kinds.split(",") if k.strip()], **options)
    loop_bench.run(args, "trtspec bench-loop " + " ".join(shlex.quote(a) for a in sys.argv[2:]))
