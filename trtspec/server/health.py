"""The probes' HTTP endpoint of `trtspec serve`: ``/health/ready``, ``/health/live`` (200 or 503, a JSON body that
says why) and ``/metrics`` (the watchdog's restarts counter), answered from a ``ModelWatchdog``.

Triton's own ``/v2/health/ready`` stays 200 while a model's process is dead (see ``trtspec.server.watchdog``), so
Kubernetes probes point here.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from typing import Protocol

from trtspec.server.base import TritonServer, http_get_status
from trtspec.server.watchdog import Health

DEFAULT_HEALTH_PORT = 8003
READY_PATH, LIVE_PATH, METRICS_PATH = "/health/ready", "/health/live", "/metrics"


class HealthSource(Protocol):
    def health(self) -> Health: ...

    def prometheus(self) -> str: ...


class TritonHealth:
    """Health from Triton alone, for a server the watchdog cannot watch (TensorRT-LLM launches: their engines are
    not Python-backend stubs): ready is Triton's own readiness, live that its process runs."""

    def __init__(self, server: TritonServer) -> None:
        self.server = server

    def health(self) -> Health:
        rc = self.server.returncode
        if rc is not None:
            return Health(False, False, f"tritonserver exited with code {rc}")
        ready = http_get_status(f"{self.server.endpoints.http}/v2/health/ready") == 200
        return Health(ready, True, "" if ready else "Triton is not ready")

    def prometheus(self) -> str:
        return ""


class HealthServer:
    """``with HealthServer(watchdog, port=0) as h: h.port``: serves in a daemon thread."""

    def __init__(self, watchdog: HealthSource, host: str = "0.0.0.0", port: int = DEFAULT_HEALTH_PORT) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if path == METRICS_PATH:
                    self._send(200, watchdog.prometheus().encode(), "text/plain; version=0.0.4")
                    return
                if path not in (READY_PATH, LIVE_PATH):
                    self._send(404, json.dumps({"error": f"no such path: {path}"}).encode(), "application/json")
                    return
                health = watchdog.health()
                ok = health.ready if path == READY_PATH else health.live
                self._send(200 if ok else 503, json.dumps(health.as_dict()).encode(), "application/json")

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # probes every few seconds: not worth a log line
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="trtspec-health", daemon=True)

    def start(self) -> "HealthServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "HealthServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
