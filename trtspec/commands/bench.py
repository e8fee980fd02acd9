"""`trtspec bench`: speculative vs target-only A/B over concurrency levels and draft lengths."""

from __future__ import annotations

import contextlib
import datetime as _dt
import time
from pathlib import Path
from typing import Any, Sequence

import click
from rich.markup import escape

from trtspec.contract import NUM_DRAFT_TOKENS, field_by_name
from trtspec.commands._common import UserError, console, err_console

_HELP = f"""Measure speculative decoding against target-only decoding on a running trtspec deployment.

\b
For every cell (concurrency level x {NUM_DRAFT_TOKENS}) it sends --requests
streamed requests (--no-stream: answered whole) with that many in flight at once (after --warmup
requests that are not counted), and measures per request: time to first
token (TTFT), inter-token latency (ITL), end-to-end latency, output
tokens (counted from the returned token ids) and tokens/s per user; per
cell: p50/p90/p99, total output tokens/s and, with drafting on, the
acceptance rate, tokens per target call and acceptance per draft position.

\b
{NUM_DRAFT_TOKENS} 0 is the target-only `baseline` endpoint; k > 0 is the
speculative `ensemble` endpoint with k draft tokens per step. The baseline
always runs at every concurrency: each speculative cell's speedup is its
output tokens/s over the baseline's at the same concurrency. The report
names the best k per concurrency and the crossover: the concurrency above
which speculation stops paying.

\b
With --fixed-k the run also measures fixed draft lengths, and every other
cell (the adaptive policy, say) gets "vs best fixed k": its tokens/s over
the best of the baseline and those fixed k at its concurrency, the k you
would have picked knowing the results. Where the responses carry
draft_len_counts, k_chosen.png plots the k the deployment chose per
iteration against concurrency.

\b
Before and after the run it reads Triton's metrics endpoint and checks that
the spec_decode_* counters moved by exactly what the responses reported.

\b
Output: a table here, and in --output DIR: results.json (field names:
docs/bench-results.md), results.csv (one row per cell), requests.csv (one
row per request), speedup.png, throughput.png (total and per-user tokens/s
by concurrency, crossover marked), acceptance_per_position.png, latency.png,
k_chosen.png, and with --profile a GPU (or, without NVIDIA driver, CPU/RSS)
timeline.

\b
Examples:
  trtspec serve out/model_repository &           # a deployment to measure
  trtspec bench                                  # localhost:8000, defaults
  trtspec bench --concurrency 1,2,4,8 --draft-tokens 0,1,2,4,6 --requests 32
  trtspec bench --protocol grpc --url gpu-box:8001 --prompt-kind code
  trtspec bench --prompts my_prompts.jsonl --max-tokens 128 --profile
  trtspec bench --config build_configs/demo.yaml --requests 4   # own server
  trtspec bench --api openai --url localhost:9000                # through the OpenAI API
  trtspec bench --draft-tokens 6 --draft-length-policy adaptive --fixed-k 0,1,2,3,4,6
  trtspec bench --concurrency 1,8 --k0-on-ensemble --requests 32 --rounds 4   # cells interleaved

\b
Soak (--soak MINUTES): instead of the sweep, --soak-streams clients send
streamed requests back to back for that long, alternating `ensemble` (k =
the largest --draft-tokens value) and `baseline`; --soak-disconnect of
them leave after 1-3 responses and --soak-bad carry a bad value (NaN or
negative temperature, top_p 2, top_k -1, text that is not UTF-8) that
must be refused with a named error. It reports completed / errored /
left / refused requests, the server's count of cancelled requests and of
tokens generated after a cancellation, E2E p50/p95, the RSS of the
server's processes after warm-up, at the peak, at the end of the load and
after --soak-settle seconds, whether the server is still ready, and its
log's error lines; soak.json in --output. Any check that fails makes the
command exit with 1 after writing soak.json. With --config the bench's own
server is measured; with --url give its processes with --profile-pid.
  trtspec bench --config build_configs/demo.yaml --soak 10
"""


