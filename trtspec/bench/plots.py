"""The PNG plots of a bench run, drawn from its results.json: speedup and throughput over concurrency, acceptance
per draft position, latency distributions per cell, and the draft length the deployment chose. One line per
series (``series_label``: what chose the cell's draft length)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.bench import stats as st
from trtspec.bench.runner import BASELINE
from trtspec.contract import NUM_DRAFT_TOKENS


def series_label(cell: dict[str, Any], deployment_policy: str | None = None) -> str:
    """A cell's line in the plots, named by what chose its draft length: under adaptive the controller picks k each
    iteration up to the cell's k, so "k=3" would read as a fixed k = 3. A cell that sent no policy runs under the
    deployment's (`deployment_policy`, where the bench could read it)."""
    k, policy = cell[NUM_DRAFT_TOKENS], cell.get("draft_length_policy") or deployment_policy
    if cell["endpoint"] == BASELINE:
        return "baseline (target only)"
    if k == 0:
        return "speculative endpoint, drafting off"
    if policy == "adaptive":
        return f"controller, k <= {k}"
    if policy == "fixed":
        return f"fixed k = {k}"
    return f"k = {k}, the deployment's policy"


def _series(cells: list[dict[str, Any]], deployment_policy: str | None) -> dict[str, list[dict[str, Any]]]:
    """Cells by plot line (series_label), baseline first, then by k, fixed before the controller; each line's
    cells by concurrency."""
    def order(c: dict[str, Any]) -> tuple:
        return (c["endpoint"] != BASELINE, c[NUM_DRAFT_TOKENS], c.get("draft_length_policy") or "")

    out: dict[str, list[dict[str, Any]]] = {}
    for c in sorted(cells, key=lambda c: (order(c), c["concurrency"])):
        out.setdefault(series_label(c, deployment_policy), []).append(c)
    return out


