"""`trtspec tune CONFIG`: measure the best fixed draft length per concurrency band, write it as the config's
draft-length schedule."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from trtspec.commands._common import UserError, console, err_console
from trtspec.commands.bench import bench_and_report, default_output_dir, int_list
from trtspec.config import MAX_DRAFT_LEN, BuildConfig, ConfigError, SpeculativeConfig, load_config, parse_config
from trtspec.contract import NUM_DRAFT_TOKENS

DEFAULT_KS = (0, 1, 2, 3, 4, 6)

_HELP = f"""Find the best draft length k for each concurrency band by measuring it,
and write it into the build config as a draft-length schedule.

\b
What it does:
  1. serves CONFIG on this machine (as `trtspec bench --config` does), with
     its load caps (max_concurrency, draft_len_schedule) off so that every k
     is measured as it is;
  2. at each --concurrency level runs the target-only baseline (k=0) and the
     speculative endpoint with each fixed k of --draft-tokens (an A/B sweep,
     greedy, the built-in prompts or --prompts);
  3. picks per level the k with the highest output tokens/s over the
     baseline of the same run (k=0 when nothing beats it);
  4. writes the schedule: {{1: k at the lowest level, next level: its k, ...}},
     each key a number of requests in flight from which its k applies
     upward, as speculative.draft_len_schedule (engine: reference,
     tensorrt_llm) or llmapi.draft_len_schedule (engine: llmapi, which
     TensorRT-LLM reads; {MAX_DRAFT_LEN} becomes the k of the first band).

\b
engine: llmapi decides k inside TensorRT-LLM, so each k > 0 is a deployment
of its own ({MAX_DRAFT_LEN} = k, with the baseline endpoint): slower to tune.
engine: tensorrt_llm needs built engines: serve them with `trtspec serve`
and pass --url.

\b
The tuned config goes to CONFIG's name + .tuned.yaml beside it (--output
FILE elsewhere, --in-place to replace CONFIG after copying it to
CONFIG.bak). It is checked as `trtspec build` checks a config before it is
renamed into place: a failed or interrupted tune writes nothing. The bench
results of the sweep are in --results DIR (tune.json: the choice per band).

\b
Examples:
  trtspec tune build_configs/demo.yaml
  trtspec tune build_configs/demo-llmapi.yaml --concurrency 1,4 --draft-tokens 0,2,4
  trtspec tune my.yaml --url gpu-box:8000 --requests 32 --in-place
Then compare the tuned schedule with the online controller:
  trtspec bench --config build_configs/demo.tuned.yaml --draft-tokens 8 \\
      --draft-length-policy adaptive --fixed-k 0,1,2,3,4,6
