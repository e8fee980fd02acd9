"""Benchmark of the speculative loop (`trtspec bench-loop`): one command, one run, every number.

    trtspec bench-loop [--config build_configs/demo.yaml] [--draft demo:draft|PATH] [--k 3]
                       [--draft-source model|ngram|hybrid] [--max-tokens 128] [--prompts-per-kind 4] [--output DIR]

What it measures, in this order (greedy, batch 1, one request at a time, two prompt kinds: chat and
input-grounded):

1. Through a real Triton server (repository generated from the config into a temp dir, free ports):
   * the ``baseline`` endpoint (target only) and the ``ensemble`` endpoint (speculative, ``num_draft_tokens=k``)
     on the same prompts with the same ``max_tokens``, interleaved per prompt (A B, B A, ...) so slow drifts of
     a shared CPU hit both alike; warm-up requests are excluded; outputs are checked token for token;
   * Triton's own per-model statistics (``GET /v2/models/stats``) before and after every measured request:
     the engine time (compute_input + compute_infer + compute_output of ``tensorrt_llm`` and
     ``tensorrt_llm_draft``, plus the reference engine's ``trtspec_engine_busy_ns``: its execute() only
     queues a request for the in-flight batcher, so compute_infer does not hold its work), hence the loop overhead per iteration = (client wall time - engine time) /
     iterations;
   * one BLS round trip, measured directly: two probe models are added to the generated repository, a Python
     model that ``exec()``s an echo Python model N times and reports each exec's wall time (perf_counter
     around ``InferenceRequest.exec()`` inside the BLS model, as the loop does it).
2. In-process, after the server has stopped (so the two never share the CPU):
   * Hugging Face ``target.generate(max_new_tokens=N, do_sample=False)`` and the same with
     ``assistant_model=draft`` (k draft tokens, constant schedule, confidence threshold 0, set on
     ``draft.generation_config``: generate() kwargs are ignored for these), plus HF's defaults;
   * the draft/target per-token cost ratio c (incremental decode with KV cache, batch 1, on the reference
     engine -- the code the server runs -- and on the bare HF models);
   * the verify cost (k draft tokens) at 1,024 tokens of context vs 64, prefix cache warmed with the context.
3. From these: the acceptance alpha per kind, solved from the mean tokens per target call
   tau = (1 - a^(k+1)) / (1 - a); the bound S = (1 - a^(k+1)) / ((1 - a)(k c + 1)); the efficiency
   (speculative / baseline) / S.

It prints a markdown report (command line, machine, tables, targets) and writes ``results.json`` and
``report.md`` to ``--output`` (default ``bench-results/loop-<timestamp>``). The pure arithmetic
(``stats_delta``, ``engine_ns``, ``overhead_per_iteration``) is tested in
``tests/test_bench_loop.py``; the speculative arithmetic lives in ``trtspec.spec.speculative``.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from trtspec.bench.runner import BenchError
from trtspec.contract.models import BASELINE, ENSEMBLE
from trtspec.spec.metrics import SpecStats
from trtspec.spec.speculative import solve_alpha, speedup_bound

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "build_configs" / "demo.yaml"
DEFAULT_KINDS = ("chat", "grounded")
WARMUP_TEXTS = (
    "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nSummarise in one sentence: The shop opens at nine and closes at five, "
    "except on Sundays.<|im_end|>\n<|im_start|>assistant\n",
)
ENGINE_MODELS = ("tensorrt_llm", "tensorrt_llm_draft")
ENGINE_BUSY = "engine_busy"  # the reference engine's forward time (fetch_stats), beside Triton's parts
STAT_PARTS = ("success", "queue", "compute_input", "compute_infer", "compute_output", ENGINE_BUSY)
ENGINE_PARTS = ("compute_input", "compute_infer", "compute_output", ENGINE_BUSY)
PROBE_BLS, PROBE_ECHO = "bench_bls_probe", "bench_echo"

# Targets
TARGET_EFFICIENCY = 0.9  # speculative/baseline >= 0.9 S
# Loop overhead per speculative iteration, in BLS round trips: drafting with the draft model needs two
# engine calls per iteration, an in-process drafter (n-gram) only the verify call.
TARGET_OVERHEAD_ROUND_TRIPS = {"model": 3.0, "hybrid": 3.0, "ngram": 1.5}
TARGET_VERIFY_RATIO = 1.3  # verify at 1,024 tokens of context <= 1.3 x at 64


# ================================================================================ Triton statistics


def _model_entries(stats: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Triton's ``/v2/models[/<name>]/stats`` JSON -> {model name: {part: {count, ns}, execution_count,
    inference_count}} (versions of one model summed)."""
    out: dict[str, dict[str, Any]] = {}
    for entry in stats.get("model_stats", []):
        name = entry["name"]
        acc = out.setdefault(name, {p: {"count": 0, "ns": 0} for p in STAT_PARTS} | {"execution_count": 0, "inference_count": 0})
        inf = entry.get("inference_stats", {})
        for part in STAT_PARTS:
            d = inf.get(part, {}) or {}
            acc[part]["count"] += int(d.get("count", 0))
            acc[part]["ns"] += int(d.get("ns", 0))
        acc["execution_count"] += int(entry.get("execution_count", 0))
        acc["inference_count"] += int(entry.get("inference_count", 0))
    return out