def int_list(option: str, text: str, minimum: int) -> list[int]:
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v != ""]
    except ValueError:
        raise UserError(f"{option}: expected comma-separated integers like 1,4, got {text!r}") from None
    if not values:
        raise UserError(f"{option}: give at least one value")
    bad = [v for v in values if v < minimum]
    if bad:
        raise UserError(f"{option}: values must be >= {minimum}, got {', '.join(map(str, bad))}")
    return sorted(set(values))


def default_output_dir(prefix: str = "trtspec-bench") -> Path:
    return Path(f"{prefix}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")


def bench_and_report(settings: Any, prompts: Sequence[Any], output: Path, show_progress: bool = True) -> dict:
    """Run the bench, write the results, print the table and the summary; return the results."""
    from trtspec.bench import RichProgress, run_bench, summary_lines, table, write_results

    run = run_bench(settings, prompts, RichProgress(console) if show_progress else None)
    results = write_results(run, output)
    console.print()
    console.print(table(results))
    console.print()
    for line in summary_lines(results):
        console.print(line, soft_wrap=True)
    files = results["files"]
    console.print(f"[bold]Results[/]  {escape(str(output))}/  ({', '.join(files.values())})", soft_wrap=True)
    for w in results.get("warnings", []):
        err_console.print(f"[yellow]warning:[/] {escape(w)}")
    return results


@click.command("bench", help=_HELP, short_help="A/B benchmark: speculative vs target-only, sweeps, crossover.")
@click.option("--url", default=None, metavar="HOST:PORT",
              help="The deployment's HTTP address (or gRPC with --protocol grpc) "
                   "[default: localhost:8000, or localhost:8001 for gRPC].")
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", show_default=True,
              help="How to send the streamed requests to Triton.")
@click.option("--api", type=click.Choice(["triton", "openai"]), default="triton", show_default=True,
              help="triton: Triton's ensemble/baseline endpoints; openai: the OpenAI-compatible API of "
                   "`trtspec serve` (--url is then its address, default localhost:9000).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Instead of --url: build this config's repository (reference engine) into a temp dir, start "
                   "Triton on free ports, bench it, stop it.")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE.jsonl", help='Prompts, one JSON object a line: {"prompt": "...", "kind": "chat"} '
                                         "(sent as is: apply the chat template yourself).")
@click.option("--prompt-kind", default="chat,code,grounded", show_default=True,
              help="Built-in prompts to use (8 of each): chat, code (completion of a source file), grounded "
                   "(summarise / rewrite / extract from a given passage).")
@click.option("--num-prompts", type=click.IntRange(min=1), default=None,
              help="Use only the first N prompts (the built-in set interleaves the kinds).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True,
              help="Output tokens per request (a request may end earlier at the end-of-sequence token).")
@click.option("--concurrency", default="1,2,4,8,16", show_default=True, metavar="LIST",
              help="Concurrency levels: requests in flight at once (comma-separated).")
@click.option("--draft-tokens", default="0,2,4", show_default=True, metavar="LIST",
              help=f"{NUM_DRAFT_TOKENS} values; 0 = the target-only baseline endpoint (always run).")
@click.option("--draft-source", type=click.Choice(field_by_name("draft_source").choices), default=None,
              help="Who proposes tokens in the speculative cells: the draft model, prompt lookup (n-gram), or "
                   "n-gram when it finds a match else the model. Default: the deployment's draft_source.")
@click.option("--draft-length-policy", type=click.Choice(field_by_name("draft_length_policy").choices), default=None,
              help="fixed: exactly k draft tokens per iteration (what a k sweep measures); adaptive: k adapts and "
                   "a draft source that does not pay is skipped. Default: the deployment's draft_length_policy.")
