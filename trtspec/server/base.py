"""The small interface every way of running Triton implements, plus its options and errors.

Layout after triton_cli's ``server/`` package: one abstract ``TritonServer`` with ``start`` /
``wait_ready`` / ``stop`` / ``endpoints`` / ``log_tail`` / ``returncode``, and one class per way
of launching it (``local.LocalTritonServer``: a tritonserver process on this machine;
``launch.TrtllmTritonServer``: the TensorRT-LLM launch modes, orchestrator or mpirun leader).
"""

from __future__ import annotations

import abc
import dataclasses
import json
import re
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence, Union

Port = Union[int, str]  # an int, or 0 / "auto" for a free port
ModelControlMode = Literal["none", "explicit", "poll"]

DEFAULT_LOG_TAIL_LINES = 40
_MAX_REASON_LINES = 20

METRICS_GRACE_S = 10.0  # how long ready waits for the metrics port once HTTP is ready


class ServerError(RuntimeError):
    """Base class of the errors raised by ``trtspec.server``."""


class TritonNotFoundError(ServerError):
    """No usable tritonserver binary (neither a system one nor the one in the nvidia-pytriton wheel)."""


class ServerStartError(ServerError):
    """The server did not become ready: it exited, a model failed to load, or the timeout passed.

    ``str(error)`` is written for a person: what happened, which models failed and why, and the last log lines.
    The same facts are available as attributes for programs.
    """

    def __init__(
        self,
        summary: str,
        *,
        failed_models: Mapping[str, str] | None = None,
        log_lines: Sequence[str] = (),
        log_path: Path | None = None,
        returncode: int | None = None,
    ) -> None:
        self.summary = summary
        self.failed_models: dict[str, str] = dict(failed_models or {})
        self.log_lines: list[str] = list(log_lines)
        self.log_path = log_path
        self.returncode = returncode
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [self.summary]
        if self.failed_models:
            parts.append("Models that failed to load:")
            for name, reason in self.failed_models.items():
                lines = (reason or "(no reason given)").strip().splitlines() or ["(no reason given)"]
                parts.append(f"  - {name}: {lines[0]}")
                more = [line for line in lines[1:] if line.strip()]
                parts.extend(f"      {line}" for line in more[:_MAX_REASON_LINES])
                if len(more) > _MAX_REASON_LINES:
                    parts.append(f"      ... ({len(more) - _MAX_REASON_LINES} more lines in the log)")
        if self.log_lines:
            where = f" ({self.log_path})" if self.log_path else ""
            parts.append(f"Last {len(self.log_lines)} lines of the server log{where}:")
            parts.extend(f"  | {line}" for line in self.log_lines)
        elif self.log_path:
            parts.append(f"Server log: {self.log_path}")
        return "\n".join(parts)


