"""TensorRT-LLM launch modes (GPU containers): what NVIDIA's ``scripts/launch_triton_server.py`` does, as data.

``plan_launch(repo, ...)`` returns a ``LaunchPlan`` (argv + environment); ``run_launch(plan)`` runs it and waits,
``exec_launch(plan)`` replaces the current process with it (best for a container entrypoint: signals reach it
directly), and ``TrtllmTritonServer`` runs it behind the usual ``TritonServer`` interface.

Modes (spec §6.1, ``TRTLLM:triton_backend/scripts/launch_triton_server.py@0b06796b``):

* **single**: no TensorRT-LLM model in the repository: a plain ``tritonserver`` (use ``LocalTritonServer``).
* **leader** (one TensorRT-LLM model, or ``multi_model=False``): ``mpirun --allow-run-as-root -n 1 tritonserver ...
  --backend-config=python,shm-region-prefix-name=prefix{i}_ : ...`` repeated ``world_size`` (= TP x PP) times; ranks
  != 0 get ``--model-control-mode=explicit --load-model=<each TensorRT-LLM model>``.
* **orchestrator** (two or more TensorRT-LLM models, e.g. draft + target): environment ``TRTLLM_ORCHESTRATOR=1``,
  ``TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1`` (``0`` with ``disable_spawn_processes``); world_size must be 1 when the
  workers are spawned; on Triton > 24.06 (and spawning) each rank also gets ``--pinned-memory-pool-byte-size=0
  --enable-peer-access=false --cuda-memory-pool-byte-size=<gpu>:0`` for every GPU.

Differences from NVIDIA's script, on purpose: the ports are passed once (the script adds them twice), there is no
trailing ``:`` after the last rank, an unknown Triton version counts as new (every container this toolkit targets
is > 24.06; the script crashes when ``NVIDIA_TRITON_SERVER_VERSION`` is unset), and we *wait* on the server (the
script returns right after ``Popen``, which ends a container whose entrypoint it is).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from trtspec.repository_reader import RepositoryError, read_repository
from trtspec.server.base import ServerError, ServerOptions
from trtspec.server.installation import SYSTEM_TRITONSERVER
from trtspec.server.local import LocalTritonServer

LaunchMode = Literal["single", "leader", "orchestrator"]
#: Triton releases after this one need the orchestrator memory-pool flags (NVIDIA's check: version > 24.06)
ORCHESTRATOR_POOL_FLAGS_AFTER = (24, 6)


def trtllm_model_names(model_repository: str | Path) -> list[str]:
    """Names of the TensorRT-LLM-backend models (``backend: "tensorrtllm"``) in the repository."""
    try:
        return [m.name for m in read_repository(model_repository) if m.is_trtllm]
    except RepositoryError as e:
        raise ServerError(str(e)) from None


# ----------------------------------------------------------------------------------------------------------------
# Machine facts


def parse_triton_version(version: str | None) -> tuple[int, int] | None:
    """``"24.07"`` (NGC container release, ``$NVIDIA_TRITON_SERVER_VERSION``) -> (24, 7); None if unknown."""
    if not version:
        return None
    m = re.match(r"^\s*(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def needs_orchestrator_pool_flags(triton_version: str | None) -> bool:
    parsed = parse_triton_version(triton_version)
    return parsed is None or parsed > ORCHESTRATOR_POOL_FLAGS_AFTER


def gpu_count() -> int:
    """GPUs Triton will see: ``$CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi --list-gpus``; at least 1."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() not in ("", "all"):
        ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        return max(1, len(ids))
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--list-gpus"], capture_output=True, text=True, timeout=20).stdout
            n = sum(1 for line in out.splitlines() if line.strip().startswith("GPU "))
            if n:
                return n
        except (OSError, subprocess.SubprocessError):
            pass
    return 1


# ----------------------------------------------------------------------------------------------------------------
# The plan


@dataclass
class LaunchPlan:
    """What to run: ``argv`` with ``env`` added to the current environment."""

    mode: LaunchMode
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    world_size: int = 1
    trtllm_models: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def full_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.update(self.env)
        return env

    def shell(self) -> str:
        """The plan as one shell command line (for docs, Dockerfiles, k8s manifests)."""
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        cmd = shlex.join(self.argv)
        return f"{prefix} {cmd}" if prefix else cmd


def _launch_mode(names: list[str], multi_model: bool | None) -> LaunchMode:
    """single without TensorRT-LLM models; orchestrator for several (unless told otherwise); else leader."""
    if multi_model is None:
        multi_model = len(names) >= 2
    if not names:
        return "single"
    return "orchestrator" if multi_model else "leader"