def stats_delta(before: Mapping[str, Any], after: Mapping[str, Any], models: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """Per-model difference after - before of two stats snapshots (raw Triton JSON or already parsed by
    ``_model_entries``). A model missing from ``before`` counts from zero; one missing from ``after`` is skipped."""
    b = before if "model_stats" not in before else _model_entries(before)
    a = after if "model_stats" not in after else _model_entries(after)
    names = list(models) if models is not None else sorted(a)
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        if name not in a:
            continue
        zero = {p: {"count": 0, "ns": 0} for p in STAT_PARTS} | {"execution_count": 0, "inference_count": 0}
        prev = b.get(name, zero)
        d: dict[str, Any] = {}
        for part in STAT_PARTS:
            d[part] = {f: _part(a[name], part)[f] - _part(prev, part)[f] for f in ("count", "ns")}
        for f in ("execution_count", "inference_count"):
            d[f] = a[name][f] - prev[f]
        out[name] = d
    return out


def _part(entry: Mapping[str, Any], part: str) -> Mapping[str, int]:
    """One part of a model's stats; records made without it (ENGINE_BUSY is newer than saved results) count 0."""
    return entry.get(part) or {"count": 0, "ns": 0}


def add_deltas(x: Mapping[str, Any], y: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Sum of two ``stats_delta`` results (used to accumulate per-request deltas)."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(x) | set(y)):
        zero = {p: {"count": 0, "ns": 0} for p in STAT_PARTS} | {"execution_count": 0, "inference_count": 0}
        a, b = x.get(name, zero), y.get(name, zero)
        d: dict[str, Any] = {p: {f: _part(a, p)[f] + _part(b, p)[f] for f in ("count", "ns")} for p in STAT_PARTS}
        for f in ("execution_count", "inference_count"):
            d[f] = a[f] + b[f]
        out[name] = d
    return out


def engine_ns(delta: Mapping[str, Any], models: Iterable[str] = ENGINE_MODELS, parts: Iterable[str] = ENGINE_PARTS) -> int:
    """Engine time in a stats delta: compute_input + compute_infer + compute_output of the engine models."""
    parts = tuple(parts)
    return sum(int(_part(delta[m], p)["ns"]) for m in models if m in delta for p in parts)


def engine_calls(delta: Mapping[str, Any], model: str) -> int:
    return int(delta[model]["compute_infer"]["count"]) if model in delta else 0


def overhead_per_iteration(wall_s: float, engine_time_ns: int, iterations: int) -> float | None:
    """(client wall time - engine time) / iterations, in seconds; None without iterations."""
    if iterations <= 0:
        return None
    return (wall_s - engine_time_ns / 1e9) / iterations


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


# ================================================================================ prompts


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    kind: str
    text: str


def select_prompts(kinds: Sequence[str], per_kind: int) -> list[BenchPrompt]:
    """The first ``per_kind`` built-in prompts of each kind (trtspec.bench.prompts: held out of the draft's
    training seeds), interleaved."""
    from trtspec.bench.prompts import builtin_prompts

    out: list[BenchPrompt] = []
    counts = {k: 0 for k in kinds}
    for p in builtin_prompts(kinds):
        if counts[p.kind] < per_kind:
            counts[p.kind] += 1
            out.append(BenchPrompt(p.id, p.kind, p.text))
    short = [k for k, n in counts.items() if n < per_kind]
    if short:
        raise BenchError(f"only {min(counts.values())} built-in prompts for kind(s) {', '.join(short)}; lower --prompts-per-kind")
    return out


# ================================================================================ Triton probes


PROBE_MODELS = Path(__file__).resolve().parent / "probe_models"


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
    entries = _model_entries(_http_json(f"{http}/v2/models/stats"))
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


# ================================================================================ server phase


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


def run_server_phase(cfg: Any, prompts: Sequence[BenchPrompt], args: "LoopBenchArgs", log: Any) -> dict[str, Any]:
    from trtspec.bench.local import local_deployment
    from trtspec.client import Client

    k = args.k
    out: dict[str, Any] = {"records": []}
    t0 = time.perf_counter()
    with local_deployment(cfg, ready_timeout=args.ready_timeout, prepare=add_probe_models, on_step=log) as server:
            out["startup_s"] = time.perf_counter() - t0
            ep = server.endpoints
            http = ep.http
            addr = ep.http_address if args.protocol == "http" else ep.grpc_address
            clients = {
                "baseline": Client(addr, args.protocol, BASELINE),
                "speculative": Client(addr, args.protocol, ENSEMBLE),
            }
            log(f"server ready in {out['startup_s']:.0f} s at {http}")

            def gen(endpoint: str, text: str, max_tokens: int):
                kw = {"num_draft_tokens": k, "draft_source": args.draft_source} if endpoint == "speculative" else {}
                return clients[endpoint].generate(text, max_tokens=max_tokens, stream=args.stream, **kw)

            # warm-up: both endpoints, short requests on texts outside the measured set (excluded from everything)
            for _ in range(args.warmup):
                for text in WARMUP_TEXTS:
                    for endpoint in ("baseline", "speculative"):
                        gen(endpoint, text, min(16, args.max_tokens))

            # BLS round trip
            log(f"timing {args.bls_execs} BLS round trips")
            probe_bls(http, 20)  # warm
            s0 = fetch_stats(http)
            exec_ns = probe_bls(http, args.bls_execs)
            d = stats_delta(s0, fetch_stats(http), [PROBE_ECHO])
            echo_compute = engine_ns(d, [PROBE_ECHO]) / max(1, engine_calls(d, PROBE_ECHO))
            out["bls_exec"] = {
                "n": len(exec_ns),
                "payload_int32": 256,
                "median_s": _median([x / 1e9 for x in exec_ns]),
                "mean_s": sum(exec_ns) / len(exec_ns) / 1e9 if exec_ns else None,
                "p10_s": sorted(exec_ns)[len(exec_ns) // 10] / 1e9 if exec_ns else None,
                "echo_compute_s": echo_compute / 1e9,
                "how": f"perf_counter around InferenceRequest.exec() inside a BLS Python model, to a Python echo model, "
                f"{len(exec_ns)} calls, 256-int32 payload",
            }

            # measured requests: per prompt, both endpoints, the order alternating within each kind (A B, B A, ...).
            # The target engine (and its prefix KV cache) is shared by both endpoints, so whichever runs second
            # would find the prompt cached: each prompt is first prefilled on both endpoints (max_tokens=1,
            # unmeasured), so that both measured requests start with the prompt in the prefix cache.
            seen: dict[str, int] = {}
            for p in prompts:
                i = seen[p.kind] = seen.get(p.kind, -1) + 1
                order = ("baseline", "speculative") if i % 2 == 0 else ("speculative", "baseline")
                for endpoint in order:
                    gen(endpoint, p.text, 1)
                for endpoint in order:
                    before = fetch_stats(http, ep.metrics)
                    g = gen(endpoint, p.text, args.max_tokens)
                    after = fetch_stats(http, ep.metrics)
                    rec = LoopRecord(p.id, p.kind, endpoint, g.latency, list(g.token_ids), g.stats, stats_delta(before, after))
                    out["records"].append(rec)
                    log(
                        f"  {p.id:12s} {endpoint:11s} {len(g.token_ids):4d} tok {g.latency:6.2f} s "
                        f"{len(g.token_ids) / g.latency:6.1f} tok/s  iterations {rec.iterations}"
                        + (f"  accepted {g.stats.total_accepted_draft_tokens}/{g.stats.total_draft_tokens}" if endpoint == "speculative" else "")
                    )
    log("server stopped")
    return out


def summarize_server(records: Sequence[LoopRecord], kinds: Sequence[str], k: int, streaming: bool = False) -> dict[str, Any]:
    """Per kind and overall: tokens/s of both endpoints, identity, tokens per call, alpha, engine time, overhead.

    With streaming, postprocessing runs while the loop goes on, so its time is not subtracted from the wall time
    (``overhead_per_iteration_excl_pre_post_s`` is None)."""

    def agg(recs: list[LoopRecord]) -> dict[str, Any]:
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
            "target_calls": engine_calls(delta, "tensorrt_llm"),
            "draft_calls": engine_calls(delta, "tensorrt_llm_draft"),
            "target_engine_s": engine_ns(delta, ["tensorrt_llm"]) / 1e9,
            "draft_engine_s": engine_ns(delta, ["tensorrt_llm_draft"]) / 1e9,
            "pre_post_s": engine_ns(delta, ["preprocessing", "postprocessing"]) / 1e9,
            "overhead_per_iteration_s": overhead_per_iteration(wall, eng, iters),
        }
        res["overhead_per_iteration_excl_pre_post_s"] = None if streaming else overhead_per_iteration(wall - res["pre_post_s"], eng, iters)
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

    out: dict[str, Any] = {"per_kind": {}}
    for kind in list(kinds) + ["all"]:
        sel = [r for r in records if kind == "all" or r.kind == kind]
        base = [r for r in sel if r.endpoint == "baseline"]
        spec = [r for r in sel if r.endpoint == "speculative"]
        by_prompt = {r.prompt_id: r for r in base}
        same = sum(1 for r in spec if r.prompt_id in by_prompt and by_prompt[r.prompt_id].token_ids == r.token_ids)
        entry = {"baseline": agg(base), "speculative": agg(spec), "identical": same, "compared": len(spec)}
        entry["speedup"] = _ratio(entry["speculative"]["tokens_per_s"], entry["baseline"]["tokens_per_s"])
        out["per_kind"][kind] = entry
    return out


# ================================================================================ in-process phase




def hf_generate_runs(target: Any, draft: Any, prompt_ids: Sequence[list[int]], max_tokens: int, k: int, eos: int | None, defaults: bool, log: Any) -> dict[str, Any]:
    """HF generate, target only and assisted (k constant, threshold 0; and HF defaults), per prompt."""
    import torch

    counters: dict[str, Any] = {"calls": 0, "matches": 0, "proposed": 0, "observed": None}
    try:
        from transformers.generation.candidate_generator import AssistedCandidateGenerator

        original = AssistedCandidateGenerator.update_candidate_strategy

        def counting(self, input_ids, scores, num_matches):  # noqa: ANN001
            if counters["observed"] is None:  # what HF actually used (generate() kwargs would be ignored)
                agc = getattr(self, "assistant_generation_config", None)
                counters["observed"] = {
                    "num_assistant_tokens": getattr(self, "num_assistant_tokens", None),
                    "num_assistant_tokens_schedule": getattr(agc, "num_assistant_tokens_schedule", None),
                    "assistant_confidence_threshold": getattr(self, "assistant_confidence_threshold", None),
                }
            counters["calls"] += 1
            counters["matches"] += int(num_matches)
            counters["proposed"] += int(scores.shape[1]) - 1
            return original(self, input_ids, scores, num_matches)

        AssistedCandidateGenerator.update_candidate_strategy = counting
    except Exception:  # noqa: BLE001 - counts are a bonus
        AssistedCandidateGenerator, original = None, None

    gc = draft.generation_config
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    hf_default = {name: getattr(gc, name, None) for name in names}
    try:  # transformers 5: None in the config means "the library default", applied at generate() time
        from transformers import GenerationConfig

        lib_defaults = GenerationConfig._get_default_generation_params()
    except Exception:  # noqa: BLE001
        lib_defaults = {}
    effective_default = {n: hf_default[n] if hf_default[n] is not None else lib_defaults.get(n) for n in names}

    def set_assist(num: Any, schedule: Any, threshold: Any) -> None:
        gc.num_assistant_tokens = num
        gc.num_assistant_tokens_schedule = schedule
        gc.assistant_confidence_threshold = threshold

    def gen(ids: list[int], n: int, assistant: Any) -> tuple[list[int], float]:
        x = torch.tensor([ids], dtype=torch.long)
        kw = {"assistant_model": assistant} if assistant is not None else {}
        t0 = time.perf_counter()
        with torch.inference_mode():
            y = target.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, pad_token_id=eos, **kw)
        dt = time.perf_counter() - t0
        new = [int(t) for t in y[0, len(ids):]]
        if eos is not None and eos in new:
            new = new[: new.index(eos)]
        return new, dt

    modes = [("target", None, None), ("assisted", draft, (k, "constant", 0.0))]
    if defaults:
        modes.append(("assisted_hf_defaults", draft, tuple(hf_default.values())))
    results: dict[str, Any] = {"hf_default_assistant_settings": effective_default, "draft_generation_config_values": hf_default, "modes": {}}
    try:
        for name, assistant, settings in modes:
            if settings is not None:
                set_assist(*settings)
            gen(prompt_ids[0], 8, assistant)  # warm-up
            counters.update(calls=0, matches=0, proposed=0, observed=None)
            per_prompt = []
            for ids in prompt_ids:
                new, dt = gen(ids, max_tokens, assistant)
                per_prompt.append({"tokens": new, "seconds": dt})
                log(f"  HF {name:22s} {len(new):4d} tok {dt:6.2f} s {len(new) / dt:6.1f} tok/s")
            mode = {"per_prompt": per_prompt}
            if assistant is not None:
                mode["settings"] = dict(zip(names, settings))
                mode["observed_settings"] = counters["observed"]
                if counters["calls"]:
                    mode["target_forwards"] = counters["calls"]
                    mode["tokens_per_target_forward"] = (counters["matches"] + counters["calls"]) / counters["calls"]
                    mode["acceptance_rate"] = counters["matches"] / counters["proposed"] if counters["proposed"] else None
            results["modes"][name] = mode
    finally:
        set_assist(*hf_default.values())
        if original is not None:
            AssistedCandidateGenerator.update_candidate_strategy = original
    return results


def decode_cost(engine: Any, prompt: list[int], n: int, reps: int) -> tuple[float, float]:
    """Seconds per generated token of a ReferenceEngine (incremental decode, prefix cache warmed): median, best."""
    from trtspec.reference_engine import EngineRequest

    engine.run(EngineRequest(list(prompt), output_len=1))  # the prompt is in the prefix cache now
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        engine.run(EngineRequest(list(prompt), output_len=n))
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times), min(times)


