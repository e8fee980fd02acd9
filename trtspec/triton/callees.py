"""Engine calls that end when the engine's process dies.

A BLS call in flight on a Python-backend model whose stub process dies never returns (this Python backend does not
fail the requests a dead stub held; docs/benchmarks/faults.md). So a loop runs each call on a model that has stub
processes in a helper thread and, while it waits, checks every ``poll_s`` that those processes still live: if one
died, the call fails at once (ProcessDied) and its thread is left behind, so the request fails
cleanly (or goes on without its drafter) and the watchdog can reload the model underneath. Models without stub
processes (TensorRT-LLM's C++ backend) are called directly.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

from trtspec.contract.errors import ProcessDied
from trtspec.processes import is_alive, stub_processes

T = TypeVar("T")
POLL_S = 0.25


class _Caller:
    """A daemon thread running one call at a time for one loop worker thread."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="trtspec-engine-call", daemon=True).start()

    def _run(self) -> None:
        while True:
            fn = self.jobs.get()
            try:
                self.results.put((True, fn()))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                self.results.put((False, e))


class CalleeProcesses:
    """The stub processes of the models a loop model calls, in its own repository and tritonserver's process group."""

    def __init__(self, repository: str | Path, poll_s: float = POLL_S) -> None:
        self.repository = Path(repository)
        self.poll_s = poll_s
        self._pids: dict[str, frozenset[int]] = {}
        self._checked: dict[str, float] = {}  # when the model's processes were last seen alive
        self._stubs: set[str] = set()  # models seen with stub processes: watched for good
        self._local = threading.local()

    def pids(self, model: str) -> frozenset[int]:
        """The model's processes: looked up on the first call, and again once one of them is gone (a reload);
        checked at most every poll_s (a check reads /proc: cheap beside an engine call)."""
        pids, now = self._pids.get(model), time.monotonic()
        if pids is not None and (model not in self._stubs or now - self._checked.get(model, 0.0) < self.poll_s):
            return pids
        if pids is None or not pids or not all(map(is_alive, pids)):
            pids = frozenset(stub_processes(os.getpgid(0), self.repository).get(model, ()))
            self._pids[model] = pids
            if pids:
                self._stubs.add(model)
        self._checked[model] = now
        return pids

    def call(self, model: str, fn: Callable[[], T]) -> T:
        pids = self.pids(model)
        if not pids:
            return fn()  # not a Python-backend model (or one being reloaded: Triton answers that at once)
        caller = getattr(self._local, "caller", None) or _Caller()
        self._local.caller = caller
        caller.jobs.put(fn)
        while True:
            try:
                ok, value = caller.results.get(timeout=self.poll_s)
                break
            except queue.Empty:
                if not all(map(is_alive, pids)):
                    self._local.caller = None  # its thread waits for ever on the dead process
                    raise ProcessDied(
                        f"{model}: its model process died during the call; it is being reloaded") from None
        if ok:
            return value
        raise value