def _orchestrator_env(names: list[str], world_size: int, disable_spawn_processes: bool,
                      model_ranks: Mapping[str, int] | None) -> dict[str, str]:
    """The orchestrator's environment, once world_size is checked against how its workers are started."""
    if not disable_spawn_processes and world_size != 1:
        raise ServerError(
            f"orchestrator mode spawns one worker process per TensorRT-LLM model itself: world_size must be 1 "
            f"(got {world_size}). For world_size = 1 + TP_draft + TP_target (fast logits), also set "
            "disable_spawn_processes."
        )
    ranks = {n: 1 for n in names} | dict(model_ranks or {})
    if disable_spawn_processes and world_size != 1 + sum(ranks[n] for n in names):
        # NVIDIA's multi-instance docs: exactly one orchestrator rank plus every model's ranks; more fails at load.
        each = " + ".join(f"{ranks[n]} ({n})" for n in names)
        raise ServerError(
            f"world_size: with disable_spawn_processes it must be exactly 1 (orchestrator) + {each} = "
            f"{1 + sum(ranks[n] for n in names)}, got {world_size}; set world_size to that (model_ranks gives "
            "each TensorRT-LLM model's TP x PP)"
        )
    return {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "0" if disable_spawn_processes else "1"}


def _orchestrator_pool_flags(triton_version: str | None, num_gpus: int | None, notes: list[str]) -> list[str]:
    """The memory-pool flags an orchestrator that spawns its workers needs on Triton after 24.06."""
    version = triton_version if triton_version is not None else os.environ.get("NVIDIA_TRITON_SERVER_VERSION")
    if not needs_orchestrator_pool_flags(version):
        return []
    gpus = num_gpus if num_gpus is not None else gpu_count()
    flags = ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"]
    flags += [f"--cuda-memory-pool-byte-size={j}:0" for j in range(gpus)]
    if version is None:
        notes.append("Triton version unknown ($NVIDIA_TRITON_SERVER_VERSION unset): assumed > 24.06")
    return flags


def plan_launch(
    model_repository: str | Path,
    *,
    tritonserver: str | Path = SYSTEM_TRITONSERVER,
    world_size: int = 1,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    tensorrt_llm_model_names: Sequence[str] | None = None,
    multi_model: bool | None = None,
    disable_spawn_processes: bool = False,
    model_ranks: Mapping[str, int] | None = None,
    use_mpi: bool = True,
    mpirun: str = "mpirun",
    oversubscribe: bool = False,
    log_verbose: int = 0,
    log_file: str | Path | None = None,
    exit_timeout_s: int | None = None,
    triton_version: str | None = None,
    num_gpus: int | None = None,
    shm_prefix: str = "prefix",
    disable_auto_complete_config: bool = True,
    extra_args: Sequence[str] = (),
) -> LaunchPlan:
    """Build the argv/env to serve ``model_repository`` the way TensorRT-LLM needs.

    ``tensorrt_llm_model_names``: default = the models with ``backend: "tensorrtllm"`` in the repository.
    ``multi_model``: orchestrator mode; default = two or more TensorRT-LLM models. ``model_ranks``: TP x PP of each
    TensorRT-LLM model (default 1 each); with ``disable_spawn_processes`` world_size must be 1 + their sum.
    ``triton_version``: default ``$NVIDIA_TRITON_SERVER_VERSION``. ``num_gpus``: default ``gpu_count()`` (only
    needed for the orchestrator memory-pool flags).
    """
    repo = Path(model_repository).expanduser().resolve()
    names = list(tensorrt_llm_model_names) if tensorrt_llm_model_names else trtllm_model_names(repo)
    if world_size < 1:
        raise ServerError(f"world_size must be >= 1, got {world_size}")
    mode = _launch_mode(names, multi_model)
    env = _orchestrator_env(names, world_size, disable_spawn_processes, model_ranks) if mode == "orchestrator" else {}
    if mode == "single" and world_size != 1:
        raise ServerError("world_size > 1 needs TensorRT-LLM models in the repository (none found)")
    if not use_mpi and world_size != 1:
        raise ServerError("world_size > 1 needs MPI (use_mpi=True)")
    notes: list[str] = []
    pool_flags = []
    if mode == "orchestrator" and not disable_spawn_processes:
        pool_flags = _orchestrator_pool_flags(triton_version, num_gpus, notes)

    # one tritonserver per rank (mpirun's colon-separated programs); rank 0 logs, the others load the engines
    use_mpi = use_mpi and mode != "single"
    argv = [mpirun, "--allow-run-as-root", *(["--oversubscribe"] if oversubscribe else [])] if use_mpi else []
    server = [str(tritonserver), f"--model-repository={repo}"]
    server += [f"--exit-timeout-secs={int(exit_timeout_s)}"] if exit_timeout_s is not None else []
    server += [f"--grpc-port={grpc_port}", f"--http-port={http_port}", f"--metrics-port={metrics_port}"]
    leader = [f"--log-verbose={int(log_verbose)}"] if log_verbose else []
    leader += [f"--log-file={log_file}"] if log_file else []
    follower = ["--model-control-mode=explicit", *[f"--load-model={name}" for name in names]]
    every_rank = [*pool_flags, *(["--disable-auto-complete-config"] if disable_auto_complete_config else [])]
    for rank in range(world_size):
        argv += [":"] if rank else []
        argv += ["-n", "1"] if use_mpi else []
        argv += [*server, *(follower if rank else leader), *every_rank,
                 f"--backend-config=python,shm-region-prefix-name={shm_prefix}{rank}_", *extra_args]
    return LaunchPlan(mode=mode, argv=argv, env=env, world_size=world_size, trtllm_models=names, notes=notes)


