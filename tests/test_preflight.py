"""Each preflight failure, produced from a config / device inventory that triggers it, with its message.

Also the machine inventory: NVML answers (including "no NVIDIA driver") and --gpus specs.
"""

from __future__ import annotations

import os

import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.contract.nvidia import ENGINE_FLOW_RANGE
from trtspec.pipeline.plan import Tools, make_plan
from trtspec.cli import cli
from trtspec.config import ConfigError, parse_config
from trtspec.machine import GpuSpecError, Machine, Tool, machine_inventory, nvml_gpus, parse_gpu_spec, synthetic_machine

try:
    from tests.test_checkpoint import (
        LLAMA_31_8B, LLAMA_31_70B, LLAMA_32_1B, SMOLLM2_135M, SMOLLM2_DRAFT, example_config, make_checkpoint, squash,
        write_config,
    )  # fmt: skip
except ImportError:
    from test_checkpoint import (  # type: ignore[no-redef]
        LLAMA_31_8B, LLAMA_31_70B, LLAMA_32_1B, SMOLLM2_135M, SMOLLM2_DRAFT, example_config, make_checkpoint, squash,
        write_config,
    )  # fmt: skip

H100_CFG = "llama-3.1-8b_llama-3.2-1b_h100.yaml"
H200_CFG = "llama-3.1-70b_llama-3.2-1b_h200_fp8.yaml"


@pytest.fixture(autouse=True)
def plenty_of_disk(monkeypatch):
    """The disk check looks at the real filesystem; these tests plan 300 GB builds."""
    import trtspec.pipeline.preflight as pre

    monkeypatch.setattr(pre, "disk_free", lambda p: 10 << 40)


