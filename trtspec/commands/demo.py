"""`trtspec demo`: the whole path on the shipped demo pair, on CPU, in a few minutes."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

import trtspec
from trtspec.commands._common import UserError, console, err_console
from trtspec.contract import NUM_DRAFT_TOKENS
from trtspec.contract.models import BASELINE, ENSEMBLE

_HELP = """Run trtspec end to end on the shipped demo pair (CPU is fine).

\b
  1. prepares the demo pair, once (cached in ~/.cache/trtspec/demo, or
     $TRTSPEC_CACHE/demo): SmolLM2-135M-Instruct as the target and a
     distilled 4-layer draft;
  2. writes the reference-engine Triton repository of build_configs/demo.yaml
     and starts Triton on free ports;
  3. streams one example completion (each colour change is one target call:
     the tokens the draft proposed and the target accepted arrive together)
     and prints its acceptance figures;
  4. three short A/B benches, each a table with its results and plots in a
     folder of its own: the adaptive policy (the controller that picks k)
     against target-only and against a few fixed k (the best of them in
     hindsight is "best fixed k"):
       grounded     prompts that quote their input, at concurrency 1: hybrid
                    drafting (n-gram from the prompt, else the draft model):
                    where speculation wins; fixed k 1 and 4;
       chat         the same on chat prompts, where the draft pays little;
                    fixed k 1;
       concurrency  chat at concurrency 1, 4 and 8, the deployment's drafter,
                    fixed k 1: throughput as load grows, and where
                    speculation stops paying;
  5. prints per bench how the controller compares with target-only and
     with the best fixed k, and stops Triton.

