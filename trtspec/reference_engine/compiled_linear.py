"""Linear layers on GEMM kernels that Inductor's CPP template generated for this CPU, compiled once ahead of time
(AOTInductor) and loaded in milliseconds (CPU, float32, one torch thread).

One kernel per distinct weight shape (out x in), not per layer: a kernel is an AOTInductor shared library
compiled from a bare nn.Linear with the row count dynamic (1 .. any) and the weight a frozen constant, which the
template stores blocked as [out / block_n, in, block_n]. At load, every Linear of that shape gets its own
instance of the library (a container: cheap, the code is shared) whose blocked constant is replaced by the
layer's own weight, blocked the same way (`block`) and lent, not copied (user-managed). So the compile depends
on the shapes only: the demo's target and draft share their 4 decoder shapes, and a second build reuses them.

Why: the template's products, generated for this CPU's vector width and caches, are cheaper than MKL's (1 row)
and oneDNN's (2+ rows) at the row counts a decode, a verify and a batch use (figures: docs/benchmarks/engine.md),
and a row's product is bitwise the same whether it is computed alone or among any number of rows (the reduction
over `in` is blocked the same for every row count)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from trtspec.cache import cache_root
from trtspec.reference_engine.cpu import cpu_flags

# Bumped when what a kernel directory holds, or how a kernel is compiled, changes: older directories are stale.
FORMAT = 1
MANIFEST = "kernels.json"


@dataclass(frozen=True)
class Kernel:
    """A compiled GEMM for weights of one shape: the library, and the name and shape of its blocked weight."""

    out_features: int
    in_features: int
    library: Path
    constant: str
    blocked_shape: tuple[int, int, int]

    @property
    def block_n(self) -> int:
        return self.blocked_shape[2]


def block(weight: torch.Tensor, block_n: int) -> torch.Tensor:
    """weight [out, in] -> [ceil(out / block_n), in, block_n], out padded with zeros: the CPP GEMM template's
    layout for a constant float32 weight (torch._inductor.codegen.cpp_gemm_template.block_weight)."""
    out, inp = weight.shape
    pad = -out % block_n
    return torch.nn.functional.pad(weight.detach().t(), (0, pad)).reshape(inp, -1, block_n).transpose(0, 1).contiguous()


def environment_key() -> str:
    """What a compiled kernel depends on besides its shape: torch's build and the CPU's instruction sets."""
    flags = " ".join(sorted(cpu_flags()))
    return hashlib.sha256(f"{FORMAT}|{torch.__version__}|{torch.__config__.show()}|{flags}".encode()).hexdigest()[:16]


def cache_dir() -> Path:
    """Where kernels are compiled and kept for this torch build and CPU: $TRTSPEC_CACHE/kernels/<key>."""
    return cache_root() / "kernels" / environment_key()


def linear_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """The distinct (out, in) shapes of the float32 decoder Linear layers that `replace_linears` would replace,
    and of a plain float32 LM head (engine.lm_head_product)."""
    shapes = {(m.out_features, m.in_features) for m in _replaceable(model).values()}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, torch.nn.Linear) and head.bias is None and head.weight.dtype == torch.float32:
        shapes.add((head.out_features, head.in_features))
    return sorted(shapes)


def usable_kernels(model: torch.nn.Module, directory: str | Path | None) -> tuple[dict[tuple[int, int], Kernel] | None, str]:
    """The kernels in `directory` (default: cache_dir()) if they cover every shape of `model`, else None and why."""
    directory = Path(directory) if directory is not None else cache_dir()
    if not linear_shapes(model):
        return None, "no float32 Linear layers: the kernels are float32 only"
    kernels = load_manifest(directory)
    if kernels is None:
        why = "missing" if not (directory / MANIFEST).exists() else "stale: compiled for another torch build or CPU"
        return None, f"{directory}: {why}; `trtspec build` compiles them"
    lacking = [f"{o}x{i}" for o, i in linear_shapes(model) if (o, i) not in kernels]
    if lacking:
        return None, f"{directory} has no kernel for the shapes {', '.join(lacking)}; `trtspec build` compiles them"
    return kernels, "ok"


def _replaceable(model: torch.nn.Module) -> dict[tuple[torch.nn.Module, str], torch.nn.Linear]:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    found = {}
    for parent in model.modules():
        for name, child in parent.named_children():
            if (type(child) is torch.nn.Linear and child is not head and child.bias is None
                    and child.weight.dtype == torch.float32 and child.weight.device.type in ("cpu", "meta")
                    and counts.get(id(child.weight), 0) == 1):
                found[parent, name] = child
    return found


def _compile_one(out_features: int, in_features: int, workdir: Path) -> Kernel:
    """AOTInductor-compile y = x W^T for a [rows, in_features] x (rows dynamic) with the CPP GEMM template only."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(in_features, out_features, bias=False).eval()
    example = torch.randn(4, in_features)
    rows = torch.export.Dim("rows", min=1)
    package = workdir / f"linear_{out_features}x{in_features}.pt2"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations inside export: nothing to act on
        program = torch.export.export(lin, (example,), dynamic_shapes=({0: rows},))
        torch._inductor.aoti_compile_and_package(program, package_path=str(package), inductor_configs={
            "max_autotune": True,
            "max_autotune_gemm_backends": "CPP",  # the template or nothing: no silent fallback to ATen's mm
            "freezing": True,
            "aot_inductor.package_constants_in_so": False,  # the weights come from each layer at load
        })
    library = workdir / f"linear_{out_features}x{in_features}.so"
    with zipfile.ZipFile(package) as z:
        names = z.namelist()
        so = [n for n in names if n.endswith(".so")]
        cpp = [n for n in names if n.endswith("wrapper.cpp")]
        if len(so) != 1 or len(cpp) != 1:
            raise RuntimeError(f"AOTInductor package {package}: expected one .so and one wrapper.cpp, found {names}")
        library.write_bytes(z.read(so[0]))
        wrapper = z.read(cpp[0]).decode()
    package.unlink()
    # The blocked weight is the constant that is not the module's own parameter ("weight").
    consts = dict(re.findall(r'constants_info_\[(\d+)\]\.name = "([^"]+)";', wrapper))
    shapes = dict(re.findall(r"constants_info_\[(\d+)\]\.shape = \{([^}]*)\};", wrapper))
    blocked = [(consts[i], tuple(int(s) for s in shapes[i].split(","))) for i in consts if consts[i] != "weight"]
    if len(blocked) != 1 or len(blocked[0][1]) != 3 or blocked[0][1][1] != in_features:
        raise RuntimeError(f"linear {out_features}x{in_features}: no blocked weight constant in the compiled kernel ({blocked})")
    name, shape = blocked[0]
    return Kernel(out_features, in_features, library, name, shape)  # type: ignore[arg-type]


