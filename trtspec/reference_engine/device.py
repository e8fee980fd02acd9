"""Where the engine runs and in what precision, and the CPU tuning applied at load."""

from __future__ import annotations

import logging
import os
import typing
from dataclasses import dataclass
from pathlib import Path

import torch

from trtspec.config import EngineKind, LinearKernels
from trtspec.reference_engine import compiled_linear, packed_linear
from trtspec.reference_engine.cpu import cpu_flags

log = logging.getLogger("trtspec.reference_engine")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# CPU flags (/proc/cpuinfo) of instructions that compute bf16 products natively: AVX-512 BF16 (Zen 4, Cooper
# Lake and later) and AMX (Sapphire Rapids and later). oneDNN uses them for bf16 matmuls; without them bf16
# is converted to fp32 around every product, slower than fp32 itself (2.1-3.8x on an AVX2-only Zen 3).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")

# Whether a position's logits are bitwise the same in a 1-token decode, a k+1-token verify and a 16-row batch
# (tests/test_engine_exactness.py checks it against the real engine). The CPU GEMM kernels (MKL for fp32,
# oneDNN for bf16/fp16) choose their blocking by the number of rows, so the last bits differ; greedy tokens
# stay identical (same test), as they do on TensorRT-LLM, whose kernels are not batch-invariant either.
# On compiled kernels with BATCH_INVARIANT_ATTENTION a float32 engine is (ReferenceEngine.batch_invariant).
BATCH_INVARIANT = {"float32": False, "bfloat16": False, "float16": False}

# CPU flags of the machines where bf16 was measured batch-invariant: a position's logits bitwise the same in a
# 1-token decode, a 5-row verify and a 16-row batch (scripts/gpu_check.py logits, at 1 and 2 threads) and greedy
# tokens the same alone and in a batch of 16 (tests/test_engine_exactness.py): an Intel Xeon with AMX (oneDNN's
# AMX kernels; torch 2.11, 2026-11-26, docs/benchmarks/engine.md). Elsewhere bf16 was measured not exact (AVX2
# Zen 3: a request in a batch of 16 diverged from itself alone after 2 tokens) or is unmeasured (AVX-512 BF16
# without AMX), and auto keeps float32 there.
BF16_EXACT_FLAGS = ("amx_bf16",)


def bf16_exact(flags: frozenset[str] | None = None) -> bool:
    """Whether bf16's greedy tokens stay the same in a batch as alone on this CPU (BF16_EXACT_FLAGS)."""
    return bool(set(BF16_EXACT_FLAGS) & (cpu_flags() if flags is None else flags))


# torch threads per engine process when serving on CPU (serving_threads; bench-engine measures with it): the draft
# and the target run in separate processes, and OpenMP pools of several threads each on a few shared cores slow
# every forward down many times (a busy 2-core machine: 24 demo tokens in 4 s with one thread per engine, 60 s
# with torch's default).
CPU_THREADS_PER_ENGINE = 1

# The kernels of the float32 decoder Linear layers on CPU with one torch thread (tune_for_cpu), and of a plain LM
# head (engine.lm_head_product follows the decoder's choice):
#   "mkl+onednn": a 1-row product (decode) on MKL, more rows (verify, batch) on oneDNN-packed weights
#                 (packed_linear: cheaper at a few rows; the decoder's weights are held twice);
#   "onednn":     every product on oneDNN: a row's product is bitwise the same for any row count, but a decode
#                 step is slower;
#   "mkl":        nn.Linear (MKL) with column-major weights, the engine before packing;
#   "compiled":   every product, LM head included, on GEMM kernels Inductor's CPP template generated for this
#                 CPU ahead of time (compiled_linear: cheaper at the few rows a step has, dearer at many; a row's
#                 product bitwise the same at any row count; the weights held once). Where the kernels are
#                 missing or stale the engine says so and uses "mkl+onednn".
# Each choice's cost on a measured CPU: docs/benchmarks/engine.md; on this one: trtspec bench-engine --linear-kernels.
LINEAR_KERNELS = os.environ.get("TRTSPEC_LINEAR_KERNELS", "mkl+onednn")
KERNEL_CHOICES = tuple(k for k in typing.get_args(LinearKernels) if k != "auto")  # one list: the config's

# On compiled kernels, whether a verify's query rows attend one at a time (ragged.RaggedBatch.row_invariant), the
# one step left whose sums depend on the row count: then a position's logits are bitwise the same in a decode, a
# verify and a batch (ReferenceEngine.batch_invariant), at some cost per verify (its rows' attention runs one call
# each instead of one for all; docs/benchmarks/engine.md). Greedy tokens are the same either way
# (tests/test_engine_exactness.py), so the faster one is the default.
BATCH_INVARIANT_ATTENTION = os.environ.get("TRTSPEC_BATCH_INVARIANT", "0") == "1"


