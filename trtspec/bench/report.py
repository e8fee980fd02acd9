"""Figures from a bench run: results.json (schema in docs/bench-results.md), CSV, PNG plots, the terminal table.

Speedup of a cell = its total output tokens/s over the baseline's at the same concurrency (the same requests,
so it is also the ratio of the wall times). The best k at a concurrency is the speculative cell (k > 0) with
the highest speedup; speculation "pays" there when that speedup is > 1. The crossover is
``trtspec.bench.stats.crossover`` of those best speedups.

Best fixed k in hindsight at a concurrency: among the baseline (k=0) and the speculative cells run with
draft_length_policy fixed, the one with the highest output tokens/s (a tie goes to the smaller k). Every
speculative-endpoint cell at that concurrency gets ``vs_best_fixed``: its output tokens/s over that cell's.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from trtspec import __version__
from trtspec.bench import stats as st
from trtspec.bench.plots import plot_all
from trtspec.bench.runner import BASELINE, BenchRun, CellRun, RequestRecord, cell_policy
from trtspec.contract import NUM_DRAFT_TOKENS
from trtspec.spec.metrics import SpecStats

SCHEMA_VERSION = 1


# ------------------------------------------------------------------------------------------------ records


def request_entry(r: RequestRecord, t0: float, max_tokens: int) -> dict[str, Any]:
    ok = r.error is None
    ttft = r.ttft_s
    per_token, per_chunk = st.inter_token_latencies(r.chunk_times, r.chunk_tokens)
    n = r.output_tokens
    e2e = r.e2e_s
    return {
        "cell": r.cell.label,
        "concurrency": r.cell.concurrency,
        NUM_DRAFT_TOKENS: r.cell.k,
        "endpoint": r.cell.endpoint,
        "index": r.index,
        "warmup": r.warmup,
        "prompt_id": r.prompt.id,
        "prompt_kind": r.prompt.kind,
        "start_s": r.start - t0,
        "ttft_s": ttft,
        "e2e_s": e2e if ok else None,
        "output_tokens": n,
        "ended_early": ok and n < max_tokens,
        "num_responses": len(r.chunk_times),
        "tokens_per_s": (n / e2e) if ok and e2e > 0 else None,
        "tpot_s": ((e2e - ttft) / (n - 1)) if ok and ttft is not None and n > 1 else None,
        "itl_token_mean_s": (sum(per_token) / len(per_token)) if per_token else None,
        "client_overhead_s": r.client_overhead_s,
        "client_overhead_fraction": (r.client_overhead_s / e2e) if ok and e2e > 0 else None,
        "response_times_s": [t - r.start for t in r.chunk_times],
        "response_tokens": list(r.chunk_tokens),
        "stats": r.stats.to_wire(),
        "error": r.error,
    }


def _acceptance(ok: list[RequestRecord]) -> dict[str, Any]:
    total = SpecStats.total(r.stats for r in ok)
    per_pos = [{"position": i, "accepted": a, "proposed": p, "rate": (a / p) if p else None}
               for i, (a, p) in enumerate(zip(total.accepted_per_position, total.proposed_per_position)) if p or a]
    return {
        "rate": total.acceptance_rate if total.total_draft_tokens else None,
        "rate_per_request": st.describe(r.stats.acceptance_rate for r in ok if r.stats.total_draft_tokens),
        "mean_acceptance_length": total.mean_acceptance_length if total.num_drafts else None,
        "tokens_per_target_call": total.tokens_per_target_call,
        NUM_DRAFT_TOKENS: total.total_draft_tokens,
        "num_accepted_tokens": total.total_accepted_draft_tokens,
        "num_iterations": total.num_iterations,
        "num_drafts": total.num_drafts,
        "draft_fallbacks": total.draft_fallbacks,
        "load_paused_iterations": total.load_paused_iterations,
        "per_position": per_pos,
        "by_source": total.by_source(),
    }


def draft_len_counts(records: list[RequestRecord]) -> list[int] | None:
    """Iterations per draft length k chosen (entry k), summed over the requests; None when no response carried
    the statistic (a server older than the per-response `draft_len_counts`)."""
    vectors = [v for v in (getattr(r.stats, "draft_len_counts", None) for r in records) if v]
    if not vectors:
        return None
    out = [0] * max(len(v) for v in vectors)
    for v in vectors:
        for k, n in enumerate(v):
            out[k] += int(n)
    return out


def k_chosen(counts: list[int] | None) -> dict[str, Any] | None:
    """Mean k and the share of iterations at k=0, from the summed draft_len_counts of a cell."""
    total = sum(counts or [])
    if not total:
        return None
    return {"iterations": total, "mean": sum(k * n for k, n in enumerate(counts)) / total,
            "k0_fraction": counts[0] / total, "counts": counts}


def cell_entry(run: CellRun, max_tokens: int, policy: str | None = None) -> dict[str, Any]:
    recs = run.records
    ok = [r for r in recs if r.error is None]
    ttft, e2e, tpot, per_user, overhead, overhead_frac, itl_tok, itl_chunk = ([] for _ in range(8))
    for r in ok:
        if r.ttft_s is not None:
            ttft.append(r.ttft_s)
        e2e.append(r.e2e_s)
        if r.e2e_s > 0:
            per_user.append(r.output_tokens / r.e2e_s)
            overhead_frac.append(r.client_overhead_s / r.e2e_s)
        if r.ttft_s is not None and r.output_tokens > 1:
            tpot.append((r.e2e_s - r.ttft_s) / (r.output_tokens - 1))
        overhead.append(r.client_overhead_s)
        pt, pc = st.inter_token_latencies(r.chunk_times, r.chunk_tokens)
        itl_tok += pt
        itl_chunk += pc
    tokens = sum(r.output_tokens for r in ok)
    wall = run.wall_s
    c = run.cell
    return {
        "label": c.label,
        "concurrency": c.concurrency,
        NUM_DRAFT_TOKENS: c.k,
        "endpoint": c.endpoint,
        "speculative": c.speculative,
        "draft_length_policy": policy,
        "num_requests": len(recs),
        "num_ok": len(ok),
        "num_errors": len(recs) - len(ok),
        "num_warmup": len(run.warmups),
        "errors": sorted({r.error for r in recs if r.error})[:5],
        "wall_s": wall,
        "rounds": len(run.rounds),
        "output_tokens": tokens,
        "output_tokens_per_s": (tokens / wall) if wall > 0 else None,
        "requests_per_s": (len(ok) / wall) if wall > 0 else None,
        "ended_early": sum(1 for r in ok if r.output_tokens < max_tokens),
        "output_tokens_per_request": st.describe(r.output_tokens for r in ok),
        "ttft_s": st.describe(ttft),
        "itl_token_s": st.describe(itl_tok),
        "itl_chunk_s": st.describe(itl_chunk),
        "tpot_s": st.describe(tpot),
        "e2e_s": st.describe(e2e),
        "tokens_per_s_per_user": st.describe(per_user),
        "tokens_per_response": st.describe(n for r in ok for n in r.chunk_tokens if n > 0),
        "client_overhead_s": st.describe(overhead),
        "client_overhead_fraction": st.describe(overhead_frac),
        "acceptance": _acceptance(ok) if c.endpoint != BASELINE else None,
        "k_chosen": k_chosen(draft_len_counts(ok)) if c.endpoint != BASELINE else None,
        "speedup": None,  # filled by build_results (None for the baseline itself)
        "vs_best_fixed": None,  # filled by build_results where fixed k were run at this concurrency
    }


def _add_speedups(cells: list[dict[str, Any]]) -> None:
    base = {c["concurrency"]: c for c in cells if c["endpoint"] == BASELINE}
    for c in cells:
        b = base.get(c["concurrency"])
        if c["endpoint"] == BASELINE or b is None:
            continue
        c["speedup"] = {
            "output_tokens_per_s": st.speedup(c["output_tokens_per_s"], b["output_tokens_per_s"]),
            "e2e_p50": st.speedup(b["e2e_s"]["p50"], c["e2e_s"]["p50"]),
            "ttft_p50": st.speedup(b["ttft_s"]["p50"], c["ttft_s"]["p50"]),
            "tokens_per_s_per_user_mean": st.speedup(c["tokens_per_s_per_user"]["mean"],
                                                     b["tokens_per_s_per_user"]["mean"]),
            "baseline_num_requests": b["num_ok"],
        }


def is_fixed_candidate(c: dict[str, Any]) -> bool:
    """The baseline (k=0) and the speculative cells whose requests fixed k."""
    return c["endpoint"] == BASELINE or (c["speculative"] and c.get("draft_length_policy") == "fixed")


def best_fixed_k(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency where at least one fixed k > 0 ran: the best fixed k in hindsight (module docstring)."""
    out = []
    for conc in sorted({c["concurrency"] for c in cells}):
        cands = [c for c in cells if c["concurrency"] == conc and is_fixed_candidate(c)
                 and c["output_tokens_per_s"] is not None]
        if not any(c["speculative"] for c in cands):
            continue
        best = max(cands, key=lambda c: (c["output_tokens_per_s"], -c[NUM_DRAFT_TOKENS]))
        base = next((c for c in cands if c["endpoint"] == BASELINE), None)
        out.append({
            "concurrency": conc,
            NUM_DRAFT_TOKENS: best[NUM_DRAFT_TOKENS],
            "label": best["label"],
            "output_tokens_per_s": best["output_tokens_per_s"],
            "speedup": st.speedup(best["output_tokens_per_s"], base["output_tokens_per_s"]) if base else None,
            "tried": sorted(c[NUM_DRAFT_TOKENS] for c in cands),
        })
    return out


