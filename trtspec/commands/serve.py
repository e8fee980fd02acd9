"""`trtspec serve REPO`: start Triton on a model repository, wait until every model is loaded, keep serving."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from trtspec.commands._common import UserError, console, err_console
from trtspec.openai.auth import API_KEY_ENV
from trtspec.openai.server import DEFAULT_PORT
from trtspec.repository_reader import RepositoryError
from trtspec.server import (
    LocalTritonServer,
    ServerError,
    ServerOptions,
    ServerStartError,
    TritonServer,
    TrtllmTritonServer,
    create_server,
    read_repository,
    trtllm_model_names,
)
from trtspec.server.health import DEFAULT_HEALTH_PORT, HealthServer, TritonHealth
from trtspec.server.watchdog import ModelWatchdog, deployment_watchdog, watchable

_HELP = """Serve a Triton model repository (e.g. the one `trtspec build` wrote) over HTTP and gRPC.

\b
Starts tritonserver, waits until every model has loaded, prints the
endpoints and the loaded models, and keeps serving until Ctrl-C (or
SIGTERM, e.g. `docker stop`), then shuts down cleanly (exit code 0).
If a model fails to load, it says which one and why, with the end of
the server log (exit code 1).

\b
Stopping is bounded whatever the clients do: on Ctrl-C / SIGTERM Triton
gets --exit-timeout seconds to finish in-flight requests, and is killed
(with its model processes) --kill-grace seconds after that, so `trtspec
serve` returns within --exit-timeout + --kill-grace. If Triton exits with an
error (or has to be killed), `trtspec serve` exits 1 and says why.

