"""Requests in flight across every loop-model process of one Triton server.

The loop models (`ensemble`, `baseline`, `speculative`, `baseline_loop`, several instances each) run in separate
processes and all drive the same target engine, whose batch is what they have in flight together. Each process
maps one shared int64 (a file in /dev/shm named after the server process and its start time, so a restarted
server never reads an old count), changes it under an flock and reads it without one. The file outlives the
loop models: one that is unloaded and loaded again must find its siblings' count, not start a new one. Files of
servers that are gone are removed when the next server's first loop model starts.
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


PREFIX = "trtspec-inflight-"


def server_key(pid: int) -> str:
    """`pid` and its start time (clock ticks since boot): unique for the machine's uptime."""
    try:
        start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "0"
    return f"{pid}-{start}"


def default_path() -> Path:
    """The counter of the Triton server this process serves (a Python-backend stub's parent)."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"{PREFIX}{server_key(os.getppid())}"


def remove_stale(directory: Path) -> None:
    """Removes the counters of servers that no longer run (their pid is gone, or now names another process)."""
    for path in directory.glob(f"{PREFIX}*"):
        pid = path.name.removeprefix(PREFIX).split("-", 1)[0]
        if pid.isdigit() and path.name != f"{PREFIX}{server_key(int(pid))}":
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


class InFlight:
    """A process-shared count of requests in flight; calling it reads the count."""

    def __init__(self, path: str | Path | None = None):
        if path is None:
            path = default_path()
            remove_stale(path.parent)
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_size < 8:
                os.ftruncate(fd, 8)
            fcntl.flock(fd, fcntl.LOCK_UN)
            self._map = mmap.mmap(fd, 8)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._count = np.frombuffer(self._map, dtype=np.int64, count=1)

    def __call__(self) -> int:
        return int(self._count[0])

    def add(self, n: int) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            self._count[0] += n
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

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
