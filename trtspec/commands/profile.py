"""`trtspec profile -- COMMAND ...`: sample the GPU (or, with no NVIDIA driver, the processes) while a command runs."""

from __future__ import annotations

import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from trtspec.commands._common import UserError, console, err_console


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


def summary_table(summary: dict[str, Any]) -> Table:
    """A rich table: one row per source and metric, with mean / p50 / max."""
    kind = summary.get("sampler")
    interval = summary.get("interval_s")
    caption = f"{summary.get('ticks', 0)} samples over {summary.get('duration_s', 0.0):.1f} s"
    if interval:
        caption += f", every {interval * 1000:.0f} ms"
    t = Table(title=f"Profile ({kind} sampler)", caption=caption, title_justify="left")
    for col, just in (("source", "left"), ("metric", "left"), ("unit", "left"),
                      ("mean", "right"), ("p50", "right"), ("max", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    skip = {"num_threads", "total_gpu_memory", "system_memory_total", "gpu_power_limit"}
    for src_id, src in summary.get("sources", {}).items():
        name = src.get("name")
        label = src_id if not name or src.get("kind") in ("system", "process_total") else f"{src_id} {name}"
        first = True
        for metric, st in src.get("metrics", {}).items():
            if metric in skip:
                continue
            if st.get("delta") is not None:  # a counter: its increase is what matters
                t.add_row(label if first else "", metric + " (increase)", st["unit"], "", "", _fmt(st["delta"]))
            else:
                t.add_row(label if first else "", metric, st["unit"], _fmt(st["mean"]), _fmt(st["p50"]),
                          _fmt(st["max"]))
            first = False
        t.add_section()
    return t


def _command_argv(cmd: tuple[str, ...]) -> list[str]:
    argv = list(cmd)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UserError("give the command to profile after `--`, e.g. `trtspec profile -- python job.py`")
    return argv


def _run_sampled(argv: list[str], sampler: Any) -> tuple[int, bool]:
    """Runs the command to its end with its process tree sampled: (its return code, whether Ctrl-C ended it)."""
    interrupted = False
    try:
        child = subprocess.Popen(argv)
    except (FileNotFoundError, PermissionError) as e:
        err = UserError(f"cannot run {argv[0]!r}: {e.strerror or e}")
        err.exit_code = 127 if isinstance(e, FileNotFoundError) else 126
        raise err from None
    sampler.add_pids([child.pid])
    try:
        returncode = child.wait()
    except KeyboardInterrupt:  # the terminal sent SIGINT to the child too; give it time to finish
        interrupted = True
        try:
            returncode = child.wait(timeout=10)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            child.send_signal(signal.SIGKILL)
            returncode = child.wait()
    sampler.mark(f"exit {returncode}")
    return returncode, interrupted


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N -> 128 + N, like a shell


@click.command(
    "profile",
    context_settings={"allow_interspersed_args": False},
)
@click.option("--interval", type=click.FloatRange(min=0.001), default=0.1, show_default=True,
              help="Seconds between samples (0.1 = 10 Hz).")
@click.option("--output", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Results directory [default: ./profile-results/<timestamp>].")
@click.option("--pid", "pids", type=int, multiple=True, metavar="PID",
              help="Also sample this already running process and its children, e.g. a tritonserver "
                   "started elsewhere. Repeatable.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
def command(interval: float, output: Path | None, pids: tuple[int, ...], cmd: tuple[str, ...]) -> None:
    """Run COMMAND and sample the GPU while it runs; write a timeline, a summary and a plot.

    \b
    What is sampled (every --interval seconds):
      with an NVIDIA driver (NVML), per GPU:
        gpu_utilization, memory_copy_utilization (%)  time a kernel / a memory copy was running
        gpu_memory_used, gpu_memory_free, total_gpu_memory (MiB)
        gpu_power_usage, gpu_power_limit (W), energy_consumption (J, counter)
        gpu_clock_sm, gpu_clock_memory (MHz), gpu_temperature (°C)
      and per process on each GPU: gpu_memory_used, named from /proc (a Python-backend
      stub shows as python_stub[<model>]), so the draft and the target can be told apart
      when they run in different processes.
    \b
      without one (no NVIDIA driver, e.g. CPU machines and CI) it says so once and samples
      COMMAND's process tree instead (COMMAND, its children, e.g. tritonserver and its
      Python-backend stubs, and the trees of --pid): per process cpu_percent (100 = one
      core busy) and rss (MiB), their total, and system CPU and memory.
    \b
    Files in the results directory:
      timeline.csv / timeline.json  one row per sample per source (gpu0, gpu0/pid123, pid123,
                                    processes, system): t (unix time), t_rel (s since the first
                                    sample), t_perf (perf_counter, to align with request times),
                                    then one column per metric (empty where not sampled); the
                                    JSON also lists each metric's unit and meaning
      summary.json                  per source and metric: mean, p50, max, min, n; a metric a GPU
                                    does not support has n = 0 and nulls
      timeline.png                  one panel per metric group; dotted lines mark start and exit
    \b
    Exits with COMMAND's exit code (128+N if a signal N killed it). Metric names follow
    GenAI-Perf's GPU telemetry (gpu_utilization, gpu_memory_used, gpu_power_usage, ...).
    NVML utilization is busy time, not SM occupancy.
    \b
    Examples:
      trtspec profile -- tritonserver --model-repository out/model_repository
      trtspec profile -o results/run1 --interval 0.05 -- python my_client.py
    """
    from trtspec.profiling import create_sampler, plot_timeline, summarize, write_timeline

    argv = _command_argv(cmd)
    out_dir = output or Path("profile-results") / time.strftime("%Y%m%d-%H%M%S")

    sampler = create_sampler(interval_s=interval, pids=list(pids))
    if sampler.reason:
        err_console.print(f"[yellow]{sampler.reason}[/]")
    try:
        sampler.start()
    except Exception as e:  # noqa: BLE001 - NVML can fail between the probe and start
        raise UserError(f"could not start the {sampler.kind} sampler: {e}") from None
    sampler.mark("start")
    err_console.print(f"[dim]profiling `{shlex.join(argv)}` ({sampler.kind} sampler, every {interval:g} s)[/]")
    try:
        returncode, interrupted = _run_sampled(argv, sampler)
    finally:
        sampler.stop()

    samples = sampler.samples
    paths = write_timeline(samples, out_dir)
    png = plot_timeline(samples, out_dir / "timeline.png")
    summary = summarize(samples)
    for w in sampler.warnings:
        err_console.print(f"[yellow]note:[/] {w}")
    console.print(summary_table(summary))
    console.print("Results:")
    for p in [*paths, png]:
        console.print(f"  {p}", soft_wrap=True)
    code = _exit_code(returncode)
    if interrupted:
        code = code or 130
    if code:
        console.print(f"[dim]{argv[0]} exited with {code}[/]")
    click.get_current_context().exit(code)
