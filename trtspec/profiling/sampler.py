"""Samplers: what the GPU (NVML) or, without an NVIDIA driver, the processes (/proc) are doing over time.

A sampler runs a daemon thread that takes one *tick* every ``interval_s`` seconds (a tick at ``start()`` and
a last one at ``stop()`` included). A tick yields one :class:`Sample` per source:

``NvmlSampler`` (kind ``"nvml"``)
    * ``gpu<i>`` (kind ``gpu``): utilization, memory, power, clocks, temperature, energy of GPU *i*;
    * ``gpu<i>/pid<p>`` (kind ``gpu_process``): the GPU memory process *p* holds on GPU *i*
      (``nvmlDeviceGetComputeRunningProcesses``), named from /proc, so a draft and a target that run in
      different processes (e.g. two Python-backend stubs, or two tritonservers) can be told apart.

``ProcessSampler`` (kind ``"process"``, the fallback with no NVIDIA driver)
    * ``pid<p>`` (kind ``process``): CPU % (100 = one core busy) and RSS of each process in the tree of the
      given pids (the pids and all their descendants, e.g. tritonserver and its Python-backend stubs);
    * ``processes`` (kind ``process_total``): the same summed over the tree;
    * ``system`` (kind ``system``): whole-machine CPU utilization and memory used.

``mark(label)`` adds an ``event`` sample (no metrics) at the current time, e.g. "warm-up done".

Every sample carries ``t`` (``time.time()``) and ``t_perf`` (``time.perf_counter()``) taken together, so
samples line up with request timelines measured with ``perf_counter``. Metric names follow GenAI-Perf's GPU
telemetry names where one exists (peers.md §4.3); units are in :data:`METRICS`.

Use :func:`create_sampler`: it picks NVML when ``nvmlInit`` works and a GPU is visible, else it says once
why not and returns the /proc fallback, with the reason in ``sampler.reason``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pynvml

from trtspec.profiling.procfs import (
    CLK_TCK, PROC, ProcNames, meminfo, process_tree, read_proc_stat, system_cpu_times, uptime,
)

log = logging.getLogger("trtspec.profiling")
log.addHandler(logging.NullHandler())

MIB = 1024 * 1024
NO_DRIVER_REASON = "no NVIDIA driver: sampling process CPU and memory instead"


@dataclass(frozen=True)
class Metric:
    unit: str
    group: str  # the plot panel it is drawn in
    description: str
    cumulative: bool = False  # a running counter: the summary adds its increase over the run ("delta")


#: Every metric a sampler can record: name -> unit, plot group, meaning. Names follow GenAI-Perf's
#: GPU telemetry where one exists (gpu_utilization, gpu_memory_used, gpu_power_usage, ...).
METRICS: dict[str, Metric] = {
    # NVML, per GPU
    "gpu_utilization": Metric("%", "utilization", "time a kernel was running (NVML utilization.gpu; not SM occupancy)"),
    "memory_copy_utilization": Metric("%", "utilization",
                                      "time device memory was read or written (NVML utilization.memory)"),
    "gpu_memory_used": Metric("MiB", "memory", "GPU memory used (per GPU, or held by one process for gpu<i>/pid<p>)"),
    "gpu_memory_free": Metric("MiB", "memory", "GPU memory free"),
    "total_gpu_memory": Metric("MiB", "memory", "GPU memory total"),
    "gpu_power_usage": Metric("W", "power", "board power draw"),
    "gpu_power_limit": Metric("W", "power", "enforced power limit"),
    "energy_consumption": Metric("J", "power", "energy used since the driver loaded (counter)", cumulative=True),
    "gpu_clock_sm": Metric("MHz", "clocks", "SM clock"),
    "gpu_clock_memory": Metric("MHz", "clocks", "memory clock"),
    "gpu_temperature": Metric("°C", "temperature", "GPU core temperature"),
    # /proc, per process (and the tree total)
    "cpu_percent": Metric("%", "cpu", "process CPU time over wall time; 100 = one core busy"),
    "rss": Metric("MiB", "rss", "resident memory of the process"),
    "num_threads": Metric("", "threads", "threads of the process"),
    "num_processes": Metric("", "threads", "processes in the sampled tree"),
    # /proc, whole machine
    "system_cpu_utilization": Metric("%", "cpu", "all cores busy share (100 = every core busy)"),
    "system_memory_used": Metric("MiB", "system_memory", "MemTotal - MemAvailable"),
    "system_memory_total": Metric("MiB", "system_memory", "MemTotal"),
}


@dataclass
class Sample:
    """One source at one tick (or one event from ``mark``)."""

    t: float  # time.time()
    t_perf: float  # time.perf_counter(), same instant
    kind: str  # gpu | gpu_process | process | process_total | system | event
    source: str  # gpu0, gpu0/pid123, pid123, processes, system, event
    metrics: dict[str, float | None] = field(default_factory=dict)
    name: str | None = None  # GPU model, process name, or the event's label
    device: int | None = None
    pid: int | None = None

    def as_row(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "t_perf": self.t_perf,
            "kind": self.kind,
            "source": self.source,
            "device": self.device,
            "pid": self.pid,
            "name": self.name,
            **self.metrics,
        }


class Sampler:
    """Base class: a daemon thread calling ``_tick()`` every ``interval_s``; a context manager."""

    kind: str = "abstract"

    def __init__(self, interval_s: float = 0.1, pids: Iterable[int] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = float(interval_s)
        self.pids: list[int] = [int(p) for p in (pids or [])]
        self.samples: list[Sample] = []
        self.reason: str | None = None  # why this kind of sampler was chosen (set by create_sampler)
        self.warnings: list[str] = []  # problems logged once each (e.g. a metric a GPU does not support)
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._stopped = False
        self.t_start_perf: float | None = None
        self.t_stop_perf: float | None = None

    # -- for subclasses --------------------------------------------------------------------------
    def _open(self) -> None:
        """Acquire resources (in the caller's thread, so failures raise from start())."""

    def _close(self) -> None:
        """Release resources (after the thread has stopped)."""

    def _tick(self, t: float, t_perf: float) -> list[Sample]:
        raise NotImplementedError

    # -- public ----------------------------------------------------------------------------------
    def add_pids(self, pids: Iterable[int]) -> None:
        """Sample these pids (and their descendants) too, e.g. a child started after the sampler."""
        with self._lock:
            for p in pids:
                if int(p) not in self.pids:
                    self.pids.append(int(p))

    def mark(self, label: str) -> Sample:
        """Record a timestamped event (drawn as a vertical line in the plot, listed in the summary)."""
        s = Sample(time.time(), time.perf_counter(), "event", "event", {}, name=str(label))
        with self._lock:
            self.samples.append(s)
        return s

    def start(self) -> "Sampler":
        if self._started:
            raise RuntimeError("a sampler can be started once")
        self._open()
        self._started = True
        self.t_start_perf = time.perf_counter()
        self._take()  # a first tick now, so even a short run has a sample at its start
        self._thread = threading.Thread(target=self._run, name=f"trtspec-{self.kind}-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        """Stop the thread, take a last tick, release resources. Safe to call twice."""
        if not self._started or self._stopped:
            return self.samples
        self._stopped = True
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._take()  # a last tick, so the end of the run is covered
        finally:
            self.t_stop_perf = time.perf_counter()
            self._close()
        return self.samples

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------------
    def _warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        self.warnings.append(message)
        log.warning(message)

    def _take(self) -> None:
        t, t_perf = time.time(), time.perf_counter()
        try:
            got = self._tick(t, t_perf)
        except Exception as e:  # noqa: BLE001 - a sampler must never take the run down
            self._warn_once(f"tick:{type(e).__name__}", f"{self.kind} sampler: a tick failed: {e!r}")
            return
        with self._lock:
            self.samples.extend(got)

    def _run(self) -> None:
        next_t = time.perf_counter() + self.interval_s
        while not self._stop_event.wait(max(0.0, next_t - time.perf_counter())):
            self._take()
            next_t += self.interval_s
            now = time.perf_counter()
            if next_t < now:  # fell behind (a slow tick): skip the missed slots, keep the cadence
                next_t = now + self.interval_s - ((now - next_t) % self.interval_s)


# ------------------------------------------------------------------------------------------------
# The fallback: processes from /proc
# ------------------------------------------------------------------------------------------------
class ProcessSampler(Sampler):
    """CPU % and RSS of the process trees of ``pids`` (children included) plus system CPU and memory.

    With no pids it samples the machine as a whole only. Reads /proc directly (Linux).
    """

    kind = "process"

    def __init__(self, pids: Iterable[int] | None = None, interval_s: float = 0.1) -> None:
        super().__init__(interval_s=interval_s, pids=pids)
        self._prev: dict[tuple[int, int], tuple[int, float]] = {}  # (pid, start) -> (cpu ticks, t_perf)
        self._prev_sys: tuple[int, int] | None = None
        self._names = ProcNames()

    def _open(self) -> None:
        if not (PROC / "stat").exists():
            raise RuntimeError("the process sampler needs Linux /proc")
        # system CPU is a difference between ticks: the first tick only sets the baseline (None)

    def _tick(self, t: float, t_perf: float) -> list[Sample]:
        out: list[Sample] = []
        with self._lock:
            roots = list(self.pids)
        if roots:
            tot_cpu: float = 0.0
            tot_cpu_known = False
            tot_rss = 0
            n = 0
            prev_all, self._prev = self._prev, {}  # keep only live processes
            for pid in process_tree(roots):
                st = read_proc_stat(pid)
                if st is None:
                    continue
                key = (pid, st.start_ticks)
                prev = prev_all.get(key)
                if prev is not None and t_perf > prev[1]:
                    cpu = 100.0 * (st.cpu_ticks - prev[0]) / CLK_TCK / (t_perf - prev[1])
                else:  # first sight of this process: its average since it started
                    try:
                        age = uptime() - st.start_ticks / CLK_TCK
                    except (OSError, ValueError):
                        age = 0.0
                    cpu = 100.0 * st.cpu_ticks / CLK_TCK / age if age > 0.05 else None
                self._prev[key] = (st.cpu_ticks, t_perf)
                if cpu is not None:
                    cpu = max(0.0, cpu)
                    tot_cpu += cpu
                    tot_cpu_known = True
                tot_rss += st.rss_bytes
                n += 1
                out.append(
                    Sample(
                        t, t_perf, "process", f"pid{pid}",
                        {"cpu_percent": cpu, "rss": st.rss_bytes / MIB, "num_threads": float(st.num_threads)},
                        name=self._names.get(pid, st) or st.comm, pid=pid,
                    )
                )
            if n:  # nothing alive (yet, or any more): no total rather than a misleading 0
                total_metrics: dict[str, float | None] = {
                    "cpu_percent": tot_cpu if tot_cpu_known else None,
                    "rss": tot_rss / MIB,
                    "num_processes": float(n),
                }
                out.append(Sample(t, t_perf, "process_total", "processes", total_metrics, name="process tree"))
        sys_cpu = system_cpu_times()
        util = None
        if sys_cpu is not None and self._prev_sys is not None and sys_cpu[1] > self._prev_sys[1]:
            util = 100.0 * (sys_cpu[0] - self._prev_sys[0]) / (sys_cpu[1] - self._prev_sys[1])
        if sys_cpu is not None:
            self._prev_sys = sys_cpu
        mem = meminfo()
        total = mem.get("MemTotal")
        avail = mem.get("MemAvailable")
        out.append(
            Sample(
                t, t_perf, "system", "system",
                {
                    "system_cpu_utilization": util,
                    "system_memory_used": (total - avail) / MIB if total is not None and avail is not None else None,
                    "system_memory_total": total / MIB if total is not None else None,
                },
                name=f"{os.cpu_count()} cores",
            )
        )
        return out


# ------------------------------------------------------------------------------------------------
# NVML
# ------------------------------------------------------------------------------------------------
def _as_str(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class NvmlSampler(Sampler):
    """Per GPU: utilization, memory, power, clocks, temperature, energy; per process: GPU memory.

    ``nvmlInit`` once in ``start()``, ``nvmlShutdown`` once in ``stop()``. An NVMLError for one metric
    on one device leaves that metric None and the rest sampling; it is logged once (and kept in
    ``warnings``). A metric that raises ``NVMLError_NotSupported`` is not asked for again on that device.
    Every GPU compute process is recorded, not only those under ``pids``: in a container NVML may report
    host pids that /proc here cannot see, so filtering would lose them. The GPU processes that do belong
    to the tree of ``pids`` are collected in ``tracked_pids``.
    """

    kind = "nvml"

    def __init__(self, interval_s: float = 0.1, pids: Iterable[int] | None = None) -> None:
        super().__init__(interval_s=interval_s, pids=pids)
        self._devices: list[tuple[int, Any, str]] = []  # (NVML index, handle, name)
        self._unsupported: set[tuple[int, str]] = set()
        self._proc_names = ProcNames()
        self._initialized = False
        self.tracked_pids: set[int] = set()  # GPU processes seen that belong to the tree of `pids`

    def _open(self) -> None:
        pynvml.nvmlInit()
        self._initialized = True
        try:
            count = pynvml.nvmlDeviceGetCount()
            for i in range(count):
                try:
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                except pynvml.NVMLError as e:  # e.g. no permission on one GPU: sample the others
                    self._warn_once(f"{i}:handle", f"GPU {i}: not sampled ({type(e).__name__}: {e})")
                    continue
                try:
                    name = _as_str(pynvml.nvmlDeviceGetName(h))
                except pynvml.NVMLError:
                    name = f"GPU {i}"
                self._devices.append((i, h, name))
        except BaseException:
            self._initialized = False
            pynvml.nvmlShutdown()
            raise

    def _close(self) -> None:
        if self._initialized:
            self._initialized = False
            pynvml.nvmlShutdown()

    def _get(self, dev: int, metric: str, fn: Callable[[], Any]) -> Any:
        """Call one NVML query; on NVMLError return None and log once per (device, metric)."""
        if (dev, metric) in self._unsupported:
            return None
        try:
            return fn()
        except pynvml.NVMLError as e:
            if isinstance(e, pynvml.NVMLError_NotSupported):
                self._unsupported.add((dev, metric))
            self._warn_once(f"{dev}:{metric}", f"GPU {dev}: {metric} not sampled ({type(e).__name__}: {e})")
            return None

    def _tick(self, t: float, t_perf: float) -> list[Sample]:
        out: list[Sample] = []
        with self._lock:
            roots = list(self.pids)
        tree = set(process_tree(roots)) if roots else set()
        for i, h, gpu_name in self._devices:
            m: dict[str, float | None] = {}
            util = self._get(i, "utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(h))
            m["gpu_utilization"] = float(util.gpu) if util is not None else None
            m["memory_copy_utilization"] = float(util.memory) if util is not None else None
            mem = self._get(i, "memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
            m["gpu_memory_used"] = mem.used / MIB if mem is not None else None
            m["gpu_memory_free"] = mem.free / MIB if mem is not None else None
            m["total_gpu_memory"] = mem.total / MIB if mem is not None else None
            p = self._get(i, "power", lambda: pynvml.nvmlDeviceGetPowerUsage(h))
            m["gpu_power_usage"] = p / 1000.0 if p is not None else None
            pl = self._get(i, "power_limit", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h))
            m["gpu_power_limit"] = pl / 1000.0 if pl is not None else None
            e = self._get(i, "energy", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
            m["energy_consumption"] = e / 1000.0 if e is not None else None
            c = self._get(i, "clock_sm", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
            m["gpu_clock_sm"] = float(c) if c is not None else None
            c = self._get(i, "clock_memory", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM))
            m["gpu_clock_memory"] = float(c) if c is not None else None
            tc = self._get(i, "temperature", lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
            m["gpu_temperature"] = float(tc) if tc is not None else None
            out.append(Sample(t, t_perf, "gpu", f"gpu{i}", m, name=gpu_name, device=i))

            procs = self._get(i, "processes", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h)) or []
            per_pid: dict[int, float | None] = {}
            for pr in procs:  # a process can appear once per context (MPS, MIG): sum what it holds
                used = getattr(pr, "usedGpuMemory", None)
                prev = per_pid.get(pr.pid)
                if used is None:
                    per_pid.setdefault(pr.pid, None)
                else:
                    per_pid[pr.pid] = (prev or 0.0) + used / MIB
            for pid, used_mib in per_pid.items():
                st = read_proc_stat(pid)  # None when the pid is in another namespace (containers)
                name = self._proc_names.get(pid, st) or f"pid {pid}"
                if pid in tree:
                    self.tracked_pids.add(pid)
                out.append(
                    Sample(
                        t, t_perf, "gpu_process", f"gpu{i}/pid{pid}",
                        {"gpu_memory_used": used_mib}, name=name, device=i, pid=pid,
                    )
                )
        return out


# ------------------------------------------------------------------------------------------------
# The chooser
# ------------------------------------------------------------------------------------------------
_said: set[str] = set()  # reasons already logged in this process ("say so once")


def _say_once(reason: str) -> None:
    if reason not in _said:
        _said.add(reason)
        log.warning(reason)


def nvml_unavailable_reason() -> str | None:
    """None if NVML works and sees a GPU, else why not (a sentence ending in what is sampled instead)."""
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded):
        return NO_DRIVER_REASON
    except pynvml.NVMLError as e:
        return f"NVML unavailable ({type(e).__name__}: {e}): sampling process CPU and memory instead"
    except OSError as e:  # a broken libnvidia-ml
        return f"NVML unavailable ({e}): sampling process CPU and memory instead"
    try:
        n = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as e:
        n, err = 0, e
    else:
        err = None
    finally:
        pynvml.nvmlShutdown()
    if n == 0:
        why = f" ({type(err).__name__}: {err})" if err is not None else ""
        return f"no NVIDIA GPU visible{why}: sampling process CPU and memory instead"
    return None


def create_sampler(interval_s: float = 0.1, pids: list[int] | None = None) -> Sampler:
    """An :class:`NvmlSampler` when the NVIDIA driver answers, else a :class:`ProcessSampler` on ``pids``.

    The choice is explained in ``sampler.reason`` (None for NVML) and, the first time in a process, in a
    warning on the ``trtspec.profiling`` logger. Not started: call ``start()`` or use it as a context manager.
    """
    reason = nvml_unavailable_reason()
    if reason is None:
        s: Sampler = NvmlSampler(interval_s=interval_s, pids=pids)
    else:
        _say_once(reason)
        s = ProcessSampler(pids=pids, interval_s=interval_s)
    s.reason = reason
    return s
