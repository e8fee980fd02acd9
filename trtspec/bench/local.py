"""A throw-away deployment for `trtspec bench --config` and `trtspec demo`: the repository is generated into a
temp dir, Triton is started on free ports, and both are gone when the ``with`` block ends (also on errors and
Ctrl-C)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from trtspec.bench.runner import BenchError
from trtspec.config import BuildConfig, EngineKind, checkpoint_path
from trtspec.repository import generate_repository
from trtspec.server import ServerOptions, TritonServer, create_server
from trtspec.server.watchdog import watchable


def server_pids(server: TritonServer) -> list[int]:
    """The server process and the processes of its group (the Python-backend stubs run the models)."""
    pid = getattr(server, "pid", None)
    if not pid:
        return []
    try:
        from trtspec.processes import process_group_members

        members = process_group_members(pid)
    except Exception:  # noqa: BLE001 - best effort (not Linux, process gone)
        members = []
    return sorted({pid, *members})


def prepare_checkpoints(cfg: BuildConfig, say: Callable[[str], None]) -> None:
    """Prepare the demo pair first when the config names it (with progress), so that generating the repository
    does not sit silent for minutes; then the compiled GEMM kernels a reference config asks for
    (`linear_kernels: compiled`), into the kernel cache, which the engines load from when the repository names no
    directory of its own: what `trtspec build`'s compile-kernels step does, a minute once per torch build and CPU."""
    refs = [m.checkpoint for m in (cfg.target, cfg.draft) if m is not None]
    if any(r.startswith("demo:") for r in refs):
        from trtspec.demo_pair import prepare_demo_pair

        prepare_demo_pair(progress=say)
    if any(m is not None and m.linear_kernels == "compiled" for m in (cfg.target, cfg.draft)):  # torch only then
        from trtspec.reference_engine import compiled_linear, device

        roles = device.roles_to_compile(cfg)
        shapes = sorted({s for r in roles for s in compiled_linear.checkpoint_shapes(checkpoint_path(cfg, r))})
        compiled_linear.compile_kernels(shapes, compiled_linear.cache_dir(), say)


def check_local(cfg: BuildConfig) -> None:
    """A throwaway deployment serves what needs no engine build: engine: reference or llmapi."""
    if cfg.engine is EngineKind.tensorrt_llm:
        raise BenchError(
            "--config serves only what needs no engine build (engine: reference or llmapi; this config has "
            f"engine: {cfg.engine.value}); build TensorRT-LLM engines with `trtspec build CONFIG`, serve them "
            "with `trtspec serve`, and point `trtspec bench --url` at that server"
        )


@contextlib.contextmanager
def local_deployment(
    cfg: BuildConfig,
    *,
    log_file: Path | None = None,
    ready_timeout: float = 600.0,
    on_step: Callable[[str], None] | None = None,
    prepare: Callable[[Path], None] | None = None,
) -> Iterator[TritonServer]:
    """Generate ``cfg``'s repository (reference or llmapi: TensorRT-LLM engines need `trtspec build`), start
    Triton, wait until every model is loaded, yield the server; stop it and remove the repository after."""
    check_local(cfg)
    step = on_step or (lambda _m: None)
    tmp = Path(tempfile.mkdtemp(prefix="trtspec-deploy-"))
    try:
        step("writing the model repository")
        repo = generate_repository(cfg, tmp / "model_repository")
        if prepare is not None:  # e.g. the loop benchmark's probe models
            prepare(repo)
        options = ServerOptions(
            repo,
            http_port="auto",
            grpc_port="auto",
            metrics_port="auto",
            log_file=log_file or tmp / "triton.log",
        )
        server = create_server(watchable(options))  # a soak with faults reloads engines through model control
        step("starting Triton and loading the models")
        server.start()
        try:
            server.wait_ready(ready_timeout)
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
