"""trtspec: speculative decoding (draft + target) served by Triton Inference Server."""

import logging as _logging
import os as _os
import sys as _sys

# Must happen before torch loads libgomp. With the default, OpenMP threads spin while they wait, and as soon as
# processes share cores (draft and target stubs, a benchmark client) they take each other's cores: a decode step
# becomes many times slower (docs/benchmarks/engine.md). A user's explicit setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"


def log_to_stderr(level: int = _logging.INFO) -> None:
    """trtspec's log records on this process's stderr: a Triton model's is the server log, a command's the terminal
    (the reference engine says there which precision and kernels it loaded with). Other libraries' logs stay as
    they are."""
    logger = _logging.getLogger("trtspec")
    if not logger.handlers:
        handler = _logging.StreamHandler(_sys.stderr)
        handler.setFormatter(_logging.Formatter("%(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