\b
Health that tells the truth: Triton's own /v2/health/ready stays 200
when a model's process dies. `trtspec serve` watches every model's
process (Triton runs with its model-control API on). When an engine's
process dies, that engine alone is loaded again: the requests that
needed it fail at once with a clear, retryable error, the rest go on,
and /health/ready on --health-port (and the OpenAI API's /health) says
503 meanwhile (200 "degraded" for the draft engine: the endpoints serve
without drafting). When any other model's process dies, Triton is
restarted at once (every request in flight fails with a clear error
instead of hanging on the dead process). Each recovery is logged and
counted (trtspec_model_restarts_total on --health-port's /metrics). A
deployment not back within --recovery-timeout makes /health/live 503
and `trtspec serve` exit 1, so that a supervisor restarts it. If Triton
itself dies, it exits 1 at once with the reason.

\b
API keys: with --api-key KEY (or $TRTSPEC_API_KEY, which `ps` does not
show) every /v1 path of the OpenAI API needs `Authorization: Bearer KEY`
(the openai client's api_key=KEY) and answers 401 without it, as vLLM's
--api-key / $VLLM_API_KEY does. /health stays open for probes. Triton's
own HTTP/gRPC/metrics ports are not behind the key: keep them private.

\b
Which tritonserver runs (first match wins):
  1. --tritonserver PATH, or $TRITONSERVER=PATH
  2. `tritonserver` on PATH
  3. /opt/tritonserver/bin/tritonserver (NVIDIA NGC containers)
  4. the one in the nvidia-pytriton wheel (`pip install nvidia-pytriton`):
     runs anywhere (CPU is fine) with Python-backend models; its Python
     models run in *this* Python environment. Force it with
     --tritonserver bundled. (Its backend dir, with the Python-backend
     stub for this Python, is prepared once in $TRTSPEC_CACHE,
     default ~/.cache/trtspec.)

\b
If the repository holds TensorRT-LLM models (backend "tensorrtllm"),
Triton is launched the way TensorRT-LLM needs: orchestrator mode when
there are two of them (draft + target), mpirun with --world-size ranks
otherwise.

\b
Examples:
  trtspec serve out/model_repository
  trtspec serve out/model_repository --http-port 0 --grpc-port 0   # free ports
  curl localhost:9000/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model": "NAME", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32}'
  TRTSPEC_API_KEY=$(cat key.txt) trtspec serve out/model_repository   # clients: Authorization: Bearer <key>
  TRITONSERVER=/opt/tritonserver/bin/tritonserver trtspec serve repo --verbose
"""


def _models_table(server: TritonServer, repo: Path) -> Table:
    backends: dict[str, str] = {}
    try:
        for m in read_repository(repo):
            backends[m.name] = m.backend or m.platform
    except RepositoryError:
        pass
    table = Table(title="Models", title_justify="left", show_edge=False, header_style="bold")
    table.add_column("model")
    table.add_column("version")
    table.add_column("backend")
    table.add_column("state")
    for m in sorted(server.models(), key=lambda m: str(m.get("name"))):
        state = str(m.get("state") or "-")
        style = "green" if state == "READY" else "yellow"
        table.add_row(str(m.get("name")), str(m.get("version") or "-"), backends.get(str(m.get("name")), "?"),
                      f"[{style}]{state}[/]")
    return table


def _start_openai(repo: Path, server: TritonServer, port: int, name: str | None,
                  watchdog: ModelWatchdog | None, api_keys: tuple[str, ...]) -> Any:
    from trtspec.openai.backend import DeploymentError
    from trtspec.openai.server import OpenAIServer

    try:
        api = OpenAIServer(repo, server.endpoints.grpc_address, port=port, name=name,
                           health=watchdog.health if watchdog is not None else None, api_keys=api_keys)
    except DeploymentError as e:  # not a trtspec deployment: Triton alone is what this repository serves
        err_console.print(f"[yellow]OpenAI API off:[/] {escape(str(e))}", soft_wrap=True)
        return None
    try:
        api.start()
    except DeploymentError as e:  # the caller stops Triton
        raise UserError(escape(str(e))) from None
    return api


def _print_ready(server: TritonServer, repo: Path, elapsed: float, api: Any = None,
                 health: HealthServer | None = None) -> None:
    ep = server.endpoints
    console.print(f"[bold green]Triton is ready[/] after {elapsed:.1f} s")
    console.print(f"  HTTP     {ep.http}")
    console.print(f"  gRPC     {ep.grpc_address}")
    console.print(f"  metrics  {ep.metrics}")
    if health is not None:
        console.print(f"  health   http://{ep.host}:{health.port}/health/ready  /health/live  /metrics")
    if api is not None:
        models = ", ".join(api.deployment.models)
        key = ", API key required" if api.protected else ""
        console.print(f"  OpenAI   {api.url}  (models: {escape(models)}{key})")
    if server.log_path:
        console.print(f"  log      {server.log_path}")
    console.print(_models_table(server, repo))
    console.print("[dim]Serving. Press Ctrl-C to stop.[/]")


class _Follower:
    """Copies new lines of the server log to the console."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.offset = path, 0

    def pump(self) -> None:
        if not self.path:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        if data:
            self.offset += len(data)
            click.echo(data.decode("utf-8", errors="replace"), nl=False)


@click.command("serve", help=_HELP, short_help="Serve a model repository with Triton (HTTP + gRPC).")
@click.argument("repo", type=click.Path(file_okay=False, path_type=Path))
@click.option("--http-port", default=8000, show_default=True, type=int, help="HTTP port (0: pick a free one).")
@click.option("--grpc-port", default=8001, show_default=True, type=int, help="gRPC port (0: pick a free one).")
@click.option("--metrics-port", default=8002, show_default=True, type=int,
              help="Prometheus metrics port (0: pick a free one).")
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the server log (Triton + what Python models print) here "
                   "[default: a new file in the temp dir, path printed].")
@click.option("--verbose", "-v", is_flag=True, help="Verbose Triton log (--log-verbose=1).")
@click.option("--follow-log", is_flag=True,
              help="Also copy the server log to this terminal while serving (useful in containers).")
@click.option("--timeout", default=300.0, show_default=True, type=float,
              help="Seconds to wait for all models to load.")
@click.option("--exit-timeout", default=ServerOptions.exit_timeout_s, show_default=True, type=click.IntRange(min=0),
              help="On Ctrl-C/SIGTERM: seconds Triton gets to finish in-flight requests before it is stopped "
                   "(see the bound above).")
@click.option("--kill-grace", default=ServerOptions.kill_grace_s, show_default=True, type=click.FloatRange(min=0),
              help="On Ctrl-C/SIGTERM: seconds past --exit-timeout before Triton and its model processes are killed.")
@click.option("--tritonserver", "tritonserver", default=None, metavar="PATH|bundled",
              help="tritonserver binary to use [default: see above; also $TRITONSERVER].")
@click.option("--disable-auto-complete-config", is_flag=True,
              help="Trust the config.pbtxt files as written (Triton skips the extra Python process it starts per "
                   "Python model to auto-complete its config: starts faster).")
@click.option("--openai-port", default=DEFAULT_PORT, show_default=True, type=int,
              help="Port of the OpenAI-compatible API (0: pick a free one).")
@click.option("--openai/--no-openai", "openai", default=True, show_default=True,
              help="Serve the OpenAI-compatible API beside Triton.")
@click.option("--served-model-name", default=None, metavar="NAME",
              help="The model name of the OpenAI API [default: the build config's name from manifest.json beside "
                   "the repository, else the name of the folder that holds it].")
@click.option("--api-key", "api_keys", multiple=True, envvar=API_KEY_ENV, metavar="KEY",
              help=f"Require `Authorization: Bearer KEY` on the OpenAI API's /v1 paths (401 without it; see above). "
                   f"Repeat it to accept several keys (a rotation). Prefer ${API_KEY_ENV} (keys separated by "
                   "spaces): a command line is visible to every user of the machine [default: no key].")
@click.option("--health-port", default=None, type=int,
              help=f"Port of /health/ready, /health/live and /metrics (model restarts) (0: pick a free one) "
                   f"[default: {DEFAULT_HEALTH_PORT}, or a free one when --http-port is 0].")
@click.option("--recovery-timeout", default=300.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds a model whose process died may take to come back before the deployment reports "
                   "not live (and exits 1).")
@click.option("--world-size", default=1, show_default=True, type=int,
              help="TensorRT-LLM only: MPI ranks (TP x PP of the engine) in leader mode.")
def serve(
    repo: Path,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    log_file: Path | None,
    verbose: bool,
    follow_log: bool,
    timeout: float,
    exit_timeout: int,
    kill_grace: float,
    tritonserver: str | None,
    disable_auto_complete_config: bool,
    openai_port: int,
    openai: bool,
    served_model_name: str | None,
    api_keys: tuple[str, ...],
    health_port: int | None,
    recovery_timeout: float,
    world_size: int,
) -> None:
    _check_repository(repo)
    options = ServerOptions(
        model_repository=repo,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_file=log_file,
        keep_log=True,
        log_verbose=1 if verbose else 0,
        tritonserver=tritonserver,
        disable_auto_complete_config=disable_auto_complete_config,
        exit_timeout_s=exit_timeout,
        kill_grace_s=kill_grace,
        ready_timeout_s=timeout,
    )
    if not trtllm_model_names(repo):  # a local tritonserver, watched
        options = watchable(options)
    server = _start_triton(options, world_size)
    if health_port is None:
        health_port = 0 if http_port == 0 else DEFAULT_HEALTH_PORT
    previous_handlers = _stop_signals_as_keyboard_interrupt()
    follower: _Follower | None = None
    api = watchdog = health = None
    try:
        started = time.monotonic()
        _wait_ready(server, repo, timeout)
        if isinstance(server, LocalTritonServer):
            watchdog = deployment_watchdog(server, give_up_s=recovery_timeout,
                                           on_event=lambda m: err_console.print(f"[yellow]watchdog:[/] {escape(m)}"))
            watchdog.start()
        health = _start_health(watchdog or TritonHealth(server), options.bind_address, health_port)
        api = _start_openai(repo, server, openai_port, served_model_name, watchdog, api_keys) if openai else None
        _print_ready(server, repo, time.monotonic() - started, api, health)
        follower = _Follower(server.log_path) if follow_log else None
        _serve_until_it_ends(server, watchdog, follower)
    except KeyboardInterrupt:
        err_console.print("\nStopping Triton...")
        _stop_beside_triton(watchdog, health, api)
        _stop_triton(server, follower)
    except BaseException:
        _stop_beside_triton(watchdog, health, api)
        server.stop()
        raise
    finally:
        _restore_stop_signals(previous_handlers)


def _check_repository(repo: Path) -> None:
    if not repo.is_dir():
        raise UserError(f"model repository {repo} does not exist (build one with `trtspec build CONFIG`).")
    if not any((d / "config.pbtxt").is_file() for d in repo.iterdir() if d.is_dir()):
        raise UserError(f"{repo} holds no model (no <model>/config.pbtxt): is it a Triton model repository?")


def _start_triton(options: ServerOptions, world_size: int) -> TritonServer:
    """Starts tritonserver (the launch TensorRT-LLM models need, or a local one) without waiting for its models."""
    try:
        server = create_server(options, world_size=world_size)
        if world_size != 1 and not isinstance(server, TrtllmTritonServer):
            raise UserError("--world-size only applies to TensorRT-LLM models; this repository has none.")
        installation = getattr(server, "installation", None)
        if installation is not None:
            console.print(f"[dim]tritonserver: {escape(installation.describe())}[/]", soft_wrap=True)
        server.start()
    except ServerError as e:
        raise UserError(escape(str(e))) from None
    return server


def _wait_ready(server: TritonServer, repo: Path, timeout: float) -> None:
    """Waits until every model has loaded; stops Triton and says why where one did not."""
    try:
        with console.status(f"Starting Triton on {repo} (loading models; up to {timeout:g} s)...", spinner="dots"):
            server.wait_ready(timeout)
    except ServerStartError as e:
        server.stop()
        raise UserError(escape(str(e))) from None


def _start_health(source: ModelWatchdog | TritonHealth, bind_address: str | None, port: int) -> HealthServer:
    try:
        return HealthServer(source, host=bind_address or "0.0.0.0", port=port).start()
    except OSError as e:
        raise UserError(f"health endpoint: cannot listen on port {port} ({e.strerror}); pick "
                        "another with --health-port") from None


def _serve_until_it_ends(server: TritonServer, watchdog: ModelWatchdog | None, follower: _Follower | None) -> None:
    """Returns only by an exception: Ctrl-C or SIGTERM (KeyboardInterrupt), or a deployment that cannot serve any
    more (Triton died, or a model did not come back in time)."""
    while True:
        rc = server.wait(timeout=0.25)
        if follower:
            follower.pump()
        if watchdog is not None:  # it knows a restart of its own from Triton dying
            if rc is not None:
                time.sleep(0.25)  # the old process during a restart: wait() returns at once
            state = watchdog.health()
            if not state.live:
                tail = "\n".join(f"  | {line}" for line in server.log_tail(40))
                raise UserError(escape(f"{state.reason}.\nLast log lines:\n{tail}"))
        elif rc is not None:
            tail = "\n".join(f"  | {line}" for line in server.log_tail(40))
            raise UserError(escape(f"tritonserver exited unexpectedly with code {rc}.\nLast log lines:\n{tail}"))


def _stop_beside_triton(watchdog: ModelWatchdog | None, health: HealthServer | None, api: Any) -> None:
    """Stops what serves beside Triton: the watchdog first (the model processes that end with Triton are not
    faults to repair), the health endpoint, the OpenAI API."""
    if watchdog is not None:
        watchdog.stop()
    if health is not None:
        health.stop()
    if api is not None:
        api.stop()


def _stop_triton(server: TritonServer, follower: _Follower | None) -> None:
    """Stops Triton on Ctrl-C or SIGTERM; an error where it did not stop cleanly."""
    rc = server.stop()
    if follower is not None:
        follower.pump()
    if rc != 0:
        raise UserError(escape(_stop_failure(server, rc))) from None
    err_console.print(f"Triton stopped (exit code {rc}).")


def _stop_failure(server: TritonServer, rc: int | None) -> str:
    reason = getattr(server, "stop_reason", None)
    lines = [line for line in server.log_tail(60) if re.search(r"(?i)error|timeout|fail|exit", line)][-8:]
    tail = "\n".join(f"  | {line}" for line in lines)
    what = reason or f"tritonserver exited with code {rc} on shutdown"
    return f"{what}.\nFrom its log:\n{tail}" if tail else f"{what}."


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop_signals_as_keyboard_interrupt() -> Any:
    """SIGTERM and SIGINT both stop the server cleanly. SIGINT is set explicitly: a process started in the
    background by a non-interactive shell (`trtspec serve &` in a script, CI runners) inherits it ignored,
    and `kill -INT` must still stop it."""
    try:
        return (signal.signal(signal.SIGTERM, _raise_keyboard_interrupt),
                signal.signal(signal.SIGINT, signal.default_int_handler))
    except ValueError:  # not in the main thread
        return None


def _restore_stop_signals(previous: Any) -> None:
    if previous is not None:
        try:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])
        except ValueError:
            pass


command = serve
