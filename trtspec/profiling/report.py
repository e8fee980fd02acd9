"""Turning samples into files: a timeline (CSV + JSON), a summary (JSON) and a plot (PNG).

Files written by :func:`write_timeline` into ``out_dir``:

``timeline.csv`` / ``timeline.json``
    One row per sample per source (a GPU, a process on a GPU, a process, the process tree, the system)
    plus one row per ``mark()`` event (kind ``event``, the label in ``name``). Columns: ``t`` (unix
    time), ``t_rel`` (seconds since the first sample), ``t_perf`` (``time.perf_counter()``, to align with
    request timelines), ``kind``, ``source``, ``device``, ``pid``, ``name``, then one column per metric
    (empty / null where not sampled). ``timeline.json`` holds the same rows under ``samples`` plus the
    unit and meaning of each metric under ``metrics``.
``summary.json``
    :func:`summarize`: per source, per metric ``mean``, ``p50``, ``max``, ``min``, ``n`` (samples with a
    value; 0 and nulls when a GPU does not support a metric) and ``delta`` for counters (energy).
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from trtspec.profiling.sampler import METRICS, Sample

TIMELINE_FORMAT = "trtspec.profile.timeline/1"
SUMMARY_FORMAT = "trtspec.profile.summary/1"
BASE_COLUMNS = ["t", "t_rel", "t_perf", "kind", "source", "device", "pid", "name"]

# plot panels, in order: group -> title
PANELS: list[tuple[str, str]] = [
    ("utilization", "GPU utilization (%)"),
    ("memory", "GPU memory (MiB)"),
    ("power", "Power (W)"),
    ("clocks", "Clocks (MHz)"),
    ("temperature", "Temperature (°C)"),
    ("cpu", "CPU (%; 100 = one core, system: all cores)"),
    ("rss", "Resident memory (MiB)"),
    ("system_memory", "System memory (MiB)"),
]
# not drawn: totals would squash the per-process lines (they go in the panel title), counters, counts
_NOT_PLOTTED = {"gpu_memory_free", "energy_consumption", "num_threads", "num_processes", "total_gpu_memory",
                "system_memory_total"}
_TOTALS = {"memory": "total_gpu_memory", "system_memory": "system_memory_total"}
_DASHED = {"total_gpu_memory", "gpu_power_limit", "system_memory_total", "memory_copy_utilization", "gpu_clock_memory"}
_MAX_LINES_PER_PANEL = 8
_SHORT = {  # legend: "<source> <short>"
    "gpu_utilization": "gpu",
    "memory_copy_utilization": "memory",
    "gpu_memory_used": "used",
    "total_gpu_memory": "total",
    "gpu_power_usage": "draw",
    "gpu_power_limit": "limit",
    "gpu_clock_sm": "SM",
    "gpu_clock_memory": "memory",
    "gpu_temperature": "",
    "cpu_percent": "",
    "rss": "",
    "system_cpu_utilization": "",
    "system_memory_used": "used",
    "system_memory_total": "total",
}


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def _data(samples: Iterable[Sample]) -> list[Sample]:
    return [s for s in samples if s.kind != "event"]


def _events(samples: Iterable[Sample]) -> list[Sample]:
    return [s for s in samples if s.kind == "event"]


def _t0(samples: Sequence[Sample]) -> tuple[float, float]:
    """(wall, perf) of the earliest sample or event."""
    if not samples:
        return 0.0, 0.0
    first = min(samples, key=lambda s: s.t_perf)
    return first.t, first.t_perf


def sampler_kind(samples: Iterable[Sample]) -> str:
    kinds = {s.kind for s in samples}
    if kinds & {"gpu", "gpu_process"}:
        return "nvml"
    if kinds & {"process", "process_total", "system"}:
        return "process"
    return "unknown"


def _metric_columns(samples: Iterable[Sample]) -> list[str]:
    present: dict[str, None] = {}
    for s in samples:
        for k in s.metrics:
            present[k] = None
    known = [m for m in METRICS if m in present]
    return known + sorted(m for m in present if m not in METRICS)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


def _rows(samples: Sequence[Sample]) -> tuple[list[str], list[dict[str, Any]]]:
    _, t0p = _t0(samples)
    cols = BASE_COLUMNS + _metric_columns(samples)
    rows = []
    for s in sorted(samples, key=lambda s: (s.t_perf, s.kind == "event", s.source)):
        r = s.as_row()
        r["t_rel"] = s.t_perf - t0p
        rows.append({c: _clean(r.get(c)) for c in cols})
    return cols, rows


def _metric_info(names: Iterable[str]) -> dict[str, dict[str, str]]:
    out = {}
    for n in names:
        m = METRICS.get(n)
        out[n] = {"unit": m.unit, "description": m.description} if m else {"unit": "", "description": ""}
    return out


# ------------------------------------------------------------------------------------------------
# timeline + summary files
# ------------------------------------------------------------------------------------------------
def write_timeline(samples: Sequence[Sample], out_dir: str | Path) -> list[Path]:
    """Write ``timeline.csv``, ``timeline.json`` and ``summary.json`` into ``out_dir`` (created).

    Returns the three paths in that order.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    samples = list(samples)
    cols, rows = _rows(samples)
    t0, t0p = _t0(samples)

    csv_path = out / "timeline.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})

    json_path = out / "timeline.json"
    doc = {
        "format": TIMELINE_FORMAT,
        "sampler": sampler_kind(samples),
        "t0": t0,
        "t0_perf": t0p,
        "columns": cols,
        "metrics": _metric_info(c for c in cols if c not in BASE_COLUMNS),
        "samples": rows,
    }
    json_path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")

    summary_path = write_summary(summarize(samples), out)
    return [csv_path, json_path, summary_path]