@pytest.fixture()
def models(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "models"
    return {
        "70b": make_checkpoint(root / "70b", LLAMA_31_70B),
        "8b": make_checkpoint(root / "8b", LLAMA_31_8B),
        "1b": make_checkpoint(root / "1b", LLAMA_32_1B),
    }


@pytest.fixture()
def tools(tmp_path: Path) -> Tools:
    """TensorRT-LLM's example scripts present (as in NVIDIA's container)."""
    ex = tmp_path / "examples"
    for rel in ("models/core/llama/convert_checkpoint.py", "quantization/quantize.py"):
        (ex / rel).parent.mkdir(parents=True, exist_ok=True)
        (ex / rel).write_text("# stand-in\n")
    return Tools(python="python3", trtllm_build=["trtllm-build"], examples=ex)


def gpu_machine(spec: str, trtllm: str | None = "1.1.0", *, trtllm_build: bool = True) -> Machine:
    """A machine with these GPUs whose software was checked (as `trtspec build` sees a real one)."""
    m = synthetic_machine(spec)
    m.software_checked = True
    m.tensorrt_llm_version = trtllm
    m.tensorrt_version = "10.13.3.9" if trtllm else None
    m.trtllm_build = Tool("/usr/local/bin/trtllm-build", trtllm) if trtllm_build else Tool(None, None, "not on PATH")
    return m


def preflight(tmp_path, tools, name, checkpoints, machine, *, ignore=(), check_paths=True, **overrides):
    cfg = parse_config(example_config(name, checkpoints, **overrides), source_dir=tmp_path, check_paths=check_paths)
    return make_plan(cfg, tmp_path / "out", machine, tools=tools, ignore=ignore).preflight


def only(pf, code):
    hits = [f for f in pf.findings if f.code == code]
    assert hits, f"no {code} finding in {[(f.level, f.code) for f in pf.findings]}"
    return hits[0]


def test_clean_plans_have_no_errors(tmp_path, tools, models) -> None:
    pf = preflight(tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": models["1b"]}, gpu_machine("h100x1"))
    assert pf.ok and not pf.warnings, pf.findings
    pf = preflight(tmp_path, tools, H200_CFG, {"target": models["70b"], "draft": models["1b"]}, gpu_machine("h200x8"))
    assert pf.ok and not pf.warnings, pf.findings


# -------------------------------------------------------------------------------------------- the pair


def test_vocab_mismatch(tmp_path, tools, models) -> None:
    small_vocab = make_checkpoint(tmp_path / "tiny", {**LLAMA_32_1B, "vocab_size": 32000})
    pf = preflight(tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": small_vocab}, gpu_machine("h100x1"))
    f = only(pf, "vocab-mismatch")
    assert f.level == "error" and "draft vocab_size 32000 != target vocab_size 128256" in f.message
    assert "Incompatible buffer sizes" in f.message


def test_tokenizer_mismatch(tmp_path, tools, models) -> None:
    other = make_checkpoint(tmp_path / "other", LLAMA_32_1B, tokenizer_vocab=128256)
    (other / "tokenizer.json").write_text((other / "tokenizer.json").read_text().replace('"t5"', '"T5"'))
    pf = preflight(tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": other}, gpu_machine("h100x1"))
    f = only(pf, "tokenizer-mismatch")
    assert f.level == "error" and "tokenizers differ" in f.message


def test_draft_too_large_is_a_warning(tmp_path, tools, models) -> None:
    big_draft = make_checkpoint(tmp_path / "bigdraft", {**LLAMA_31_8B, "num_hidden_layers": 16})
    pf = preflight(tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": big_draft}, gpu_machine("h100x1"))
    f = only(pf, "draft-too-large")
    assert f.level == "warning" and "more than 1/3" in f.message


# ------------------------------------------------------------------------------------------ speculation


def test_draft_len_schedule_above_max_draft_len(tmp_path, tools, models) -> None:
    data = example_config(H100_CFG, {"target": models["8b"], "draft": models["1b"]},
                          speculative__draft_len_schedule={1: 8, 4: 9})
    with pytest.raises(ConfigError, match=r"draft_len_schedule: draft lengths \{4: 9\} exceed max_draft_len \(8\)"):
        parse_config(data)


def test_num_draft_tokens_above_max_draft_len(tmp_path, tools, models) -> None:
    data = example_config(H100_CFG, {"target": models["8b"], "draft": models["1b"]}, speculative__num_draft_tokens=12)
    with pytest.raises(ConfigError, match=r"num_draft_tokens \(12\) is larger than max_draft_len \(8\)"):
        parse_config(data)
    # A config built in code (no validation) is still caught by preflight.
    cfg = parse_config(example_config(H100_CFG, {"target": models["8b"], "draft": models["1b"]}))
    cfg = cfg.model_copy(update={"speculative": cfg.speculative.model_copy(update={"default_k": 12})})
    pf = make_plan(cfg, tmp_path / "out", gpu_machine("h100x1"), tools=tools).preflight
    f = only(pf, "draft-len")
    assert f.level == "error" and "num_draft_tokens (12) > speculative.max_draft_len (8)" in f.message
    assert "Number of draft tokens is larger than maximum number of draft tokens" in f.message


def test_small_gap_between_max_seq_len_and_max_input_len(tmp_path, tools, models) -> None:
    pf = preflight(
        tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": models["1b"]}, gpu_machine("h100x1"),
        limits__max_input_len=4096, limits__max_seq_len=4100,
    )  # fmt: skip
    f = only(pf, "seq-len-gap")
    assert f.level == "warning" and "resends prompt + generated tokens" in f.message and ">= 4105" in f.message


def test_max_seq_len_beyond_trained_positions(tmp_path, tools) -> None:
    t = make_checkpoint(tmp_path / "t", SMOLLM2_135M)
    d = make_checkpoint(tmp_path / "d", SMOLLM2_DRAFT)
    pf = preflight(
        tmp_path, tools, H100_CFG, {"target": t, "draft": d}, gpu_machine("h100x1"),
        limits__max_input_len=9000, limits__max_seq_len=10000,
    )  # fmt: skip
    assert "max_position_embeddings 8192" in only(pf, "seq-beyond-positions").message


# --------------------------------------------------------------------------------------------- the GPUs


def test_tp_larger_than_the_gpus_present(tmp_path, tools, models) -> None:
    pf = preflight(
        tmp_path, tools, H200_CFG, {"target": models["70b"], "draft": models["1b"]}, gpu_machine("h200x2"),
        target__gpu_device_ids=None, draft__gpu_device_ids=None,
    )  # fmt: skip
    f = only(pf, "not-enough-gpus")
    assert f.level == "error"
    assert "target needs tp_size x pp_size = 4 x 1 = 4 GPUs but this machine has 2" in f.message
    assert "lower target.tp_size" in f.message


def test_gpu_device_ids_beyond_the_gpus_present(tmp_path, tools, models) -> None:
    pf = preflight(tmp_path, tools, H200_CFG, {"target": models["70b"], "draft": models["1b"]}, gpu_machine("h200x4"))
    f = only(pf, "gpu-missing")
    assert "draft.gpu_device_ids lists GPU(s) [4] but this machine has 4 GPU(s) (ids 0..3)" in f.message


def test_no_gpu_at_all(tmp_path, tools, models) -> None:
    m = gpu_machine("none")
    m.nvml_error = "no NVIDIA driver (libnvidia-ml not found)"
    pf = preflight(tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": models["1b"]}, m)
    f = only(pf, "no-gpu")
    assert "no NVIDIA driver" in f.message and "engine: reference" in f.message and "--gpus" in f.message


def test_fp8_refused_below_sm89_with_reason_and_alternative(tmp_path, tools, models) -> None:
    pf = preflight(tmp_path, tools, H200_CFG, {"target": models["70b"], "draft": models["1b"]}, gpu_machine("a100x8"))
    f = only(pf, "fp8-unsupported-gpu")
    assert f.level == "error"
    assert "compute capability >= 8.9" in f.message and "SM 8.0" in f.message and "A100" in f.message
    assert "paged context FMHA" in f.message and "KV-cache reuse" in f.message
    assert "draft.quantization: none" in f.message and "H100/H200/L40S" in f.message
    # Ada (SM 8.9) is fine.
    pf = preflight(tmp_path, tools, H200_CFG, {"target": models["8b"], "draft": models["1b"]}, gpu_machine("l40sx8"))
    assert "fp8-unsupported-gpu" not in pf.codes()


def test_blackwell_engine_path_warning(tmp_path, tools, models) -> None:
    pf = preflight(tmp_path, tools, H200_CFG, {"target": models["70b"], "draft": models["1b"]}, gpu_machine("b200x8"))
    assert only(pf, "blackwell-engine-path").level == "warning"
    assert pf.ok


# ------------------------------------------------------------------------------------------- memory


def test_weights_that_do_not_fit(tmp_path, tools, models) -> None:
    pf = preflight(
        tmp_path, tools, H200_CFG, {"target": models["70b"], "draft": models["1b"]}, gpu_machine("h200x2"),
        target__tp_size=1, target__gpu_device_ids=[0], draft__gpu_device_ids=[1],
    )  # fmt: skip
    f = only(pf, "gpu-memory")
    assert f.level == "error" and f.message.startswith("GPU 0 (NVIDIA H200) needs about")
    assert "target weights 131" in f.message  # 70.6B params in bf16
    assert "raise target.tp_size" in f.message and "lower limits.max_seq_len" in f.message
    assert "target" in pf.placement and 0 in [g.index for g in pf.memory if not g.fits]


def test_draft_and_target_sharing_a_gpu_that_is_too_small(tmp_path, tools, models) -> None:
    pf = preflight(tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": models["1b"]}, gpu_machine("a10g"))
    f = only(pf, "gpu-memory")
    assert "place the draft on another GPU" in f.message and "quantize the draft" in f.message


def test_kv_fractions_derived_for_a_shared_gpu(tmp_path, tools, models) -> None:
    pf = preflight(tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": models["1b"]}, gpu_machine("h100x1"))
    assert pf.kv_derived == {"target": True, "draft": True}
    t, d = pf.kv_fractions["target"], pf.kv_fractions["draft"]
    assert t != 0.5 and d != 0.5  # not NVIDIA's fixed split
    assert t > d  # the 8B needs 4x the KV bytes per token of the 1B
    # Whatever order the two models initialize in, their KV caches fit in what both engines leave free.
    gm = pf.memory[0]
    est = pf.estimates
    worst = t * (gm.usable - est["target"].own) + d * (gm.usable - est["draft"].own)
    assert worst <= gm.kv_room
    # And each still holds the minimal KV cache.
    assert t * (gm.usable - gm.own) >= est["target"].min_kv and d * (gm.usable - gm.own) >= est["draft"].min_kv


def test_kv_fractions_from_the_config_are_kept_and_overcommit_warned(tmp_path, tools, models) -> None:
    pf = preflight(
        tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": models["1b"]}, gpu_machine("h100x1"),
        target__kv_cache_free_gpu_mem_fraction=0.5, draft__kv_cache_free_gpu_mem_fraction=0.5,
    )  # fmt: skip
    assert pf.kv_fractions == {"target": 0.5, "draft": 0.5} and pf.kv_derived == {"target": False, "draft": False}
    f = only(pf, "kv-overcommit")
    assert f.level == "warning" and "Leave the fractions unset" in f.message


def test_kv_capacity_warning(tmp_path, tools, models) -> None:
    pf = preflight(
        tmp_path, tools, H200_CFG, {"target": models["70b"], "draft": models["1b"]}, gpu_machine("h100x8"),
        limits__max_batch_size=256, limits__max_input_len=32000, limits__max_seq_len=32768,
        triton__speculative_instance_count=64,
    )  # fmt: skip
    f = only(pf, "kv-capacity")
    assert "full-length sequences" in f.message and "limits.max_batch_size 256" in f.message


# -------------------------------------------------------------------------------------- software, disk


def test_missing_trtllm_build_and_tensorrt_llm(tmp_path, tools, models) -> None:
    m = gpu_machine("h100x1", trtllm=None, trtllm_build=False)
    pf = preflight(tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": models["1b"]}, m)
    assert "trtllm-build not found" in only(pf, "trtllm-build-missing").message
    assert f"tritonserver:{ENGINE_FLOW_RANGE.last_container}-trtllm-python-py3" in only(pf, "trtllm-build-missing").message
    assert "engine: llmapi" in only(pf, "trtllm-build-missing").message
    assert "tensorrt_llm Python package is not installed" in only(pf, "tensorrt-llm-missing").message


def test_missing_examples_dir_names_the_env_override(tmp_path, models) -> None:
    t = Tools(python="python3", trtllm_build=["trtllm-build"], examples=tmp_path / "no-examples")
    pf = preflight(tmp_path, t, H100_CFG, {"target": models["8b"], "draft": models["1b"]}, gpu_machine("h100x1"))
    f = only(pf, "converter-missing")
    assert "TRTSPEC_TRTLLM_EXAMPLES" in f.message and "convert_checkpoint.py" in f.message


@pytest.mark.parametrize(
    ("version", "text"),
    [("1.3.0", "trtllm-build were removed in 1.3.0"), ("0.16.0", "older than 0.17")],
)
def test_trtllm_version_outside_the_supported_range(tmp_path, tools, models, version, text) -> None:
    pf = preflight(
        tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": models["1b"]}, gpu_machine("h100x1", version),
        tensorrt_llm_version=version,
    )  # fmt: skip
    f = only(pf, "trtllm-version-unsupported")
    assert f.level == "error" and text in f.message


def test_pinned_version_differs_from_installed(tmp_path, tools, models) -> None:
    pf = preflight(tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": models["1b"]}, gpu_machine("h100x1", "1.0.0"))
    f = only(pf, "trtllm-version-mismatch")
    assert "tensorrt_llm_version: 1.1.0 in the config but TensorRT-LLM 1.0.0 is installed" in f.message


def test_not_enough_disk(tmp_path, tools, models, monkeypatch) -> None:
    import trtspec.pipeline.preflight as pre

    monkeypatch.setattr(pre, "disk_free", lambda p: 10 << 30)
    pf = preflight(tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": models["1b"]}, gpu_machine("h100x1"))
    f = only(pf, "disk-space")
    assert "only 10.0 GiB is free" in f.message and "--output" in f.message


def test_missing_checkpoint_in_a_dry_run(tmp_path, tools, models) -> None:
    pf = preflight(
        tmp_path, tools, H100_CFG, {"target": tmp_path / "absent", "draft": models["1b"]}, gpu_machine("h100x1"),
        check_paths=False,  # as `trtspec build --dry-run` loads it
    )  # fmt: skip
    f = only(pf, "checkpoint-missing")
    assert "target.checkpoint" in f.message and "not found" in f.message


def test_ignore_preflight_downgrades_an_error(tmp_path, tools, models) -> None:
    pf = preflight(
        tmp_path, tools, H100_CFG, {"target": models["8b"], "draft": models["1b"]}, gpu_machine("a10g"),
        ignore=("gpu-memory",),
    )  # fmt: skip
    f = only(pf, "gpu-memory")
    assert f.level == "warning" and "ignored" in f.message and pf.ok


def test_reference_engine_on_cuda_without_gpu(tmp_path, tools) -> None:
    t = make_checkpoint(tmp_path / "t", SMOLLM2_135M)
    d = make_checkpoint(tmp_path / "d", SMOLLM2_DRAFT)
    pf = preflight(tmp_path, tools, "demo.yaml", {"target": t, "draft": d}, synthetic_machine("none"), device="cuda")
    assert "set device: cpu" in only(pf, "no-gpu").message


# ------------------------------------------------------------------------------------------- machine


def test_parse_gpu_spec() -> None:
    g = parse_gpu_spec("h200x8")
    assert len(g) == 8 and g[7].index == 7 and g[0].sm == 90 and g[0].memory_total == 143771 << 20
    assert [x.name for x in parse_gpu_spec("2xh100,l40s")] == ["NVIDIA H100 80GB HBM3"] * 2 + ["NVIDIA L40S"]
    assert parse_gpu_spec("A100").__len__() == 1 and parse_gpu_spec("a100")[0].cc == "8.0"
    assert parse_gpu_spec("b200x1")[0].sm == 100 and parse_gpu_spec("rtx4090")[0].cc == "8.9"
    assert parse_gpu_spec("a10g")[0].cc == "8.6" and parse_gpu_spec("none") == []
    with pytest.raises(GpuSpecError, match="known SKUs: a100, a10g, b200, h100, h200, l40s, rtx4090"):
        parse_gpu_spec("v100x2")


def _fake_pynvml(monkeypatch, error: str | None = None) -> None:
    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    mod.NVMLError = NVMLError
    mod.NVMLError_LibraryNotFound = type("NVMLError_LibraryNotFound", (NVMLError,), {})
    mod.NVMLError_DriverNotLoaded = type("NVMLError_DriverNotLoaded", (NVMLError,), {})

    def init() -> None:
        if error:
            raise getattr(mod, error)()

    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: None
    mod.nvmlSystemGetDriverVersion = lambda: b"580.95.05"
    mod.nvmlDeviceGetCount = lambda: 2
    mod.nvmlDeviceGetHandleByIndex = lambda i: i
    mod.nvmlDeviceGetName = lambda h: b"NVIDIA H200" if h == 0 else "NVIDIA L40S"
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=150_000_000_000, free=140_000_000_000)
    mod.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0) if h == 0 else (8, 9)
    monkeypatch.setitem(sys.modules, "pynvml", mod)


@pytest.mark.parametrize("error", ["NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded"])
def test_no_nvidia_driver_is_a_normal_answer(monkeypatch, error) -> None:
    _fake_pynvml(monkeypatch, error)
    gpus, driver, err = nvml_gpus()
    assert gpus == [] and driver is None and err.startswith("no NVIDIA driver")
    m = machine_inventory()
    assert m.gpus == [] and "no NVIDIA driver" in m.describe_gpus()


def test_nvml_gpus_are_read(monkeypatch) -> None:
    _fake_pynvml(monkeypatch)
    gpus, driver, err = nvml_gpus()
    assert err is None and driver == "580.95.05"
    assert [(g.name, g.cc, g.sm) for g in gpus] == [("NVIDIA H200", "9.0", 90), ("NVIDIA L40S", "8.9", 89)]
    assert gpus[0].memory_free == 140_000_000_000


def test_machine_inventory_reads_this_machine(tmp_path) -> None:
    import shutil

    m = machine_inventory(disk_paths=[tmp_path])
    if m.nvml_error is not None:  # no driver: no GPU is made up, and the reason is given
        assert m.gpus == [] and m.driver_version is None and "NVIDIA" in m.nvml_error
    else:
        assert m.gpus and m.driver_version
    free = shutil.disk_usage(tmp_path).free
    assert abs(m.disk_free[str(tmp_path)] - free) <= 0.05 * free
    if m.tritonserver.available:  # the test environment installs the bundled one (nvidia-pytriton)
        assert os.access(m.tritonserver.path, os.X_OK)
    else:
        assert "tritonserver" in m.tritonserver.note or "container" in m.tritonserver.note
    d = m.to_dict()
    assert d["disk_free"] == m.disk_free and d["tritonserver"]["path"] == m.tritonserver.path


def test_doctor_shows_preflight_errors_with_fixes(tmp_path, models) -> None:
    cfg = write_config(tmp_path / "c.yaml", example_config(H200_CFG, {"target": models["70b"], "draft": models["1b"]}))
    res = CliRunner().invoke(cli, ["doctor", str(cfg), "--gpus", "a100x8", "-o", str(tmp_path / "o")])
    assert res.exit_code == 1
    out = squash(res.output)
    assert "fp8-unsupported-gpu" in out and "compute capability >= 8.9" in out
    assert "Traceback" not in res.output


def test_busy_gpu_is_a_warning_and_does_not_change_the_fractions(tmp_path, tools, models) -> None:
    ck = {"target": models["8b"], "draft": models["1b"]}
    idle = preflight(tmp_path, tools, H100_CFG, ck, gpu_machine("h100x1"))
    m = gpu_machine("h100x1")
    m.synthetic = False
    m.gpus[0].memory_free = m.gpus[0].memory_total // 3
    busy = preflight(tmp_path, tools, H100_CFG, ck, m)
    assert "other processes use it now" in only(busy, "gpu-busy").message
    assert busy.kv_fractions == idle.kv_fractions and busy.ok


def test_a_draft_alone_on_its_gpu_gets_only_the_kv_it_can_use(tmp_path, tools, models) -> None:
    from trtspec.pipeline.memory import _kv_tokens

    pf = preflight(tmp_path, tools, H200_CFG, {"target": models["70b"], "draft": models["1b"]}, gpu_machine("h200x8"))
    assert pf.kv_fractions["target"] == 0.9 and pf.kv_fractions["draft"] < 0.9
    target_tokens = _kv_tokens(pf, "target", pf.kv_fractions["target"])
    draft_tokens = _kv_tokens(pf, "draft", pf.kv_fractions["draft"])
    assert target_tokens * 1.2 <= draft_tokens <= target_tokens * 1.4  # as many sequences as the target, + margin
    # A fraction set in the config is never changed.
    pf = preflight(
        tmp_path, tools, H200_CFG, {"target": models["70b"], "draft": models["1b"]}, gpu_machine("h200x8"),
        draft__kv_cache_free_gpu_mem_fraction=0.8,
    )  # fmt: skip
    assert pf.kv_fractions["draft"] == 0.8 and pf.kv_derived["draft"] is False