@dataclass(frozen=True)
class Precision:
    """The dtype the engine loads its weights in, and why (printed at load, shown by `trtspec doctor`)."""

    dtype: str
    reason: str
    warning: str | None = None
    exact_bf16: bool = False  # bf16 measured batch-invariant on this CPU (bf16_exact)

    @property
    def batch_invariant(self) -> bool:
        return BATCH_INVARIANT[self.dtype] or (self.dtype == "bfloat16" and self.exact_bf16)


def choose_precision(requested: str, device: str, flags: frozenset[str] | None = None) -> Precision:
    """The dtype for `requested` (auto, float32, bfloat16, float16) on `device` ("cpu" or "cuda[:n]").

    auto: on CPU bf16 where the CPU computes it natively and batch-invariantly (bf16_exact), fp32 elsewhere; on
    CUDA fp32, the engine's exact reference precision (write bfloat16/float16 for speed). An explicit dtype is
    honoured, with a warning where the CPU has no native support for it."""
    if requested != "auto" and requested not in _DTYPES:
        raise ValueError(f"dtype: {requested!r} is not one of auto, {', '.join(_DTYPES)}")
    if not device.startswith("cpu"):
        if requested == "auto":
            return Precision("float32", "auto on CUDA: float32, the reference engine's exact precision")
        return Precision(requested, "as configured")
    flags = cpu_flags() if flags is None else flags
    native, exact = sorted(set(NATIVE_BF16_FLAGS) & flags), bf16_exact(flags)
    if requested == "auto":
        if native and exact:
            return Precision("bfloat16", f"auto: this CPU computes bf16 natively ({', '.join(native)}) and its bf16 is "
                             "batch-invariant", exact_bf16=True)
        if native:
            return Precision("float32", f"auto: this CPU computes bf16 natively ({', '.join(native)}), but bf16 greedy "
                             "tokens change with the batch (tests/test_engine_exactness.py): float32 keeps them exact; "
                             "write dtype: bfloat16 to trade that for speed")
        return Precision("float32", f"auto: this CPU has no native bf16 (none of {', '.join(NATIVE_BF16_FLAGS)}): float32 is faster")
    warning = None
    if requested == "bfloat16" and not native:
        warning = f"dtype bfloat16 on a CPU without native bf16 (none of {', '.join(NATIVE_BF16_FLAGS)}): slower than float32; use dtype: auto"
    elif requested == "float16" and "avx512_fp16" not in flags and "amx_fp16" not in flags:
        warning = "dtype float16 on a CPU without native fp16 (avx512_fp16, amx_fp16): slower than float32; use dtype: auto"
    return Precision(requested, "as configured", warning, exact_bf16=exact)


def tune_for_cpu(model: torch.nn.Module, linear_kernels: str = "auto", kernel_dir: str | Path | None = None,
                 label: str = "") -> dict | None:
    """Make verifying k + 1 tokens on CPU cheaper, relative to a 1-token step, without making that step dearer
    (what each measure gained: docs/benchmarks/engine.md).

    * grouped-query attention inside SDPA: with more than one query row transformers passes a mask,
      and then (unless forced) expands K and V to every head — a copy of the whole KV cache per layer
      per call, which is what made verify cost grow with context. Forcing it is exact on CPU.
    * with one torch thread (how trtspec serves on CPU), Linear weights stored column-major: the GEMM
      kernels then read them as they are instead of packing them for every call with more than one
      row. With 2 threads it slowed the 1-token step (by 16%), so it is left out there.
    * with one torch thread, float32 decoder Linear layers packed once by oneDNN for verify and batch
      products, or on compiled kernels from `kernel_dir` (`linear_kernels`, auto: LINEAR_KERNELS;
      packed_linear, compiled_linear); measured with one thread only.

    Returns the compiled kernels in use (the LM head takes one too: engine.lm_head_product), or None.
    """
    os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    choice = LINEAR_KERNELS if linear_kernels == "auto" else linear_kernels
    if torch.get_num_threads() != 1:
        if choice == "compiled":
            log.warning("%scompiled GEMM kernels not used (%d torch threads; they are generated for one, the served "
                        "setting)", label, torch.get_num_threads())
        return None
    if choice not in KERNEL_CHOICES:
        where = f"TRTSPEC_LINEAR_KERNELS={choice!r}" if linear_kernels == "auto" else f"linear_kernels: {choice!r}"
        raise ValueError(f"{where}: write one of {', '.join(KERNEL_CHOICES)} (mkl+onednn is the default)")
    kernels = None
    if choice == "compiled":
        kernel_dir = kernel_dir if kernel_dir is not None else compiled_linear.cache_dir()
        kernels, why = compiled_linear.usable_kernels(model, kernel_dir)
        if kernels is None:
            log.warning("%scompiled GEMM kernels not used (%s): mkl+onednn instead", label, why)
            choice = "mkl+onednn"
        else:
            try:
                n = compiled_linear.replace_linears(model, kernels)
                log.info("%s%d Linear layers on compiled GEMM kernels from %s", label, n, kernel_dir)
            except (AttributeError, RuntimeError, OSError, ValueError) as e:  # AOTInductor's runner is torch-internal API
                log.warning("%scompiled GEMM kernels not used (they did not load: %s): mkl+onednn instead", label, e)
                kernels, choice = None, "mkl+onednn"
    if choice in ("mkl+onednn", "onednn") and packed_linear.available():
        packed_linear.pack_linears(model, gemv=choice == "mkl+onednn")
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m.weight.is_contiguous():
            m.weight.data = m.weight.data.t().contiguous().t()
    return kernels


