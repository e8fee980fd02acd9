"""The runner against stand-in tools: resume, atomicity, caching, manifest.

The stand-ins (`trtllm-build` on PATH, `convert_checkpoint.py` / `quantize.py` in a fake TensorRT-LLM
examples dir named by TRTSPEC_TRTLLM_EXAMPLES) parse their argv with parsers built from the real 1.x flag
sets of test_build_plan.py, write what the real tools write (config.json + rank<r>.safetensors, or
config.json + rank<r>.engine), and fail on demand mid-step (after writing part of their output) when
STANDIN_FAIL matches their output dir.
"""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from trtspec.pipeline.plan import Tools, make_plan
from trtspec.pipeline.runner import Runner, StepFailed
from trtspec.cli import cli
from trtspec.config import parse_config
from trtspec.machine import Tool, synthetic_machine
from trtspec.repository import ENSEMBLE

try:
    from tests.test_build_plan import FLAG_SETS
    from tests.test_checkpoint import SMOLLM2_135M, SMOLLM2_DRAFT, make_checkpoint, squash, write_config
except ImportError:
    from test_build_plan import FLAG_SETS  # type: ignore[no-redef]
    from test_checkpoint import SMOLLM2_135M, SMOLLM2_DRAFT, make_checkpoint, squash, write_config  # type: ignore[no-redef]

STANDIN = r'''
import argparse, json, os, sys, time
from pathlib import Path

tool = os.environ.get("STANDIN_TOOL") or Path(sys.argv[0]).name
flags = json.loads(Path(os.environ["STANDIN_FLAGS"]).read_text())[tool]
p = argparse.ArgumentParser(prog=tool, allow_abbrev=False)
types_ = {"int": int, "float": float, "str": str}
for flag, spec in flags.items():
    if spec["type"] == "flag":
        p.add_argument(flag, action="store_true")
    else:
        kw = {"type": types_[spec["type"]]}
        if "choices" in spec:
            kw["choices"] = spec["choices"]
        if "nargs" in spec:
            kw["nargs"] = spec["nargs"]
        p.add_argument(flag, **kw)
args = p.parse_args()  # exits 2 on an unknown flag or a bad value, like the real tool
out = Path(args.output_dir)
with open(os.environ["STANDIN_CALLS"], "a") as f:
    f.write(json.dumps({"tool": tool, "output_dir": str(out), "argv": sys.argv[1:],
                        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\n")
out.mkdir(parents=True, exist_ok=True)
fail = os.environ.get("STANDIN_FAIL", "")
failing = bool(fail) and fail in str(out)
hang = os.environ.get("STANDIN_HANG", "")
if hang and hang in str(out):
    (out / "config.json").write_text("{}")
    Path(os.environ["STANDIN_PID"]).write_text(str(os.getpid()))
    print("working ...", flush=True)
    time.sleep(60)
if tool == "trtllm-build":
    ckpt = json.loads((Path(args.checkpoint_dir) / "config.json").read_text())
    world = ckpt["mapping"]["world_size"]
    (out / "config.json").write_text(json.dumps({"pretrained_config": ckpt, "build_config": {
        "max_batch_size": args.max_batch_size, "max_input_len": args.max_input_len, "max_seq_len": args.max_seq_len,
        "max_draft_len": args.max_draft_len, "speculative_decoding_mode": args.speculative_decoding_mode}}))
    for r in range(world):
        print(f"[TRT-LLM] [I] building rank {r}/{world} ...", flush=True)
        if failing and r == 0:
            (out / "rank0.engine").write_bytes(b"half an engine")
            print("[TRT-LLM] [E] stand-in failure requested (STANDIN_FAIL)", flush=True)
            sys.exit(1)
        (out / f"rank{r}.engine").write_bytes(b"E" * (1000 + r))
else:
    world = args.tp_size * args.pp_size
    quant = {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"} if getattr(args, "qformat", None) == "fp8" else {}
    (out / "config.json").write_text(json.dumps({"architecture": "LlamaForCausalLM", "dtype": args.dtype,
        "mapping": {"world_size": world, "tp_size": args.tp_size, "pp_size": args.pp_size}, "quantization": quant}))
    for r in range(world):
        print(f"converting rank {r}", flush=True)
        if failing:
            print("stand-in failure requested (STANDIN_FAIL)", flush=True)
            sys.exit(3)
        if os.environ.get("STANDIN_SKIP_RANK1") and r == 1:
            continue
        (out / f"rank{r}.safetensors").write_bytes(b"W" * 100)
print("done", flush=True)
'''