def write_summary(summary: dict[str, Any], out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    p = out / "summary.json"
    p.write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    return p


def _stats(values: list[float], cumulative: bool) -> dict[str, float | int | None]:
    if not values:
        d: dict[str, float | int | None] = {"mean": None, "p50": None, "max": None, "min": None, "n": 0}
        if cumulative:
            d["delta"] = None
        return d
    a = np.asarray(values, dtype=float)
    d = {
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "max": float(a.max()),
        "min": float(a.min()),
        "n": int(a.size),
    }
    if cumulative:
        d["delta"] = float(a[-1] - a[0])
    return d


def summarize(samples: Sequence[Sample], window: tuple[float, float] | None = None) -> dict[str, Any]:
    """Per source (``gpu0``, ``gpu0/pid123``, ``pid123``, ``processes``, ``system``) and per metric:
    mean / p50 / max / min / n (and ``delta`` for counters). ``window=(start, end)`` in perf_counter time
    keeps only samples inside it (e.g. the measured part of a benchmark, warm-up excluded).
    """
    samples = list(samples)
    if window is not None:
        lo, hi = window
        samples = [s for s in samples if lo <= s.t_perf <= hi]
    t0, t0p = _t0(samples)
    data = sorted(_data(samples), key=lambda s: s.t_perf)
    ticks = sorted({s.t_perf for s in data})
    diffs = np.diff(ticks) if len(ticks) > 1 else np.array([])

    sources: dict[str, dict[str, Any]] = {}
    values: dict[str, dict[str, list[float]]] = {}
    for s in data:
        src = sources.get(s.source)
        if src is None:
            src = sources[s.source] = {
                "kind": s.kind,
                "name": s.name,
                "device": s.device,
                "pid": s.pid,
                "samples": 0,
                "first_t_rel": s.t_perf - t0p,
                "last_t_rel": s.t_perf - t0p,
            }
            values[s.source] = {}
        src["samples"] += 1
        src["last_t_rel"] = s.t_perf - t0p
        for k, v in s.metrics.items():
            vals = values[s.source].setdefault(k, [])
            if v is not None and not (isinstance(v, float) and math.isnan(v)):
                vals.append(float(v))
    for name, src in sources.items():
        ordered = [m for m in METRICS if m in values[name]] + sorted(m for m in values[name] if m not in METRICS)
        src["metrics"] = {
            m: {"unit": METRICS[m].unit if m in METRICS else "",
                **_stats(values[name][m], m in METRICS and METRICS[m].cumulative)}
            for m in ordered
        }
    order = {"gpu": 0, "gpu_process": 1, "process": 2, "process_total": 3, "system": 4}
    sources = dict(sorted(sources.items(), key=lambda kv: (order.get(kv[1]["kind"], 9), kv[1]["device"] or 0)))
    metric_names = _metric_columns(data)
    return {
        "format": SUMMARY_FORMAT,
        "sampler": sampler_kind(data),
        "t0": t0,
        "t0_perf": t0p,
        "duration_s": float(ticks[-1] - ticks[0]) if ticks else 0.0,
        "ticks": len(ticks),
        "interval_s": float(np.median(diffs)) if diffs.size else None,
        "sources": sources,
        "events": [
            {"label": e.name, "t": e.t, "t_perf": e.t_perf, "t_rel": e.t_perf - t0p} for e in _events(samples)
        ],
        "metrics": _metric_info(metric_names),
    }


# ------------------------------------------------------------------------------------------------
# plot
# ------------------------------------------------------------------------------------------------
def _source_label(s: Sample) -> str:
    if s.kind == "gpu":
        return f"GPU{s.device}"
    if s.kind == "gpu_process":
        return f"GPU{s.device} {s.name} ({s.pid})"
    if s.kind == "process":
        return f"{s.name} ({s.pid})"
    if s.kind == "process_total":
        return "process tree"
    return s.source


# plot series: group -> (source, metric) -> (x, y)
_Series = dict[str, dict[tuple[str, str], tuple[list[float], list[float]]]]


def plot_timeline(
    samples: Sequence[Sample],
    out_path: str | Path,
    requests: list[tuple[float, float, str]] | None = None,
) -> Path:
    """A PNG with one panel per metric group (GPU: utilization, memory, power, clocks, temperature;
    fallback: CPU, RSS, system memory). ``requests`` = ``[(start, end, label), ...]`` in perf_counter
    time: drawn as shaded spans (one colour per label) and as a requests-in-flight panel on top.
    ``mark()`` events are dashed vertical lines. The x axis is seconds since the first sample.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg, without touching pyplot's backend
    from matplotlib.figure import Figure

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    samples = list(samples)
    data = _data(samples)
    events = _events(samples)
    _, t0p = _t0(samples)  # the same origin as t_rel in the timeline files
    if requests and not samples:
        t0p = min(r[0] for r in requests)
    series, labels = _plot_series(data, t0p)
    panels = [(g, title) for g, title in PANELS if g in series and any(
        not all(math.isnan(y) for y in ys) for _, ys in series[g].values())]
    if "other" in series:
        panels.append(("other", "Other"))

    n_ticks = len({s.t_perf for s in data})
    kind = sampler_kind(data)
    n_rows = len(panels) + (1 if requests else 0)
    fig = Figure(figsize=(11, 2.3 * max(1, n_rows) + 0.8))
    FigureCanvasAgg(fig)
    if n_rows == 0:
        ax = fig.add_subplot(1, 1, 1)
        ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        fig.savefig(out, dpi=100)
        return out
    axes = fig.subplots(n_rows, 1, sharex=True, squeeze=False)[:, 0]
    title = f"trtspec profile: {kind} sampler, {n_ticks} samples"
    if requests:
        title += f", {len(requests)} requests"
    fig.suptitle(title)

    label_colors = _plot_in_flight(axes[0], requests, t0p) if requests else {}
    colors = {src: f"C{i % 10}" for i, src in enumerate(sorted(labels))}  # one colour per source, all panels
    n_proc_sources = sum(1 for s in {d.source: d.kind for d in data}.values() if s == "process")
    for ax, (group, ptitle) in zip(axes[1 if requests else 0 :], panels):
        lines = series[group]
        if n_proc_sources < 2:  # the tree total of one process is that process again
            lines = {k: v for k, v in lines.items() if k[0] != "processes"}
        _plot_panel(ax, group, ptitle, lines, labels, colors, data)
    shade = bool(requests) and len(requests) <= 300
    for ax in axes:
        if shade:
            for a, b, lab in requests or []:
                ax.axvspan(a - t0p, b - t0p, color=label_colors[lab], alpha=0.08, lw=0)
        for e in events:
            ax.axvline(e.t_perf - t0p, color="0.3", ls=":", lw=1)
    for e in events:
        axes[0].annotate(str(e.name), (e.t_perf - t0p, 1.0), xycoords=("data", "axes fraction"),
                         rotation=90, va="top", ha="right", fontsize=7, color="0.3")
    axes[-1].set_xlabel("seconds since the first sample")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    return out


def _plot_series(data: Sequence[Sample], t0p: float) -> tuple[_Series, dict[str, str]]:
    """Each plotted metric's points per source, by plot group (seconds since `t0p`), and each source's label."""
    series: _Series = {}
    labels: dict[str, str] = {}
    for s in sorted(data, key=lambda s: s.t_perf):
        labels.setdefault(s.source, _source_label(s))
        for k, v in s.metrics.items():
            if k in _NOT_PLOTTED:
                continue
            group = METRICS[k].group if k in METRICS else "other"
            xs, ys = series.setdefault(group, {}).setdefault((s.source, k), ([], []))
            xs.append(s.t_perf - t0p)
            ys.append(float("nan") if v is None else float(v))
    return series, labels


def _plot_in_flight(ax: Any, requests: list[tuple[float, float, str]], t0p: float) -> dict[str, Any]:
    """The requests in flight over time, one line per label; returns each label's colour."""
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
               "tab:olive", "tab:cyan", "tab:gray"]
    label_colors: dict[str, Any] = {}
    for _, _, lab in requests:
        label_colors.setdefault(lab, palette[len(label_colors) % len(palette)])
    counts = Counter(lab for _, _, lab in requests)
    for lab, color in label_colors.items():
        pts = sorted([(a - t0p, 1) for a, _, l in requests if l == lab]
                     + [(b - t0p, -1) for _, b, l in requests if l == lab])
        xs, ys, cur = [], [], 0
        for x, d in pts:
            cur += d
            xs.append(x)
            ys.append(cur)
        ax.step(xs, ys, where="post", color=color, label=f"{lab} (n={counts[lab]})")
    ax.set_ylabel("in flight")
    ax.set_title("Requests in flight", fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="upper right", ncol=min(4, len(label_colors)))
    return label_colors


