"""The loop benchmark's server phase: a real Triton server, the baseline and speculative endpoints on the same
prompts, Triton's per-model statistics around every measured request, and one BLS round trip timed by a probe
model; then the figures per prompt kind."""

from __future__ import annotations

import json
import shutil
import statistics
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from trtspec.bench.loop_settings import BenchPrompt, LoopBenchArgs
from trtspec.bench.loop_stats import (
    ENGINE_BUSY,
    add_deltas,
    engine_calls,
    engine_ns,
    model_entries,
    overhead_per_iteration,
    ratio,
    stats_delta,
)
from trtspec.contract import NUM_DRAFT_TOKENS
from trtspec.contract.models import BASELINE, DRAFT, ENSEMBLE, TARGET_ENGINES
from trtspec.spec.metrics import SpecStats
from trtspec.spec.speculative import solve_alpha

if TYPE_CHECKING:
    from trtspec.client import Generation

WARMUP_TEXTS = (
    "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nSummarise in one sentence: The shop opens at nine and closes at five, "
    "except on Sundays.<|im_end|>\n<|im_start|>assistant\n",
)
PROBE_BLS, PROBE_ECHO = "bench_bls_probe", "bench_echo"
PROBE_MODELS = Path(__file__).resolve().parent / "probe_models"


# ================================================================================ Triton probes


def add_probe_models(repo: Path) -> None:
    """Adds the BLS probe and the echo model to a generated repository."""
    for name in (PROBE_ECHO, PROBE_BLS):
        shutil.copytree(PROBE_MODELS / name, Path(repo) / name)


def _http_json(url: str, body: Any | None = None, timeout: float = 600) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def fetch_stats(http: str, metrics_url: str | None = None) -> dict[str, dict[str, Any]]:
    """Triton's per-model statistics; with `metrics_url`, the reference engine's compute time (which its
    compute_infer does not hold: execute() only queues) is added as the ENGINE_BUSY part."""
    entries = model_entries(_http_json(f"{http}/v2/models/stats"))
    if metrics_url:
        from trtspec.bench.metrics import scrape
        from trtspec.spec.metrics import ENGINE_BUSY_COUNTER

        for (name, labels), v in scrape(metrics_url).items():
            model = dict(labels).get("model")
            if name == ENGINE_BUSY_COUNTER and model in entries:
                entries[model][ENGINE_BUSY] = {"count": 0, "ns": int(v)}
    return entries