def model_decode_cost(model: Any, prompt: list[int], n: int, reps: int) -> tuple[float, float]:
    """Seconds per token of bare HF incremental decoding (DynamicCache, batch 1, argmax), prompt prefilled."""
    import torch
    from transformers import DynamicCache

    times = []
    with torch.inference_mode():
        for _ in range(reps + 1):
            cache = DynamicCache(config=model.config)
            out = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            t0 = time.perf_counter()
            for _ in range(n):
                out = model(input_ids=tok, past_key_values=out.past_key_values, use_cache=True)
                tok = out.logits[:, -1:].argmax(-1)
            times.append((time.perf_counter() - t0) / n)
    return statistics.median(times[1:]), min(times[1:])


def verify_cost(engine: Any, context: list[int], draft: list[int], reps: int) -> dict[str, Any]:
    """Median seconds of one verify call (k draft tokens) after the context is in the prefix cache."""
    from trtspec.reference_engine import EngineRequest, PrefixCache

    engine.cache = PrefixCache(engine.cache.max_entries, engine.cache.max_bytes)
    engine.run(EngineRequest(list(context), output_len=1))  # warms the cache with the context
    times, computed, reused = [], 0, 0
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        r = engine.run(EngineRequest(list(context), output_len=len(draft) + 1, draft_ids=list(draft)))
        times.append(time.perf_counter() - t0)
        computed, reused = r.computed_tokens, r.reused_tokens
    return {
        "context": len(context),
        "median_s": statistics.median(times[1:]),
        "min_s": min(times[1:]),
        "all_s": times[1:],
        "computed_tokens": computed,
        "reused_tokens": reused,
    }


