"""GPU profiling with NVML, and a /proc fallback where there is no NVIDIA driver.

    from trtspec.profiling import create_sampler, write_timeline, summarize, plot_timeline

    sampler = create_sampler(interval_s=0.1, pids=[server_pid])   # NVML, or /proc with sampler.reason set
    with sampler:
        sampler.mark("measured run")
        ...                                                        # the work to profile
    write_timeline(sampler.samples, out_dir)                       # timeline.csv, timeline.json, summary.json
    plot_timeline(sampler.samples, out_dir / "timeline.png", requests=[(t_start, t_end, "k=4"), ...])

Request spans are given in ``time.perf_counter()`` time; every sample carries ``t_perf`` too.
"""

from trtspec.profiling.report import plot_timeline, summarize, write_summary, write_timeline
from trtspec.profiling.sampler import (
    METRICS,
    NO_DRIVER_REASON,
    NvmlSampler,
    ProcessSampler,
    Sample,
    Sampler,
    create_sampler,
)

__all__ = [
    "METRICS",
    "NO_DRIVER_REASON",
    "NvmlSampler",
    "ProcessSampler",
    "Sample",
    "Sampler",
    "create_sampler",
    "plot_timeline",
    "summarize",
    "write_summary",
    "write_timeline",
]
