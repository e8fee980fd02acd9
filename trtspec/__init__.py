"""trtspec: speculative decoding (draft + target) served by Triton Inference Server."""

import os as _os

# Must happen before torch loads libgomp. With the default, OpenMP threads spin while they wait, and as soon as
# processes share cores (draft and target stubs, a benchmark client) they take each other's cores: a decode step
# becomes many times slower (docs/benchmarks/engine.md). A user's explicit setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
