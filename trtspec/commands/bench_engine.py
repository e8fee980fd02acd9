"""`trtspec bench-engine`: the reference engine's step against this machine's weight-streaming limit."""

from __future__ import annotations

import typing
from pathlib import Path

import click

from trtspec.config import LinearKernels

_HELP = """Measure the reference engine's step against this machine's limit, for each dtype.

\b
In process (no Triton): the bandwidth of a 1-row GEMV over the model's own weights and the
step time it implies for the model's bytes; the engine's decode step, verify of 2/4/8 tokens
and batched steps of 4/8/16 one-token rows; and the ratios against the targets an engine
that speculation pays on should meet: a decode step <= 1.5x the weight-streaming limit (it
is bound by memory, not arithmetic), a verify of 4 tokens <= 1.25x a step (checking drafts
costs little more than one step) and 8 one-token rows <= 2x a step (batching pays). Medians.

\b
On a GPU (--device cuda, or auto where there is one) the clocks are read with the device
synchronized, and the limit is the GPU's: a GEMV over all weights of one width stacked (one
GEMV per matrix, also shown, measures kernel launches there).

\b
Examples:
  trtspec bench-engine                              # demo target, float32 and bfloat16, 1 thread
  trtspec bench-engine --dtypes auto --threads 2 --checkpoint PATH
  trtspec bench-engine --dtypes float32 --linear-kernels compiled   # as the demo serves
  trtspec bench-engine --device cuda --dtypes float32,bfloat16,float16 --json gpu.json
"""


@click.command("bench-engine", help=_HELP, short_help="Measure the reference engine's step against the machine's limit.")
@click.option("--checkpoint", default="demo:target", show_default=True, help="HF checkpoint directory or demo:target / demo:draft.")
@click.option("--dtypes", default="float32,bfloat16", show_default=True, help="Comma-separated: auto, float32, bfloat16, float16.")
@click.option("--threads", type=click.IntRange(0), default=None, help="torch threads (0: torch's default)  "
              "[default: 1 per engine, as the demo serves: reference_engine.device.CPU_THREADS_PER_ENGINE]")
@click.option("--context", type=click.IntRange(1), default=64, show_default=True, help="Tokens of KV cache per row.")
@click.option("--reps", type=click.IntRange(1), default=7, show_default=True, help="Timed repetitions per figure (median).")
@click.option("--linear-kernels", type=click.Choice(typing.get_args(LinearKernels)), default="auto", show_default=True,
              help="The weight products' kernels, as the config's linear_kernels (compiled: the demo's; compiled "
                   "once per shape into the cache, then reused).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="cpu", show_default=True,
              help="Where the engine runs (auto: cuda where torch sees a GPU).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write every dtype's figures to this JSON file.")
def command(checkpoint: str, dtypes: str, threads: int | None, context: int, reps: int, linear_kernels: str, device: str,
            json_path: Path | None) -> None:
    import dataclasses
    import json

    import torch

    from trtspec import log_to_stderr
    from trtspec.demo_pair import resolve_checkpoint
    from trtspec.reference_engine import ReferenceEngine
    from trtspec.reference_engine.device import CPU_THREADS_PER_ENGINE, pick_device
    from trtspec.reference_engine.limits import measure, report

    log_to_stderr()  # the engine's precision and kernels, beside the figures
    device = pick_device(device)
    if device == "cuda" and not torch.cuda.is_available():
        raise click.UsageError("--device cuda: torch sees no CUDA GPU here; use --device cpu (or auto)")
    threads = CPU_THREADS_PER_ENGINE if threads is None else threads
    if threads:
        torch.set_num_threads(threads)  # before load: tune_for_cpu reads it
    path = resolve_checkpoint(checkpoint)
    if linear_kernels == "compiled" and device == "cpu":  # into the cache the engine loads from, where missing
        from trtspec.reference_engine import compiled_linear

        compiled_linear.compile_kernels(compiled_linear.checkpoint_shapes(path), compiled_linear.cache_dir(), click.echo)
    results = []
    for dtype in dtypes.split(","):
        engine = ReferenceEngine(path, device=device, dtype=dtype.strip(), linear_kernels=linear_kernels)
        limits = measure(engine, context=context, reps=reps)
        for line in report(limits):
            click.echo(line)
        results.append({"requested_dtype": dtype.strip(), **dataclasses.asdict(limits),
                        "ratios": {name: {"measured": v, "target": t} for name, (v, t) in limits.ratios().items()}})
        del engine
        if device == "cuda":
            torch.cuda.empty_cache()
    if json_path is not None:
        json_path.write_text(json.dumps({"checkpoint": str(path), "device": device, "results": results}, indent=1) + "\n")
