"""Reading /proc (Linux; psutil is not a dependency): a process's stat line, a telling name for it, the tree of
its descendants, and the machine's CPU times, memory and uptime."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PROC = Path("/proc")


@dataclass
class ProcStat:
    pid: int
    ppid: int
    comm: str
    cpu_ticks: int  # utime + stime
    start_ticks: int  # since boot
    num_threads: int
    rss_bytes: int


def read_proc_stat(pid: int) -> ProcStat | None:
    """Parse /proc/<pid>/stat; None if the process is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    lp, rp = raw.find("("), raw.rfind(")")  # comm may hold spaces and parentheses
    rest = raw[rp + 2 :].split()
    try:
        return ProcStat(
            pid=pid,
            ppid=int(rest[1]),
            comm=raw[lp + 1 : rp],
            cpu_ticks=int(rest[11]) + int(rest[12]),
            start_ticks=int(rest[19]),
            num_threads=int(rest[17]),
            rss_bytes=int(rest[21]) * _PAGE,
        )
    except (IndexError, ValueError):
        return None


def process_name(pid: int) -> str | None:
    """A short, telling name: the program, the Python script or module, or the Triton model of a stub."""
    try:
        argv = [a for a in (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        argv = []
    if not argv:
        try:
            return (PROC / str(pid) / "comm").read_text().strip() or None
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return None
    prog = os.path.basename(argv[0])
    if prog.startswith("triton_python_backend_stub") and len(argv) > 1:
        # argv[1] is <repository>/<model>/<version>/model.py: the model tells draft from target
        return f"python_stub[{Path(argv[1]).parent.parent.name}]"
    if prog.startswith("python"):
        args = argv[1:]
        for i, a in enumerate(args):
            if a == "-m" and i + 1 < len(args):
                return f"{prog} -m {args[i + 1]}"
            if a == "-c":
                return f"{prog} -c"
            if not a.startswith("-"):
                return f"{prog} {os.path.basename(a)}"
    return prog


def _children(pid: int) -> list[int]:
    """Direct children from /proc/<pid>/task/*/children (Linux >= 3.5 with CONFIG_PROC_CHILDREN)."""
    out: list[int] = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return out
    for task in tasks:
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return out


_HAS_CHILDREN_FILE = (PROC / "self" / "task" / str(os.getpid()) / "children").exists()


def process_tree(pids: Iterable[int]) -> list[int]:
    """The given pids (those alive) and all their descendants, in discovery order."""
    roots = [p for p in pids if (PROC / str(p)).exists()]
    children = _children
    if not _HAS_CHILDREN_FILE:
        # no children files: one pass over /proc building the parent map
        by_parent: dict[int, list[int]] = {}
        for d in PROC.iterdir():
            if d.name.isdigit():
                st = read_proc_stat(int(d.name))
                if st is not None:
                    by_parent.setdefault(st.ppid, []).append(st.pid)
        children = lambda p: by_parent.get(p, [])  # noqa: E731
    seen: dict[int, None] = {}
    stack = list(roots)
    while stack:
        p = stack.pop(0)
        if p in seen:
            continue
        seen[p] = None
        stack.extend(children(p))
    return list(seen)


def uptime() -> float:
    return float((PROC / "uptime").read_text().split()[0])


def system_cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies over all cores from /proc/stat."""
    try:
        first = (PROC / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    vals = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    total = sum(vals)
    return total - vals[3] - vals[4], total


def meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in (PROC / "meminfo").read_text().splitlines():
            k, _, v = line.partition(":")
            out[k] = int(v.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return out


class ProcNames:
    """pid -> name, cached per (pid, start time, comm): a reused pid, or a fork that has since exec'd
    (comm changes on exec), gets a fresh name."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[Any, str | None]] = {}

    def get(self, pid: int, st: ProcStat | None = None) -> str | None:
        key = (st.start_ticks, st.comm) if st is not None else None
        hit = self._cache.get(pid)
        if hit is not None and hit[0] == key:
            return hit[1]
        name = process_name(pid)
        self._cache[pid] = (key, name)
        return name