def _add_vs_best_fixed(cells: list[dict[str, Any]], best_fixed: list[dict[str, Any]]) -> None:
    by_conc = {b["concurrency"]: b for b in best_fixed}
    for c in cells:
        b = by_conc.get(c["concurrency"])
        if b is None or c["endpoint"] == BASELINE:
            continue
        c["vs_best_fixed"] = {"output_tokens_per_s": st.speedup(c["output_tokens_per_s"], b["output_tokens_per_s"]),
                              f"best_{NUM_DRAFT_TOKENS}": b[NUM_DRAFT_TOKENS]}


def _best(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for conc in sorted({c["concurrency"] for c in cells}):
        spec = [c for c in cells if c["concurrency"] == conc and c["speculative"] and c["speedup"]
                and c["speedup"]["output_tokens_per_s"] is not None]
        if not spec:
            out.append({"concurrency": conc, NUM_DRAFT_TOKENS: None, "speedup": None, "pays": None,
                        "num_requests": 0})
            continue
        best = max(spec, key=lambda c: c["speedup"]["output_tokens_per_s"])
        s = best["speedup"]["output_tokens_per_s"]
        out.append({"concurrency": conc, NUM_DRAFT_TOKENS: best[NUM_DRAFT_TOKENS], "speedup": s,
                    "pays": s > 1.0, "num_requests": best["num_ok"],
                    "draft_length_policy": best.get("draft_length_policy")})
    return out


def build_results(run: BenchRun) -> dict[str, Any]:
    s = run.settings
    cells = [cell_entry(c, s.max_tokens, cell_policy(s, c.cell)) for c in run.cells]
    _add_speedups(cells)
    best = _best(cells)
    best_fixed = best_fixed_k(cells)
    _add_vs_best_fixed(cells, best_fixed)
    cross = st.crossover({b["concurrency"]: b["speedup"] for b in best})
    measured = [r for c in run.cells for r in c.records]
    fracs = [r.client_overhead_s / r.e2e_s for r in measured if r.error is None and r.e2e_s > 0]
    spec_ok = [r for c in run.cells if c.cell.speculative for r in c.records if r.error is None]
    kinds: dict[str, int] = {}
    for p in run.prompts:
        kinds[p.kind] = kinds.get(p.kind, 0) + 1
    warnings = [f"concurrency {c}: only {s.requests_per_cell} requests per cell, so at most "
                f"{s.requests_per_cell} were in flight at once" for c in sorted(set(s.concurrency))
                if s.requests_per_cell < c]
    out = {
        "schema_version": SCHEMA_VERSION,
        "tool": "trtspec bench",
        "trtspec_version": __version__,
        "started_at": run.started_at,
        "duration_s": run.duration_s,
        "settings": {
            "url": s.url,
            "protocol": s.protocol,
            "metrics_url": s.resolved_metrics_url,
            "max_tokens": s.max_tokens,
            "concurrency": sorted(set(s.concurrency)),
            "draft_tokens": sorted(set(s.draft_tokens) | {0}),
            "k0_on_ensemble": s.k0_on_ensemble,
            "stream": s.stream,
            "fixed_k": sorted(set(s.fixed_k)),
            "draft_source": s.draft_source,
            "draft_length_policy": s.draft_length_policy,
            "deployment_draft_length_policy": s.deployment_policy,
            "requests_per_cell": s.requests_per_cell,
            "warmup_per_cell": s.warmup,
            "rounds": s.rounds,
            "profile": s.profile,
        },
        "prompts": {"count": len(run.prompts), "kinds": kinds},
        "cells": cells,
        "summary": {
            "num_cells": len(cells),
            "num_requests": len(measured),
            "num_warmup": sum(len(c.warmups) for c in run.cells),
            "num_errors": sum(c["num_errors"] for c in cells),
            "best": best,
            "best_fixed": best_fixed,
            "crossover": cross,
            "acceptance": _acceptance(spec_ok) | {"num_requests": len(spec_ok)},
            "client_overhead_fraction": st.describe(fracs),
        },
        "metrics_check": run.metrics_check,
        "profile": None,
        "requests": [request_entry(r, run.t0, s.max_tokens) for r in run.all_records],
        "files": {},
    }
    if warnings:
        out["warnings"] = warnings
    return out


# ------------------------------------------------------------------------------------------------ files


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python, tuples -> lists, other objects -> str."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item"):
        return _clean(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> one level, keys joined by '.'; lists are written as JSON text."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, list):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    flat = [flatten(r) for r in rows]
    columns: list[str] = []
    for r in flat:
        columns += [k for k in r if k not in columns]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(flat)


def write_results(run: BenchRun, out_dir: str | Path, results: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write results.json, results.csv (one row per cell), requests.csv (one row per request) and the plots
    into ``out_dir``; return the results (with ``files`` and ``profile`` filled in)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = results if results is not None else build_results(run)
    files: dict[str, str] = {"json": "results.json", "csv": "results.csv", "requests_csv": "requests.csv"}
    _write_csv(out / "results.csv", [{k: v for k, v in c.items() if k != "errors"} for c in results["cells"]])
    _write_csv(out / "requests.csv", [
        {k: v for k, v in r.items() if k not in ("response_times_s", "response_tokens")} for r in results["requests"]
    ])
    try:
        files.update(plot_all(results, out))
    except Exception as e:  # noqa: BLE001 - a plotting problem must not lose the measurements
        results.setdefault("warnings", []).append(f"plots not written: {type(e).__name__}: {e}")
    if run.sampler is not None:
        results["profile"], prof_files = _write_profile(run, out)
        files.update(prof_files)
    results["files"] = files
    (out / "results.json").write_text(json.dumps(_clean(results), indent=2, allow_nan=False) + "\n")
    return results


def _write_profile(run: BenchRun, out: Path) -> tuple[dict[str, Any], dict[str, str]]:
    sampler = run.sampler
    samples = list(getattr(sampler, "samples", []) or [])
    info: dict[str, Any] = {"kind": getattr(sampler, "kind", None), "reason": getattr(sampler, "reason", None),
                            "num_samples": len(samples), "summary": None, "errors": []}
    files: dict[str, str] = {}
    try:
        from trtspec.profiling import plot_timeline, summarize, write_timeline
    except ImportError as e:
        info["errors"].append(f"trtspec.profiling: {e}")
        return info, files
    try:
        written = write_timeline(samples, out / "profile")
        files["timeline_data"] = "profile/"
        if written:
            info["timeline_files"] = [str(Path(p).relative_to(out)) if Path(p).is_absolute() and
                                      Path(p).is_relative_to(out) else str(p)
                                      for p in (written if isinstance(written, (list, tuple)) else [written])]
    except Exception as e:  # noqa: BLE001
        info["errors"].append(f"write_timeline: {type(e).__name__}: {e}")
    try:
        info["summary"] = summarize(samples)
    except Exception as e:  # noqa: BLE001
        info["errors"].append(f"summarize: {type(e).__name__}: {e}")
    try:
        reqs = [(r.start, r.end, r.cell.label) for r in run.all_records if r.error is None and not r.warmup]
        plot_timeline(samples, out / "timeline.png", requests=reqs)
        files["timeline_plot"] = "timeline.png"
    except Exception as e:  # noqa: BLE001
        info["errors"].append(f"plot_timeline: {type(e).__name__}: {e}")
    return info, files


# ------------------------------------------------------------------------------------------------ terminal


def _dur(v: float | None) -> str:
    """Seconds -> '432ms' / '1.76s' / '23.8s' (short enough for the table)."""
    if v is None:
        return "-"
    if v < 1:
        return f"{v * 1000:.0f}ms" if v >= 0.01 else f"{v * 1000:.1f}ms"
    return f"{v:.2f}s" if v < 10 else f"{v:.1f}s"


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def table(results: dict[str, Any]) -> Any:
    """The per-cell table (fits 80 columns; every figure is also in results.json)."""
    from rich import box
    from rich.table import Table

    cfg = results["settings"]
    t = Table(title=f"trtspec bench ({cfg['protocol']}, max_tokens {cfg['max_tokens']}"
                    f"{'' if cfg.get('stream', True) else ', not streamed'}): "
                    "n = measured requests per cell, warm-ups excluded",
              title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    any_errors = any(c["num_errors"] for c in results["cells"])
    best_fixed = {b["concurrency"]: b for b in results["summary"].get("best_fixed") or []}
    columns = ["c", "k", "n", "tok/s", "speedup"] + (["vs best\nfixed k"] if best_fixed else []) + [
        "TTFT\np50", "ITL\np50", "E2E\np50", "E2E\np90", "accept", "tok/\ncall"] + (["err"] if any_errors else [])
    for name in columns:
        t.add_column(name, justify="right", no_wrap=True)
    best = {(b["concurrency"], b[NUM_DRAFT_TOKENS]) for b in results["summary"]["best"] if b["pays"]}
    previous = None
    for c in results["cells"]:
        if previous is not None and c["concurrency"] != previous:
            t.add_section()
        previous = c["concurrency"]
        if c["endpoint"] == BASELINE:
            k, sp = "base", "1.00x"
        else:
            k = str(c[NUM_DRAFT_TOKENS]) + ("*" if not c["speculative"] else "")
            v = c["speedup"]["output_tokens_per_s"] if c["speedup"] else None
            sp = "-" if v is None else f"{v:.2f}x"
            if v is not None:
                style = "bold green" if (c["concurrency"], c[NUM_DRAFT_TOKENS]) in best else (
                    "green" if v > 1 else "red")
                sp = f"[{style}]{sp}[/]"
        acc = c["acceptance"] or {}
        extra = []
        if best_fixed:
            policy = c.get("draft_length_policy")
            if c["endpoint"] != BASELINE and policy:
                k = f"{k} {policy[:5]}"
            extra = [_vs_best_fixed(c, best_fixed.get(c["concurrency"]))]
        row = [
            str(c["concurrency"]), k, str(c["num_ok"]), _num(c["output_tokens_per_s"]), sp, *extra,
            _dur(c["ttft_s"]["p50"]), _dur(c["itl_token_s"]["p50"]), _dur(c["e2e_s"]["p50"]), _dur(c["e2e_s"]["p90"]),
            _num(acc.get("rate"), "{:.0%}") if c["speculative"] else "-",
            _num(acc.get("tokens_per_target_call"), "{:.2f}") if c["speculative"] else "-",
        ]
        if any_errors:
            row.append(f"[red]{c['num_errors']}[/]" if c["num_errors"] else "0")
        t.add_row(*row)
    captions = []
    if any(c["endpoint"] != BASELINE and not c["speculative"] for c in results["cells"]):
        captions.append("k=0*: the speculative endpoint with drafting off (the loop's own overhead)")
    if best_fixed:
        captions.append("vs best fixed k: tok/s over the best of the baseline and the fixed-k cells at that "
                        "concurrency (marked best)")
    if captions:
        t.caption = "\n".join(captions)
        t.caption_justify = "left"
    return t


def _vs_best_fixed(cell: dict[str, Any], best: dict[str, Any] | None) -> str:
    if best is None:
        return "-"
    if cell["label"] == best["label"]:
        return "[bold]best[/]"
    v = (cell.get("vs_best_fixed") or {}).get("output_tokens_per_s")
    if v is None:
        return "-"
    return f"[{'green' if v >= 0.95 else 'red'}]{v:.2f}x[/]"


def _policy(best: dict[str, Any]) -> str:
    return f" {best['draft_length_policy']}" if best.get("draft_length_policy") else ""


def best_fixed_line(results: dict[str, Any]) -> str | None:
    """'Best fixed k (hindsight): c=1: k=0 (baseline) ...; adaptive vs best fixed: ...' or None."""
    best_fixed = results["summary"].get("best_fixed") or []
    if not best_fixed:
        return None
    parts = []
    for b in best_fixed:
        k = "k=0 (baseline)" if b[NUM_DRAFT_TOKENS] == 0 else f"k={b[NUM_DRAFT_TOKENS]}"
        parts.append(f"c={b['concurrency']}: {k}, {_num(b['speedup'], '{:.2f}x')}")
    tried = sorted({k for b in best_fixed for k in b["tried"]})
    line = (f"[bold]Best fixed k[/] (in hindsight, of k {', '.join(map(str, tried))})  " + "   ".join(parts))
    others = [c for c in results["cells"] if c.get("vs_best_fixed") and c["speculative"]
              and c.get("draft_length_policy") != "fixed"]
    if others:
        line += "\n[bold]vs best fixed k[/]  " + "   ".join(
            f"{c['label']}: {_num(c['vs_best_fixed']['output_tokens_per_s'], '{:.2f}x')}" for c in others)
    return line


def summary_lines(results: dict[str, Any]) -> list[str]:
    """Rich-markup lines printed under the table."""
    s = results["summary"]
    lines = []
    parts = []
    for b in s["best"]:
        if b["speedup"] is None:
            parts.append(f"c={b['concurrency']}: -")
        elif b["pays"]:
            parts.append(f"c={b['concurrency']}: k={b[NUM_DRAFT_TOKENS]}{_policy(b)} ({b['speedup']:.2f}x)")
        else:
            parts.append(f"c={b['concurrency']}: baseline (best k={b[NUM_DRAFT_TOKENS]}{_policy(b)} is "
                         f"{b['speedup']:.2f}x)")
    lines.append(f"[bold]Best {NUM_DRAFT_TOKENS}[/]  " + "   ".join(parts))
    lines.append(f"[bold]Crossover[/]  {s['crossover']['summary']}")
    fixed = best_fixed_line(results)
    if fixed:
        lines.append(fixed)
    acc = s["acceptance"]
    if acc["num_requests"]:
        lines.append(f"[bold]Acceptance[/]  {_num(acc['rate'], '{:.1%}')} of {acc[NUM_DRAFT_TOKENS]} draft tokens, "
                     f"{_num(acc['tokens_per_target_call'], '{:.2f}')} tokens per target call "
                     f"(n={acc['num_requests']} speculative requests)")
    oh = s["client_overhead_fraction"]
    if oh["n"]:
        lines.append(f"[bold]Client overhead[/]  mean {oh['mean']:.3%} of request latency, max {oh['max']:.3%} "
                     f"(n={oh['n']} requests)")
    lines.append(metrics_line(results["metrics_check"]))
    if (tree := tree_line(results["metrics_check"])) is not None:
        lines.append(tree)
    if s["num_errors"]:
        errs = sorted({e for c in results["cells"] for e in c["errors"]})
        lines.append(f"[red]{s['num_errors']} request(s) failed[/]: " + "; ".join(errs[:3]))
    if results.get("profile"):
        p = results["profile"]
        lines.append(f"[bold]Profile[/]  {p['num_samples']} samples ({p['kind']})"
                     + (f": {p['reason']}" if p.get("reason") else "")
                     + (f"; [yellow]{'; '.join(p['errors'])}[/]" if p.get("errors") else ""))
    return lines


def tree_line(check: dict[str, Any]) -> str | None:
    """A Medusa engine's steps over the run by the tree's nodes it verified (it sizes them itself: tree_size.py)."""
    steps = check.get("medusa_tree_steps") or []
    total = sum(steps)
    if not total:
        return None
    shares = ", ".join(f"{m}: {n / total:.0%}" for m, n in enumerate(steps) if n)
    return f"[bold]Medusa tree[/]  the engine's request steps by nodes verified (0: the root alone): {shares} of {total}"


def metrics_line(check: dict[str, Any]) -> str:
    status = check.get("status")
    if status == "ok":
        models = ", ".join(check["models"])
        n = sum(m["spec_decode_num_requests"]["observed"] for m in check["models"].values())
        return (f"[bold]Prometheus cross-check[/]  [green]OK[/]: the spec_decode_* counter deltas of {models} "
                f"equal the bench's own counts ({n} requests incl. warm-ups)")
    if status == "mismatch":
        bad = [f"{m}.{name} expected {row['expected']} observed {row['observed']}"
               for m, rows in check["models"].items() for name, row in rows.items() if not row["ok"]]
        return f"[bold]Prometheus cross-check[/]  [red]MISMATCH[/]: {'; '.join(bad[:4])}. {check.get('reason') or ''}"
    return f"[bold]Prometheus cross-check[/]  [yellow]{status}[/]: {check.get('reason')}"

