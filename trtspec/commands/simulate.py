"""`trtspec simulate`: the loop's own decisions against a cost model, for any number of requests in flight."""

from __future__ import annotations

import json
from pathlib import Path

import click

_HELP = """Run the speculative loop's planner (the decisions the deployment makes each iteration: source, k,
probes, catch-up) for N requests in flight against a cost model, beside target-only and every fixed k.

\b
No server and no GPU: seconds per cell. The requests run in lock step, as an in-flight batcher runs
them: the draft engine batches the draft calls of every request that drafts, one target step runs
every request in flight, prompts are prefilled in chunks of max_num_tokens, and requests arrive and
leave. Acceptance is synthetic, by position: strong / medium / weak start at 0.75 / 0.5 / 0.25 and
fall 8% a position; drop falls from 0.75 to 0.1 for the middle third of the run and comes back.

\b
Cost models (--costs):
  gpu:NAME           first principles for a GPU of trtspec's table (h100, h200, a100, l40s, ...) and
                     the model shapes of --target / --draft (known names or checkpoint directories);
                     the assumptions are printed
  PATH.json          `trtspec bench-engine --json` of the target, with --draft-costs for the draft's:
                     this CPU, or a GPU where one was at hand; or the JSON of scripts/gpu_step_costs.py
                     (a GPU's steps as CUDA graphs, target, draft and EAGLE-3 head in one file; an H100's
                     is docs/benchmarks/data/gpu-h100/steps.json)

\b
Engines (--engines):
  lockstep           a draft call, then one target step over every request, as on one GPU
  overlapped         the draft and target engines on their own clocks at once, each stepping its own
                     in-flight batch, and each engine call costing --call-ms of the loop's own (a Triton
                     round trip): the reference engine on a CPU, its engines on separate cores, plain
                     calls runs the engine streams, each engine waiting for the calls it answered as the
                     reference engine does. With the costs of `trtspec bench-engine` on that CPU and
                     --acceptance from a `trtspec bench` run, it predicts that run's ratios (within 10% in
                     every cell of docs/benchmarks/data/calibration-cpu)

\b
Examples:
  trtspec simulate                                           # H100, Llama-3.1-8B + Llama-3.2-1B
  trtspec simulate --concurrency 1,4,16,64,ramp:256 --profiles drop
  trtspec simulate --costs target.json --draft-costs draft.json --concurrency 1,4,8
  trtspec simulate --method eagle3 --target llama-3.1-8b
  trtspec simulate --costs docs/benchmarks/data/gpu-h100/steps.json --method eagle3
  trtspec simulate --costs docs/benchmarks/data/gpu-h100/steps.json --seeds 4 --warmup 1
  trtspec simulate --costs target.json --draft-costs draft.json --engines overlapped --prompt 60 \\
      --max-tokens 32 --acceptance 0.6,0.55,0.5,0.45 --concurrency 1,4,8 --fixed-k 1,2,4
"""


@click.command("simulate", help=_HELP, short_help="The controller against GPU (or measured) cost models, no server.")
@click.option("--costs", default="gpu:h100", show_default=True, help="gpu:NAME, or a bench-engine JSON of the target.")
@click.option("--draft-costs", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="bench-engine JSON of the draft model (with --costs PATH.json).")
@click.option("--target", default="llama-3.1-8b", show_default=True, help="Target shape: a known name or a checkpoint.")
@click.option("--draft", default="llama-3.2-1b", show_default=True, help="Draft shape: a known name or a checkpoint.")
@click.option("--method", type=click.Choice(["draft_model", "eagle3"]), default="draft_model", show_default=True,
              help="eagle3: the drafter is a head inside the target (its steps add to the target's).")
@click.option("--concurrency", default="1,2,4,8,16,32,64,128,256", show_default=True,
              help="Requests in flight, comma-separated; ramp:N runs 1 -> N -> 1.")
@click.option("--profiles", default="strong,medium,weak,drop", show_default=True, help="Acceptance profiles.")
@click.option("--acceptance", default=None, metavar="A0,A1,...",
              help="Instead of --profiles: the conditional acceptance of each draft position, as measured (e.g. "
                   "`trtspec bench`'s acceptance per position, each divided by the one before).")
@click.option("--engines", type=click.Choice(["lockstep", "overlapped"]), default="lockstep", show_default=True,
              help="How the draft and target engines share time (see above).")
@click.option("--call-ms", type=click.FloatRange(0.0), default=None, show_default="fitted to this project's CPU",
              help="overlapped: the loop's own time per engine call (a Triton round trip and its Python).")
@click.option("--fixed-k", default="1,2,3,4,5,6,7,8", show_default=True, help="Fixed draft lengths run beside it.")
@click.option("--max-draft", type=click.IntRange(1, 64), default=4, show_default=True,
              help="The controller's cap: the most draft tokens it picks (a request's k).")
@click.option("--requests", type=click.IntRange(1), default=48, show_default=True,
              help="Requests per cell (at least 2x the concurrency).")
@click.option("--max-tokens", type=click.IntRange(2), default=96, show_default=True,
              help="Mean tokens a request generates (each draws 0.5-1.5x).")
@click.option("--prompt", type=click.IntRange(1), default=256, show_default=True, help="Prompt tokens.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--seeds", type=click.IntRange(1), default=1, show_default=True,
              help="Run each cell with this many seeds from --seed, pooled into one longer run; the worst seed is "
                   "printed beside it (a learning controller's cells vary with the draws more than a fixed k's).")
