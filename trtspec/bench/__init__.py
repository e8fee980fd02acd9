"""`trtspec bench`: speculative vs target-only A/B over concurrency levels and draft lengths.

    from trtspec.bench import BenchSettings, builtin_prompts, run_bench, build_results, write_results

    run = run_bench(BenchSettings(url="localhost:8000", concurrency=[1, 4], draft_tokens=[0, 2, 4]),
                    builtin_prompts())
    results = write_results(run, "bench-results")   # results.json, results.csv, requests.csv, *.png

Field names of results.json: docs/bench-results.md.
"""

from trtspec.bench.metrics import CrossCheck, MetricsError, parse_prometheus, scrape
from trtspec.bench.prompts import KINDS, Prompt, PromptError, builtin_prompts, chat, load_prompts, parse_kinds
from trtspec.bench.report import SCHEMA_VERSION, build_results, summary_lines, table, write_results
from trtspec.bench.runner import (
    BenchError,
    BenchRun,
    BenchSettings,
    Cell,
    ProgressSink,
    RequestRecord,
    RichProgress,
    plan_cells,
    run_bench,
)

__all__ = [
    "KINDS",
    "SCHEMA_VERSION",
    "BenchError",
    "BenchRun",
    "BenchSettings",
    "Cell",
    "CrossCheck",
    "MetricsError",
    "ProgressSink",
    "Prompt",
    "PromptError",
    "RequestRecord",
    "RichProgress",
    "build_results",
    "builtin_prompts",
    "chat",
    "load_prompts",
    "parse_kinds",
    "parse_prometheus",
    "plan_cells",
    "run_bench",
    "scrape",
    "summary_lines",
    "table",
    "write_results",
]
