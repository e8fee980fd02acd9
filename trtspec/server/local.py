"""Run tritonserver as a local process, and stop, restart and reload it; which binary, and the environment its Python
models get: `trtspec.server.installation`.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Mapping

from trtspec.processes import process_group_members
from trtspec.repository_reader import RepositoryError, read_repository
from trtspec.server.base import (
    BIND_ERROR_RE,
    Endpoints,
    ServerError,
    ServerOptions,
    ServerStartError,
    TritonServer,
    is_auto_port,
    resolve_ports,
)
from trtspec.server.installation import TritonInstallation, find_tritonserver, python_model_env


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _repository_models(repository: Path) -> list[Any] | None:
    """The repository's models; None when it cannot be read (Triton then says why)."""
    try:
        return read_repository(repository)
    except (RepositoryError, OSError):
        return None


def _needs_auto_complete(models: list[Any] | None) -> bool:
    """Whether Triton's config auto-completion can change a model of the repository: not when every model is a
    Python-backend model without an ``auto_complete_config`` (Triton would start one more process per model, which
    imports its model.py, only to get the config back as written: on the demo deployment, a second torch import
    in front of each engine's load)."""
    if not models:
        return True
    try:
        return any(m.backend != "python" or any("auto_complete_config" in f.read_text(errors="replace")
                                                 for f in m.path.glob("*/model.py"))
                   for m in models)
    except OSError:
        return True


def _bool(b: bool) -> str:
    return "true" if b else "false"