\b
About 5 minutes on 2 CPU cores once installed (the first run also
converts the model: about a minute more). --quick runs smaller benches
(CI: about 2 minutes). For your own pair and sizes use `trtspec bench`.
"""


@dataclass(frozen=True)
class Part:
    """One A/B bench of the demo."""

    folder: str
    title: str
    kinds: tuple[str, ...]
    concurrency: tuple[int, ...]
    draft_tokens: tuple[int, ...]
    requests: int
    max_tokens: int
    draft_source: str | None = None  # None: the deployment's
    draft_length_policy: str | None = "adaptive"  # the controller, compared with the fixed k below
    fixed_k: tuple[int, ...] = ()  # the fixed draft lengths tried: "best fixed k in hindsight" is the best of them


# The fixed k are few (each is a cell per concurrency), so that `scripts/quickstart demo` stays near 5 minutes on
# 2 CPU cores (Triton's start takes 2 of them): k=1 beat k=3 and k=4 in every chat cell of the demo
# (docs/benchmarks/bench-tune.md), and k=4 is the grounded prompts' own k.
_HYBRID = dict(draft_source="hybrid")
FULL = dict(
    example_tokens=48,
    parts=(
        Part("grounded", "Input-grounded prompts: hybrid drafting, the controller against fixed k", ("grounded",), (1,),
             (0, 4), 2, 48, fixed_k=(1, 4), **_HYBRID),
        Part("chat", "Chat prompts: the same, where the draft pays little", ("chat",), (1,), (0, 4), 2, 48,
             fixed_k=(1,), **_HYBRID),
        Part("concurrency", "Load: throughput by concurrency, the controller against fixed k", ("chat",), (1, 4, 8),
             (0, 3), 8, 16, fixed_k=(1,)),
    ),
)
QUICK = dict(
    example_tokens=24,
    parts=(
        Part("grounded", "Input-grounded prompts: hybrid drafting, the controller against fixed k", ("grounded",), (1,),
             (0, 2), 1, 12, fixed_k=(1,), **_HYBRID),
        Part("chat", "Chat prompts: the same, where the draft pays little", ("chat",), (1,), (0, 2), 1, 12,
             fixed_k=(1,), **_HYBRID),
        Part("concurrency", "Load: throughput by concurrency, the controller against fixed k", ("chat",), (1, 2),
             (0, 2), 2, 12, fixed_k=(1,)),
    ),
)
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
    from trtspec.spec.metrics import SpecStats

    k = cfg.speculative.default_k
    console.print(f"[dim]prompt:[/] {EXAMPLE_PROMPT}  [dim](ensemble endpoint, {NUM_DRAFT_TOKENS}={k}, "
                  f"max_tokens={max_tokens})[/]")
    client = Client(server.endpoints.http_address, "http", model=ENSEMBLE)
    start = time.perf_counter()
    stats = SpecStats()
    tokens = calls = 0
    first = None
    styles = ("bold white", "bold yellow")
    try:
        for chunk in client.stream(chat(EXAMPLE_PROMPT), max_tokens, **{NUM_DRAFT_TOKENS: k}):
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


def _bench(part: Part, ep: Any, pids: list[int], cfg: Any, output: Path) -> dict:
    from trtspec.bench import BenchSettings, builtin_prompts
    from trtspec.commands.bench import bench_and_report

    prompts = builtin_prompts(part.kinds)
    settings = BenchSettings(
        url=ep.http_address,
        protocol="http",
        max_tokens=part.max_tokens,
        concurrency=part.concurrency,
        draft_tokens=[k for k in part.draft_tokens if k <= cfg.speculative.max_k],
        fixed_k=[k for k in part.fixed_k if k <= cfg.speculative.max_k],
        requests_per_cell=part.requests,
        warmup=1,
        draft_source=part.draft_source,
        draft_length_policy=part.draft_length_policy,
        metrics_url=ep.metrics,
        profile_pids=pids or None,
    )
    how = f"draft_source {part.draft_source or cfg.speculative.draft_source}, {part.draft_length_policy}"
    fixed = f"; fixed k tried: 0 (target-only), {', '.join(map(str, settings.fixed_k))}" if settings.fixed_k else ""
    console.print(f"  [dim]{len(prompts)} {'/'.join(part.kinds)} prompts, {part.requests} requests per cell "
                  f"+ 1 warm-up (and each prompt once through each endpoint first), max_tokens {part.max_tokens}, "
                  f"{how}{fixed}[/]")
    return bench_and_report(settings, prompts, output)


def _paused(cell: dict) -> str:
    """How much of a speculative cell ran without drafts because of load (speculative.max_concurrency)."""
    acc = cell.get("acceptance") or {}
    paused, iterations = acc.get("load_paused_iterations") or 0, acc.get("num_iterations") or 0
    return f" (drafting off for load in {paused / iterations:.0%} of iterations)" if paused and iterations else ""


def summary_facts(results: dict[str, dict]) -> list[str]:
    """Per bench, at each concurrency: the controller's (the cell not among the fixed-k candidates) throughput
    against target-only and against the best fixed k in hindsight, which k that was and which were tried; for the
    load bench also the baseline's throughput scaling and the crossover."""
    def cells(name: str) -> list[dict]:
        return results.get(name, {}).get("cells", [])

    def versus(name: str) -> str:
        best = {b["concurrency"]: b for b in results.get(name, {}).get("summary", {}).get("best_fixed") or []}
        parts = []
        for c in cells(name):
            if not c["speculative"] or c.get("draft_length_policy") == "fixed":
                continue
            ratio = (c.get("speedup") or {}).get("output_tokens_per_s")
            if ratio is None:
                continue
            text = f"c={c['concurrency']}: [bold]{ratio:.2f}x[/] target-only"
            b, vs = best.get(c["concurrency"]), (c.get("vs_best_fixed") or {}).get("output_tokens_per_s")
            if b is not None and vs is not None:
                k = "k=0, target-only" if b[NUM_DRAFT_TOKENS] == 0 else f"k={b[NUM_DRAFT_TOKENS]}"
                text += f", [bold]{vs:.2f}x[/] the best fixed k ({k})"
            parts.append(text + _paused(c))
        if not parts:
            return "no speculative cell measured"
        tried = sorted({k for b in best.values() for k in b["tried"]})
        return "; ".join(parts) + (f"  [dim](fixed k tried: {', '.join(map(str, tried))})[/]" if tried else "")

    lines = [f"[bold]grounded[/]  the controller, hybrid drafting: {versus('grounded')}",
             f"[bold]chat[/]      the same on chat prompts: {versus('chat')}"]
    base = {c["concurrency"]: c["output_tokens_per_s"] for c in cells("concurrency") if c["endpoint"] == BASELINE}
    if base and base.get(min(base)):
        c1 = min(base)
        scaling = ", ".join(f"c={c}: {v:.1f} tok/s ({v / base[c1]:.1f}x)" for c, v in sorted(base.items()))
        lines.append(f"[bold]load[/]      baseline throughput {scaling}")
        lines.append(f"          the controller: {versus('concurrency')}")
        crossover = results["concurrency"].get("summary", {}).get("crossover", {}).get("summary")
        if crossover:
            lines.append(f"          crossover: {crossover}")
    return lines


@click.command("demo", help=_HELP, short_help="Run everything on the shipped demo pair (CPU, a few minutes).")
@click.option("--quick", is_flag=True, help="Smaller benches (1-2 requests per cell, 12 tokens, concurrency 1 and 2): "
                                            "for CI.")
@click.option("--output", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Results directory [default: ./trtspec-demo-<date>-<time>].")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Another reference-engine build config to demo [default: the shipped demo.yaml].")
def demo(quick: bool, output: Path | None, config_path: Path | None) -> None:
    from trtspec.bench import BenchError
    from trtspec.bench.local import local_deployment, prepare_checkpoints, server_pids
    from trtspec.commands.bench import default_output_dir
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

                    results = {}
                    for i, part in enumerate(size["parts"]):
                        _step(4, total, f"A/B bench {i + 1}/{len(size['parts'])}: {part.title}")
                        results[part.folder] = _bench(part, ep, server_pids(server), cfg, output / part.folder)
                    _step(5, total, "What the benches show")
                    for line in summary_facts(results):
                        console.print(f"  {line}", soft_wrap=True)
                finally:
                    console.print("\n[dim]Stopping Triton...[/]")
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