def _plot_panel(ax: Any, group: str, ptitle: str, lines: dict[tuple[str, str], tuple[list[float], list[float]]],
                labels: dict[str, str], colors: dict[str, str], data: Sequence[Sample]) -> None:
    """One metric group's panel: its biggest series (many Python-backend stubs would crowd it), and its totals."""

    def peak(item: tuple[tuple[str, str], tuple[list[float], list[float]]]) -> float:
        ys = [y for y in item[1][1] if not math.isnan(y)]
        return max(ys) if ys else -1.0

    items = sorted(lines.items(), key=peak, reverse=True)
    shown = items[:_MAX_LINES_PER_PANEL]
    for (source, metric), (xs, ys) in sorted(shown, key=lambda it: it[0]):
        ls = "--" if metric in _DASHED else "-"
        short = _SHORT.get(metric, metric)
        ax.plot(xs, ys, ls, color=colors[source], lw=1.2, marker="." if len(xs) < 30 else None,
                label=f"{labels[source]} {short}".strip())
    extra = len(items) - len(shown)
    if group in _TOTALS:
        tot = {labels[d.source]: d.metrics.get(_TOTALS[group]) for d in data if d.metrics.get(_TOTALS[group])}
        if tot:
            ptitle += "; total " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(tot.items()))
    ax.set_title(ptitle + (f"  (+{extra} smaller series not shown)" if extra > 0 else ""), fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    if group in ("utilization", "cpu"):
        ax.set_ylim(bottom=0)