def _concurrency_axis(ax: Any, concs: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(concs, [str(c) for c in concs])
    ax.set_xlabel("concurrency (requests in flight)")


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_all(results: dict[str, Any], out: Path) -> dict[str, str]:
    """Writes each plot the results hold data for into `out`: {files key: file name}."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    files: dict[str, str] = {}
    cells = results["cells"]
    policy = results["settings"].get("deployment_draft_length_policy")  # older results.json: absent
    if plot_speedup(plt, results, policy, out):
        files["plot_speedup"] = "speedup.png"
    if plot_throughput(plt, results, policy, out):
        files["plot_throughput"] = "throughput.png"
    if plot_acceptance(plt, cells, policy, out):
        files["plot_acceptance"] = "acceptance_per_position.png"
    if plot_latency(plt, results, out):
        files["plot_latency"] = "latency.png"
    if plot_k_chosen(plt, results, policy, out):
        files["plot_k_chosen"] = "k_chosen.png"
    return files


def plot_speedup(plt: Any, results: dict[str, Any], policy: str | None, out: Path) -> bool:
    """Speedup over concurrency, one line per k and policy; False where no cell has a speedup."""
    cells = results["cells"]
    spec = [c for c in cells if c["speedup"] is not None]
    if not spec:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, mine in _series(spec, policy).items():
        pts = [(c["concurrency"], c["speedup"]["output_tokens_per_s"], c["num_ok"],
                c["speedup"]["baseline_num_requests"]) for c in mine
               if c["speedup"]["output_tokens_per_s"] is not None]
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        for x, y, n, nb in pts:
            ax.annotate(f"n={n}/{nb}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="baseline (target only)")
    _concurrency_axis(ax, sorted({c["concurrency"] for c in cells}))
    ax.set_ylabel("speedup (output tokens/s vs baseline)")
    ax.set_title(f"Speculative vs target-only, {results['settings']['requests_per_cell']} requests per cell\n"
                 "(n=speculative/baseline requests behind each point; warm-ups excluded)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(plt, fig, out / "speedup.png")
    return True


def plot_throughput(plt: Any, results: dict[str, Any], policy: str | None, out: Path) -> bool:
    """Throughput over concurrency, total and per user, baseline and each k and policy, with the crossover
    marked; False with a single concurrency."""
    cells = results["cells"]
    concs = sorted({c["concurrency"] for c in cells})
    if len(concs) <= 1:
        return False
    fig, (total_ax, user_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    for label, mine in _series(cells, policy).items():
        baseline = mine[0]["endpoint"] == BASELINE
        style = {"color": "black", "linestyle": "--"} if baseline else {}
        for ax, value in ((total_ax, lambda c: c["output_tokens_per_s"]),
                          (user_ax, lambda c: c["tokens_per_s_per_user"]["mean"])):
            pts = [(c["concurrency"], value(c)) for c in mine if value(c) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, **style)
    cross = results["summary"]["crossover"]
    for ax, title in ((total_ax, "total output tokens/s"), (user_ax, "output tokens/s per user (mean)")):
        if cross.get("estimate") is not None:
            ax.axvline(cross["estimate"], color="red", linewidth=1, alpha=0.6,
                       label=f"crossover ~{cross['estimate']:.1f}")
        _concurrency_axis(ax, concs)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Throughput by concurrency, {results['settings']['requests_per_cell']} requests per cell: "
                 f"{cross['summary']}", fontsize=10)
    _save(plt, fig, out / "throughput.png")
    return True


def _acceptance_by_series(cells: list[dict[str, Any]], policy: str | None) -> dict[str, dict[str, Any]]:
    """Accepted and proposed draft tokens per position, per series, pooled over concurrency levels."""
    by_series: dict[str, dict[str, Any]] = {}
    for label, mine in _series([c for c in cells if c["speculative"] and c["acceptance"]], policy).items():
        agg = by_series[label] = {"acc": {}, "prop": {}, "n": sum(c["num_ok"] for c in mine)}
        for p in (p for c in mine for p in c["acceptance"]["per_position"]):
            agg["acc"][p["position"]] = agg["acc"].get(p["position"], 0) + p["accepted"]
            agg["prop"][p["position"]] = agg["prop"].get(p["position"], 0) + p["proposed"]
    return by_series


def plot_acceptance(plt: Any, cells: list[dict[str, Any]], policy: str | None, out: Path) -> bool:
    """Acceptance per position, one line per k and policy (pooled over concurrency levels); False without any."""
    by_series = _acceptance_by_series(cells, policy)
    if not by_series:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, agg in by_series.items():
        pos = sorted(p for p in agg["prop"] if agg["prop"][p])
        if not pos:
            continue
        ax.plot([p + 1 for p in pos], [agg["acc"][p] / agg["prop"][p] for p in pos], marker="o",
                label=f"{label}: n={agg['n']} requests, {sum(agg['prop'].values())} draft tokens")
    ax.set_ylim(0, 1.05)
    width = max((p for agg in by_series.values() for p in agg["prop"]), default=0) + 1
    ax.set_xticks(range(1, width + 1))
    ax.set_xlabel("position in the draft (1 = first draft token; position 0 in results.json)")
    ax.set_ylabel("acceptance rate (accepted / proposed)")
    ax.set_title("Acceptance per draft position (all concurrency levels pooled; warm-ups excluded)", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(plt, fig, out / "acceptance_per_position.png")
    return True


def _itl_tokens(r: dict[str, Any]) -> list[float]:
    times = [r["start_s"] + t for t in r["response_times_s"]]
    return st.inter_token_latencies(times, r["response_tokens"])[0]


def plot_latency(plt: Any, results: dict[str, Any], out: Path) -> bool:
    """TTFT, ITL per token and end-to-end latency distributions per cell; False without a measured request."""
    reqs = [r for r in results["requests"] if not r["warmup"] and r["error"] is None]
    if not reqs:
        return False
    labels = [c["label"] for c in results["cells"]]
    panels = [
        ("TTFT (s)", lambda r: [r["ttft_s"]] if r["ttft_s"] is not None else []),
        ("ITL per token (s)", _itl_tokens),
        ("end-to-end latency (s)", lambda r: [r["e2e_s"]]),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(7, 1.1 * len(labels)), 3 * len(panels)))
    for ax, (title, get) in zip(axes, panels):
        data = [[v for r in reqs if r["cell"] == lab for v in get(r)] for lab in labels]
        keep = [(lab, d) for lab, d in zip(labels, data) if d]
        if keep:
            ax.boxplot([d for _, d in keep], showfliers=True)
            n_req = {lab: sum(1 for r in reqs if r["cell"] == lab) for lab, _ in keep}
            ax.set_xticks(range(1, len(keep) + 1),
                          [f"{lab}\nn={n_req[lab]}" + (f"\n({len(d)} tok)" if "ITL" in title else "")
                           for lab, d in keep], fontsize=7)
        ax.set_ylabel(title)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_title(f"Latency distributions per cell (n = requests; {len(reqs)} in all, warm-ups excluded)",
                      fontsize=10)
    _save(plt, fig, out / "latency.png")
    return True


def plot_k_chosen(plt: Any, results: dict[str, Any], policy: str | None, out: Path) -> bool:
    """The k the deployment chose, by concurrency (the responses' draft_len_counts, summed per cell); False where
    no response reported it."""
    cells = results["cells"]
    chosen = [c for c in cells if c.get("k_chosen")]
    if not chosen:
        return False
    fig, (mean_ax, off_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    concs = sorted({c["concurrency"] for c in cells})
    for label, mine in _series(chosen, policy).items():
        xs = [c["concurrency"] for c in mine]
        mean_ax.plot(xs, [c["k_chosen"]["mean"] for c in mine], marker="o", label=label)
        off_ax.plot(xs, [c["k_chosen"]["k0_fraction"] for c in mine], marker="o", label=label)
        for c in mine:
            mean_ax.annotate(f"{c['k_chosen']['iterations']} it", (c["concurrency"], c["k_chosen"]["mean"]),
                             textcoords="offset points", xytext=(4, 4), fontsize=7)
    for b in results["summary"].get("best_fixed") or []:
        mean_ax.scatter([b["concurrency"]], [b[NUM_DRAFT_TOKENS]], marker="*", s=120, color="black", zorder=3)
    mean_ax.scatter([], [], marker="*", s=120, color="black", label="best fixed k (hindsight)")
    for ax, title, ylabel in ((mean_ax, "mean k chosen per iteration", "draft length k"),
                              (off_ax, "share of iterations with k=0", "fraction of iterations")):
        _concurrency_axis(ax, concs)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    off_ax.set_ylim(-0.05, 1.05)
    fig.suptitle("Draft length chosen by the deployment (responses' draft_len_counts; warm-ups excluded)",
                 fontsize=10)
    _save(plt, fig, out / "k_chosen.png")
    return True
