"""Profiling: the NVML sampler against a stand-in NVML that checks its calls, the /proc fallback for real,
and `trtspec profile` end to end."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pynvml
import pytest
from click.testing import CliRunner

from trtspec.profiling import (
    NO_DRIVER_REASON,
    NvmlSampler,
    ProcessSampler,
    Sample,
    create_sampler,
    plot_timeline,
    summarize,
    write_timeline,
)
from trtspec.profiling import sampler as sampler_mod

MIB = 1024 * 1024


class FakeNVML:
    """Stands in for libnvidia-ml at pynvml's boundary and records protocol violations.

    Two GPUs. Device 1 raises NVMLError_NotSupported for power. Device 0 runs `proc0` (pid, bytes),
    device 1 runs `proc1`.
    """

    def __init__(self, proc0: tuple[int, int], proc1: tuple[int, int]) -> None:
        self.lock = threading.Lock()
        self.initialized = 0  # NVML's init is reference counted
        self.init_calls = 0
        self.shutdown_calls = 0
        self.violations: list[str] = []
        self.calls: list[str] = []
        self.handles = [object(), object()]  # opaque, like the real ones
        self.procs = {0: [proc0], 1: [proc1]}
        self.power_calls = {0: 0, 1: 0}

    # -- lifecycle
    def nvmlInit(self) -> None:
        with self.lock:
            self.init_calls += 1
            self.initialized += 1
            self.calls.append("nvmlInit")

    def nvmlShutdown(self) -> None:
        with self.lock:
            self.calls.append("nvmlShutdown")
            if self.initialized <= 0:
                self.violations.append("nvmlShutdown without nvmlInit")
            self.shutdown_calls += 1
            self.initialized -= 1

    # -- checks
    def _check(self, fn: str, handle: object | None = None) -> int | None:
        with self.lock:
            self.calls.append(fn)
            if self.initialized <= 0:
                self.violations.append(f"{fn} called while NVML is not initialised")
            if handle is None:
                return None
            for i, h in enumerate(self.handles):
                if h is handle:
                    return i
            self.violations.append(f"{fn} got a handle NVML never handed out: {handle!r}")
            raise pynvml.NVMLError_InvalidArgument()

    # -- device queries
    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.handles)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> object:
        self._check("nvmlDeviceGetHandleByIndex")
        return self.handles[i]

    def nvmlDeviceGetName(self, h: object) -> str:
        return f"Fake H100 #{self._check('nvmlDeviceGetName', h)}"

    def nvmlDeviceGetUtilizationRates(self, h: object) -> SimpleNamespace:
        i = self._check("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=50 + i, memory=20 + i)

    def nvmlDeviceGetMemoryInfo(self, h: object) -> SimpleNamespace:
        i = self._check("nvmlDeviceGetMemoryInfo", h)
        total = 80 * 1024 * MIB
        used = (1000 + 1000 * i) * MIB
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetPowerUsage(self, h: object) -> int:
        i = self._check("nvmlDeviceGetPowerUsage", h)
        self.power_calls[i] += 1
        if i == 1:
            raise pynvml.NVMLError_NotSupported()
        return 350_000  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h: object) -> int:
        self._check("nvmlDeviceGetEnforcedPowerLimit", h)
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: object) -> int:
        self._check("nvmlDeviceGetTotalEnergyConsumption", h)
        return int(time.perf_counter() * 1e6)  # mJ, rising

    def nvmlDeviceGetClockInfo(self, h: object, kind: int) -> int:
        self._check("nvmlDeviceGetClockInfo", h)
        if kind not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM):
            self.violations.append(f"unexpected clock type {kind}")
        return 1980 if kind == pynvml.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetTemperature(self, h: object, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature", h)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            self.violations.append(f"unexpected sensor {sensor}")
        return 41

    def nvmlDeviceGetComputeRunningProcesses(self, h: object) -> list[SimpleNamespace]:
        i = self._check("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.procs[i]]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "FakeNVML":
        for name in dir(self):
            if name.startswith("nvml"):
                assert hasattr(pynvml, name), f"the stand-in fakes {name}, which pynvml does not have"
                monkeypatch.setattr(pynvml, name, getattr(self, name))
        return self


@pytest.fixture
def sleeper():
    """A real second process, so per-process GPU memory can be attributed to two different pids."""
    p = subprocess.Popen(["sleep", "30"])
    yield p
    p.kill()
    p.wait()


def test_nvml_sampler_against_a_checking_stand_in(monkeypatch, sleeper, caplog):
    me = os.getpid()
    fake = FakeNVML(proc0=(me, 512 * MIB), proc1=(sleeper.pid, 1024 * MIB)).install(monkeypatch)
    caplog.set_level(logging.WARNING, logger="trtspec.profiling")

    s = NvmlSampler(interval_s=0.05, pids=[sleeper.pid])
    with s:
        time.sleep(0.5)
    s.stop()  # a second stop is a no-op: shut down exactly once

    assert fake.violations == []
    assert fake.calls[0] == "nvmlInit" and fake.init_calls == 1
    assert fake.shutdown_calls == 1 and fake.calls[-1] == "nvmlShutdown"

    gpu = {i: [x for x in s.samples if x.kind == "gpu" and x.device == i] for i in (0, 1)}
    n = len(gpu[0])
    assert n == len(gpu[1])
    # sampled repeatedly through the window, never faster than the interval asks (a busy machine only slows it)
    assert n >= 2, n
    ticks = sorted({x.t_perf for x in gpu[0]})
    assert len(ticks) == n and float(np.min(np.diff(ticks)[:-1])) >= 0.05 * 0.5  # the last tick is the one at stop
    assert all(abs(x.t - time.time()) < 60 for x in gpu[0])  # wall-clock time too

    # power not supported on GPU 1: None there, everything else keeps sampling on both GPUs
    assert all(x.metrics["gpu_power_usage"] is None for x in gpu[1])
    assert all(x.metrics["gpu_power_usage"] == pytest.approx(350.0) for x in gpu[0])
    assert fake.power_calls[1] == 1  # NotSupported: not asked again
    for i in (0, 1):
        for x in gpu[i]:
            assert x.metrics["gpu_utilization"] == 50 + i
            assert x.metrics["memory_copy_utilization"] == 20 + i
            assert x.metrics["gpu_memory_used"] == pytest.approx(1000 + 1000 * i)
            assert x.metrics["total_gpu_memory"] == pytest.approx(80 * 1024)
            assert x.metrics["gpu_clock_sm"] == 1980 and x.metrics["gpu_clock_memory"] == 2619
            assert x.metrics["gpu_temperature"] == 41
            assert x.name == f"Fake H100 #{i}"
    # logged once, not once per tick
    power_logs = [r for r in caplog.records if "power" in r.getMessage()]
    assert len(power_logs) == 1 and "GPU 1" in power_logs[0].getMessage()
    assert len(s.warnings) == 1

    # per-process GPU memory lands on the right pid and device, named from /proc
    p0 = [x for x in s.samples if x.kind == "gpu_process" and x.device == 0]
    p1 = [x for x in s.samples if x.kind == "gpu_process" and x.device == 1]
    assert {x.pid for x in p0} == {me} and {x.pid for x in p1} == {sleeper.pid}
    assert all(x.metrics["gpu_memory_used"] == pytest.approx(512) for x in p0)
    assert all(x.metrics["gpu_memory_used"] == pytest.approx(1024) for x in p1)
    assert p1[0].name == "sleep" and p1[0].source == f"gpu1/pid{sleeper.pid}"
    assert p0[0].name.startswith("python") or "pytest" in p0[0].name
    assert s.tracked_pids == {sleeper.pid}

    # the summary keeps the unsupported metric, with no values
    summ = summarize(s.samples)
    assert summ["sampler"] == "nvml"
    assert summ["sources"]["gpu1"]["metrics"]["gpu_power_usage"]["n"] == 0
    assert summ["sources"]["gpu1"]["metrics"]["gpu_power_usage"]["mean"] is None
    assert summ["sources"]["gpu0"]["metrics"]["gpu_power_usage"]["p50"] == pytest.approx(350.0)
    assert summ["sources"][f"gpu1/pid{sleeper.pid}"]["metrics"]["gpu_memory_used"]["max"] == pytest.approx(1024)
    assert summ["sources"]["gpu0"]["metrics"]["energy_consumption"]["delta"] > 0


def test_nvml_start_failure_shuts_down(monkeypatch):
    fake = FakeNVML((1, 1), (2, 2)).install(monkeypatch)

    def broken_count() -> int:
        raise pynvml.NVMLError_Unknown()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", broken_count)
    with pytest.raises(pynvml.NVMLError):
        NvmlSampler().start()
    assert fake.init_calls == 1 and fake.shutdown_calls == 1


@pytest.mark.parametrize("error", [pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded])
def test_create_sampler_falls_back_without_a_driver(monkeypatch, caplog, error):
    def no_driver() -> None:
        raise error()

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    monkeypatch.setattr(sampler_mod, "_said", set())
    caplog.set_level(logging.WARNING, logger="trtspec.profiling")
    a = create_sampler(0.1, [os.getpid()])
    b = create_sampler(0.1, None)
    for s in (a, b):
        assert isinstance(s, ProcessSampler) and s.kind == "process"
        assert s.reason == NO_DRIVER_REASON == "no NVIDIA driver: sampling process CPU and memory instead"
    assert a.pids == [os.getpid()] and a.interval_s == 0.1
    assert [r.getMessage() for r in caplog.records] == [NO_DRIVER_REASON]  # said once


def test_create_sampler_picks_nvml_when_it_works(monkeypatch):
    fake = FakeNVML((1, 1), (2, 2)).install(monkeypatch)
    s = create_sampler(0.2, [123])
    assert isinstance(s, NvmlSampler) and s.kind == "nvml" and s.reason is None
    assert fake.init_calls == fake.shutdown_calls == 1  # the probe leaves NVML as it found it


CHILD = r"""
import os, subprocess, sys, time
# a grandchild that idles, then allocates ~120 MiB and burns CPU for ~0.8 s
code = '''
import sys, time
time.sleep(0.4)
print("go", flush=True)
block = bytearray(120 << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
t = time.time()
x = 0
while time.time() - t < 0.8:
    x += 1
'''
p = subprocess.Popen([sys.executable, "-c", code])
print(p.pid, flush=True)
p.wait()
"""


def test_process_sampler_sees_a_real_child_tree_grow():
    parent = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    s = ProcessSampler([parent.pid], interval_s=0.05)
    s.start()
    grandchild = int(parent.stdout.readline())
    assert parent.stdout.readline().strip() == "go"
    s.mark("allocating")
    parent.wait(timeout=20)
    s.stop()

    mine = sorted((x for x in s.samples if x.pid == grandchild), key=lambda x: x.t_perf)
    assert len(mine) >= 5, "the grandchild (a child of the given pid) was not sampled"
    assert mine[0].name == f"{os.path.basename(sys.executable)} -c"
    t_go = next(e.t_perf for e in s.samples if e.kind == "event")
    before = [x for x in mine if x.t_perf < t_go]
    after = [x for x in mine if x.t_perf > t_go]
    assert before and after
    rss_before = min(x.metrics["rss"] for x in before)
    rss_after = max(x.metrics["rss"] for x in after)
    assert rss_after - rss_before > 80, (rss_before, rss_after)  # ~120 MiB touched
    cpu_after = max(x.metrics["cpu_percent"] or 0.0 for x in after)
    cpu_idle = min(x.metrics["cpu_percent"] for x in before if x.metrics["cpu_percent"] is not None)
    assert cpu_after > cpu_idle, (cpu_idle, cpu_after)  # the busy loop shows; a shared machine decides how much

    totals = [x for x in s.samples if x.kind == "process_total"]
    assert max(x.metrics["num_processes"] for x in totals) == 2
    system = [x for x in s.samples if x.kind == "system"]
    assert system[0].metrics["system_cpu_utilization"] is None  # the first tick only sets the baseline
    util = [x.metrics["system_cpu_utilization"] for x in system[1:]]
    util = [u for u in util if u is not None]  # None when no jiffy passed between two ticks (the last one)
    assert len(util) >= len(system) - 3 and all(0 <= u <= 100 for u in util)
    assert all(x.metrics["system_memory_used"] > 0 for x in system)


def _fake_samples() -> list[Sample]:
    out = []
    t0, p0 = time.time(), 1000.0
    for k in range(5):
        t, p = t0 + 0.1 * k, p0 + 0.1 * k
        out.append(Sample(t, p, "gpu", "gpu0", {"gpu_utilization": 10.0 * k, "gpu_power_usage": None,
                                                "gpu_memory_used": 100.0, "energy_consumption": 5.0 + k},
                          name="GPU", device=0))
        out.append(Sample(t, p, "gpu_process", "gpu0/pid7", {"gpu_memory_used": 60.0}, name="python_stub[draft]",
                          device=0, pid=7))
    out.append(Sample(t0 + 0.15, p0 + 0.15, "event", "event", {}, name="warm-up done"))
    return out


def test_report_files_and_summary(tmp_path):
    samples = _fake_samples()
    paths = write_timeline(samples, tmp_path / "r")
    assert [p.name for p in paths] == ["timeline.csv", "timeline.json", "summary.json"]
    lines = paths[0].read_text().splitlines()
    assert lines[0].split(",")[:8] == ["t", "t_rel", "t_perf", "kind", "source", "device", "pid", "name"]
    assert len(lines) == 1 + 11
    doc = json.loads(paths[1].read_text())
    assert doc["sampler"] == "nvml" and doc["metrics"]["gpu_memory_used"]["unit"] == "MiB"
    assert doc["samples"][0]["t_rel"] == 0.0 and doc["samples"][0]["gpu_power_usage"] is None
    summ = json.loads(paths[2].read_text())
    u = summ["sources"]["gpu0"]["metrics"]["gpu_utilization"]
    assert (u["mean"], u["p50"], u["max"], u["n"]) == (20.0, 20.0, 40.0, 5)
    assert summ["sources"]["gpu0"]["metrics"]["energy_consumption"]["delta"] == pytest.approx(4.0)
    assert summ["events"][0]["label"] == "warm-up done"
    assert summ["ticks"] == 5 and summ["interval_s"] == pytest.approx(0.1)
    # a window in perf_counter time keeps what falls inside it
    assert summarize(samples, window=(1000.05, 1000.25))["ticks"] == 2
    png = plot_timeline(samples, tmp_path / "r" / "t.png", requests=[(1000.05, 1000.3, "k=4"), (1000.1, 1000.2, "k=0")])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_command_end_to_end(tmp_path):
    from trtspec.cli import cli

    out = tmp_path / "prof"
    code = "import time; x = bytearray(30 << 20); time.sleep(0.4); raise SystemExit(3)"
    res = CliRunner().invoke(cli, ["profile", "--interval", "0.05", "-o", str(out), "--", sys.executable, "-c", code])
    assert res.exit_code == 3, res.output
    for f in ("timeline.csv", "timeline.json", "summary.json", "timeline.png"):
        assert (out / f).stat().st_size > 0, f
    summ = json.loads((out / "summary.json").read_text())
    assert {"format", "sampler", "duration_s", "ticks", "interval_s", "sources", "events", "metrics"} <= set(summ)
    assert [e["label"] for e in summ["events"]] == ["start", "exit 3"]
    if summ["sampler"] == "process":  # this machine and CI have no NVIDIA driver
        procs = [v for v in summ["sources"].values() if v["kind"] == "process"]
        assert procs and set(procs[0]["metrics"]) >= {"cpu_percent", "rss"}
        assert set(procs[0]["metrics"]["rss"]) >= {"mean", "p50", "max", "unit"}
        assert "system" in summ["sources"]
    assert "timeline.png" in res.output

    res = CliRunner().invoke(cli, ["profile", "-o", str(tmp_path / "x"), "--", "definitely-not-a-command-xyz"])
    assert res.exit_code == 127
