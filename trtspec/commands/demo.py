"""`trtspec demo`: the whole path on the shipped demo pair, on CPU, in a few minutes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

import trtspec
from trtspec.commands._common import UserError, console, err_console

_HELP = """Run trtspec end to end on the shipped demo pair (CPU is fine).

\b
  1. prepares the demo pair, once (cached in ~/.cache/trtspec/demo, or
     $TRTSPEC_CACHE/demo): SmolLM2-135M-Instruct as the target and a
     distilled 4-layer draft;
  2. writes the reference-engine Triton repository of build_configs/demo.yaml;
  3. starts Triton on free ports;
  4. streams one example completion (each colour change is one target call:
     the tokens the draft proposed and the target accepted arrive together)
     and prints its acceptance figures;
  5. runs a short A/B bench, speculative vs target-only, at concurrency 1
     and 4 with num_draft_tokens 0 (baseline), 2 and 4, prints the table and
     where the results and plots are;
  6. stops Triton.

\b
About 5 minutes on 2 CPU cores once installed (the first run also
converts the model: about a minute more). --quick runs a smaller bench
(CI: about 2 minutes). For your own pair and sizes use `trtspec bench`.
"""

FULL = dict(concurrency=(1, 4), draft_tokens=(0, 2, 4), requests=4, warmup=1, max_tokens=32, prompts=6,
            example_tokens=48)
QUICK = dict(concurrency=(1, 2), draft_tokens=(0, 2), requests=2, warmup=1, max_tokens=12, prompts=2,
             example_tokens=24)
EXAMPLE_PROMPT = "Explain in a few sentences why the sky is blue."


def demo_config_path() -> Path:
    """build_configs/demo.yaml of the checkout trtspec runs from, else the copy shipped in the package."""
    package = Path(trtspec.__file__).resolve().parent
    for candidate in (package.parent / "build_configs" / "demo.yaml", package / "assets" / "demo.yaml"):
        if candidate.is_file():
            return candidate
    raise UserError("the demo config is missing (neither build_configs/demo.yaml next to the package nor "
                    "trtspec/assets/demo.yaml in it); reinstall trtspec")


def _step(n: int, total: int, text: str) -> None:
    console.print(f"\n[bold cyan]{n}/{total}[/] [bold]{text}[/]")


def _example(server: Any, cfg: Any, max_tokens: int) -> None:
    from trtspec.bench.prompts import chat
    from trtspec.client import Client, ClientError
    from trtspec.metrics import SpecStats

    k = cfg.speculative.num_draft_tokens
    console.print(f"[dim]prompt:[/] {EXAMPLE_PROMPT}  [dim](ensemble endpoint, num_draft_tokens={k}, "
                  f"max_tokens={max_tokens})[/]")
    client = Client(server.endpoints.http_address, "http", model="ensemble")
    start = time.perf_counter()
    stats = SpecStats()
    tokens = calls = 0
    first = None
    styles = ("bold white", "bold yellow")
    try:
        for chunk in client.stream(chat(EXAMPLE_PROMPT), max_tokens, num_draft_tokens=k):
            if chunk.token_ids:
                first = first or chunk.time
                console.print(escape(chunk.text), end="", style=styles[calls % 2], soft_wrap=True, highlight=False)
                tokens += len(chunk.token_ids)
                calls += 1
            stats = chunk.stats or stats
    except ClientError as e:
        raise UserError(f"the example request failed: {escape(str(e))}") from None
    elapsed = time.perf_counter() - start
    console.print()
    proposed, accepted = stats.total_draft_tokens, stats.total_accepted_draft_tokens
    iterations = stats.num_iterations or calls
    pos = ", ".join(f"{a}/{p}" for a, p in zip(stats.accepted_per_position, stats.proposed_per_position) if p)
    console.print(
        f"[dim]{tokens} tokens (counted from token ids) in {elapsed:.1f} s, first after "
        f"{(first - start) if first else elapsed:.2f} s[/]\n"
        f"acceptance [bold]{stats.acceptance_rate:.0%}[/] ({accepted} of {proposed} draft tokens), "
        f"[bold]{tokens / iterations:.2f}[/] tokens per target call ({iterations} target calls)"
        + (f"; accepted/proposed per draft position: {pos}" if pos else ""),
        soft_wrap=True,
    )


@click.command("demo", help=_HELP, short_help="Run everything on the shipped demo pair (CPU, a few minutes).")
@click.option("--quick", is_flag=True, help="A smaller bench (concurrency 1 and 2, k 0 and 2, 2 requests per "
                                            "cell, 12 tokens): for CI.")
@click.option("--output", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Results directory [default: ./trtspec-demo-<date>-<time>].")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Another reference-engine build config to demo [default: the shipped demo.yaml].")
def demo(quick: bool, output: Path | None, config_path: Path | None) -> None:
    from trtspec.bench import BenchError, BenchSettings, builtin_prompts
    from trtspec.bench.local import local_deployment, prepare_checkpoints, server_pids
    from trtspec.commands.bench import bench_and_report, default_output_dir
    from trtspec.config import ConfigError, checkpoint_path, load_config
    from trtspec.demo_pair import DemoPairError
    from trtspec.repository import RepositoryError
    from trtspec.server import ServerError

    size = QUICK if quick else FULL
    output = output or default_output_dir("trtspec-demo")
    config_path = config_path or demo_config_path()
    t0 = time.monotonic()
    total = 5
    try:
        cfg = load_config(config_path)
        _step(1, total, "Demo pair")
        with console.status("checking the cache...", spinner="dots") as status:
            def say(msg: str) -> None:
                status.update(msg)
                console.print(f"  [dim]{escape(msg)}[/]")

            prepare_checkpoints(cfg, say)
        for role in ("target", "draft"):
            m = getattr(cfg, role)
            if m is not None:
                where = checkpoint_path(cfg, role)
                shown = f"{m.checkpoint} ({where})" if m.checkpoint != str(where) else str(where)
                console.print(f"  {role:6} {escape(shown)}", soft_wrap=True)
        console.print(f"  [dim]ready in {time.monotonic() - t0:.0f} s[/]")

        _step(2, total, f"Triton on {escape(str(config_path))} (reference engine, {cfg.device})")
        output.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        status = console.status("writing the model repository...", spinner="dots")
        status.start()
        try:
            with local_deployment(cfg, log_file=output / "triton.log",
                                  on_step=lambda m: status.update(f"{m}...")) as server:
                status.stop()
                ep = server.endpoints
                console.print(f"  ready after {time.monotonic() - started:.0f} s: HTTP {ep.http_address}, "
                              f"gRPC {ep.grpc_address}, metrics {ep.metrics}")
                try:
                    _step(3, total, "One example completion, streamed")
                    _example(server, cfg, size["example_tokens"])

                    _step(4, total, "A/B bench: speculative vs target-only")
                    prompts = builtin_prompts()[: size["prompts"]]
                    settings = BenchSettings(
                        url=ep.http_address,
                        protocol="http",
                        max_tokens=size["max_tokens"],
                        concurrency=size["concurrency"],
                        draft_tokens=[k for k in size["draft_tokens"] if k <= cfg.speculative.max_draft_len],
                        requests_per_cell=size["requests"],
                        warmup=size["warmup"],
                        metrics_url=ep.metrics,
                        profile_pids=server_pids(server) or None,
                    )
                    console.print(f"  [dim]{len(prompts)} prompts (chat, code, grounded), "
                                  f"{size['requests']} requests per cell + {size['warmup']} warm-up, "
                                  f"max_tokens {size['max_tokens']}[/]")
                    bench_and_report(settings, prompts, output)
                finally:
                    _step(5, total, "Stopping Triton")
        finally:
            status.stop()
    except (BenchError, ServerError, DemoPairError, RepositoryError, ConfigError) as e:
        raise UserError(escape(str(e))) from None
    except KeyboardInterrupt:
        err_console.print("\n[yellow]interrupted[/]")
        raise SystemExit(130) from None
    console.print(f"\n[bold green]Demo done[/] in {time.monotonic() - t0:.0f} s. Results and plots: "
                  f"{escape(str(output))}/  (next: `trtspec bench --help`)", soft_wrap=True)


command = demo