@click.option("--fixed-k", default=None, metavar="LIST",
              help="Also run the speculative endpoint with draft_length_policy fixed at each of these k (0 is the "
                   "baseline, always run), and report every other cell against the best of them in hindsight at "
                   "its concurrency: 'vs best fixed k'. E.g. --draft-tokens 6 --draft-length-policy adaptive "
                   "--fixed-k 0,1,2,3,4,6.")
@click.option("--k0-on-ensemble", is_flag=True,
              help=f"Also run the speculative endpoint with {NUM_DRAFT_TOKENS}=0 (drafting off): its speedup over "
                   "the baseline (~1) is the speculative loop's own overhead.")
@click.option("--stream/--no-stream", default=True, show_default=True,
              help="--no-stream: one response per request; throughput and end-to-end latency are measured, time to "
                   "first token and inter-token latency are not. Either way, where the deployment does not draft, "
                   "its target calls are runs of engine steps, as target-only decoding is (streamed: the engine "
                   "streams the run, a token a response).")
@click.option("--requests", "requests_per_cell", type=click.IntRange(min=1), default=16, show_default=True,
              help="Measured requests per cell (prompts are reused in order when there are fewer).")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Warm-up requests per cell, sent first and excluded from every figure. With any, the prompts "
                   "the cells will send also go once through each endpoint before a concurrency's measured "
                   "requests: otherwise the first cell to send a prompt meets it cold and the others find it in "
                   "the prefix cache (KV cache reuse).")
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Interleave the cells of each concurrency: each runs its --requests in this many rounds, "
                   "taking turns in A-B-B-A order, so a machine that gets slower or faster during the run "
                   "(other jobs, heat) weighs on every cell alike; a cell's tok/s is its tokens over the sum of "
                   "its rounds' time. Fewer rounds where a round would have fewer requests than the concurrency.")