# ----------------------------------------------------------------------------------------------------------------
# Running it


def run_launch(plan: LaunchPlan, env: Mapping[str, str] | None = None) -> int:
    """Run the plan in the foreground and wait for it; SIGTERM/SIGINT are forwarded (as SIGINT: Triton's graceful
    shutdown). Returns the exit code."""
    proc = subprocess.Popen(plan.argv, env=plan.full_env(env))
    forwarded: dict[int, Any] = {}

    def _forward(signum: int, _frame: Any) -> None:
        try:
            proc.send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            forwarded[sig] = signal.signal(sig, _forward)
        except ValueError:  # not the main thread
            pass
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                _forward(signal.SIGINT, None)
    finally:
        for sig, handler in forwarded.items():
            signal.signal(sig, handler)


def exec_launch(plan: LaunchPlan, env: Mapping[str, str] | None = None) -> None:  # pragma: no cover - replaces us
    """Replace this process with the plan (``os.execvpe``): the server becomes the container's main process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(plan.argv[0], plan.argv, plan.full_env(env))


class TrtllmTritonServer(LocalTritonServer):
    """``LocalTritonServer`` that runs a ``LaunchPlan`` (mpirun leader / orchestrator mode) instead of a bare
    tritonserver. The ports, log, repository and exit timeout come from ``ServerOptions``; ``launch_kwargs`` go to
    ``plan_launch``."""

    def __init__(self, options: ServerOptions | str | Path, /, **launch_kwargs: Any) -> None:
        super().__init__(options)
        self.launch_kwargs = launch_kwargs
        self._plan: LaunchPlan | None = None

    @property
    def plan(self) -> LaunchPlan:
        if self._plan is None:
            o = self.options
            h, g, m = self._resolve_ports()
            kwargs = dict(self.launch_kwargs)
            world_size = int(kwargs.pop("world_size", 1))
            use_mpi = kwargs.pop("use_mpi", None)
            if use_mpi is None:
                # NVIDIA always runs mpirun; without one, a single leader rank still works (orchestrator mode
                # spawns its workers through MPI, so it keeps mpirun and fails clearly if there is none)
                names = kwargs.get("tensorrt_llm_model_names") or trtllm_model_names(o.repository_path)
                multi = kwargs.get("multi_model")
                orchestrator = len(names) >= 2 if multi is None else bool(multi)
                use_mpi = bool(shutil.which(kwargs.get("mpirun", "mpirun"))) or world_size > 1 or orchestrator
            extra = [*(f"--backend-config={c}" for c in o.backend_config), *o.extra_args]
            if o.backend_directory:
                extra.insert(0, f"--backend-directory={o.backend_directory}")
            self._plan = plan_launch(
                o.repository_path,
                tritonserver=self.installation.executable,
                world_size=world_size,
                use_mpi=use_mpi,
                http_port=h,
                grpc_port=g,
                metrics_port=m,
                log_verbose=o.log_verbose,
                exit_timeout_s=o.exit_timeout_s,
                triton_version=kwargs.pop(
                    "triton_version", self.installation.version if self.installation.kind == "system" else None
                ),
                extra_args=extra,
                **kwargs,
            )
        return self._plan

    def _reset_ports(self) -> None:
        super()._reset_ports()
        self._plan = None

    def command(self) -> list[str]:
        return list(self.plan.argv)

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = super().environment(base)
        env.update(self.plan.env)
        return env