def compile_kernels(shapes: list[tuple[int, int]], directory: Path, log=print, workers: int | None = None) -> None:
    """Compile a kernel for every shape missing from `directory` (created; shapes already there are kept), in
    `workers` processes at once (default: one per missing shape, at most one per CPU core this process may use).
    Written to a temporary directory first and moved in with the manifest last, so an interrupted or failed
    compile leaves nothing that looks finished."""
    directory = Path(directory)
    have = load_manifest(directory) or {}
    missing = [s for s in shapes if s not in have]
    if not missing:
        return
    directory.mkdir(parents=True, exist_ok=True)
    workers = max(1, min(len(missing), workers if workers is not None else len(os.sched_getaffinity(0))))
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        t = time.perf_counter()
        log(f"compiling {len(missing)} GEMM kernel(s) ({', '.join(f'{o}x{i}' for o, i in missing)}) in {workers} "
            f"process(es) (Inductor CPP template; 10-20 s a kernel a core)")
        if workers == 1:
            new = _collect((_compile_one_thread(out, inp, Path(tmp)) for out, inp in missing), directory, log)
        else:
            new = _compile_in_processes(missing, Path(tmp), workers, directory, log)
        log(f"  kernels compiled in {time.perf_counter() - t:.0f} s")
        have.update(new)
        manifest = {"format": FORMAT, "environment": environment_key(), "kernels": [
            {"out": k.out_features, "in": k.in_features, "library": k.library.name, "constant": k.constant,
             "blocked_shape": list(k.blocked_shape)} for k in have.values()]}
        part = directory / (MANIFEST + ".part")
        part.write_text(json.dumps(manifest, indent=1))
        os.replace(part, directory / MANIFEST)


def _compile_one_thread(out_features: int, in_features: int, workdir: Path) -> Kernel:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernels are generated (and autotuned) for the engine's one thread
    try:
        return _compile_one(out_features, in_features, workdir)
    finally:
        torch.set_num_threads(threads)


def _collect(compiled, directory: Path, log) -> dict[tuple[int, int], Kernel]:
    """Move each compiled library from the work directory into `directory` under its final name (the manifest,
    written last, is what makes it count)."""
    new = {}
    for k in compiled:
        final = directory / k.library.name
        os.replace(k.library, final)
        new[k.out_features, k.in_features] = Kernel(k.out_features, k.in_features, final, k.constant, k.blocked_shape)
        log(f"  {k.out_features}x{k.in_features} done")
    return new


