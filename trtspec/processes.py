"""The processes of a local tritonserver, read from /proc (stdlib only: the loop models import it).

Every Python-backend model instance is one ``triton_python_backend_stub <repo>/<model>/<version>/model.py ...``
process in tritonserver's process group; the watchdog and the loop models find a model's processes by that path.
"""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def _state(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a process, or None where it is gone."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # pid (comm) state ppid pgrp ...; comm may contain spaces/parens: split after the last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    return (fields[0], int(fields[2])) if len(fields) >= 3 else None


def is_alive(pid: int) -> bool:
    """The process exists and is not a zombie (a dead stub stays a zombie until tritonserver reaps it)."""
    if not (_PROC / "self" / "stat").exists():
        try:
            os.kill(pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    state = _state(pid)
    return state is not None and state[0] not in ("Z", "X")


def process_group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid`` (Linux: from /proc; elsewhere: [pgid] if signalable)."""
    if not (_PROC / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    members = []
    for d in _PROC.iterdir():
        if d.name.isdigit() and (state := _state(int(d.name))) is not None:
            if state[0] not in ("Z", "X") and state[1] == pgid:
                members.append(int(d.name))
    return members


def _cmdline(pid: int) -> list[str]:
    try:
        return (_PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def stub_processes(pgid: int, repository: str | Path) -> dict[str, set[int]]:
    """Model name -> pids of its Python-backend stub processes (one per instance) in the server's process group."""
    repo = str(Path(repository).resolve())
    out: dict[str, set[int]] = {}
    for pid in process_group_members(pgid):
        argv = _cmdline(pid)
        if len(argv) < 2 or not argv[0].endswith("triton_python_backend_stub"):
            continue
        model_py = Path(argv[1])  # <repo>/<model>/<version>/model.py
        if str(model_py.parent.parent.parent) == repo:
            out.setdefault(model_py.parent.parent.name, set()).add(pid)
    return out