@pytest.fixture()
def env(tmp_path: Path, monkeypatch) -> dict:
    """Stand-in tools on PATH / in a fake examples dir, and a fake repository generator."""
    flags = tmp_path / "flags.json"
    flags.write_text(json.dumps(FLAG_SETS))
    calls = tmp_path / "calls.jsonl"
    calls.touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tb = bin_dir / "trtllm-build"
    tb.write_text(f"#!{sys.executable}\n{STANDIN}")
    tb.chmod(tb.stat().st_mode | stat.S_IEXEC)
    ex = tmp_path / "examples"
    for rel in ("models/core/llama/convert_checkpoint.py", "quantization/quantize.py"):
        (ex / rel).parent.mkdir(parents=True, exist_ok=True)
        (ex / rel).write_text(STANDIN)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TRTSPEC_TRTLLM_EXAMPLES", str(ex))
    monkeypatch.setenv("TRTSPEC_PYTHON", sys.executable)
    monkeypatch.delenv("TRTSPEC_TRTLLM_BUILD", raising=False)
    monkeypatch.setenv("STANDIN_FLAGS", str(flags))
    monkeypatch.setenv("STANDIN_CALLS", str(calls))
    monkeypatch.delenv("STANDIN_FAIL", raising=False)

    generated: list[dict] = []
    from trtspec import repository

    real = repository.generate_repository

    def generate_repository(cfg, output_dir, *, target_engine_dir=None, draft_engine_dir=None, trtllm_version=None, kv_cache_fractions=None, final_dir=None):  # noqa: E501
        """The real generator, with a record of what the build handed it."""
        generated.append(
            {"cfg": cfg, "output_dir": Path(output_dir), "target": target_engine_dir, "draft": draft_engine_dir,
             "version": trtllm_version, "kv": kv_cache_fractions, "final_dir": final_dir}
        )  # fmt: skip
        return real(cfg, output_dir, target_engine_dir=target_engine_dir, draft_engine_dir=draft_engine_dir,
                    trtllm_version=trtllm_version, kv_cache_fractions=kv_cache_fractions, final_dir=final_dir)

    monkeypatch.setattr(repository, "generate_repository", generate_repository)
    return {"calls": calls, "generated": generated, "tmp": tmp_path}


def tiny_config(tmp_path: Path, **extra) -> dict:
    t = make_checkpoint(tmp_path / "models" / "target", SMOLLM2_135M)
    d = make_checkpoint(tmp_path / "models" / "draft", SMOLLM2_DRAFT)
    return {
        "name": "tiny",
        "engine": "tensorrt_llm",
        "target": {"checkpoint": str(t), "dtype": "bfloat16", "tp_size": 2},
        "draft": {"checkpoint": str(d), "dtype": "bfloat16", "quantization": "fp8"},
        "speculative": {"max_draft_len": 4, "num_draft_tokens": 3},
        "limits": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 320},
        "tensorrt_llm_version": "1.1.0",
        **extra,
    }


def machine():
    m = synthetic_machine("h100x2")
    m.software_checked = True
    m.tensorrt_llm_version = "1.1.0"
    m.trtllm_build = Tool("trtllm-build", "1.1.0")
    return m


def new_plan(tmp_path: Path, data: dict):
    cfg = parse_config(data, source_dir=tmp_path)
    return make_plan(cfg, tmp_path / "out", machine(), tools=Tools.from_env())


def run(plan, **kw):
    buf = io.StringIO()
    console = Console(file=buf, width=200, highlight=False, force_terminal=False)
    try:
        return Runner(plan, console=console, **kw).run(), buf.getvalue()
    except StepFailed as e:
        e.output = buf.getvalue()  # type: ignore[attr-defined]
        raise


def calls(env) -> list[dict]:
    lines = env["calls"].read_text().splitlines()
    env["calls"].write_text("")
    return [json.loads(x) for x in lines]


def steps_run(env) -> list[str]:
    out = []
    for c in calls(env):
        o = c["output_dir"]
        role = "target" if "/target" in o else "draft"
        kind = {"trtllm-build": "build", "quantize.py": "quantize", "convert_checkpoint.py": "convert"}[c["tool"]]
        out.append(f"{kind}-{role}")
    return out


