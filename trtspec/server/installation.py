"""Which tritonserver to run, and the environment its Python models need: a system install, or the real binary
shipped in the nvidia-pytriton wheel, prepared to run this interpreter's models.

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

import importlib.metadata
import importlib.util
import json
import os
import secrets
import shutil
import site
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from trtspec.cache import cache_root
from trtspec.server.base import TritonNotFoundError

SYSTEM_TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")
#: env vars read by the hook below (the stub's interpreter runs with -E: it ignores PYTHONPATH)
STUB_PATH_ENV = "TRTSPEC_STUB_PYTHONPATH"
STUB_SITEDIRS_ENV = "TRTSPEC_STUB_SITEDIRS"
_HOOK_VERSION = 1
# Prepended to our copy of triton_python_backend_utils.py: runs when a model (or the stub) first imports it.
_STUB_HOOK = f"""# --- added by trtspec (hook v{_HOOK_VERSION}) --------------------------------------------------------
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