@click.option("--output", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Results directory [default: ./trtspec-bench-<date>-<time>].")
@click.option("--profile", is_flag=True,
              help="Sample the GPUs (NVML; CPU/RSS of the server without NVIDIA driver) during the run: "
                   "timeline + summary + plot aligned with the requests.")
@click.option("--profile-pid", "profile_pids", type=int, multiple=True, metavar="PID",
              help="With --profile and no NVIDIA driver: also sample this process and its children (e.g. a "
                   "tritonserver on this machine; repeatable). With --config the bench's own server is sampled.")
@click.option("--metrics-url", default=None, metavar="URL",
              help="Triton's Prometheus endpoint for the counter cross-check [default: port 8002 of the --url "
                   "host; 'none' skips the check].")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for one response.")
@click.option("--soak", "soak_minutes", type=click.FloatRange(min=0, min_open=True), default=None, metavar="MINUTES",
              help="Run a soak test for this many minutes instead of the sweep (see above).")
@click.option("--soak-streams", type=click.IntRange(min=1), default=16, show_default=True,
              help="With --soak: clients sending at once.")
@click.option("--soak-disconnect", type=click.FloatRange(0, 1), default=0.2, show_default=True,
              help="With --soak: share of the requests whose client leaves after 1-3 responses.")
@click.option("--soak-bad", type=click.FloatRange(0, 1), default=0.05, show_default=True,
              help="With --soak: share of the requests carrying a bad value.")
@click.option("--soak-settle", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="With --soak: seconds to keep sampling RSS after the load (is memory returned?).")
@click.option("--fault-every", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="With --soak and --config: SIGKILL a random model process this often; report per fault the "
                   "requests failed and the recovery time (the deployment restarts itself).")
def bench(url: str | None, protocol: str, api: str, config_path: Path | None, prompts_file: Path | None,
          prompt_kind: str, num_prompts: int | None, max_tokens: int, concurrency: str, draft_tokens: str,
          draft_source: str | None, draft_length_policy: str | None, fixed_k: str | None, k0_on_ensemble: bool,
          stream: bool, requests_per_cell: int, warmup: int, rounds: int, output: Path | None, profile: bool,
          profile_pids: tuple[int, ...], metrics_url: str | None, timeout: float, soak_minutes: float | None,
          soak_streams: int, soak_disconnect: float, soak_bad: float, soak_settle: float,
          fault_every: float | None) -> None:
    from trtspec.bench import BenchError, BenchSettings, PromptError, builtin_prompts, load_prompts, parse_kinds
    from trtspec.bench.metrics import MetricsError

    if config_path is not None and url is not None:
        raise UserError("give either --url (a running deployment) or --config (start one), not both")
    if config_path is not None and metrics_url is not None:
        raise UserError("--metrics-url applies to --url; with --config the bench reads its own server's metrics")
    try:
        if prompts_file is not None:
            prompts = load_prompts(prompts_file)
        else:
            prompts = builtin_prompts(parse_kinds(prompt_kind))
    except PromptError as e:
        raise UserError(escape(str(e))) from None
    if num_prompts is not None:
        prompts = prompts[:num_prompts]
    settings = BenchSettings(
        url=url or _default_url(api, protocol),
        protocol=protocol,
        api=api,
        max_tokens=max_tokens,
        concurrency=int_list("--concurrency", concurrency, 1),
        draft_tokens=int_list("--draft-tokens", draft_tokens, 0),
        requests_per_cell=requests_per_cell,
        warmup=warmup,
        rounds=rounds,
        k0_on_ensemble=k0_on_ensemble,
        stream=stream,
        fixed_k=int_list("--fixed-k", fixed_k, 0) if fixed_k is not None else (),
        draft_source=draft_source,
        draft_length_policy=draft_length_policy,
        metrics_url=metrics_url,
        profile=profile,
        profile_pids=list(profile_pids) or None,
        timeout=timeout,
    )
    run: Any = lambda s, p, out, server=None: bench_and_report(s, p, out)  # noqa: E731
    if soak_minutes is not None:
        if api != "triton":
            raise UserError("--soak sends to Triton's endpoints; leave out --api openai")
        run = _soak_run(settings, soak_minutes, soak_streams, soak_disconnect, soak_bad, soak_settle,
                        profile_pids, fault_every)
    output = output or default_output_dir("trtspec-soak" if soak_minutes is not None else "trtspec-bench")
    try:
        if config_path is None:
            run(settings, prompts, output)
        else:
            _bench_own_server(config_path, settings, prompts, output, run)
    except (BenchError, MetricsError) as e:
        raise UserError(escape(str(e))) from None
    except KeyboardInterrupt:
        err_console.print("\n[yellow]interrupted[/]")
        raise SystemExit(130) from None


def _soak_run(settings: Any, minutes: float, streams: int, disconnect: float, bad: float, settle: float,
              server_pids: tuple[int, ...], fault_every: float | None) -> Any:
    """--soak: what runs instead of the sweep, with the same arguments (the soak samples the server itself, so the
    sweep's profiler is off)."""
    from trtspec.bench.soak import SoakSettings

    soak = SoakSettings(minutes, streams, disconnect, bad, settle,
                        grpc_url=settings.url if settings.protocol == "grpc" else None, server_pids=list(server_pids),
                        fault_every_s=fault_every)
    settings.profile = False
    return lambda s, p, out, **kw: soak_and_report(s, soak, p, out, **kw)


def _default_url(api: str, protocol: str) -> str:
    from trtspec.openai.server import DEFAULT_PORT

    if api == "openai":
        return f"localhost:{DEFAULT_PORT}"
    return "localhost:8001" if protocol == "grpc" else "localhost:8000"


def soak_and_report(settings: Any, soak: Any, prompts: Sequence[Any], output: Path,
                    server: Any = None) -> dict:
    """Run the soak (against `server` when the bench started it), print the table and the checks, write soak.json."""
    import json

    from trtspec.bench.soak import check_lines, failed_checks, run_soak, summarize, table

    if server is not None:
        from trtspec.bench.local import server_pids

        soak.grpc_url = server.endpoints.grpc_address
        soak.server_pids = server_pids(server)
        soak.log_file = server.options.log_file
        soak.server = server
    status = console.status("soak: warming up...", spinner="dots")
    status.start()

    def tick(records: list, elapsed: float) -> None:
        kinds = [r.kind for r in records]
        status.update(f"soak: {elapsed / 60:.1f}/{soak.minutes:g} min, {len(records)} requests "
                      f"({kinds.count('disconnect')} left early, {kinds.count('bad')} bad, "
                      f"{sum(1 for r in records if r.kind != 'bad' and r.record.error)} failed)")

    try:
        run = run_soak(settings, soak, prompts, tick)
        status.update(f"soak: load done; sampling RSS for {soak.settle_s:g} s more...")
    finally:
        status.stop()
    summary = summarize(run)
    output.mkdir(parents=True, exist_ok=True)
    (output / "soak.json").write_text(json.dumps(summary, indent=2))
    console.print()
    console.print(table(summary))
    for line in check_lines(summary):
        console.print(line, soft_wrap=True)
    console.print(f"[bold]Results[/]  {escape(str(output / 'soak.json'))}", soft_wrap=True)
    failed = failed_checks(summary)
    if failed:  # a soak is a pass/fail test: a script or CI job running it must see the failure
        raise UserError(f"the soak failed {len(failed)} check{'s' if len(failed) > 1 else ''}: "
                        + escape("; ".join(failed)))
    return summary


def _bench_own_server(config_path: Path, settings: Any, prompts: Sequence[Any], output: Path, run: Any) -> None:
    from trtspec.bench.local import check_local, local_deployment, prepare_checkpoints, server_pids
    from trtspec.config import ConfigError, load_config
    from trtspec.demo_pair import DemoPairError
    from trtspec.openai.backend import DeploymentError
    from trtspec.repository import RepositoryError
    from trtspec.server import ServerError

    try:
        cfg = load_config(config_path)
    except ConfigError as e:
        raise UserError(escape(str(e))) from None
    check_local(cfg)  # before anything is written
    for option, ks in (("--draft-tokens", settings.draft_tokens), ("--fixed-k", settings.fixed_k)):
        too_long = cfg.speculative.too_long(option, ks)
        if too_long:
            raise UserError(too_long)
    output.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    status = console.status("Preparing the deployment...", spinner="dots")
    status.start()
    try:
        prepare_checkpoints(cfg, lambda m: status.update(f"Preparing the deployment: {m}..."))
        with local_deployment(cfg, log_file=output / "triton.log",
                              on_step=lambda m: status.update(f"{m[0].upper()}{m[1:]}...")) as server:
            status.stop()
            ep = server.endpoints
            console.print(f"[green]Triton is ready[/] after {time.monotonic() - started:.0f} s "
                          f"(HTTP {ep.http_address}, gRPC {ep.grpc_address}; "
                          f"log: {escape(str(output / 'triton.log'))})", soft_wrap=True)
            settings.url = ep.grpc_address if settings.protocol == "grpc" else ep.http_address
            settings.metrics_url = ep.metrics
            settings.profile_pids = server_pids(server) or None
            try:
                with contextlib.ExitStack() as stack:
                    if settings.api == "openai":
                        from trtspec.openai.server import OpenAIServer

                        api = stack.enter_context(OpenAIServer(server.options.model_repository, ep.grpc_address,
                                                               host="127.0.0.1", port=0, name=cfg.name))
                        settings.url = api.url.removesuffix("/v1")
                    run(settings, prompts, output, server=server)
            finally:
                console.print("Stopping Triton...")
    except (ServerError, DemoPairError, RepositoryError, ConfigError, DeploymentError) as e:
        raise UserError(escape(str(e))) from None
    finally:
        status.stop()


command = bench