# -------------------------------------------------------------------------------------------- tests


def test_failed_step_leaves_nothing_finished_and_rerun_resumes_there(tmp_path, env, monkeypatch) -> None:
    data = tiny_config(tmp_path)
    out = tmp_path / "out"
    monkeypatch.setenv("STANDIN_FAIL", "engines/target")
    plan = new_plan(tmp_path, data)
    assert [s.name for s in plan.steps] == ["preflight", "convert-target", "quantize-draft", "build-target", "build-draft", "repository"]  # fmt: skip
    with pytest.raises(StepFailed) as ei:
        run(plan)
    assert ei.value.step == "build-target"
    printed = ei.value.output  # type: ignore[attr-defined]
    assert "stand-in failure requested" in printed and "full log:" in printed and "Last" in printed
    assert steps_run(env) == ["convert-target", "quantize-draft", "build-target"]
    # The failed step: no done record, no final output, no partial left behind; its log kept.
    assert not (out / ".steps" / "build-target.done.json").exists()
    assert not (out / "engines" / "target").exists()
    assert not list((out / "engines").glob("target.partial-*"))
    assert "stand-in failure requested" in (out / "logs" / "build-target.log").read_text()
    # The finished ones are marked done.
    assert (out / ".steps" / "convert-target.done.json").is_file()
    assert (out / "checkpoints" / "target" / "rank1.safetensors").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    status = {s["name"]: s["status"] for s in manifest["steps"]}
    assert status == {"preflight": "done", "convert-target": "done", "quantize-draft": "done", "build-target": "failed", "build-draft": "pending", "repository": "pending"}  # fmt: skip

    # Re-run: resumes at build-target, skips the conversions.
    monkeypatch.delenv("STANDIN_FAIL")
    plan = new_plan(tmp_path, data)
    assert [s.name for s in plan.steps if s.up_to_date] == ["convert-target", "quantize-draft"]
    result, printed = run(plan)
    assert steps_run(env) == ["build-target", "build-draft"]
    assert "convert-target: up to date, skipped" in printed
    assert [r.status for r in result.results] == ["done", "skipped", "skipped", "done", "done", "done"]
    assert sorted(p.name for p in (out / "engines" / "target").iterdir()) == ["config.json", "rank0.engine", "rank1.engine"]
    assert result.repository == out / "model_repository" and (out / "model_repository" / ENSEMBLE / "config.pbtxt").is_file()

    # The manifest: versions, GPUs, each step's argv, duration and outputs, engine sizes.
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["versions"]["tensorrt_llm"] == "1.1.0" and manifest["versions"]["trtspec"]
    assert manifest["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    by_name = {s["name"]: s for s in manifest["steps"]}
    assert all(s["status"] in ("done", "skipped") for s in manifest["steps"])
    assert by_name["build-target"]["argv"][0] == "trtllm-build"
    assert "--speculative_decoding_mode" in by_name["build-target"]["argv"]
    assert all(isinstance(by_name[n]["duration_s"], float) for n in by_name if n != "preflight")
    assert by_name["convert-target"]["outputs"][str(out / "checkpoints" / "target")] > 0
    assert manifest["engines"]["target"]["size_bytes"] == sum(f.stat().st_size for f in (out / "engines" / "target").iterdir())
    assert manifest["engines"]["draft"]["files"]["rank0.engine"] == 1000
    assert manifest["placement"] == {"target": [0, 1], "draft": [0]}
    assert set(manifest["kv_cache_free_gpu_mem_fraction"]) == {"target", "draft"}


def test_rerun_skips_everything_force_reruns_only_runs_one(tmp_path, env) -> None:
    data = tiny_config(tmp_path)
    run(new_plan(tmp_path, data))
    assert steps_run(env) == ["convert-target", "quantize-draft", "build-target", "build-draft"]
    assert len(env["generated"]) == 1

    plan = new_plan(tmp_path, data)
    assert all(s.up_to_date for s in plan.steps if s.name != "preflight")
    result, _ = run(plan)
    assert steps_run(env) == [] and len(env["generated"]) == 1
    assert [r.status for r in result.results][1:] == ["skipped"] * 5

    run(new_plan(tmp_path, data), force=True)
    assert steps_run(env) == ["convert-target", "quantize-draft", "build-target", "build-draft"]

    run(new_plan(tmp_path, data), only="build-draft")
    assert steps_run(env) == ["build-draft"]
    # The rebuilt draft engine makes the repository out of date, nothing else.
    plan = new_plan(tmp_path, data)
    assert [s.name for s in plan.steps if not s.up_to_date] == ["preflight", "repository"]


def test_changed_inputs_rerun_only_what_depends_on_them(tmp_path, env) -> None:
    data = tiny_config(tmp_path)
    run(new_plan(tmp_path, data))
    calls(env)
    # A new draft checkpoint (config.json changed): the draft's steps and the repository rerun.
    cfgfile = tmp_path / "models" / "draft" / "config.json"
    cfgfile.write_text(json.dumps({**SMOLLM2_DRAFT, "rms_norm_eps": 1e-6}))
    run(new_plan(tmp_path, data))
    assert steps_run(env) == ["quantize-draft", "build-draft"]
    # Another max_draft_len: only the target engine is rebuilt (the draft's argv, max_num_tokens included,
    # is unchanged here).
    data2 = {**data, "speculative": {"max_draft_len": 6, "num_draft_tokens": 3}}
    plan = new_plan(tmp_path, data2)
    assert [s.name for s in plan.steps if not s.up_to_date] == ["preflight", "build-target", "repository"]
    run(plan)
    assert steps_run(env) == ["build-target"]


def test_a_lost_done_record_means_not_done(tmp_path, env) -> None:
    data = tiny_config(tmp_path)
    run(new_plan(tmp_path, data))
    calls(env)
    # As if the process died between renaming the output and writing the record.
    (tmp_path / "out" / ".steps" / "build-draft.done.json").unlink()
    plan = new_plan(tmp_path, data)
    assert not plan.step("build-draft").up_to_date and (tmp_path / "out" / "engines" / "draft").exists()
    run(plan)
    assert steps_run(env) == ["build-draft"]


def test_tool_that_exits_zero_without_its_outputs_fails(tmp_path, env, monkeypatch) -> None:
    monkeypatch.setenv("STANDIN_SKIP_RANK1", "1")
    with pytest.raises(StepFailed, match="lacks rank1.safetensors"):
        run(new_plan(tmp_path, tiny_config(tmp_path)))
    assert not (tmp_path / "out" / "checkpoints" / "target").exists()
    assert not (tmp_path / "out" / ".steps" / "convert-target.done.json").exists()


def test_steps_get_their_gpus_and_validated_argv(tmp_path, env) -> None:
    run(new_plan(tmp_path, tiny_config(tmp_path)))
    seen = {(c["tool"], c["cuda"]) for c in calls(env)}
    assert seen == {("convert_checkpoint.py", "0,1"), ("quantize.py", "0"), ("trtllm-build", "0,1"), ("trtllm-build", "0")}


def test_repository_step_gets_engines_placement_and_kv_fractions(tmp_path, env) -> None:
    run(new_plan(tmp_path, tiny_config(tmp_path)))
    g = env["generated"][-1]
    out = tmp_path / "out"
    assert g["target"] == out / "engines" / "target" and g["draft"] == out / "engines" / "draft"
    assert g["version"] == "1.1.0" and set(g["kv"]) == {"target", "draft"}
    assert g["cfg"].target.gpu_device_ids == [0, 1] and g["cfg"].draft.gpu_device_ids == [0]  # placement filled in
    assert ".partial-" in str(g["output_dir"])  # generated in a staging dir, renamed on success


def test_reference_engine_is_preflight_then_repository(tmp_path, env) -> None:
    t = make_checkpoint(tmp_path / "t", SMOLLM2_135M)
    d = make_checkpoint(tmp_path / "d", SMOLLM2_DRAFT)
    data = {"name": "ref", "engine": "reference", "device": "cpu", "target": {"checkpoint": str(t)}, "draft": {"checkpoint": str(d)}}
    cfg = parse_config(data)
    plan = make_plan(cfg, tmp_path / "out", synthetic_machine("none"), tools=Tools.from_env())
    result, _ = run(plan)
    assert [r.status for r in result.results] == ["done", "done"]
    g = env["generated"][-1]
    assert g["target"] is None and g["draft"] is None and g["version"] is None and g["kv"] is None
    assert (tmp_path / "out" / "model_repository" / "preprocessing" / "config.pbtxt").is_file()
    assert steps_run(env) == []


def test_preflight_errors_stop_the_build_before_any_tool(tmp_path, env) -> None:
    data = tiny_config(tmp_path)
    data["draft"]["checkpoint"] = str(make_checkpoint(tmp_path / "models" / "bad", {**SMOLLM2_DRAFT, "vocab_size": 32000}))
    with pytest.raises(StepFailed, match="vocab-mismatch"):
        run(new_plan(tmp_path, data))
    assert steps_run(env) == []
    assert json.loads((tmp_path / "out" / "preflight.json").read_text())["ok"] is False


def test_cli_build_failure_then_resume(tmp_path, env, monkeypatch) -> None:
    cfg = write_config(tmp_path / "tiny.yaml", tiny_config(tmp_path))
    out = tmp_path / "cli-out"
    args = ["build", str(cfg), "-o", str(out), "--gpus", "h100x2", "--ignore-preflight", "tensorrt-llm-missing"]
    monkeypatch.setenv("STANDIN_FAIL", "engines/draft")
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1, res.output
    text = squash(res.output)
    assert "step build-draft failed: exited with code 1" in text and "build-draft.log" in text
    assert "Traceback" not in res.output
    monkeypatch.delenv("STANDIN_FAIL")
    calls(env)
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert steps_run(env) == ["build-draft"]
    assert "trtspec serve" in squash(res.output)
    plan = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)
    assert [s["up_to_date"] for s in plan] == [False, True, True, True, True, True]
    res = CliRunner().invoke(cli, [*args, "--only", "quantize-target"])
    assert res.exit_code == 1 and "no step 'quantize-target'" in squash(res.output)


