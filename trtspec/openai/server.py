"""Runs the OpenAI-compatible API (uvicorn) in a thread of the process that manages Triton: it starts once
Triton is ready and stops with it."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from trtspec.openai.auth import require_api_key
from trtspec.openai.backend import Deployment, DeploymentError, TritonBackend

if TYPE_CHECKING:
    from trtspec.server.watchdog import Health

DEFAULT_PORT = 9000


class OpenAIServer:
    """`with OpenAIServer(repo, triton_grpc_address, port=0) as s: ... s.url ...` (port 0: a free one).
    `api_keys`: a request to /v1 needs one of them as its bearer token (none: the API is open)."""

    def __init__(self, repo: Path, grpc_url: str, host: str = "0.0.0.0", port: int = DEFAULT_PORT,
                 name: str | None = None, health: Callable[[], Health] | None = None,
                 api_keys: Sequence[str] = ()) -> None:
        from trtspec.openai.app import create_app

        self.deployment = Deployment.from_repository(repo, name)
        self.app = create_app(TritonBackend(self.deployment, grpc_url), health)
        require_api_key(self.app, api_keys)
        self.protected = any(api_keys)
        self.host, self.port = host, port
        self._server: object | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL for OpenAI clients (`base_url`)."""
        host = "localhost" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> None:
        import uvicorn

        # bound here, so a port in use is an error now (not a log line in a thread) and port 0 gets its number
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            raise DeploymentError(f"OpenAI API: cannot listen on {self.host}:{self.port} ({e.strerror}); "
                                  "pick another port with --openai-port, or --no-openai") from None
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="openai-api",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise DeploymentError("OpenAI API: the HTTP server did not start (see the log above)")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True  # type: ignore[attr-defined]
        if self._thread is not None:
            self._thread.join(timeout)
        self._server = self._thread = None

    def __enter__(self) -> "OpenAIServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
