"""Run tritonserver as a local process: a system install, or the real binary shipped in the nvidia-pytriton wheel.

Which tritonserver (first match wins):

1. ``ServerOptions.tritonserver`` (a path, or ``"bundled"`` to force the nvidia-pytriton one);
2. ``$TRITONSERVER`` (a path; ``bundled`` works here too);
3. ``tritonserver`` on ``PATH``;
4. ``/opt/tritonserver/bin/tritonserver`` (NGC containers);
5. the binary in the ``nvidia-pytriton`` wheel (``pip install nvidia-pytriton``; CPU-only is fine).

What the bundled (nvidia-pytriton) binary needs, worked out from the wheel and from what ``pytriton`` itself does
(``pytriton/triton.py: _prepare_triton_inference_server``, ``pytriton/server/triton_server.py: _get_env``):

* The Python backend looks for ``triton_python_backend_stub`` *next to* ``libtriton_python.so``; the wheel ships one
  stub per Python version under ``tritonserver/python_backend_stubs/3.X/``. The stub embeds libpython 3.X, so it must
  match the Python that will run the models (the running one). pytriton copies the whole ``tritonserver`` tree into a
  workspace per start; we copy ``backends/`` and ``caches/`` once into
  ``$TRTSPEC_CACHE/triton-backends/pytriton-<version>-py3.X`` (default ``~/.cache/trtspec``), atomically, add the
  right stub, and pass ``--backend-directory`` / ``--cache-directory``.
* The copies' RPATH (``$ORIGIN/../../../../nvidia_pytriton.libs``) no longer points at the wheel's bundled
  libraries, so ``LD_LIBRARY_PATH`` gets ``site-packages/nvidia_pytriton.libs`` (pytriton does this too).
* The stub needs ``libpython3.X.so.1.0``. If another libpython of the same version is on the system (e.g.
  ``/usr/lib/x86_64-linux-gnu``), the loader may pick *that one*, and the models then run in the system Python without
  the venv's packages. So the running interpreter's ``LIBDIR`` goes on ``LD_LIBRARY_PATH`` as well.
* The embedded interpreter finds its ``sys.prefix`` by looking up ``python3`` on ``PATH`` (and its ``pyvenv.cfg``):
  the directory of ``sys.executable`` goes first on ``PATH`` (pytriton does this too). That is how a venv's
  site-packages get onto the models' ``sys.path``.
* The stub's interpreter runs with ``sys.flags.ignore_environment`` set (like ``python -E``): **PYTHONPATH is
  ignored**. So our copy of ``triton_python_backend_utils.py`` (which every Python-backend model imports) starts
  with a small hook that adds the paths from ``$TRTSPEC_STUB_PYTHONPATH`` (``ServerOptions.pythonpath`` + the
  directory holding the ``trtspec`` package) to ``sys.path`` and runs ``site.addsitedir`` on
  ``$TRTSPEC_STUB_SITEDIRS`` (this interpreter's site-packages, so ``.pth`` files and editable installs work even
  when the PATH lookup does not find the venv). PYTHONPATH is set as well, for processes the models spawn.
  The stub imports ``model.py`` *before* ``triton_python_backend_utils``, so a model must
  ``import triton_python_backend_utils`` before it imports anything that only these paths provide (every Python
  backend model imports it first by convention; the venv's own packages are importable from the start anyway).
* ``--backend-config=python,shm-region-prefix-name=<unique>``: the Python backend's /dev/shm regions are named from a
  prefix; two servers with the same prefix on one machine clash, so each server gets its own (pytriton does this too).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import json
import os
import secrets
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, Mapping, Sequence

from trtspec.cache import cache_root
from trtspec.processes import process_group_members
from trtspec.repository_reader import RepositoryError, read_repository
from trtspec.server.base import (
    BIND_ERROR_RE,
    Endpoints,
    ServerError,
    ServerOptions,
    ServerStartError,
    TritonNotFoundError,
    TritonServer,
    is_auto_port,
    resolve_ports,
)

SYSTEM_TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")
#: env vars read by the hook below (the stub's interpreter runs with -E: it ignores PYTHONPATH)
STUB_PATH_ENV = "TRTSPEC_STUB_PYTHONPATH"
STUB_SITEDIRS_ENV = "TRTSPEC_STUB_SITEDIRS"
_HOOK_VERSION = 1
# Prepended to our copy of triton_python_backend_utils.py: runs when a model (or the stub) first imports it.
_STUB_HOOK = f"""# --- added by trtspec (hook v{_HOOK_VERSION}) ---------------------------------------------------------
# The Python backend stub embeds Python with ignore_environment (-E): PYTHONPATH is ignored. trtspec passes the
# model import paths in {STUB_PATH_ENV} (prepended to sys.path) and {STUB_SITEDIRS_ENV} (site.addsitedir,
# so .pth files such as editable installs work) instead.
def _trtspec_stub_paths():
    import os, site, sys
    for d in os.environ.get("{STUB_SITEDIRS_ENV}", "").split(os.pathsep):
        if d and d not in sys.path:
            site.addsitedir(d)
    for d in reversed(os.environ.get("{STUB_PATH_ENV}", "").split(os.pathsep)):
        if d and d not in sys.path:
            sys.path.insert(0, d)
