"""`trtspec bench-engine` on a tiny real model (CPU): every figure measured and written to --json, the CPU report's
shape, the GPU limit's byte count, and --device cuda refused clearly where torch sees no GPU. No timing assertions."""

import json

import pytest
import torch
from click.testing import CliRunner

from conftest import make_tiny_llama
from trtspec.commands.bench_engine import command
from trtspec.reference_engine.limits import stacked_gemv_ms, streaming_gemv_ms


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # bench-engine's token ids reach ~20,100 (limits.measure): a vocabulary that holds them
    return make_tiny_llama(tmp_path_factory.mktemp("bench-engine"), vocab=20200)


def test_bench_engine_measures_every_figure_and_writes_json(tiny, tmp_path):
    out = tmp_path / "figures.json"
    r = CliRunner().invoke(command, ["--checkpoint", str(tiny), "--dtypes", "float32", "--reps", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "float32, 1 torch thread(s), 64 tokens of context per row" in r.output  # the CPU report, as before
    assert "one GEMV per matrix" not in r.output  # a GPU-only line
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and len(doc["results"]) == 1
    res = doc["results"][0]
    assert res["dtype"] == "float32" and res["device"] == "cpu" and res["sweep_ms"] is None
    assert sorted(res["verify_ms"]) == ["2", "4", "8"] and sorted(res["batch_ms"], key=int) == ["4", "8", "16"]
    assert res["limit_ms"] > 0 and res["step_ms"] > 0 and res["weight_bytes"] > 0
    assert set(res["ratios"]) == {"step / limit", "verify 4 / step", "batch 8 / step"}


def test_the_stacked_limit_reads_the_same_bytes_as_the_per_matrix_sweep(tiny):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny))
    sweep_bytes, _ = streaming_gemv_ms(model, reps=1)
    stacked_bytes, ms = stacked_gemv_ms(model, reps=1, inner=2)
    assert stacked_bytes == sweep_bytes and ms > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there")
def test_cuda_without_a_gpu_is_refused_with_the_fix(tiny):
    r = CliRunner().invoke(command, ["--checkpoint", str(tiny), "--device", "cuda"])
    assert r.exit_code == 2 and "--device cuda" in r.output and "--device cpu" in r.output