class LocalTritonServer(TritonServer):
    """tritonserver as a child process of this Python process, in its own process group.

    ``LocalTritonServer("repo", http_port="auto", grpc_port="auto", metrics_port="auto")`` or
    ``LocalTritonServer(ServerOptions(...))``. ``start()`` returns at once; ``wait_ready()`` blocks. As a context
    manager it does both and stops on exit.
    """

    def __init__(self, options: ServerOptions | str | Path | None = None, /, **overrides: Any) -> None:
        if options is None:
            options = ServerOptions(**overrides)
        else:
            if not isinstance(options, ServerOptions):
                options = ServerOptions(model_repository=options)
            if overrides:
                options = options.replace(**overrides)
        self.options = options
        self._installation: TritonInstallation | None = None
        self._ports: tuple[int, int, int] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._log_fh: IO[bytes] | None = None
        self._shm_prefix = options.python_shm_prefix or f"trtspec{os.getpid()}-{secrets.token_hex(4)}_"
        self._started_at: float | None = None
        self._append_log = False
        self.ready_after_s: float | None = None
        #: set when stop() had to kill the server (it did not exit within ``options.stop_bound_s``)
        self.stop_reason: str | None = None

    # -- what will run --------------------------------------------------------------------------------------------

    @property
    def installation(self) -> TritonInstallation:
        if self._installation is None:
            self._installation = find_tritonserver(self.options.tritonserver, cache_dir=self.options.cache_dir)
        return self._installation

    def _resolve_ports(self) -> tuple[int, int, int]:
        if self._ports is None:
            self._ports = resolve_ports(self.options)
        return self._ports

    def _reset_ports(self) -> None:
        self._ports = None

    @property
    def endpoints(self) -> Endpoints:
        h, g, m = self._resolve_ports()
        return Endpoints(host=self.options.host, http_port=h, grpc_port=g, metrics_port=m)

    def server_args(self) -> list[str]:
        """tritonserver's arguments (without the executable)."""
        o, inst = self.options, self.installation
        h, g, m = self._resolve_ports()
        args = [f"--model-repository={o.repository_path}", f"--http-port={h}", f"--grpc-port={g}"]
        if o.allow_metrics:
            args.append(f"--metrics-port={m}")
        else:
            args.append("--allow-metrics=false")
        if o.bind_address:
            args += [f"--http-address={o.bind_address}", f"--grpc-address={o.bind_address}"]
            if o.allow_metrics:
                args.append(f"--metrics-address={o.bind_address}")
        args.append(f"--model-control-mode={o.model_control_mode}")
        if o.model_control_mode == "explicit":
            args += [f"--load-model={name}" for name in o.load_models]
        elif o.load_models:
            raise ServerError("load_models needs model_control_mode='explicit'")
        models = _repository_models(o.repository_path)
        # one load thread per model (at least Triton's default of 4): no model waits behind others for a thread
        args.append(f"--model-load-thread-count={o.model_load_threads or max(4, len(models or ()))}")
        args += [
            f"--strict-readiness={_bool(o.strict_readiness)}",
            f"--exit-on-error={_bool(o.exit_on_error)}",
            f"--exit-timeout-secs={int(o.exit_timeout_s)}",
        ]
        if o.log_verbose:
            args.append(f"--log-verbose={int(o.log_verbose)}")
        if o.disable_auto_complete_config or not _needs_auto_complete(models):
            args.append("--disable-auto-complete-config")
        backend_dir = o.backend_directory or inst.backend_directory
        if backend_dir:
            args.append(f"--backend-directory={backend_dir}")
        cache_dir = o.cache_directory or inst.cache_directory
        if cache_dir:
            args.append(f"--cache-directory={cache_dir}")
        args.append(f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}")
        if o.python_shm_default_byte_size:
            args.append(f"--backend-config=python,shm-default-byte-size={int(o.python_shm_default_byte_size)}")
        if o.python_shm_growth_byte_size:
            args.append(f"--backend-config=python,shm-growth-byte-size={int(o.python_shm_growth_byte_size)}")
        args += [f"--backend-config={c}" for c in o.backend_config]
        args += list(o.extra_args)
        return args

    def command(self) -> list[str]:
        """The full argv that ``start()`` runs."""
        return [str(self.installation.executable), *self.server_args()]

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The full environment that ``start()`` uses."""
        o, inst = self.options, self.installation
        inherit = o.inherit_python_env if o.inherit_python_env is not None else inst.kind == "bundled"
        env = python_model_env(base, inherit=inherit, pythonpath=o.pythonpath, library_path=inst.library_path)
        env.update({k: str(v) for k, v in o.extra_env.items()})
        return env

    # -- lifecycle ------------------------------------------------------------------------------------------------

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def _started(self) -> bool:
        return self._proc is not None

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            raise ServerError(f"this server is already running (pid {self._proc.pid})")
        repo = self.options.repository_path
        if not repo.is_dir():
            raise ServerStartError(f"model repository {repo} does not exist or is not a directory.")
        argv, env = self.command(), self.environment()
        self._close_log()
        if self.options.log_file:
            self._log_path = Path(self.options.log_file).expanduser().resolve()
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
        elif self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="trtspec-tritonserver-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        # noqa: SIM115 - lives as long as the server; a restart keeps what the log says about the one before
        self._log_fh = open(self._log_path, "ab" if self._append_log else "wb")
        self._log_fh.write(f"# trtspec: {' '.join(argv)}\n".encode())
        self._log_fh.flush()
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log_fh,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: stop() can kill the stubs too
                preexec_fn=_set_pdeathsig if self.options.die_with_parent and sys.platform == "linux" else None,
            )
        except OSError as e:
            self._close_log()
            raise ServerStartError(f"could not run {argv[0]}: {e}", log_path=self._log_path) from e
        self._started_at = time.monotonic()

    def wait_ready(self, timeout: float = 300.0, poll_interval: float = 0.2) -> None:
        retries = 2 if any(is_auto_port(p) for p in (self.options.http_port, self.options.grpc_port,
                                                        self.options.metrics_port)) else 0
        deadline = time.monotonic() + timeout
        while True:
            try:
                super().wait_ready(max(0.0, deadline - time.monotonic()), poll_interval)
                if self._started_at is not None:
                    self.ready_after_s = time.monotonic() - self._started_at
                return
            except ServerStartError:
                # an auto-picked port was taken between picking and binding: pick again
                if retries and self.returncode is not None and any(
                    BIND_ERROR_RE.search(line) for line in self.log_tail(60)
                ):
                    retries -= 1
                    self.stop()
                    self._reset_ports()
                    self.start()
                    continue
                raise

    def wait(self, timeout: float | None = None) -> int | None:
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float | None = None) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        timeout = self.options.stop_bound_s if timeout is None else timeout
        pgid = proc.pid  # start_new_session: the server leads its own group
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGINT)  # Triton's graceful shutdown (what Ctrl-C does)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _killpg(pgid, signal.SIGKILL)
                proc.wait()
                self.stop_reason = f"tritonserver did not exit within {timeout:g} s of SIGINT; killed"
        _reap_group(pgid)
        self._close_log()
        self._cleanup_shm()
        keep = self.options.keep_log
        if keep is None:
            keep = bool(self.options.log_file) or proc.returncode != 0
        if not keep and self._log_path is not None:
            try:
                self._log_path.unlink()
            except OSError:
                pass
        return proc.returncode

    def restart(self) -> None:
        """Kill the server and its model processes at once, then start it again on the same ports, appending to
        the same log (``wait_ready`` next). Requests in flight fail now (their connections close) instead of
        waiting on a model process that died. The new process is started from a thread that lives as long as
        this process: ``die_with_parent`` follows the thread that started the server, and a watchdog's thread
        that restarts it may end first."""
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            _reap_group(proc.pid, grace=0.0)
        self._close_log()
        self._cleanup_shm()
        self._append_log = True
        _SPAWNER.submit(self.start).result()

    @property
    def can_reload(self) -> bool:
        """Whether ``reload_model`` works: Triton's model-control API is on (``model_control_mode="explicit"``)."""
        return self.options.model_control_mode == "explicit"

    def reload_model(self, name: str, timeout: float = 300.0) -> None:
        """Load ``name`` again through Triton's model-control API: new model processes, the others untouched.
        Triton skips the load of a model whose files did not change since it loaded it, so the model's directories
        are touched first. Returns once the model is loaded (ServerError if the load failed)."""
        import urllib.error
        import urllib.request

        if not self.can_reload:
            raise ServerError(f"cannot reload {name}: tritonserver runs without --model-control-mode=explicit")
        model_dir = self.options.repository_path / name
        for path in (model_dir, *(d for d in model_dir.iterdir() if d.is_dir() and d.name.isdigit())):
            os.utime(path)
        request = urllib.request.Request(f"{self.endpoints.http}/v2/repository/models/{name}/load", data=b"{}",
                                         method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                pass
        except urllib.error.HTTPError as e:
            raise ServerError(f"reloading {name}: {e.code} {e.read().decode(errors='replace')[:500]}") from None
        except OSError as e:
            raise ServerError(f"reloading {name}: {e}") from None

    def _close_log(self) -> None:
        if self._log_fh is not None:
            try:
                self._log_fh.close()
            finally:
                self._log_fh = None

    def _cleanup_shm(self) -> None:
        shm = Path("/dev/shm")
        if not shm.is_dir():
            return
        for p in shm.glob(f"{self._shm_prefix}*"):
            try:
                p.unlink()
            except OSError:
                pass

    def __repr__(self) -> str:
        state = "not started" if self._proc is None else (
            "running" if self.returncode is None else f"exited {self.returncode}")
        return f"<{type(self).__name__} {self.options.repository_path} {state}>"


#: starts restarted servers (see ``LocalTritonServer.restart``); its one thread lives until the interpreter exits
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tritonserver-spawner")


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _reap_group(pgid: int, grace: float = 3.0) -> None:
    """Processes left in the server's group (Python-backend stubs, mpirun ranks) after it exited: give them
    ``grace`` seconds, then SIGKILL."""
    deadline = time.monotonic() + grace
    while process_group_members(pgid):
        if time.monotonic() >= deadline:
            _killpg(pgid, signal.SIGKILL)
            time.sleep(0.1)
            return
        time.sleep(0.05)