_trtspec_stub_paths()
del _trtspec_stub_paths
# --- end of trtspec hook ------------------------------------------------------------------------------------------
"""
PYTRITON_DIST = "nvidia-pytriton"
STUB_NAME = "triton_python_backend_stub"


# ----------------------------------------------------------------------------------------------------------------
# Finding tritonserver


@dataclass(frozen=True)
class TritonInstallation:
    """A tritonserver binary plus what it needs to run."""

    executable: Path
    kind: Literal["system", "bundled"]
    #: ``--backend-directory`` to pass (None: Triton's default, /opt/tritonserver/backends)
    backend_directory: Path | None = None
    cache_directory: Path | None = None
    #: prepended to LD_LIBRARY_PATH
    library_path: tuple[Path, ...] = ()
    version: str | None = None
    #: how it was found, for people ("$TRITONSERVER", "PATH", ...)
    source: str = ""

    def describe(self) -> str:
        what = f"nvidia-pytriton {self.version}" if self.kind == "bundled" else "system tritonserver"
        return f"{self.executable} ({what}, found via {self.source})"


def bundled_tritonserver_root() -> Path | None:
    """``site-packages/pytriton/tritonserver`` of the installed nvidia-pytriton wheel (without importing pytriton,
    which is slow and pulls in its own dependencies), or None."""
    try:
        spec = importlib.util.find_spec("pytriton")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        root = Path(loc) / "tritonserver"
        if (root / "bin" / "tritonserver").is_file():
            return root
    return None


def _pytriton_version() -> str:
    try:
        return importlib.metadata.version(PYTRITON_DIST)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _pytriton_libs(root: Path) -> Path:
    # like pytriton.utils.distribution.get_libs_path: wheel install -> site-packages/nvidia_pytriton.libs,
    # editable install -> tritonserver/external_libs
    wheel_libs = root.parent.parent / "nvidia_pytriton.libs"
    return wheel_libs if wheel_libs.is_dir() else root / "external_libs"


def _fingerprint(*paths: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in paths:
        st = p.stat()
        out[str(p)] = [st.st_size, int(st.st_mtime)]
    return out


def prepare_bundled_backends(
    root: Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    python_version: tuple[int, int] | None = None,
) -> Path:
    """Make a writable copy of the wheel's ``backends/`` (+ ``caches/``) with the Python backend stub for
    ``python_version`` (default: the running Python) next to ``libtriton_python.so``. Returns the directory holding
    ``backends/`` and ``caches/``; reuses it when already there. Safe when several processes race (atomic rename).
    """
    root = root or bundled_tritonserver_root()
    if root is None:
        raise TritonNotFoundError(f"the {PYTRITON_DIST} package is not installed")
    major, minor = python_version or sys.version_info[:2]
    stubs = root / "python_backend_stubs"
    stub_src = stubs / f"{major}.{minor}" / STUB_NAME
    if not stub_src.is_file():
        have = sorted(p.name for p in stubs.iterdir()) if stubs.is_dir() else []
        raise TritonNotFoundError(
            f"{PYTRITON_DIST} {_pytriton_version()} has no Python backend stub for Python {major}.{minor} "
            f"(it has: {', '.join(have) or 'none'}). Run trtspec with one of those Python versions, or use a system "
            f"tritonserver (set TRITONSERVER=/path/to/tritonserver)."
        )
    backend_so = root / "backends" / "python" / "libtriton_python.so"
    key = f"pytriton-{_pytriton_version()}-py{major}.{minor}"
    parent = cache_root(cache_dir) / "triton-backends"
    dest = parent / key
    marker_name = ".trtspec-complete.json"
    fingerprint = {"source": str(root), "files": _fingerprint(backend_so, stub_src), "hook": _HOOK_VERSION}

    def _valid(d: Path) -> bool:
        try:
            return json.loads((d / marker_name).read_text()) == fingerprint \
                and (d / "backends/python" / STUB_NAME).is_file()
        except (OSError, ValueError):
            return False

    if _valid(dest):
        return dest
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=parent))
    try:
        shutil.copytree(root / "backends", tmp / "backends", symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        if (root / "caches").is_dir():
            shutil.copytree(root / "caches", tmp / "caches", symlinks=True, dirs_exist_ok=True)
        stub_dst = tmp / "backends" / "python" / STUB_NAME
        shutil.copy2(stub_src, stub_dst)
        stub_dst.chmod(0o755)
        utils = tmp / "backends" / "python" / "triton_python_backend_utils.py"
        if utils.is_file():
            utils.write_text(_STUB_HOOK + utils.read_text())
        (tmp / marker_name).write_text(json.dumps(fingerprint))
        tmp.chmod(0o755)
        try:
            os.rename(tmp, dest)  # atomic; fails if dest exists (non-empty)
        except OSError:
            if _valid(dest):  # someone else won the race
                shutil.rmtree(tmp, ignore_errors=True)
                return dest
            stale = parent / f".{key}.stale-{secrets.token_hex(4)}"
            try:
                os.rename(dest, stale)
            except OSError:
                pass
            os.rename(tmp, dest)
            shutil.rmtree(stale, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _system_backend_dir(executable: Path) -> Path | None:
    # <root>/bin/tritonserver with <root>/backends next to it: point Triton at it unless it is its default
    root = executable.resolve().parent.parent
    if (root / "backends").is_dir() and root != Path("/opt/tritonserver"):
        return root / "backends"
    return None


def find_tritonserver(
    explicit: str | Path | None = None, *, cache_dir: str | Path | None = None, prepare: bool = True
) -> TritonInstallation:
    """Locate tritonserver (see the module docstring for the order). With the bundled one and ``prepare=True``,
    also prepares its backend directory (stub for the running Python)."""
    candidates: list[tuple[str, str]] = []
    if explicit:
        candidates.append((str(explicit), "the --tritonserver option"))
    elif os.environ.get("TRITONSERVER"):
        candidates.append((os.environ["TRITONSERVER"], "$TRITONSERVER"))
    if candidates:
        value, source = candidates[0]
        if value != "bundled":
            path = Path(value).expanduser()
            if path.is_dir():
                path = path / "bin" / "tritonserver" if (path / "bin").is_dir() else path / "tritonserver"
            if not (path.is_file() and os.access(path, os.X_OK)):
                resolved = shutil.which(value)
                if not resolved:
                    raise TritonNotFoundError(f"tritonserver from {source} not found or not executable: {value}")
                path = Path(resolved)
            return TritonInstallation(
                executable=path.resolve(), kind="system", backend_directory=_system_backend_dir(path),
                version=os.environ.get("NVIDIA_TRITON_SERVER_VERSION"), source=source,
            )
        return _bundled(source, cache_dir, prepare)
    on_path = shutil.which("tritonserver")
    if on_path:
        path = Path(on_path)
        return TritonInstallation(
            executable=path.resolve(), kind="system", backend_directory=_system_backend_dir(path),
            version=os.environ.get("NVIDIA_TRITON_SERVER_VERSION"), source="PATH",
        )
    if SYSTEM_TRITONSERVER.is_file() and os.access(SYSTEM_TRITONSERVER, os.X_OK):
        return TritonInstallation(
            executable=SYSTEM_TRITONSERVER, kind="system",
            version=os.environ.get("NVIDIA_TRITON_SERVER_VERSION"), source=str(SYSTEM_TRITONSERVER),
        )
    return _bundled(PYTRITON_DIST, cache_dir, prepare)


def _bundled(source: str, cache_dir: str | Path | None, prepare: bool) -> TritonInstallation:
    root = bundled_tritonserver_root()
    if root is None:
        raise TritonNotFoundError(
            "no tritonserver found: not in $TRITONSERVER, not on PATH, not at /opt/tritonserver/bin/tritonserver, "
            f"and the {PYTRITON_DIST} package (which ships one) is not installed. "
            "Install it with `pip install nvidia-pytriton` (or `pip install trtspec[cpu-triton]`), "
            "run inside an NGC tritonserver container, or set TRITONSERVER=/path/to/tritonserver."
        )
    prepared = prepare_bundled_backends(root, cache_dir=cache_dir) if prepare else None
    return TritonInstallation(
        executable=root / "bin" / "tritonserver",
        kind="bundled",
        backend_directory=prepared / "backends" if prepared else None,
        cache_directory=(prepared / "caches") if prepared and (prepared / "caches").is_dir() else None,
        library_path=(_pytriton_libs(root),),
        version=_pytriton_version(),
        source=source,
    )


# ----------------------------------------------------------------------------------------------------------------
# The Python models' environment


def _site_packages() -> list[str]:
    dirs: list[str] = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # some embedded/virtualenv builds
        pass
    purelib = sysconfig.get_paths().get("purelib")
    if purelib:
        dirs.append(purelib)
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def trtspec_import_root() -> Path:
    """The directory that holds the ``trtspec`` package (a checkout, or site-packages)."""
    import trtspec

    return Path(trtspec.__file__).resolve().parent.parent


def _prepend_path(env: dict[str, str], var: str, entries: Sequence[str | Path]) -> None:
    existing = [p for p in env.get(var, "").split(os.pathsep) if p]
    merged = list(dict.fromkeys([str(e) for e in entries if str(e)] + existing))
    if merged:
        env[var] = os.pathsep.join(merged)


def python_model_env(
    base: Mapping[str, str] | None = None,
    *,
    inherit: bool = True,
    pythonpath: Sequence[str | Path] = (),
    library_path: Sequence[str | Path] = (),
) -> dict[str, str]:
    """Environment for a tritonserver whose Python models should import ``pythonpath``, the trtspec package and,
    with ``inherit``, this interpreter's packages.

    The paths go to PYTHONPATH (for whatever the models spawn) *and* to ``TRTSPEC_STUB_PYTHONPATH`` /
    ``TRTSPEC_STUB_SITEDIRS``, which trtspec's copy of ``triton_python_backend_utils.py`` reads: the stub's embedded
    interpreter ignores PYTHONPATH.
    """
    env = dict(os.environ if base is None else base)
    ld = [str(p) for p in library_path]
    extra_pp = [str(Path(p).expanduser().resolve()) for p in pythonpath]
    root = str(trtspec_import_root())
    in_site = any(part in ("site-packages", "dist-packages") for part in Path(root).parts)
    sitedirs: list[str] = []
    given = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    stub_pp = list(extra_pp)
    if inherit:
        if sysconfig.get_config_var("Py_ENABLE_SHARED"):
            libdir = sysconfig.get_config_var("LIBDIR")
            if libdir and os.path.isdir(libdir):
                ld.append(libdir)
        # the stub's interpreter finds its prefix (and a venv's pyvenv.cfg) by looking up `python3` on PATH
        _prepend_path(env, "PATH", [os.path.dirname(sys.executable)])
        sitedirs = _site_packages()
        if not in_site:
            extra_pp.append(root)
        # what this process was given in PYTHONPATH, the models get too (the stub itself would ignore it)
        stub_pp = extra_pp + given
    elif not in_site:  # a source checkout is plain Python: always importable
        extra_pp.append(root)
        stub_pp = list(extra_pp)
    _prepend_path(env, "LD_LIBRARY_PATH", ld)
    _prepend_path(env, "PYTHONPATH", extra_pp + sitedirs)
    env[STUB_PATH_ENV] = os.pathsep.join(dict.fromkeys(stub_pp))
    env[STUB_SITEDIRS_ENV] = os.pathsep.join(sitedirs)
    return env


# ----------------------------------------------------------------------------------------------------------------
# The server


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