def _compile_in_processes(missing, workdir: Path, workers: int, directory: Path, log) -> dict[tuple[int, int], Kernel]:
    # Most of a kernel's compile is g++ on one core (on a Zen 3: the AOT wrapper ~8 s, the kernel ~2 s), so
    # processes compiling different shapes side by side divide the time by the cores. spawn, not fork: the
    # parent may already run torch's threads.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_compile_one_thread, out, inp, workdir): (out, inp) for out, inp in missing}
        try:
            return _collect((_result(f, *futures[f]) for f in as_completed(futures)), directory, log)
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _result(future, out_features: int, in_features: int) -> Kernel:
    try:
        return future.result()
    except Exception as e:
        raise RuntimeError(f"compiling the {out_features}x{in_features} GEMM kernel failed: {e}") from e


def load_manifest(directory: Path) -> dict[tuple[int, int], Kernel] | None:
    """The kernels in `directory`; None where there is no manifest, or it was written for another torch build,
    CPU or format (stale)."""
    path = Path(directory) / MANIFEST
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if m.get("format") != FORMAT or m.get("environment") != environment_key():
        return None
    kernels = {}
    for k in m["kernels"]:
        lib = Path(directory) / k["library"]
        if not lib.is_file():
            return None
        kernels[k["out"], k["in"]] = Kernel(k["out"], k["in"], lib, k["constant"], tuple(k["blocked_shape"]))
    return kernels


class CompiledLinear(torch.nn.Module):
    """y = x W^T on a compiled kernel; W is held only in the kernel's blocked layout."""

    def __init__(self, linear: torch.nn.Linear, kernel: Kernel):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.blocked = block(linear.weight, kernel.block_n)
        if tuple(self.blocked.shape) != kernel.blocked_shape:
            raise ValueError(f"{kernel.library}: blocked weight {tuple(self.blocked.shape)}, kernel expects {kernel.blocked_shape}")
        self.runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(kernel.library), 1)
        # user_managed: the kernel reads self.blocked in place (kept alive by this module).
        self.runner.update_constant_buffer({kernel.constant: self.blocked}, False, False, True)

    @property
    def nbytes(self) -> int:
        return self.in_features * self.out_features * 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        if x.numel() == 0:  # the kernel's row blocking divides by the row count
            return x.new_empty(*lead, self.out_features)
        y = self.runner.run([x.reshape(-1, self.in_features).contiguous()])[0]
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias=False, kernel=Inductor CPP GEMM (AOT)"


def replace_linears(model: torch.nn.Module, kernels: dict[tuple[int, int], Kernel]) -> int:
    """Replace the float32 decoder Linear layers of `model` (not the LM head, nor anything sharing a weight) whose
    shape has a kernel by CompiledLinear; returns how many were replaced."""
    # every replacement is built before any is made: a library that does not load (another torch's internals)
    # leaves the model as it was
    replacements = [(parent, name, CompiledLinear(lin, kernels[lin.out_features, lin.in_features]))
                    for (parent, name), lin in _replaceable(model).items() if (lin.out_features, lin.in_features) in kernels]
    for parent, name, compiled in replacements:
        setattr(parent, name, compiled)
    return len(replacements)


def checkpoint_shapes(checkpoint: str | Path) -> list[tuple[int, int]]:
    """linear_shapes of a checkpoint's model, built on the meta device (no weights read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return linear_shapes(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(checkpoint))))


def build(out: Path, checkpoints: list[str | Path], log=print) -> None:
    """`trtspec build`'s compile-kernels step: the kernels of every checkpoint's shapes, compiled into the kernel
    cache where missing, copied into `out` (a deployment's own directory, which the engine loads from)."""
    shapes = sorted({s for c in checkpoints for s in checkpoint_shapes(c)})
    cache = cache_dir()
    log(f"kernels for {len(shapes)} weight shapes ({', '.join(f'{o}x{i}' for o, i in shapes)}); cache {cache}")
    compile_kernels(shapes, cache, log)
    kernels = load_manifest(cache)
    if kernels is None or any(s not in kernels for s in shapes):
        raise RuntimeError(f"{cache}: kernels missing after compiling")
    out.mkdir(parents=True, exist_ok=True)
    for s in shapes:
        shutil.copy2(kernels[s].library, out / kernels[s].library.name)
    manifest = json.loads((cache / MANIFEST).read_text())
    manifest["kernels"] = [k for k in manifest["kernels"] if (k["out"], k["in"]) in set(shapes)]
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python -m trtspec.reference_engine.compiled_linear OUT_DIR CHECKPOINT [CHECKPOINT ...]")
    # by its module's name: the compile's worker processes unpickle functions of trtspec's module, not of __main__
    from trtspec.reference_engine.compiled_linear import build as build_kernels

    build_kernels(Path(sys.argv[1]), sys.argv[2:], log=lambda m: print(m, flush=True))