def detokenize_cost(tokenizer: Any, lengths: Sequence[int] = (64, 1024), chunk: int = 2, reps: int = 3) -> dict[str, Any]:
    """Postprocessing's work per streamed chunk at the end of a stream of each length: decoding the chunk against
    the whole prefix (what postprocessing was sent before) and against the loop's window of the last tokens
    (trtspec.triton.loop_model.PREFIX_WINDOW). Real text, greedy-output-like chunks of `chunk` tokens."""
    from trtspec.detokenize import chunk_text
    from trtspec.triton.loop_model import PREFIX_WINDOW

    text = " ".join(p.text for p in select_prompts(DEFAULT_KINDS, 2))
    ids = tokenizer.encode(text, add_special_tokens=False)
    while len(ids) < max(lengths) + chunk:
        ids = ids + ids
    out: dict[str, Any] = {"chunk_tokens": chunk, "window": PREFIX_WINDOW}
    for n in lengths:
        prefix, new = ids[:n], ids[n : n + chunk]
        for name, ctx in (("whole_prefix", prefix), ("window", prefix[-PREFIX_WINDOW:])):
            times = []
            for _ in range(reps * 50):
                t0 = time.perf_counter()
                chunk_text(tokenizer, ctx, new)
                times.append(time.perf_counter() - t0)
            out[f"{name}_{n}_s"] = statistics.median(times)
    return out


