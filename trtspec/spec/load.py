"""Requests in flight, and the goodput controller's estimates, across every loop-model process of one Triton server.

The loop models (`ensemble`, `baseline`, `speculative`, `baseline_loop`, several instances each) run in separate
processes and all drive the same target engine, whose batch is what they have in flight together. Each process
maps one shared int64 (a file in /dev/shm named after the server process and its start time, so a restarted
server never reads an old count), changes it under an flock and reads it without one. The file outlives the
loop models: one that is unloaded and loaded again must find its siblings' count, not start a new one. Files of
servers that are gone are removed when the next server's first loop model starts. The controller's estimates
(trtspec.spec.estimates.Estimates: acceptance per position per source, measured engine costs) live the same way in
a second file, so every loop process learns from every request of the deployment.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np

from trtspec.spec.estimates import ESTIMATES_LAYOUT, ESTIMATES_SIZE, Estimates


PREFIX = "trtspec-inflight-"
ESTIMATES_PREFIX = "trtspec-estimates-"


def server_key(pid: int) -> str:
    """`pid` and its start time (clock ticks since boot): unique for the machine's uptime."""
    try:
        start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "0"
    return f"{pid}-{start}"


def default_path(prefix: str = PREFIX) -> Path:
    """The counter (or estimates) of the Triton server this process serves (a Python-backend stub's parent)."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"{prefix}{server_key(os.getppid())}"


def remove_stale(directory: Path) -> None:
    """Removes the files of servers that no longer run (their pid is gone, or now names another process)."""
    for prefix in (PREFIX, ESTIMATES_PREFIX):
        for path in directory.glob(f"{prefix}*"):
            pid = path.name.removeprefix(prefix).split("-", 1)[0]
            if pid.isdigit() and path.name != f"{prefix}{server_key(int(pid))}":
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def _map(path: Path, nbytes: int) -> tuple[int, mmap.mmap]:
    """(fd, a shared mapping of the file's first `nbytes`), created zeroed if missing."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_size < nbytes:
            os.ftruncate(fd, nbytes)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return fd, mmap.mmap(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def _flocked(fd: int) -> Iterator[None]:
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


class InFlight:
    """A process-shared count of requests in flight; calling it reads the count."""

    def __init__(self, path: str | Path | None = None):
        if path is None:
            path = default_path()
            remove_stale(path.parent)
        self.path = Path(path)
        self._fd, self._map = _map(self.path, 8)
        self._count = np.frombuffer(self._map, dtype=np.int64, count=1)

    def __call__(self) -> int:
        return int(self._count[0])

    def add(self, n: int) -> None:
        with _flocked(self._fd):
            self._count[0] += n

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Counts one request for the duration of the block."""
        self.add(1)
        try:
            yield
        finally:
            self.add(-1)

    def close(self) -> None:
        del self._count
        self._map.close()
        os.close(self._fd)


class SharedEstimates(Estimates):
    """The goodput controller's estimates in a file every loop process of the server maps; updates under an flock."""

    def __init__(self, path: str | Path | None = None):
        if path is None:
            path = default_path(ESTIMATES_PREFIX)
            remove_stale(path.parent)
        self.path = Path(path)
        self._fd, self._map = _map(self.path, ESTIMATES_SIZE * 8)
        super().__init__(np.frombuffer(self._map, dtype=np.float64, count=ESTIMATES_SIZE))

    def locked(self) -> contextlib.AbstractContextManager:
        return _flocked(self._fd)

    def close(self) -> None:
        for name in ESTIMATES_LAYOUT:
            delattr(self, name)
        del self.buffer
        self._map.close()
        os.close(self._fd)
