"""trtspec's cache directory: the demo pair, Triton's backend directory, compiled GEMM kernels."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$TRTSPEC_CACHE``, else ``$XDG_CACHE_HOME/trtspec`` (``~/.cache/trtspec``)."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("TRTSPEC_CACHE"):
        return Path(os.environ["TRTSPEC_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "trtspec"
