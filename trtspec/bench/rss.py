"""The resident memory (RSS) of a server's processes, sampled in the background from /proc (the soak's memory
check: memory returned after the burst), and the samples' summary."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from trtspec.profiling.procfs import process_name, process_tree, read_proc_stat


@dataclass
class RssSample:
    t: float  # seconds since the load started (negative: before)
    total: int
    by_process: dict[str, int]


def sample_rss(pids: Sequence[int]) -> tuple[int, dict[str, int]]:
    """Summed RSS of the processes and their descendants (from /proc), and per process (by telling name)."""
    by: dict[str, int] = {}
    for pid in process_tree(pids):
        s = read_proc_stat(pid)
        if s is not None:
            name = f"{process_name(pid) or s.comm}"
            by[name] = by.get(name, 0) + s.rss_bytes
    return sum(by.values()), by


class RssSampler:
    def __init__(self, pids: Sequence[int] | Callable[[], Sequence[int]], interval_s: float, t0: float) -> None:
        # a callable: the server's processes now (a restarted server has new ones)
        self._pids = pids if callable(pids) else (lambda fixed=list(pids): fixed)
        self.interval_s, self.t0 = interval_s, t0
        self.samples: list[RssSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-rss")

    @property
    def pids(self) -> list[int]:
        return [p for p in self._pids() if p]

    def take(self) -> None:
        if self.pids:
            total, by = sample_rss(self.pids)
            self.samples.append(RssSample(time.perf_counter() - self.t0, total, by))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.take()

    def start(self) -> "RssSampler":
        self.take()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.take()


def rss_summary(rss: Sequence[RssSample], load_end_t: float) -> dict[str, Any]:
    """The samples' start, peak, end of the load (`load_end_t`) and end, in all and per process, and the timeline."""
    if not rss:
        return {"num_samples": 0}
    start, end = rss[0], rss[-1]
    during = [s for s in rss if s.t <= load_end_t] or [start]
    peak = max(rss, key=lambda s: s.total)
    end_of_load = during[-1]
    return {
        "num_samples": len(rss),
        "start_bytes": start.total,
        "peak_bytes": peak.total,
        "peak_t_s": peak.t,
        "end_of_load_bytes": end_of_load.total,
        "end_bytes": end.total,
        "end_t_s": end.t,
        "end_vs_start": end.total / start.total - 1 if start.total else None,
        "by_process": {name: {"start": start.by_process.get(name), "peak": peak.by_process.get(name),
                              "end": end.by_process.get(name)}
                       for name in sorted(set(start.by_process) | set(end.by_process))},
        "timeline": [[round(s.t, 1), s.total] for s in rss],
    }