def probe_bls(http: str, n: int, length: int = 256) -> list[int]:
    body = {
        "inputs": [
            {"name": "n", "shape": [1], "datatype": "INT32", "data": [n]},
            {"name": "length", "shape": [1], "datatype": "INT32", "data": [length]},
        ]
    }
    out = _http_json(f"{http}/v2/models/{PROBE_BLS}/infer", body)
    return [int(x) for x in out["outputs"][0]["data"]]


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def time_bls_round_trip(http: str, execs: int) -> dict[str, Any]:
    """`execs` BLS round trips to the echo model, timed inside the probe, and Triton's compute time of the echo."""
    probe_bls(http, 20)  # warm
    s0 = fetch_stats(http)
    exec_ns = probe_bls(http, execs)
    d = stats_delta(s0, fetch_stats(http), [PROBE_ECHO])
    echo_compute = engine_ns(d, [PROBE_ECHO]) / max(1, engine_calls(d, PROBE_ECHO))
    return {
        "n": len(exec_ns),
        "payload_int32": 256,
        "median_s": _median([x / 1e9 for x in exec_ns]),
        "mean_s": sum(exec_ns) / len(exec_ns) / 1e9 if exec_ns else None,
        "p10_s": sorted(exec_ns)[len(exec_ns) // 10] / 1e9 if exec_ns else None,
        "echo_compute_s": echo_compute / 1e9,
        "how": f"perf_counter around InferenceRequest.exec() inside a BLS Python model, to a Python echo model, "
        f"{len(exec_ns)} calls, 256-int32 payload",
    }


# ================================================================================ measured requests


@dataclass
class LoopRecord:
    """One measured request of the loop benchmark."""

    prompt_id: str
    kind: str
    endpoint: str  # "baseline" | "speculative"
    wall_s: float
    token_ids: list[int]
    stats: SpecStats
    delta: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def iterations(self) -> int:
        return self.stats.num_iterations


# (endpoint, text, max_tokens) -> the client's result
Generate = Callable[[str, str, int], "Generation"]


def run_server_phase(cfg: Any, prompts: Sequence[BenchPrompt], args: LoopBenchArgs, log: Any) -> dict[str, Any]:
    from trtspec.bench.local import local_deployment
    from trtspec.client import Client

    out: dict[str, Any] = {"records": []}
    t0 = time.perf_counter()
    with local_deployment(cfg, ready_timeout=args.ready_timeout, prepare=add_probe_models, on_step=log) as server:
        out["startup_s"] = time.perf_counter() - t0
        ep = server.endpoints
        addr = ep.http_address if args.protocol == "http" else ep.grpc_address
        clients = {
            "baseline": Client(addr, args.protocol, BASELINE),
            "speculative": Client(addr, args.protocol, ENSEMBLE),
        }
        log(f"server ready in {out['startup_s']:.0f} s at {ep.http}")

        def gen(endpoint: str, text: str, max_tokens: int) -> Generation:
            kw = {NUM_DRAFT_TOKENS: args.k, "draft_source": args.draft_source} if endpoint == "speculative" else {}
            return clients[endpoint].generate(text, max_tokens=max_tokens, stream=args.stream, **kw)

        # warm-up: both endpoints, short requests on texts outside the measured set (excluded from everything)
        for _ in range(args.warmup):
            for text in WARMUP_TEXTS:
                for endpoint in ("baseline", "speculative"):
                    gen(endpoint, text, min(16, args.max_tokens))

        log(f"timing {args.bls_execs} BLS round trips")
        out["bls_exec"] = time_bls_round_trip(ep.http, args.bls_execs)
        measure_requests(gen, prompts, ep.http, ep.metrics, args.max_tokens, out["records"], log)
    log("server stopped")
    return out


def measure_requests(
    gen: Generate, prompts: Sequence[BenchPrompt], http: str, metrics_url: str | None, max_tokens: int,
    records: list[LoopRecord], log: Any,
) -> None:
    """Per prompt, both endpoints, the order alternating within each kind (A B, B A, ...); appends to `records`.

    The target engine (and its prefix KV cache) is shared by both endpoints, so whichever runs second would find
    the prompt cached: each prompt is first prefilled on both endpoints (max_tokens=1, unmeasured), so that both
    measured requests start with the prompt in the prefix cache."""
    seen: dict[str, int] = {}
    for p in prompts:
        i = seen[p.kind] = seen.get(p.kind, -1) + 1
        order = ("baseline", "speculative") if i % 2 == 0 else ("speculative", "baseline")
        for endpoint in order:
            gen(endpoint, p.text, 1)
        for endpoint in order:
            before = fetch_stats(http, metrics_url)
            g = gen(endpoint, p.text, max_tokens)
            after = fetch_stats(http, metrics_url)
            rec = LoopRecord(p.id, p.kind, endpoint, g.latency, list(g.token_ids), g.stats, stats_delta(before, after))
            records.append(rec)
            accepted = f"  accepted {g.stats.total_accepted_draft_tokens}/{g.stats.total_draft_tokens}"
            log(
                f"  {p.id:12s} {endpoint:11s} {len(g.token_ids):4d} tok {g.latency:6.2f} s "
                f"{len(g.token_ids) / g.latency:6.1f} tok/s  iterations {rec.iterations}"
                + (accepted if endpoint == "speculative" else "")
            )


# ================================================================================ figures per kind


def summarize_server(
    records: Sequence[LoopRecord], kinds: Sequence[str], k: int, streaming: bool = False
) -> dict[str, Any]:
    """Per kind and overall: tokens/s of both endpoints, identity, tokens per call, alpha, engine time, overhead.

    With streaming, postprocessing runs while the loop goes on, so its time is not subtracted from the wall time
    (``overhead_per_iteration_excl_pre_post_s`` is None)."""
    out: dict[str, Any] = {"per_kind": {}}
    for kind in list(kinds) + ["all"]:
        sel = [r for r in records if kind == "all" or r.kind == kind]
        base = [r for r in sel if r.endpoint == "baseline"]
        spec = [r for r in sel if r.endpoint == "speculative"]
        by_prompt = {r.prompt_id: r for r in base}
        same = sum(1 for r in spec if r.prompt_id in by_prompt and by_prompt[r.prompt_id].token_ids == r.token_ids)
        entry = {
            "baseline": summarize_endpoint(base, k, streaming),
            "speculative": summarize_endpoint(spec, k, streaming),
            "identical": same,
            "compared": len(spec),
        }
        entry["speedup"] = ratio(entry["speculative"]["tokens_per_s"], entry["baseline"]["tokens_per_s"])
        out["per_kind"][kind] = entry
    return out


def summarize_endpoint(recs: list[LoopRecord], k: int, streaming: bool) -> dict[str, Any]:
    """One endpoint's requests together: tokens/s, engine time and calls, overhead, and acceptance where it drafted."""
    tokens = sum(len(r.token_ids) for r in recs)
    wall = sum(r.wall_s for r in recs)
    delta: dict[str, Any] = {}
    for r in recs:
        delta = add_deltas(delta, r.delta)
    iters = sum(r.iterations for r in recs)
    eng = engine_ns(delta)
    res = {
        "requests": len(recs),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall else None,
        "iterations": iters,
        "engine_s": eng / 1e9,
        "target_calls": sum(engine_calls(delta, m) for m in TARGET_ENGINES),
        "draft_calls": engine_calls(delta, DRAFT),
        "target_engine_s": engine_ns(delta, TARGET_ENGINES) / 1e9,
        "draft_engine_s": engine_ns(delta, [DRAFT]) / 1e9,
        "pre_post_s": engine_ns(delta, ["preprocessing", "postprocessing"]) / 1e9,
        "overhead_per_iteration_s": overhead_per_iteration(wall, eng, iters),
    }
    res["overhead_per_iteration_excl_pre_post_s"] = (
        None if streaming else overhead_per_iteration(wall - res["pre_post_s"], eng, iters)
    )
    total = SpecStats.total(r.stats for r in recs)
    drafted, accepted = total.total_draft_tokens, total.total_accepted_draft_tokens
    if drafted:
        res["draft_tokens"] = drafted
        res["accepted_draft_tokens"] = accepted
        res["acceptance_rate"] = total.acceptance_rate
        res["tokens_per_call"] = total.tokens_per_target_call
        res["alpha"] = solve_alpha(res["tokens_per_call"], k) if iters else None
        res["draft_s_per_token"] = res["draft_engine_s"] / drafted
        res["acceptance_per_position"] = [
            a / p if p else None for a, p in zip(total.accepted_per_position[:k], total.proposed_per_position[:k])
        ]
    if res["target_calls"]:
        res["target_s_per_call"] = res["target_engine_s"] / res["target_calls"]
    return res
