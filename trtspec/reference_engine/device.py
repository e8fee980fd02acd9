"""Where the engine runs and in what precision, and the CPU tuning applied at load."""

from __future__ import annotations

import os

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def tune_for_cpu(model: torch.nn.Module) -> None:
    """Make verifying k + 1 tokens on CPU cheaper (demo target, 1 thread, interleaved runs: a verify of
    4 draft tokens went from 1.76x to 1.53x a 1-token step at 200 tokens of context, 1.94x to 1.63x at
    1,024; the 1-token step itself unchanged).

    * grouped-query attention inside SDPA: with more than one query row transformers passes a mask,
      and then (unless forced) expands K and V to every head — a copy of the whole KV cache per layer
      per call, which is what made verify cost grow with context. Forcing it is exact on CPU.
    * with one torch thread (how trtspec serves on CPU), Linear weights stored column-major: the GEMM
      kernels then read them as they are instead of packing them for every call with more than one
      row. With 2 threads it slowed the 1-token step (by 16%), so it is left out there.
    """
    os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    if torch.get_num_threads() != 1:
        return
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m.weight.is_contiguous():
            m.weight.data = m.weight.data.t().contiguous().t()


def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device