def test_with_the_real_repository_generator(tmp_path, env, monkeypatch) -> None:
    """Engine dirs, placement and KV fractions land in the tensorrt_llm-flavour configs, which parse with Triton's
    ModelConfig protobuf."""
    from trtspec import repository

    plan = new_plan(tmp_path, tiny_config(tmp_path))
    result, _ = run(plan)
    models = repository.list_models(result.repository)
    out = tmp_path / "out"

    def params(name: str) -> dict[str, str]:
        return {k: v.string_value for k, v in models[name].parameters.items()}

    t, d = params("tensorrt_llm"), params("tensorrt_llm_draft")
    assert t["gpt_model_path"] == str((out / "engines" / "target").resolve())
    assert d["gpt_model_path"] == str((out / "engines" / "draft").resolve())
    assert t["gpu_device_ids"] == "0,1" and d["gpu_device_ids"] == "0"
    assert float(t["kv_cache_free_gpu_mem_fraction"]) == plan.preflight.kv_fractions["target"]
    assert float(d["kv_cache_free_gpu_mem_fraction"]) == plan.preflight.kv_fractions["draft"]
    assert not list(out.glob("model_repository.partial*"))


def test_sigterm_mid_step_stops_the_tool_and_leaves_nothing_finished(tmp_path, env, monkeypatch) -> None:
    import signal
    import threading
    import time

    pidfile = tmp_path / "standin.pid"
    monkeypatch.setenv("STANDIN_HANG", "engines/draft")
    monkeypatch.setenv("STANDIN_PID", str(pidfile))

    def stop_when_started() -> None:
        for _ in range(200):
            if pidfile.exists() and pidfile.read_text():
                os.kill(os.getpid(), signal.SIGTERM)  # as `docker stop` does
                return
            time.sleep(0.05)

    threading.Thread(target=stop_when_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run(new_plan(tmp_path, tiny_config(tmp_path)))
    out = tmp_path / "out"
    child = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the tool was stopped, not orphaned
    assert not (out / "engines" / "draft").exists() and not list((out / "engines").glob("draft.partial-*"))
    assert not (out / ".steps" / "build-draft.done.json").exists()
    assert (out / ".steps" / "build-target.done.json").exists()
    # The next run resumes at the interrupted step.
    monkeypatch.delenv("STANDIN_HANG")
    calls(env)
    run(new_plan(tmp_path, tiny_config(tmp_path)))
    assert steps_run(env) == ["build-draft"]