"""


@click.command("tune", help=_HELP,
               short_help="Measure the best k per concurrency band; write the draft-length schedule.")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--concurrency", default="1,2,4,8", show_default=True, metavar="LIST",
              help="Concurrency levels: each is the lower edge of a band of the schedule (the lowest applies from 1).")
@click.option("--draft-tokens", default=None, metavar="LIST",
              help="The k to compare at each level (0, the baseline, is always measured) "
                   f"[default: {','.join(map(str, DEFAULT_KS))}, those within speculative.{MAX_DRAFT_LEN}].")
@click.option("--url", default=None, metavar="HOST:PORT",
              help="Measure this running deployment of CONFIG instead of starting one (serve it without "
                   "max_concurrency / draft_len_schedule, or they cap the k measured). Not with engine: llmapi.")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE.jsonl", help="Prompts, as `trtspec bench --prompts` reads them: tune on your traffic.")
@click.option("--prompt-kind", default="chat,code,grounded", show_default=True,
              help="Built-in prompts to use (see `trtspec bench --help`).")
@click.option("--num-prompts", type=click.IntRange(min=1), default=None, help="Use only the first N prompts.")
@click.option("--requests", "requests_per_cell", type=click.IntRange(min=1), default=8, show_default=True,
              help="Measured requests per cell (more: less noise, longer).")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True, help="Warm-up requests per cell.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=32, show_default=True,
              help="Output tokens per request.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the tuned config [default: CONFIG's name + .tuned.yaml, beside it].")
@click.option("--in-place", is_flag=True, help="Replace CONFIG (its old content goes to CONFIG.bak first).")
@click.option("--force", is_flag=True, help="Replace an existing --output file (or CONFIG.bak with --in-place).")
@click.option("--results", "results_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the sweep's bench results and tune.json [default: ./trtspec-tune-<date>-<time>].")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for one response.")
def tune(config: Path, concurrency: str, draft_tokens: str | None, url: str | None, prompts_file: Path | None,
         prompt_kind: str, num_prompts: int | None, requests_per_cell: int, warmup: int, max_tokens: int,
         output: Path | None, in_place: bool, force: bool, results_dir: Path | None, timeout: float) -> None:
    from trtspec.bench import BenchError, BenchSettings, PromptError, builtin_prompts, load_prompts, parse_kinds
    from trtspec.bench.tune import (
        TuneError,
        apply_schedule,
        best_k_per_band,
        check_writable,
        header,
        output_paths,
        schedule_from_bands,
        sweep_variant,
        write_config,
    )

    cfg, doc = _load_config(config)
    llmapi = cfg.engine.value == "llmapi"
    _check_deployment(cfg.engine.value, url)
    ks = _draft_lengths(draft_tokens, cfg.speculative)
    levels = int_list("--concurrency", concurrency, 1)
    try:
        dest, backup = output_paths(config, output, in_place)
        check_writable(dest, backup, force)
        prompts = load_prompts(prompts_file) if prompts_file is not None else builtin_prompts(parse_kinds(prompt_kind))
    except (TuneError, PromptError) as e:
        raise UserError(escape(str(e))) from None
    if num_prompts is not None:
        prompts = prompts[:num_prompts]
    results_dir = results_dir or default_output_dir("trtspec-tune")

    # one run per deployment: all k on one (k per request), or one deployment per k (llmapi)
    runs = [(k, [k]) for k in ks if k > 0] if llmapi else [(None, [k for k in ks if k > 0])]
    console.print(f"[bold]Tuning[/] {escape(str(config))} (engine: {cfg.engine.value}): k {', '.join(map(str, ks))} "
                  f"at concurrency {', '.join(map(str, levels))}, {requests_per_cell} requests per cell, "
                  f"max_tokens {max_tokens}" + (f"; {len(runs)} deployments, one per k" if llmapi else ""),
                  soft_wrap=True)
    results = []
    started = time.monotonic()
    try:
        for i, (k, fixed) in enumerate(runs):
            out = results_dir / (f"k{k}" if k is not None else "sweep")
            s = BenchSettings(url=url or "", max_tokens=max_tokens, concurrency=levels, draft_tokens=[0],
                              fixed_k=fixed, requests_per_cell=requests_per_cell, warmup=warmup, timeout=timeout)
            if url is not None:
                s.url = url
                results.append(bench_and_report(s, prompts, out))
            else:
                what = f"run {i + 1}/{len(runs)}: {MAX_DRAFT_LEN} {k}" if k is not None else "the sweep"
                results.append(_bench_variant(sweep_variant(doc, k), config, s, prompts, out, what))
        bands = best_k_per_band(results)
        schedule = schedule_from_bands(bands)
        tuned = apply_schedule(doc, schedule)
        write_config(dest, tuned.doc, header(config, bands, tuned.notes), backup,
                     validate=lambda p: load_config(p))
    except (TuneError, BenchError, ConfigError) as e:
        raise UserError(escape(str(e))) from None
    except KeyboardInterrupt:
        err_console.print("\n[yellow]interrupted[/]: nothing written")
        raise SystemExit(130) from None

    summary = {"config": str(config), "written": str(dest), "backup": str(backup) if backup else None,
               "engine": cfg.engine.value, "draft_tokens": ks, "concurrency": levels,
               "bands": [{"concurrency": b.concurrency, NUM_DRAFT_TOKENS: b.k, "speedup": b.speedup,
                          "speedups": b.speedups} for b in bands],
               "schedule": {f"{tuned.section}.draft_len_schedule": tuned.schedule}, "notes": tuned.notes,
               "duration_s": time.monotonic() - started}
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "tune.json").write_text(json.dumps(summary, indent=2) + "\n")
    _print_schedule(bands, tuned, dest, backup, results_dir)


def _load_config(config: Path) -> tuple[BuildConfig, dict]:
    """The config, checked, and its YAML document (what the tuned config is written from)."""
    import yaml

    try:
        return load_config(config), yaml.safe_load(config.read_text())
    except ConfigError as e:
        raise UserError(escape(str(e))) from None


def _check_deployment(engine: str, url: str | None) -> None:
    """Whether tune can measure this engine flavour as asked: starting it, or at --url."""
    if url is not None and engine == "llmapi":
        raise UserError("--url with engine: llmapi: TensorRT-LLM fixes k per deployment, so tune starts one per k "
                        "itself; leave --url out")
    if url is None and engine == "tensorrt_llm":
        raise UserError("engine: tensorrt_llm needs built engines: `trtspec build` and `trtspec serve` this config, "
                        "then run `trtspec tune CONFIG --url HOST:PORT`")


def _draft_lengths(draft_tokens: str | None, spec: SpeculativeConfig) -> list[int]:
    """The k to compare (0, the baseline, always among them), within the config's max_k."""
    if draft_tokens is None:
        ks = [k for k in DEFAULT_KS if k <= spec.max_k]
    else:
        ks = int_list("--draft-tokens", draft_tokens, 0)
        too_long = spec.too_long("--draft-tokens", ks)
        if too_long:
            raise UserError(f"{too_long}; raise it or leave them out")
    ks = sorted(set(ks) | {0})
    if ks == [0]:
        raise UserError("--draft-tokens: give at least one k > 0 to compare with the baseline")
    return ks


