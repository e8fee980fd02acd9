"""Run Triton Inference Server: one small interface, several ways to launch it.

* ``LocalTritonServer``: a tritonserver process on this machine (a system install, or the real binary shipped in
  the ``nvidia-pytriton`` wheel, prepared so that Python models run in this interpreter's environment).
* ``TrtllmTritonServer`` / ``plan_launch``: TensorRT-LLM launch modes (mpirun leader, orchestrator for draft +
  target) for GPU containers.
* ``create_server(options)``: the right one for a repository.

    from trtspec.server import ServerOptions, create_server

    with create_server(ServerOptions("model_repository", http_port="auto")) as server:
        print(server.endpoints.http, [m["name"] for m in server.models()])
"""

from __future__ import annotations

from typing import Any

from trtspec.server.base import (
    Endpoints,
    ServerError,
    ServerOptions,
    ServerStartError,
    TritonNotFoundError,
    TritonServer,
    failed_models_from_log,
    free_port,
)
from trtspec.repository_reader import RepositoryModel, read_repository
from trtspec.server.launch import (
    LaunchPlan,
    TrtllmTritonServer,
    exec_launch,
    plan_launch,
    run_launch,
    trtllm_model_names,
)
from trtspec.cache import cache_root
from trtspec.server.installation import TritonInstallation, find_tritonserver, prepare_bundled_backends
from trtspec.server.local import LocalTritonServer


def create_server(options: ServerOptions, **launch_kwargs: Any) -> TritonServer:
    """A ``TrtllmTritonServer`` when the repository holds TensorRT-LLM-backend models (``launch_kwargs`` go to
    ``plan_launch``: ``world_size``, ``multi_model``, ``disable_spawn_processes``, ...), else a
    ``LocalTritonServer``."""
    if trtllm_model_names(options.repository_path):
        return TrtllmTritonServer(options, **launch_kwargs)
    return LocalTritonServer(options)


__all__ = [
    "Endpoints",
    "LaunchPlan",
    "LocalTritonServer",
    "RepositoryModel",
    "ServerError",
    "ServerOptions",
    "ServerStartError",
    "TritonInstallation",
    "TritonNotFoundError",
    "TritonServer",
    "TrtllmTritonServer",
    "cache_root",
    "create_server",
    "exec_launch",
    "failed_models_from_log",
    "find_tritonserver",
    "free_port",
    "plan_launch",
    "prepare_bundled_backends",
    "read_repository",
    "run_launch",
    "trtllm_model_names",
]
