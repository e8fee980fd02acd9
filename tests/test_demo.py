"""`trtspec demo`: the shipped config, and the whole demo (--quick) end to end on a real Triton."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.cli import cli

ROOT = Path(__file__).resolve().parents[1]


def test_packaged_demo_config_is_the_checkouts():
    """trtspec/assets/demo.yaml is the copy `trtspec demo` uses when installed from a wheel: it must not drift."""
    assert (ROOT / "trtspec" / "assets" / "demo.yaml").read_text() == (ROOT / "build_configs" / "demo.yaml").read_text()


def test_demo_finds_its_config():
    from trtspec.commands.demo import demo_config_path
    from trtspec.config import load_config

    path = demo_config_path()
    assert path == ROOT / "build_configs" / "demo.yaml"
    cfg = load_config(path)
    assert cfg.target.checkpoint == "demo:target" and cfg.draft.checkpoint == "demo:draft"


def test_demo_help():
    result = CliRunner().invoke(cli, ["demo", "--help"])
    assert result.exit_code == 0
    for word in ("--quick", "demo pair", "A/B bench", "concurrency 1"):
        assert word in result.output


def test_summary_facts_read_the_bench_results():
    from trtspec.commands.demo import summary_facts

    def cell(c, k, tok_s, ratio=None, paused=0):
        return {"concurrency": c, "num_draft_tokens": k, "speculative": k > 0, "output_tokens_per_s": tok_s,
                "speedup": None if ratio is None else {"output_tokens_per_s": ratio},
                "acceptance": {"num_iterations": 40, "load_paused_iterations": paused} if k else None}

    results = {
        "grounded": {"cells": [cell(1, 0, 15.0), cell(1, 4, 21.0, 1.4)]},
        "chat": {"cells": [cell(1, 0, 15.0), cell(1, 4, 14.4, 0.96)]},
        "concurrency": {"cells": [cell(1, 0, 15.0), cell(1, 3, 10.0, 0.67), cell(8, 0, 45.0), cell(8, 3, 44.0, 0.98, 30)],
                        "summary": {"crossover": {"summary": "speculation pays at no measured concurrency"}}},
    }
    text = "\n".join(summary_facts(results))
    for part in ("1.40x", "0.96x", "c=8: 45.0 tok/s (3.0x)", "c=1: 0.67x, c=8: 0.98x (drafting off for load in 75% of iterations)", "pays at no measured"):
        assert part in text, part


@pytest.mark.slow
def test_demo_quick_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "trtspec.cli", "demo", "--quick", "--output", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    for text in ("1/5", "One example completion", "acceptance", "tokens per target call", "A/B bench 1/3",
                 "A/B bench 3/3", "speedup", "Crossover", "What the benches show", "baseline throughput",
                 "Stopping Triton", "Demo done"):
        assert text in output, text
    assert "Traceback" not in output
    one = {(1, "baseline", 0), (1, "ensemble", 2)}
    expected = {"grounded": one, "chat": one, "concurrency": one | {(2, "baseline", 0), (2, "ensemble", 2)}}
    for folder, cells in expected.items():
        res = json.loads((out / folder / "results.json").read_text())
        assert res["summary"]["num_errors"] == 0
        assert {(c["concurrency"], c["endpoint"], c["num_draft_tokens"]) for c in res["cells"]} == cells
        for c in res["cells"]:
            if c["speculative"]:
                assert 0.0 <= c["acceptance"]["rate"] <= 1.0
        for name in ("speedup.png", "acceptance_per_position.png", "latency.png", "results.csv"):
            assert (out / folder / name).is_file(), f"{folder}/{name}"
    settings = json.loads((out / "grounded" / "results.json").read_text())["settings"]
    assert settings["draft_source"] == "hybrid" and settings["draft_length_policy"] == "adaptive"
    assert (out / "triton.log").is_file()