@dataclass(frozen=True)
class Endpoints:
    """Where a running server listens. ``http``/``grpc``/``metrics`` are URLs; ``*_address`` are what
    ``tritonclient.http`` / ``tritonclient.grpc`` take as ``url=`` (``host:port``, no scheme)."""

    host: str
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def http(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"grpc://{self.host}:{self.grpc_port}"

    @property
    def metrics(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def as_dict(self) -> dict[str, str]:
        return {"http": self.http, "grpc": self.grpc, "metrics": self.metrics}


@dataclass
class ServerOptions:
    """Everything needed to start one Triton server. Ports may be 0 or ``"auto"`` (a free port is picked)."""

    model_repository: Union[str, Path]
    http_port: Port = 8000
    grpc_port: Port = 8001
    metrics_port: Port = 8002
    #: host used to *reach* the server (endpoints, readiness probe)
    host: str = "127.0.0.1"
    #: address the server binds (``--http-address`` etc.); None = Triton's default (0.0.0.0)
    bind_address: str | None = None
    allow_metrics: bool = True
    #: file receiving the server's stdout+stderr (the Triton log and whatever Python models print).
    #: None: a fresh temporary file (see ``TritonServer.log_path``).
    log_file: Union[str, Path, None] = None
    #: keep the log file after ``stop()``. None: keep it unless it is the automatic temporary file and the server
    #: exited cleanly (exit code 0)
    keep_log: bool | None = None
    #: ``--log-verbose`` level (0 = off)
    log_verbose: int = 0
    model_control_mode: ModelControlMode = "none"
    #: with ``model_control_mode="explicit"``: models loaded at startup (``["*"]`` = all)
    load_models: Sequence[str] = ()
    #: ``--model-load-thread-count``: models Triton loads at once. None: one thread per model of the repository, so
    #: that no model waits behind others for a thread (Triton's default, 4, loaded the demo's engines only after
    #: its loop models: docs/benchmarks/faults.md)
    model_load_threads: int | None = None
    strict_readiness: bool = True
    exit_on_error: bool = True
    #: skip the extra stub process Triton starts per Python model to auto-complete its config (faster start;
    #: needs complete config.pbtxt files). Skipped anyway when no model of the repository can be auto-completed
    #: (``trtspec.server.local._needs_auto_complete``)
    disable_auto_complete_config: bool = False
    #: ``--exit-timeout-secs``: how long Triton waits for in-flight requests on shutdown
    exit_timeout_s: int = 10
    #: after SIGINT, seconds past ``exit_timeout_s`` before ``stop()`` kills the server's process group
    kill_grace_s: float = 10.0
    #: seconds ``with server:`` (``__enter__``) waits for every model to load
    ready_timeout_s: float = 300.0
    #: extra ``--backend-config`` values, e.g. ``"python,shm-default-byte-size=16777216"``
    backend_config: Sequence[str] = ()
    #: Python-backend shared memory (``/dev/shm``) per model instance; None = Triton's default
    python_shm_default_byte_size: int | None = None
    python_shm_growth_byte_size: int | None = None
    #: prefix of the Python backend's /dev/shm regions; None = a unique one per server (so that several servers
    #: on one machine never collide)
    python_shm_prefix: str | None = None
    #: environment variables added for the server process (and its Python model stubs)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: directories prepended to PYTHONPATH of the server (and thus of the Python models)
    pythonpath: Sequence[Union[str, Path]] = ()
    #: let Python models import this interpreter's packages (its site-packages + the trtspec package dir);
    #: None = yes with the bundled (pytriton) tritonserver, no with a system one (whose stub has its own Python)
    inherit_python_env: bool | None = None
    #: tritonserver binary; None = discover (``$TRITONSERVER``, PATH, /opt/tritonserver, nvidia-pytriton);
    #: ``"bundled"`` = force the nvidia-pytriton one
    tritonserver: Union[str, Path, None] = None
    backend_directory: Union[str, Path, None] = None
    cache_directory: Union[str, Path, None] = None
    #: where trtspec keeps the prepared backend directory for the bundled tritonserver
    #: (None: ``$TRTSPEC_CACHE`` or ``~/.cache/trtspec``)
    cache_dir: Union[str, Path, None] = None
    #: more tritonserver arguments, appended as given
    extra_args: Sequence[str] = ()
    #: kill the server (SIGTERM) if the Python thread that started it dies (Linux ``PR_SET_PDEATHSIG``)
    die_with_parent: bool = True

    @property
    def stop_bound_s(self) -> float:
        """The longest ``stop()`` takes, whatever clients did: Triton's exit timeout, then a kill."""
        return float(self.exit_timeout_s) + self.kill_grace_s

    def replace(self, **changes: Any) -> "ServerOptions":
        return dataclasses.replace(self, **changes)

    @property
    def repository_path(self) -> Path:
        return Path(self.model_repository).expanduser().resolve()


# ----------------------------------------------------------------------------------------------------------------
# Ports


def is_auto_port(port: Port) -> bool:
    return port in (0, "0", "auto", None)


def free_port(exclude: Sequence[int] = ()) -> int:
    """A TCP port that is free right now on all interfaces (Triton binds 0.0.0.0 by default)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        if port not in exclude:
            return port
    raise ServerError("could not find a free TCP port")


def resolve_ports(options: ServerOptions) -> tuple[int, int, int]:
    """(http, grpc, metrics) with every 0/"auto" replaced by a distinct free port."""
    out: list[int] = []
    for port in (options.http_port, options.grpc_port, options.metrics_port):
        if is_auto_port(port):
            out.append(free_port(exclude=out))
        else:
            try:
                out.append(int(port))
            except (TypeError, ValueError):
                raise ServerError(f"invalid port {port!r}: use a number, or 0 / 'auto' for a free port") from None
    return out[0], out[1], out[2]


# ----------------------------------------------------------------------------------------------------------------
# Log scanning (for error messages when the HTTP endpoint is gone)

# E1121 ... model_lifecycle.cc:642] "failed to load 'env' version 1: Internal: ModuleNotFoundError: ...\n\nAt: ..."
_FAILED_LOAD_RE = re.compile(r"failed to load '(?P<name>[^']+)' version (?P<version>\d+): (?P<reason>.*)")
# | env   | 1       | UNAVAILABLE: Internal: ModuleNotFoundError: No module named 'numpy'  |
_TABLE_ROW_RE = re.compile(r"^\|\s*(?P<name>[^|\s]+)\s*\|\s*(?P<version>\d+)\s*\|\s*UNAVAILABLE:\s*(?P<reason>.*?)\s*\|?\s*$")
# E... model_repository_manager.cc] "Poll failed for model directory 'x': ..."  /  "failed to load model 'x': ..."
#: tritonserver could not listen on a port
BIND_ERROR_RE = re.compile(r"already in use|Address in use|failed to bind|Failed to start (?:HTTP|GRPC|Metrics)", re.I)
_POLL_FAILED_RE = re.compile(r"(?:Poll failed for model directory|failed to load model) '(?P<name>[^']+)': (?P<reason>.*)")


def _clean_reason(reason: str) -> str:
    # Triton quotes log messages and escapes newlines: unescape, keep the whole message (tracebacks included)
    reason = reason.strip()
    if reason.endswith('"'):
        reason = reason[:-1]
    return reason.replace("\\n", "\n").replace('\\"', '"').strip()


def failed_models_from_log(lines: Sequence[str]) -> dict[str, str]:
    """Model name -> reason (possibly several lines), from Triton log lines (used when the server is gone)."""
    found: dict[str, str] = {}
    for line in lines:
        for regex in (_FAILED_LOAD_RE, _POLL_FAILED_RE, _TABLE_ROW_RE):
            m = regex.search(line)
            if m:
                name, reason = m.group("name"), _clean_reason(m.group("reason"))
                if name not in found or (reason and len(reason) > len(found[name])):
                    found[name] = reason
                break
    return found


_BORDER_RE = re.compile(r"^\+-+\+")
_COUNTDOWN_RE = re.compile(r'server\.cc:\d+\] "Timeout \d+: Found ')


def interesting_lines(lines: Sequence[str]) -> list[str]:
    """Log lines minus noise: the server-options table Triton prints at startup and the once-a-second shutdown
    countdown ("Timeout 29: Found 1 live models ...")."""
    out: list[str] = []
    in_options = False
    borders = 0
    for i, line in enumerate(lines):
        if not in_options and _BORDER_RE.match(line) and i + 1 < len(lines) and "| Option" in lines[i + 1]:
            in_options, borders = True, 0
        if in_options:
            if _BORDER_RE.match(line):
                borders += 1
                if borders == 3:  # top, under the header, bottom
                    in_options = False
            continue
        if _COUNTDOWN_RE.search(line):
            continue
        out.append(line)
    return out


def read_log_tail(path: Path | None, n: int = DEFAULT_LOG_TAIL_LINES, max_bytes: int = 256 * 1024) -> list[str]:
    """The last ``n`` lines of a log file (reads at most ``max_bytes`` from its end)."""
    if path is None or n <= 0:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # first one is probably cut
    return lines[-n:]


def read_log(path: Path | None, max_bytes: int = 4 * 1024 * 1024) -> list[str]:
    return read_log_tail(path, n=10**9, max_bytes=max_bytes)


# ----------------------------------------------------------------------------------------------------------------
# HTTP probing (stdlib only: no client library needed just to wait)


# never send local probes through $http_proxy
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get_status(url: str, timeout: float = 1.0) -> int | None:
    """HTTP status of a GET, or None if nothing answered."""
    try:
        with _OPENER.open(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError, ValueError):
        return None


def repository_index(http_url: str, timeout: float = 2.0) -> list[dict[str, Any]] | None:
    """``POST v2/repository/index``: [{"name", "version", "state", "reason"}, ...], or None if unreachable."""
    req = urllib.request.Request(
        f"{http_url}/v2/repository/index", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            data = json.loads(r.read() or b"[]")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return data if isinstance(data, list) else None


def failed_models_from_index(index: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Models Triton tried to load and could not (UNAVAILABLE with a reason other than 'unloaded')."""
    out: dict[str, str] = {}
    for m in index:
        reason = str(m.get("reason") or "")
        if m.get("state") == "UNAVAILABLE" and reason and reason != "unloaded":
            out[str(m.get("name"))] = reason
    return out


# ----------------------------------------------------------------------------------------------------------------
# The interface


class TritonServer(abc.ABC):
    """One Triton Inference Server, whatever runs it. Use as a context manager::

        with LocalTritonServer(ServerOptions("model_repository", http_port="auto")) as server:
            client = tritonclient.http.InferenceServerClient(server.endpoints.http_address)
    """

    options: ServerOptions

    @abc.abstractmethod
    def start(self) -> None:
        """Start the server process and return at once (see ``wait_ready``)."""

    @abc.abstractmethod
    def stop(self, timeout: float | None = None) -> int | None:
        """Stop the server (SIGINT, then SIGKILL after ``timeout``); return its exit code. Safe to call twice."""

    @property
    @abc.abstractmethod
    def endpoints(self) -> Endpoints:
        """HTTP / gRPC / metrics endpoints (known once ``start`` has picked the ports)."""

    @property
    @abc.abstractmethod
    def returncode(self) -> int | None:
        """The exit code once the server process has ended, None while it runs (or before ``start``)."""

    @property
    @abc.abstractmethod
    def log_path(self) -> Path | None:
        """File holding the server's output."""

    def log_tail(self, n: int = DEFAULT_LOG_TAIL_LINES) -> list[str]:
        """The last ``n`` lines of the server log."""
        return read_log_tail(self.log_path, n)

    def is_running(self) -> bool:
        return self.returncode is None and self._started()

    @abc.abstractmethod
    def _started(self) -> bool: ...

    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the server exits (or ``timeout`` passes: then None)."""

    # -- readiness ------------------------------------------------------------------------------------------------

    def is_ready(self) -> bool:
        return http_get_status(f"{self.endpoints.http}/v2/health/ready") == 200

    def models(self) -> list[dict[str, Any]]:
        """The repository index (name, version, state, reason of each model); [] if unreachable."""
        return repository_index(self.endpoints.http) or []

    def wait_ready(self, timeout: float = 300.0, poll_interval: float = 0.2) -> None:
        """Block until ``v2/health/ready`` answers 200.

        Raises ``ServerStartError`` as soon as the process exits, or as soon as the server is up (live) but a model
        is UNAVAILABLE with a load error, or when ``timeout`` passes. The message names the failed models and holds
        the last log lines.
        """
        if not self._started():
            raise ServerError("wait_ready() called before start()")
        deadline = time.monotonic() + timeout
        ep = self.endpoints
        ready_at = None
        while True:
            rc = self.returncode
            if rc is not None:
                raise self._start_error(f"tritonserver exited with code {rc} before it was ready.")
            status = http_get_status(f"{ep.http}/v2/health/ready", timeout=min(2.0, max(0.2, poll_interval * 5)))
            # Triton starts its metrics service after HTTP reports ready: ready means both answer, so that a
            # Prometheus scrape right after start does not find the port closed (a metrics port that never opens
            # delays ready by METRICS_GRACE_S at most)
            if status == 200:
                ready_at = ready_at or time.monotonic()
                if (not self.options.allow_metrics or time.monotonic() - ready_at > METRICS_GRACE_S
                        or http_get_status(ep.metrics, timeout=2.0) == 200):
                    return
            if status is not None:  # up, but not ready: did a model fail to load?
                index = repository_index(ep.http)
                failed = failed_models_from_index(index or [])
                if failed and not any(m.get("state") == "LOADING" for m in index or []):
                    raise self._start_error("Triton is up but not ready: some models failed to load.", failed)
            if time.monotonic() >= deadline:
                raise self._start_error(f"tritonserver was not ready after {timeout:g} s.")
            time.sleep(poll_interval)

    def _start_error(self, summary: str, failed: Mapping[str, str] | None = None) -> ServerStartError:
        failed = dict(failed or {})
        if not failed:
            index = repository_index(self.endpoints.http) if self.returncode is None else None
            failed = failed_models_from_index(index) if index else {}
        if not failed:
            failed = failed_models_from_log(read_log(self.log_path))
        tail = self.log_tail(4 * DEFAULT_LOG_TAIL_LINES)
        if not failed and any(BIND_ERROR_RE.search(line) for line in tail):
            ep = self.endpoints
            summary += (f" A port is already in use (HTTP {ep.http_port}, gRPC {ep.grpc_port}, metrics "
                        f"{ep.metrics_port}): stop the other server or use other ports (0 / 'auto' picks free ones).")
        return ServerStartError(
            summary,
            failed_models=failed,
            log_lines=interesting_lines(tail)[-DEFAULT_LOG_TAIL_LINES:],
            log_path=self.log_path,
            returncode=self.returncode,
        )

    # -- context manager ------------------------------------------------------------------------------------------

    def __enter__(self) -> "TritonServer":
        self.start()
        try:
            self.wait_ready(self.options.ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