def run_inprocess_phase(target_dir: Path, draft_dir: Path, prompts: Sequence[BenchPrompt], args: "LoopBenchArgs", log: Any) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    from trtspec.reference_engine import ReferenceEngine

    out: dict[str, Any] = {"torch_threads": torch.get_num_threads()}
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    # as the preprocessing model does it
    prompt_ids = [tok.encode(p.text, add_special_tokens=False) for p in prompts]
    eos = tok.eos_token_id
    log("loading target and draft in-process (reference engine)")
    target = ReferenceEngine(target_dir, device="cpu", dtype="float32")
    draft = ReferenceEngine(draft_dir, device="cpu", dtype="float32", use_draft_vocab=True)

    if not args.skip_hf:
        log("HF generate: target only, assisted (k constant, threshold 0)" + (", assisted (HF defaults)" if args.hf_defaults else ""))
        hf = hf_generate_runs(target.model, draft.model, prompt_ids, args.max_tokens, args.k, eos, args.hf_defaults, log)
        out["hf"] = hf

    # prompt prefill (HF generate pays it in every call; the server runs start with the prompt cached)
    pre = []
    with torch.inference_mode():
        for ids in prompt_ids:
            t0 = time.perf_counter()
            target.model(input_ids=torch.tensor([ids]))
            pre.append(time.perf_counter() - t0)
    out["prefill"] = {"mean_s": sum(pre) / len(pre), "per_prompt_s": pre}

    log("cost ratio c: incremental decode, batch 1")
    ref_prompt = prompt_ids[0]
    n, reps = args.cost_tokens, args.cost_reps
    (t_target, t_target_min), (t_draft, t_draft_min) = decode_cost(target, ref_prompt, n, reps), decode_cost(draft, ref_prompt, n, reps)
    (m_target, m_target_min), (m_draft, m_draft_min) = (
        model_decode_cost(target.model, ref_prompt, n, reps),
        model_decode_cost(draft.model, ref_prompt, n, reps),
    )
    out["cost"] = {
        "tokens": n,
        "reps": reps,
        "context": len(ref_prompt),
        "engine_target_s_per_token": t_target,
        "engine_draft_s_per_token": t_draft,
        "c_engine": t_draft / t_target,
        "model_target_s_per_token": m_target,
        "model_draft_s_per_token": m_draft,
        "c_model": m_draft / m_target,
        "c_engine_of_fastest": t_draft_min / t_target_min,
        "c_model_of_fastest": m_draft_min / m_target_min,
    }
    log(f"  c (reference engine) = {t_draft * 1e3:.1f} / {t_target * 1e3:.1f} ms = {t_draft / t_target:.3f};"
        f" c (bare HF) = {m_draft / m_target:.3f}")

    log("verify cost at 1,024 vs 64 tokens of context")
    passage = tok.encode(" ".join(p.text for p in prompts), add_special_tokens=False)
    while len(passage) < 1024 + 16:
        passage = passage + passage
    draft_ids = passage[1024 : 1024 + args.k]
    short = verify_cost(target, passage[:64], draft_ids, args.verify_reps)
    long = verify_cost(target, passage[:1024], draft_ids, args.verify_reps)
    out["verify"] = {
        "k": args.k,
        "ctx64": short,
        "ctx1024": long,
        "ratio": long["median_s"] / short["median_s"],
        "ratio_min": long["min_s"] / short["min_s"],
    }
    log(f"  verify k={args.k}: {short['median_s'] * 1e3:.1f} ms at 64, {long['median_s'] * 1e3:.1f} ms at 1024 -> x{out['verify']['ratio']:.2f}")
    out["prompt_lengths"] = {p.id: len(ids) for p, ids in zip(prompts, prompt_ids)}
    log("detokenization cost per streamed chunk at 64 vs 1,024 output tokens")
    out["detokenize"] = detokenize_cost(tok)
    return out