def roles_to_compile(cfg) -> list[str]:  # noqa: ANN001 - trtspec.config.BuildConfig
    """The roles ("target", "draft") of a build config whose engines will ask for compiled kernels: engine
    reference on the CPU (on a GPU torch's CUDA kernels run), `linear_kernels: compiled`, and float32 as its dtype
    resolves on this machine (a CPU where auto picks bf16 would not use them)."""
    if cfg.engine is not EngineKind.reference or pick_device(cfg.device) != "cpu":
        return []
    return [r for r in ("target", "draft") if (m := getattr(cfg, r)) is not None and m.linear_kernels == "compiled"
            and choose_precision(m.dtype, "cpu").dtype == "float32"]


def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def serving_threads(device: str, environ: typing.Mapping[str, str] = os.environ) -> int | None:
    """The torch threads an engine process serves with: $TRTSPEC_TORCH_THREADS where set (0: torch's default), else
    CPU_THREADS_PER_ENGINE on CPU, whatever started the server (`trtspec serve`, a bench, tritonserver itself, a
    Kubernetes pod); None: leave torch's default (a GPU's)."""
    if environ.get("TRTSPEC_TORCH_THREADS"):
        return int(environ["TRTSPEC_TORCH_THREADS"]) or None
    return CPU_THREADS_PER_ENGINE if pick_device(device) == "cpu" else None


def describe_precision(requested: str, device: str = "auto") -> str:
    """One line for `trtspec doctor`: the dtype the engine would pick here, why, and whether it is batch-invariant."""
    p = choose_precision(requested, pick_device(device))
    tokens = "greedy tokens can change with the batch" if p.dtype == "bfloat16" and not p.exact_bf16 else "greedy tokens stay identical"
    invariant = "batch-invariant" if p.batch_invariant else (
        f"not batch-invariant: a position's logits can differ in the last bits between a decode, a verify and a batch ({tokens})"
    )
    return f"{p.dtype} ({p.reason}); {invariant}" + (f"; warning: {p.warning}" if p.warning else "")


def describe_linear_kernels(requested: str, checkpoint: str | Path, kernel_dir: str | Path, device: str = "auto") -> str:
    """One line for `trtspec doctor`: the weight-product kernels a float32 engine serving at one thread would use
    (tune_for_cpu), why, and for compiled kernels whether the deployment's `kernel_dir` has them."""
    if pick_device(device) != "cpu":
        return f"torch's CUDA kernels (cuBLAS); linear_kernels ({requested}) chooses among CPU kernels only"
    choice = LINEAR_KERNELS if requested == "auto" else requested
    why = "linear_kernels: auto, the engine's default" + (" (TRTSPEC_LINEAR_KERNELS)" if "TRTSPEC_LINEAR_KERNELS" in os.environ else "") \
        if requested == "auto" else "as configured"
    if choice != "compiled":
        return f"{choice} ({why}; float32 at one torch thread per engine)"
    try:
        shapes = compiled_linear.checkpoint_shapes(checkpoint)
    except (OSError, ValueError) as e:
        return f"compiled ({why}); the checkpoint's shapes are unknown ({e})"
    have = compiled_linear.load_manifest(Path(kernel_dir)) or {}
    lacking = [f"{o}x{i}" for o, i in shapes if (o, i) not in have]
    cached = compiled_linear.load_manifest(compiled_linear.cache_dir()) or {}
    if not lacking:
        invariant = ("batch-invariant (TRTSPEC_BATCH_INVARIANT=1): a position's logits bitwise the same in a decode, "
                     "a verify and a batch") if BATCH_INVARIANT_ATTENTION else \
            "products batch-invariant, attention not (TRTSPEC_BATCH_INVARIANT=1 makes it so, at some cost per verify)"
        return f"compiled ({why}): all {len(shapes)} kernels in {kernel_dir}; {invariant}"
    reuse = sum((o, i) in cached for o, i in shapes)
    return (f"compiled ({why}): {kernel_dir} lacks {', '.join(lacking)}; `trtspec build` compiles them "
            f"({reuse} of {len(shapes)} already in the kernel cache); until then the engine uses mkl+onednn")
