"""Health that tells the truth, and recovery without an operator, for a Triton whose Python models can die.

Triton does not notice when a Python-backend model's stub process dies: ``/v2/health/ready`` and
``/v2/models/<m>/ready`` keep answering 200, every new request to the model fails with ``Stub process '<m>_0_0' is
not healthy``, and the requests that were in flight on it never end (measured on the nvidia-pytriton 0.7.0
tritonserver; docs/benchmarks/faults.md).

So the watchdog watches the stub processes themselves (every model instance is one
``triton_python_backend_stub <repo>/<model>/<version>/model.py ...`` process in the server's process group). When
one is gone:

* a *reloadable* model (the engines: only the loop models call them, and a loop's call on a dead engine ends at
  once, trtspec.triton.callees) is loaded again through Triton's model-control API, the other models' processes and
  the requests that do not need it untouched; the deployment is not ready meanwhile, unless the model is
  *optional* (the draft engine: the endpoints serve without drafting while it reloads);
* any other model's death (a loop, an entry or a tokenizer model, whose clients' requests would hang), or a reload
  that fails, restarts the server: the whole process group is killed at once (the requests in flight fail now, their
  connections closed), started again on the same ports and waited for until every model is loaded.

A server that does not come back within ``give_up_s`` makes the deployment not live (a supervisor such as
Kubernetes' liveness probe then restarts the pod), and so does a tritonserver that exits on its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Collection, Mapping, Protocol

from trtspec.contract.models import OPTIONAL_MODELS, RELOADABLE_MODELS
from trtspec.processes import stub_processes
from trtspec.server.base import ServerError, ServerOptions, TritonServer

log = logging.getLogger("trtspec.watchdog")

#: the Prometheus counter of the recoveries the watchdog made (a reload of the model, or a restart of the server), one
#: series per model whose process died
RESTARTS_COUNTER = "trtspec_model_restarts_total"


class RestartableServer(Protocol):
    """What the watchdog needs of a server: ``LocalTritonServer`` is one."""

    options: ServerOptions

    @property
    def pid(self) -> int | None: ...

    @property
    def returncode(self) -> int | None: ...

    def restart(self) -> None: ...

    @property
    def can_reload(self) -> bool: ...

    def reload_model(self, name: str, timeout: float = 300.0) -> None: ...


@dataclass
class Fault:
    """One model process that died, and the restart that followed (monotonic times)."""

    model: str
    pid: int
    detected_at: float
    recovered_at: float | None = None
    error: str | None = None

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.detected_at


@dataclass
class Health:
    """What the probes answer: ready (every model can serve), live (the deployment can still recover)."""

    ready: bool
    live: bool
    reason: str = ""

    def as_dict(self) -> dict[str, object]:
        status = ("degraded" if self.reason else "ok") if self.ready else ("recovering" if self.live else "dead")
        return {"status": status, "ready": self.ready, "live": self.live, "reason": self.reason}


class ModelWatchdog:
    """Watches the stub processes of ``server``'s models; reloads a dead ``reloadable`` model, restarts the server
    when any other died (the module's docstring says which and why).

    ``health()`` is what the probes answer; ``restarts`` counts reloads and restarts per model whose process died;
    ``faults`` lists every death. Start it once the server is ready (``start()`` / ``stop()``, or ``with``).
    """

    def __init__(
        self,
        server: RestartableServer,
        *,
        poll_s: float = 0.25,
        give_up_s: float = 300.0,
        on_event: Callable[[str], None] | None = None,
        reloadable: Collection[str] = (),
        optional: Collection[str] = (),
    ) -> None:
        self.server = server
        self.poll_s, self.give_up_s = poll_s, give_up_s
        self.reloadable, self.optional = frozenset(reloadable), frozenset(optional)
        self.restarts: Counter[str] = Counter()
        self.faults: list[Fault] = []
        self._on_event = on_event
        self._expected: dict[str, set[int]] = {}
        self._recovering: list[Fault] = []
        self._degraded: list[Fault] = []  # optional models reloading: the endpoints serve without them
        self._dead_reason = ""
        self._lock = threading.Lock()
        self._spawning = threading.Lock()  # held while the server's process is replaced
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the probes read --------------------------------------------------------------------------------------

    @property
    def unready(self) -> bool:
        """A restart, or the reload of a model the endpoints need, is under way (not ready meanwhile)."""
        with self._lock:
            return bool(self._recovering)

    @property
    def recovering(self) -> bool:
        """Any recovery is under way, a draft engine's reload (ready meanwhile) included."""
        with self._lock:
            return bool(self._recovering or self._degraded)

    def health(self) -> Health:
        with self._lock:
            recovering = [f.model for f in self._recovering]
            degraded = [f.model for f in self._degraded]
            dead = self._dead_reason
            rc = None if recovering else self.server.returncode
        if dead:
            return Health(False, False, dead)
        if rc is not None:
            return Health(False, False, f"tritonserver exited unexpectedly with code {rc}")
        if recovering:
            return Health(False, True, f"recovering: the process of {', '.join(recovering)} died")
        if degraded:
            return Health(True, True, f"degraded: reloading {', '.join(degraded)}, whose process died; the endpoints "
                                      "serve without it meanwhile")
        return Health(True, True)

    def prometheus(self) -> str:
        """The restarts counter in Prometheus' text format."""
        lines = [f"# HELP {RESTARTS_COUNTER} Recoveries (model reloads or server restarts) trtspec made because a "
                 "model's process died.",
                 f"# TYPE {RESTARTS_COUNTER} counter"]
        with self._lock:
            counts = dict(self.restarts)
            models = sorted(set(counts) | set(self._expected))
        lines += [f'{RESTARTS_COUNTER}{{model="{m}"}} {counts.get(m, 0)}' for m in models]
        return "\n".join(lines) + "\n"

    @property
    def watched(self) -> Mapping[str, set[int]]:
        """Model -> the pids of its instances' processes now."""
        with self._lock:
            return {m: set(p) for m, p in self._expected.items()}

    # -- the thread ------------------------------------------------------------------------------------------------

    def start(self) -> "ModelWatchdog":
        if self.server.pid is None:
            raise RuntimeError("the watchdog needs a running local tritonserver (its process group holds the stubs)")
        self._expected = self._processes()
        self._thread = threading.Thread(target=self._run, name="trtspec-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching. A restart under way has its new process started before this returns, so that whoever
        stops the server next stops that one (the rest of the restart is abandoned)."""
        self._stop.set()
        with self._spawning:
            pass
        if self._thread is not None:
            self._thread.join(2.0)  # a restart in progress is abandoned: the server is being stopped anyway
            self._thread = None

    def __enter__(self) -> "ModelWatchdog":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _processes(self) -> dict[str, set[int]]:
        pid = self.server.pid
        return stub_processes(pid, self.server.options.repository_path) if pid is not None else {}

    def _event(self, message: str) -> None:
        log.warning(message)
        if self._on_event is not None:
            self._on_event(message)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.server.returncode is not None:
                return  # Triton died on its own: health() says so, and whoever runs it exits
            current = self._processes()
            faults = [Fault(m, min(pids - current.get(m, set())), time.monotonic())
                      for m, pids in self._expected.items() if pids - current.get(m, set())]
            if faults and self.server.returncode is None:
                self._recover(faults)

    def _recover(self, faults: list[Fault]) -> None:
        """Reload the dead models where they are all reloadable (ready meanwhile where they are all optional),
        else, or if a reload fails, restart the server."""
        reload = all(f.model in self.reloadable for f in faults) and getattr(self.server, "can_reload", False)
        optional = reload and all(f.model in self.optional for f in faults)
        with self._lock:
            self.faults += faults
            if optional:
                self._degraded = faults
            else:
                self._recovering = faults
        plan = "serving without it, reloading it" if optional else "not ready, " + (
            "reloading it" if reload else "restarting tritonserver")
        for f in faults:
            self._event(f"model {f.model}: its process {f.pid} died; {plan}")
        if not (reload and self._reload(faults)):
            self._restart(faults)

    def _reload(self, faults: list[Fault]) -> bool:
        """Load the dead models again, nothing else; False (said) where a load failed."""
        try:
            for f in faults:
                self.server.reload_model(f.model, self.give_up_s)
        except ServerError as e:
            with self._lock:
                self._degraded, self._recovering = [], faults
            self._event(f"{str(e).splitlines()[0]}; restarting tritonserver")
            return False
        now = self._recovered(faults)
        self._event(f"{', '.join(f.model for f in faults)} reloaded in {now - faults[0].detected_at:.1f} s; ready")
        return True

    def _restart(self, faults: list[Fault]) -> None:
        error = None
        try:
            with self._spawning:
                if self._stop.is_set():
                    return
                self.server.restart()
            TritonServer.wait_ready(self.server, self.give_up_s)  # type: ignore[arg-type] - same ports, always
        except ServerError as e:
            error = str(e).splitlines()[0]
        if error is None:
            now = self._recovered(faults)
            self._event(f"tritonserver restarted in {now - faults[0].detected_at:.1f} s; ready")
            return
        with self._lock:
            for f in faults:
                f.error = error
            died = ", ".join(f.model for f in faults)
            self._dead_reason = f"tritonserver did not come back after {died} died: {error}"
            self._recovering = []
        self._event(f"{self._dead_reason}; reporting not live")

    def _recovered(self, faults: list[Fault]) -> float:
        """The dead models serve again: their processes watched, the faults closed and counted; the time."""
        now = time.monotonic()
        with self._lock:
            self._expected = self._processes()
            for f in faults:
                f.recovered_at = now
                self.restarts[f.model] += 1
            self._recovering, self._degraded = [], []
        return now


def watchable(options: ServerOptions) -> ServerOptions:
    """``options`` with Triton's model-control API on (every model loaded at start), so that a watchdog can reload
    a model alone."""
    return options.replace(model_control_mode="explicit", load_models=["*"])


def deployment_watchdog(server: RestartableServer, **kwargs: object) -> ModelWatchdog:
    """A watchdog for a trtspec deployment: which models it reloads alone, and which the endpoints serve without,
    are the deployment's (trtspec.contract.models)."""
    return ModelWatchdog(server, reloadable=RELOADABLE_MODELS, optional=OPTIONAL_MODELS,
                         **kwargs)  # type: ignore[arg-type]