# ================================================================================ report


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    try:
        info["affinity_cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch
        import transformers

        info["torch"] = torch.__version__
        info["transformers"] = transformers.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def derive(results: dict[str, Any], kinds: Sequence[str], k: int) -> None:
    """Adds alpha/S/efficiency per kind, the HF comparison, overhead vs BLS round trips, and the target checks."""
    server = results.get("server", {})
    per_kind = server.get("summary", {}).get("per_kind", {})
    inproc = results.get("inprocess", {})
    cost = inproc.get("cost", {})
    c = cost.get("c_engine")
    hf = inproc.get("hf", {}).get("modes", {})
    kind_of = results["prompt_kinds"]
    checks: list[dict[str, Any]] = []

    def hf_tps(mode: str, kind: str) -> float | None:
        m = hf.get(mode)
        if not m:
            return None
        sel = [pp for pid, pp in zip(results["prompt_ids"], m["per_prompt"]) if kind == "all" or kind_of[pid] == kind]
        t = sum(len(pp["tokens"]) for pp in sel)
        s = sum(pp["seconds"] for pp in sel)
        return t / s if s else None

    # c measured inside the server: draft seconds per draft token / target seconds per (baseline) target call
    all_entry = per_kind.get("all")
    if all_entry:
        d = all_entry["speculative"].get("draft_s_per_token")
        t = all_entry["baseline"].get("target_s_per_call")
        cost["c_server"] = _ratio(d, t)

    hf_kind: dict[str, dict[str, Any]] = {}
    if hf:
        for kind in list(kinds) + ["all"]:
            h = {
                "hf_target_tokens_per_s": hf_tps("target", kind),
                "hf_assisted_tokens_per_s": hf_tps("assisted", kind),
                "hf_assisted_defaults_tokens_per_s": hf_tps("assisted_hf_defaults", kind),
            }
            h["hf_assisted_vs_target"] = _ratio(h["hf_assisted_tokens_per_s"], h["hf_target_tokens_per_s"])
            hf_kind[kind] = h
        inproc["hf"]["per_kind"] = hf_kind

    for kind in list(kinds) + ["all"]:
        e = per_kind.get(kind)
        if e is None:
            continue
        spec = e["speculative"]
        alpha = spec.get("alpha")
        e["S"] = speedup_bound(alpha, k, c) if alpha is not None and c is not None else None
        e["efficiency"] = _ratio(e["speedup"], e["S"])
        e["S_c_server"] = speedup_bound(alpha, k, cost["c_server"]) if alpha is not None and cost.get("c_server") is not None else None
        e.update(hf_kind.get(kind) or dict.fromkeys(
            ("hf_target_tokens_per_s", "hf_assisted_tokens_per_s", "hf_assisted_defaults_tokens_per_s", "hf_assisted_vs_target")))
        e["spec_vs_hf_assisted"] = _ratio(spec["tokens_per_s"], e["hf_assisted_tokens_per_s"])
        e["spec_vs_hf_best_assisted"] = _ratio(
            spec["tokens_per_s"], max([x for x in (e["hf_assisted_tokens_per_s"], e["hf_assisted_defaults_tokens_per_s"]) if x] or [0]) or None
        )
        if kind == "all":
            continue
        checks.append({"check": f"{kind}: speculative/baseline >= {TARGET_EFFICIENCY} S", "value": e.get("efficiency"), "target": TARGET_EFFICIENCY,
                       "pass": None if e.get("efficiency") is None else e["efficiency"] >= TARGET_EFFICIENCY})
        checks.append({"check": f"{kind}: Triton speculative faster than HF assisted (k={k})", "value": e["spec_vs_hf_assisted"], "target": 1.0,
                       "pass": None if e["spec_vs_hf_assisted"] is None else e["spec_vs_hf_assisted"] > 1.0})
        checks.append({"check": f"{kind}: speculative token-identical to baseline", "value": f"{e['identical']}/{e['compared']}", "target": "all",
                       "pass": e["identical"] == e["compared"]})

    # HF assisted output identical to server baseline (greedy): a cross-check of both
    if hf and server.get("records"):
        base = {r["prompt_id"]: r["token_ids"] for r in server["records"] if r["endpoint"] == "baseline"}
        for mode, m in hf.items():
            m["identical_to_server_baseline"] = sum(1 for pid, pp in zip(results["prompt_ids"], m["per_prompt"]) if base.get(pid) == pp["tokens"])

    bls = server.get("bls_exec")
    if all_entry and bls:
        ov = all_entry["speculative"].get("overhead_per_iteration_s")
        trips = TARGET_OVERHEAD_ROUND_TRIPS[results["settings"].get("draft_source", "model")]
        limit = trips * bls["median_s"]
        server["overhead"] = {
            "speculative_per_iteration_s": ov,
            "baseline_per_iteration_s": all_entry["baseline"].get("overhead_per_iteration_s"),
            "bls_exec_s": bls["median_s"],
            "limit_s": limit,
            "limit_round_trips": trips,
            "in_bls_execs": _ratio(ov, bls["median_s"]),
        }
        checks.append({"check": f"loop overhead per iteration <= {trips:g} BLS round trips", "value": ov, "target": limit,
                       "pass": None if ov is None else ov <= limit})
    v = inproc.get("verify")
    if v:
        checks.append({"check": "verify cost at 1,024 tokens <= 1.3 x at 64", "value": v["ratio"], "target": TARGET_VERIFY_RATIO,
                       "pass": v["ratio"] <= TARGET_VERIFY_RATIO})
    results["checks"] = checks


def _f(x: Any, fmt: str = "{:.2f}", none: str = "–") -> str:
    if x is None:
        return none
    if isinstance(x, str):
        return x
    return fmt.format(x)


def _ms(x: Any) -> str:
    return _f(None if x is None else x * 1e3, "{:.2f} ms")


def render_report(results: dict[str, Any], kinds: Sequence[str]) -> str:
    k = results["settings"]["k"]
    m = results["machine"]
    s = results["settings"]
    lines = [
        "# trtspec loop benchmark",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Machine: {m.get('cpu_model', '?')}, {m.get('cpu_count')} CPUs (affinity {m.get('affinity_cpus', '?')}), "
        f"torch {m.get('torch', '?')} with {m.get('torch_threads', '?')} threads in-process (server stubs: torch default, "
        f"OMP_NUM_THREADS={m.get('omp_num_threads') or 'unset'}), transformers {m.get('transformers', '?')}, Python {m.get('python')}. "
        f"Load average (1/5/15 min) at start {results.get('loadavg_start')}, after the server phase {results.get('loadavg_after_server')}, "
        f"end {results.get('loadavg_end')}: Triton and in-process numbers are comparable only if the load stayed alike.",
        "",
        f"Settings: target `{s['target']}`, draft `{s['draft']}`, k = {k}, greedy, max_tokens = {s['max_tokens']}, "
        f"{s['prompts_per_kind']} prompts per kind, 1 request at a time, {s['protocol'].upper()}"
        f"{' streaming' if s['stream'] else ' non-streaming'}; run took {_f(results.get('elapsed_s'), '{:.0f}', '?')} s"
        + (f" (server start {results['server']['startup_s']:.0f} s)." if results.get("server", {}).get("startup_s") else "."),
        "",
    ]
    server = results.get("server", {})
    per_kind = server.get("summary", {}).get("per_kind", {})
    cost = results.get("inprocess", {}).get("cost", {})
    if per_kind:
        lines += [
            f"## Through Triton (c = {_f(cost.get('c_engine'), '{:.3f}')})",
            "",
            "| kind | baseline tok/s | speculative tok/s | speculative/baseline | identical | tokens/target call | α | accepted/proposed | S | efficiency (÷S) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for kind in list(kinds) + ["all"]:
            e = per_kind.get(kind)
            if not e:
                continue
            sp, b = e["speculative"], e["baseline"]
            lines.append(
                f"| {kind} | {_f(b['tokens_per_s'], '{:.1f}')} | {_f(sp['tokens_per_s'], '{:.1f}')} | {_f(e['speedup'], '{:.3f}')} | "
                f"{e['identical']}/{e['compared']} | {_f(sp.get('tokens_per_call'), '{:.3f}')} | {_f(sp.get('alpha'), '{:.3f}')} | "
                f"{_f(sp.get('acceptance_rate'), '{:.3f}')} | {_f(e.get('S'), '{:.3f}')} | {_f(e.get('efficiency'), '{:.3f}')} |"
            )
        pos = per_kind.get("all", {}).get("speculative", {}).get("acceptance_per_position")
        if pos:
            lines += ["", "Acceptance by draft position (all prompts): " + ", ".join(_f(x, "{:.2f}") for x in pos) + "."]
        lines.append("")
    hf_kind = results.get("inprocess", {}).get("hf", {}).get("per_kind", {})
    if hf_kind:
        hf = results["inprocess"]["hf"]
        dflt = hf.get("hf_default_assistant_settings", {})
        lines += [
            "## Hugging Face generate, in-process (server stopped)",
            "",
            f"| kind | HF target tok/s | HF assisted tok/s (k={k}, constant, threshold 0) | assisted/target | HF assisted tok/s (HF defaults: {dflt.get('num_assistant_tokens')}, "
            f"{dflt.get('num_assistant_tokens_schedule')}, threshold {dflt.get('assistant_confidence_threshold')}) | Triton speculative / HF assisted (k={k}) |",
            "|---|---|---|---|---|---|",
        ]
        for kind in list(kinds) + ["all"]:
            e = hf_kind.get(kind)
            if not e:
                continue
            vs = per_kind.get(kind, {}).get("spec_vs_hf_assisted")
            lines.append(
                f"| {kind} | {_f(e['hf_target_tokens_per_s'], '{:.1f}')} | {_f(e['hf_assisted_tokens_per_s'], '{:.1f}')} | "
                f"{_f(e['hf_assisted_vs_target'], '{:.3f}')} | {_f(e['hf_assisted_defaults_tokens_per_s'], '{:.1f}')} | {_f(vs, '{:.3f}')} |"
            )
        n = len(results["prompt_ids"])
        notes = []
        for mode, mm in hf.get("modes", {}).items():
            extra = ""
            if mm.get("tokens_per_target_forward"):
                extra = f", {mm['tokens_per_target_forward']:.2f} tokens per target forward, acceptance {_f(mm.get('acceptance_rate'), '{:.2f}')}"
            obs = mm.get("observed_settings")
            if obs:
                extra += (f" (HF ran with {obs.get('num_assistant_tokens')} draft tokens, {obs.get('num_assistant_tokens_schedule')} schedule, "
                          f"threshold {obs.get('assistant_confidence_threshold')})")
            notes.append(f"{mode}: identical to the server's baseline on {mm.get('identical_to_server_baseline', '?')}/{n} prompts{extra}")
        lines += ["", "HF " + "; ".join(notes) + "."]
        pre = results["inprocess"].get("prefill")
        tgt = hf.get("modes", {}).get("target")
        if pre and tgt:
            share = pre["mean_s"] * len(tgt["per_prompt"]) / sum(pp["seconds"] for pp in tgt["per_prompt"])
            lines.append(
                f"HF timings include the prompt prefill (mean {pre['mean_s'] * 1e3:.0f} ms per prompt, {share:.1%} of the target-only time); "
                "the server's measured requests start with the prompt in the prefix cache (both endpoints alike)."
            )
        lines.append("")
    if cost:
        lines += [
            "## Cost ratio c (draft / target per token, incremental decode with KV cache, batch 1)",
            "",
            "| measured on | draft per token | target per token | c |",
            "|---|---|---|---|",
            f"| reference engine in-process (used for S) | {_ms(cost['engine_draft_s_per_token'])} | {_ms(cost['engine_target_s_per_token'])} | {cost['c_engine']:.3f} |",
            f"| bare HF forward in-process | {_ms(cost['model_draft_s_per_token'])} | {_ms(cost['model_target_s_per_token'])} | {cost['c_model']:.3f} |",
        ]
        fastest = (f"Medians of {cost.get('reps', '?')} runs of {cost.get('tokens', '?')} tokens; from the fastest runs c = "
                   f"{_f(cost.get('c_engine_of_fastest'), '{:.3f}')} (engine), {_f(cost.get('c_model_of_fastest'), '{:.3f}')} (bare HF).")
        all_e = per_kind.get("all")
        if all_e and cost.get("c_server") is not None:
            lines.append(
                f"| inside the server (draft engine time / draft token; target engine time / baseline call) | {_ms(all_e['speculative'].get('draft_s_per_token'))} | "
                f"{_ms(all_e['baseline'].get('target_s_per_call'))} | {cost['c_server']:.3f} |"
            )
        lines += ["", fastest]
        if all_e and all_e.get("S_c_server") is not None:
            lines.append(f"With c from the server, S (all prompts) = {all_e['S_c_server']:.3f}.")
        lines.append("")
    ov = server.get("overhead")
    if ov:
        all_e = per_kind["all"]
        sp, b = all_e["speculative"], all_e["baseline"]
        bls = server["bls_exec"]
        lines += [
            "## Loop overhead per iteration (Triton per-model statistics)",
            "",
            "| endpoint | client wall | engine time (target + draft) | pre/post-processing | iterations | overhead / iteration | without pre/post |",
            "|---|---|---|---|---|---|---|",
            f"| speculative | {sp['wall_s']:.2f} s | {sp['engine_s']:.2f} s ({sp['target_calls']} target + {sp['draft_calls']} draft calls) | {sp['pre_post_s']:.3f} s | "
            f"{sp['iterations']} | {_ms(sp['overhead_per_iteration_s'])} | {_ms(sp['overhead_per_iteration_excl_pre_post_s'])} |",
            f"| baseline | {b['wall_s']:.2f} s | {b['engine_s']:.2f} s ({b['target_calls']} target calls) | {b['pre_post_s']:.3f} s | "
            f"{b['iterations']} | {_ms(b['overhead_per_iteration_s'])} | {_ms(b['overhead_per_iteration_excl_pre_post_s'])} |",
            "",
            f"One BLS round trip ({bls['how']}): median {_ms(bls['median_s'])}, mean {_ms(bls['mean_s'])}, p10 {_ms(bls['p10_s'])} "
            f"(Triton's compute time of the echo model, mean: {_ms(bls['echo_compute_s'])}; for Python models it includes the "
            f"backend-to-stub hand-off, so part of every exec is counted as engine time above). Speculative overhead per iteration = "
            f"{_f(ov['in_bls_execs'], '{:.2f}')} BLS round trips; target for draft source {results['settings'].get('draft_source', 'model')}: "
            f"≤ {ov['limit_round_trips']:g} round trips = {_ms(ov['limit_s'])}.",
            "",
        ]
    d = results.get("inprocess", {}).get("detokenize")
    if d:
        lines += [
            "## Streamed-chunk detokenization (postprocessing's work per chunk, median)",
            "",
            "| output so far | against the whole prefix | against the loop's window |",
            "|---|---|---|",
            *(f"| {n} tokens | {_ms(d[f'whole_prefix_{n}_s'])} | {_ms(d[f'window_{n}_s'])} |" for n in (64, 1024)),
            "",
            f"Chunks of {d['chunk_tokens']} tokens; the loop sends postprocessing the last {d['window']} generated tokens "
            "as context, so a chunk's cost does not grow with the length of the stream.",
            "",
        ]
    v = results.get("inprocess", {}).get("verify")
    if v:
        lines += [
            "## Verify cost vs context (reference engine in-process, prefix cache warmed with the context)",
            "",
            "| context | verify k tokens (median) | tokens computed / reused |",
            "|---|---|---|",
            f"| 64 | {_ms(v['ctx64']['median_s'])} | {v['ctx64']['computed_tokens']} / {v['ctx64']['reused_tokens']} |",
            f"| 1,024 | {_ms(v['ctx1024']['median_s'])} | {v['ctx1024']['computed_tokens']} / {v['ctx1024']['reused_tokens']} |",
            "",
            f"Ratio 1,024 / 64 = {v['ratio']:.2f} (k = {v['k']}, median of {len(v['ctx64']['all_s'])}; "
            f"of the fastest runs: {_ms(v['ctx1024'].get('min_s'))} / {_ms(v['ctx64'].get('min_s'))} = {_f(v.get('ratio_min'))}).",
            "",
        ]
    checks = results.get("checks", [])
    if checks:
        lines += ["## Targets", "", "| check | value | target | pass |", "|---|---|---|---|"]
        for ch in checks:
            val, tgt = ch["value"], ch["target"]
            if isinstance(val, float) and "overhead" in ch["check"]:
                val, tgt = _ms(val), _ms(tgt)
            lines.append(f"| {ch['check']} | {_f(val, '{:.3f}')} | {_f(tgt, '{:.3g}')} | {'–' if ch['pass'] is None else ('yes' if ch['pass'] else 'NO')} |")
        lines.append("")
    return "\n".join(lines)


# ================================================================================ main


def _config_with_draft(cfg_path: Path, draft: str | None) -> Any:
    from trtspec.config import load_config, parse_config

    cfg = load_config(cfg_path)
    if draft is None:
        return cfg
    ref = draft if draft.startswith("demo:") else str(Path(draft).expanduser().resolve())
    data = cfg.model_dump(mode="json")
    data["draft"] = dict(data.get("draft") or {"dtype": "float32"}, checkpoint=ref)
    return parse_config(data, source_dir=cfg.source_dir)


@dataclass
class LoopBenchArgs:
    """The benchmark's settings (the options of `trtspec bench-loop`)."""

    config: Path = DEFAULT_CONFIG
    draft: str | None = None
    k: int = 3
    draft_source: str = "model"
    max_tokens: int = 128
    prompts_per_kind: int = 4
    kinds: Sequence[str] = DEFAULT_KINDS
    output: Path | None = None
    protocol: str = "http"
    stream: bool = False
    warmup: int = 1
    bls_execs: int = 300
    hf_defaults: bool = True
    skip_hf: bool = False
    skip_server: bool = False
    cost_tokens: int = 24
    cost_reps: int = 3
    verify_reps: int = 9
    ready_timeout: float = 600


def rerender(results_json: Path) -> str:
    results = json.loads(results_json.read_text())
    kinds = results["settings"]["kinds"]
    derive(results, kinds, results["settings"]["k"])
    return render_report(results, kinds)


def run(args: LoopBenchArgs, command: str) -> int:
    kinds = list(args.kinds)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    started = time.perf_counter()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = args.output or Path("bench-results") / f"loop-{stamp}"

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f}s] {msg}", file=sys.stderr, flush=True)

    from trtspec.config import checkpoint_path

    cfg = _config_with_draft(args.config, args.draft)
    if args.k > cfg.speculative.max_draft_len:
        raise BenchError(f"--k {args.k} exceeds the config's max_draft_len {cfg.speculative.max_draft_len}")
    log("preparing checkpoints")
    try:
        target_dir, draft_dir = checkpoint_path(cfg, "target"), checkpoint_path(cfg, "draft")
    except Exception as e:  # DemoPairError: e.g. the trained demo draft is not there yet
        raise BenchError(f"{e} (--draft PATH benchmarks another draft checkpoint)") from None
    prompts = select_prompts(kinds, args.prompts_per_kind)
    results: dict[str, Any] = {
        "command": command,
        "started": stamp,
        "machine": machine_info(),
        "loadavg_start": loadavg(),
        "settings": {
            "config": str(args.config),
            "target": cfg.target.checkpoint,
            "target_dir": str(target_dir),
            "draft": cfg.draft.checkpoint,
            "draft_dir": str(draft_dir),
            "k": args.k,
            "draft_source": args.draft_source,
            "max_tokens": args.max_tokens,
            "prompts_per_kind": args.prompts_per_kind,
            "kinds": kinds,
            "protocol": args.protocol,
            "stream": args.stream,
            "greedy": True,
            "concurrency": 1,
        },
        "prompt_ids": [p.id for p in prompts],
        "prompt_kinds": {p.id: p.kind for p in prompts},
        "prompts": {p.id: p.text for p in prompts},
    }
    if not args.skip_server:
        srv = run_server_phase(cfg, prompts, args, log)
        records = srv.pop("records")
        srv["summary"] = summarize_server(records, kinds, args.k, streaming=args.stream)
        srv["records"] = [asdict(r) for r in records]
        results["server"] = srv
        results["loadavg_after_server"] = loadavg()
        # the server half on its own, in case the in-process half is interrupted (--rerender shows it)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "results.partial.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    results["inprocess"] = run_inprocess_phase(target_dir, draft_dir, prompts, args, log)
    results["loadavg_end"] = loadavg()
    results["elapsed_s"] = time.perf_counter() - started
    derive(results, kinds, args.k)
    report = render_report(results, kinds)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (out_dir / "results.partial.json").unlink(missing_ok=True)
    (out_dir / "report.md").write_text(report + "\n")
    print(report)
    print(f"\nresults: {out_dir / 'results.json'}")
    return 0