def _print_schedule(bands: list[Any], tuned: Any, dest: Path, backup: Path | None, results_dir: Path) -> None:
    """What was measured per band, the schedule written, and where."""
    console.print()
    for b in bands:
        measured = "  ".join(f"k={k} {v:.2f}x" for k, v in b.speedups.items())
        console.print(f"  c={b.concurrency}: [bold]k={b.k}[/]   ({measured})", soft_wrap=True)
    key = f"{tuned.section}.draft_len_schedule"
    console.print(f"[bold green]{key}[/] {tuned.schedule or '(none)'}"
                  + (f"   [dim]{escape('; '.join(tuned.notes))}[/]" if tuned.notes else ""), soft_wrap=True)
    console.print(f"[bold]Written[/] {escape(str(dest))}" + (f" (the old one: {escape(str(backup))})" if backup else "")
                  + f"; sweep results in {escape(str(results_dir))}/.  Next: `trtspec build {escape(str(dest))}`",
                  soft_wrap=True)


def _bench_variant(doc: dict, config: Path, settings: Any, prompts: Any, out: Path, what: str) -> dict:
    """Serve one variant of the config on this machine and bench it."""
    from trtspec.bench.local import local_deployment, prepare_checkpoints
    from trtspec.demo_pair import DemoPairError
    from trtspec.repository import RepositoryError
    from trtspec.server import ServerError

    try:
        cfg = parse_config(doc, source_dir=config.resolve().parent)
    except ConfigError as e:
        raise UserError(f"{escape(str(config))}: {escape(str(e))}") from None
    out.mkdir(parents=True, exist_ok=True)
    status = console.status(f"{what}: preparing the deployment...", spinner="dots")
    status.start()
    try:
        prepare_checkpoints(cfg, lambda m: status.update(f"{what}: {m}..."))
        step = lambda m: status.update(f"{what}: {m}...")  # noqa: E731
        with local_deployment(cfg, log_file=out / "triton.log", on_step=step) as server:
            status.stop()
            ep = server.endpoints
            console.print(f"[green]{what}[/]: Triton ready (HTTP {ep.http_address})")
            settings.url, settings.metrics_url = ep.http_address, ep.metrics
            try:
                return bench_and_report(settings, prompts, out)
            finally:
                console.print("Stopping Triton...")
    except (ServerError, DemoPairError, RepositoryError) as e:
        raise UserError(escape(str(e))) from None
    finally:
        status.stop()


command = tune