@click.option("--warmup", type=click.IntRange(0), default=0, show_default=True,
              help="Waves of requests (the concurrency's each) run first and not counted: a deployment that has run "
                   "a while (its estimates carry over) instead of a cold one. Lock step only.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write every cell's figures here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a plot (PNG) of the controller's ratios here.")
def command(costs: str, draft_costs: Path | None, target: str, draft: str, method: str, concurrency: str,
            profiles: str, acceptance: str | None, engines: str, call_ms: float | None, fixed_k: str, max_draft: int, requests: int, max_tokens: int, prompt: int, seed: int,
            seeds: int, warmup: int, json_path: Path | None, plot_path: Path | None) -> None:
    from trtspec.bench.costs import GPU_PEAKS, EngineCurve, GpuCosts, GridCosts, MeasuredCosts, Shape
    from trtspec.bench.simulate import run_matrix
    from trtspec.bench.workload import PROFILES, Acceptance
    from trtspec.checkpoint import CheckpointError, inspect_checkpoint

    def shape(name: str) -> Shape:
        if Path(name).is_dir():
            try:
                return Shape.from_checkpoint(inspect_checkpoint(name))
            except CheckpointError as e:
                raise click.BadParameter(str(e)) from None
        try:
            return Shape.known(name)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None

    if acceptance is not None:
        try:
            chosen: list = [Acceptance.measured(acceptance)]
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--acceptance") from None
    else:
        chosen = profiles.split(",")
        unknown = [p for p in chosen if p not in PROFILES]
        if unknown:
            raise click.BadParameter(f"unknown profile(s) {unknown}; known: {', '.join(PROFILES)}",
                                     param_hint="--profiles")
    in_engine = method == "eagle3"
    if in_engine and engines == "overlapped":
        raise click.UsageError("--engines overlapped has a draft engine of its own: it runs --method draft_model")
    if costs.startswith("gpu:"):
        gpu = costs.split(":", 1)[1]
        if gpu not in GPU_PEAKS:
            raise click.BadParameter(f"unknown GPU {gpu!r}; known: {', '.join(GPU_PEAKS)}", param_hint="--costs")
        model = GpuCosts(gpu, shape(target), None if in_engine else shape(draft))
    elif not Path(costs).is_file():
        raise click.BadParameter(f"{costs}: no such file (gpu:NAME or a bench-engine JSON)", param_hint="--costs")
    elif GridCosts.is_grid(Path(costs)):
        model = GridCosts.from_file(Path(costs))
        if (model.head if in_engine else model.draft) is None:
            raise click.BadParameter(f"{costs} has no {'EAGLE-3 head' if in_engine else 'draft-model'} steps",
                                     param_hint="--costs")
    else:
        if not in_engine and draft_costs is None:
            raise click.UsageError("--costs PATH.json with method draft_model needs --draft-costs (the draft's JSON)")
        model = MeasuredCosts(EngineCurve.from_bench_engine(Path(costs)),
                              EngineCurve.from_bench_engine(draft_costs) if draft_costs else None)
    click.echo(f"cost model: {model.name}")
    for line in model.assumptions():
        click.echo(f"  {line}")
    ks = [int(k) for k in fixed_k.split(",") if k.strip()]
    if call_ms is None:
        from trtspec.bench.overlapped import CALL_S

        call_ms = CALL_S * 1e3
    overlapped = dict(call_s=call_ms / 1e3) if engines == "overlapped" else None
    if warmup and overlapped is not None:
        raise click.UsageError("--warmup runs in lock step; leave it out with --engines overlapped")
    cells = run_matrix(model, concurrency.split(","), chosen, ks, max_draft, in_engine=in_engine, overlapped=overlapped,
                       requests=requests, max_tokens=max_tokens, prompt=prompt, seed=seed, seeds=seeds, warmup=warmup,
                       progress=click.echo)
    worst = min(c.ratios(next(n for n in c.results if n.startswith("controller")))[0] for c in cells)
    worst_best = min(c.ratios(next(n for n in c.results if n.startswith("controller")))[1] for c in cells)
    click.echo(f"controller: at worst {worst:.2f}x target-only, {worst_best:.2f}x the best fixed k in hindsight")
    if json_path:
        json_path.write_text(json.dumps({"costs": model.name, "assumptions": model.assumptions(), "method": method,
                                         "engines": engines, "call_ms": call_ms, "seed": seed, "seeds": seeds,
                                         "warmup": warmup,
                                         "cells": [c.to_dict() for c in cells]}, indent=1))
        click.echo(f"wrote {json_path}")
    if plot_path:
        _plot(cells, plot_path)
        click.echo(f"wrote {plot_path}")


def _plot(cells: list, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4))
    FigureCanvasAgg(fig)
    ax_base, ax_best = fig.subplots(1, 2)
    for profile in dict.fromkeys(c.profile for c in cells):
        row = [c for c in cells if c.profile == profile]
        labels = [c.concurrency for c in row]
        ctl = next(n for n in row[0].results if n.startswith("controller"))
        ax_base.plot(labels, [c.ratios(ctl)[0] for c in row], marker="o", label=profile)
        ax_best.plot(labels, [c.ratios(ctl)[1] for c in row], marker="o", label=profile)
    for ax, title, bar in ((ax_base, "controller vs target-only", 0.98), (ax_best, "controller vs best fixed k", 0.95)):
        ax.axhline(bar, color="grey", linestyle="--", linewidth=1)
        ax.set_title(title)
        ax.set_xlabel("requests in flight")
        ax.tick_params(axis="x", rotation=30)
    ax_base.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
