"""Benchmark of the speculative loop (`trtspec bench-loop`): one command, one run, every number.

    trtspec bench-loop [--config build_configs/demo.yaml] [--draft demo:draft|PATH] [--k 3]
                       [--draft-source model|ngram|hybrid] [--max-tokens 128] [--prompts-per-kind 4] [--output DIR]

What it measures, in this order (greedy, batch 1, one request at a time, two prompt kinds: chat and
input-grounded):

1. Through a real Triton server (repository generated from the config into a temp dir, free ports):
   * the ``baseline`` endpoint (target only) and the ``ensemble`` endpoint (speculative, draft length k)
     on the same prompts with the same ``max_tokens``, interleaved per prompt (A B, B A, ...) so slow drifts of
     a shared CPU hit both alike; warm-up requests are excluded; outputs are checked token for token;
   * Triton's own per-model statistics (``GET /v2/models/stats``) before and after every measured request:
     the engine time (compute_input + compute_infer + compute_output of ``tensorrt_llm`` and
     ``tensorrt_llm_draft``, plus the reference engine's ``trtspec_engine_busy_ns``: its execute() only
     queues a request for the in-flight batcher, so compute_infer does not hold its work), hence the loop
     overhead per iteration = (client wall time - engine time) / iterations;
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
``report.md`` to ``--output`` (default ``bench-results/loop-<timestamp>``).

This module runs the benchmark; its parts, in the order above: ``loop_settings`` (the options and prompts),
``loop_server`` (the server phase, with ``loop_stats``: Triton's statistics, pure arithmetic), ``loop_inprocess``,
``loop_derive`` (alpha, S, efficiency, the checks) and ``loop_report``. The pure parts are tested in
``tests/test_bench_loop.py``; the speculative arithmetic lives in ``trtspec.spec.speculative``.
"""


from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from trtspec.bench.loop_derive import derive
from trtspec.bench.loop_inprocess import run_inprocess_phase
from trtspec.bench.loop_report import render_report
from trtspec.bench.loop_server import run_server_phase, summarize_server
from trtspec.bench.loop_settings import DEFAULT_CONFIG, DEFAULT_KINDS, LoopBenchArgs, select_prompts
from trtspec.bench.runner import BenchError

# what `trtspec bench-loop` uses
__all__ = ["DEFAULT_CONFIG", "DEFAULT_KINDS", "LoopBenchArgs", "rerender", "run"]


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


def _config_with_draft(cfg_path: Path, draft: str | None) -> Any:
    from trtspec.config import load_config, parse_config

    cfg = load_config(cfg_path)
    if draft is None:
        return cfg
    ref = draft if draft.startswith("demo:") else str(Path(draft).expanduser().resolve())
    data = cfg.model_dump(mode="json")
    data["draft"] = dict(data.get("draft") or {"dtype": "float32"}, checkpoint=ref)
    return parse_config(data, source_dir=cfg.source_dir)


def _prepare_checkpoints(args: LoopBenchArgs, log: Any) -> tuple[Any, Path, Path]:
    """The build config with the draft asked for, and the target's and draft's checkpoint folders."""
    from trtspec.config import MAX_DRAFT_LEN, checkpoint_path

    cfg = _config_with_draft(args.config, args.draft)
    if args.k > cfg.speculative.max_k:
        raise BenchError(f"--k {args.k} exceeds the config's {MAX_DRAFT_LEN} {cfg.speculative.max_k}")
    log("preparing checkpoints")
    try:
        target_dir, draft_dir = checkpoint_path(cfg, "target"), checkpoint_path(cfg, "draft")
    except Exception as e:  # DemoPairError: e.g. the trained demo draft is not there yet
        raise BenchError(f"{e} (--draft PATH benchmarks another draft checkpoint)") from None
    return cfg, target_dir, draft_dir


def _settings_record(
    args: LoopBenchArgs, cfg: Any, target_dir: Path, draft_dir: Path, kinds: Sequence[str]
) -> dict[str, Any]:
    return {
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
    }


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

    cfg, target_dir, draft_dir = _prepare_checkpoints(args, log)
    prompts = select_prompts(kinds, args.prompts_per_kind)
    results: dict[str, Any] = {
        "command": command,
        "started": stamp,
        "machine": machine_info(),
        "loadavg_start": loadavg(),
        "settings": _settings_record(args, cfg, target_dir, draft_dir, kinds),
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
