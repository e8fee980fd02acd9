"""Compiled GEMM kernels (reference_engine.compiled_linear, device.LINEAR_KERNELS "compiled") on a tiny Llama:
same products as nn.Linear, a row bitwise the same at any row count, the engine's greedy tokens unchanged, and a
missing, stale or half-written kernel directory falls back to the default kernels with a log line.

The kernels compile into the machine's kernel cache (compiled_linear.cache_dir(), what `trtspec build` fills):
one shape, ~20 s the first time on a 2-core machine, nothing after."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trtspec.reference_engine import EngineRequest, ReferenceEngine, compiled_linear, device, packed_linear
from trtspec.reference_engine.compiled_linear import CompiledLinear

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="torch built without oneDNN")


# Every product of the tiny model is D x D: the decoder and the head share one kernel, which keeps the compile to one
# shape; and D is the demo pair's hidden size, so that kernel is one of the demo's five (a suite that runs the demo
# after this module compiles one shape fewer there).
D = 576


def _tiny_llama(path):
    """Like conftest.make_tiny_llama, with every product D x D (4 KV heads, intermediate D, D tokens)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=D, hidden_size=D, intermediate_size=D, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernels are the served setting's: one torch thread per engine
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, one_thread):
    path = _tiny_llama(tmp_path_factory.mktemp("tiny"))
    model = LlamaForCausalLM.from_pretrained(path)
    assert compiled_linear.linear_shapes(model) == [(D, D)]
    compiled_linear.compile_kernels(compiled_linear.linear_shapes(model), compiled_linear.cache_dir())
    return path


@pytest.fixture
def kernels(monkeypatch):
    monkeypatch.setattr(device, "LINEAR_KERNELS", "compiled")
    return compiled_linear.cache_dir()


def test_compiled_linear_matches_linear_and_a_row_is_the_same_at_any_row_count(tiny):
    kernel = compiled_linear.load_manifest(compiled_linear.cache_dir())[D, D]
    torch.manual_seed(1)
    lin = torch.nn.Linear(D, D, bias=False)
    compiled = CompiledLinear(lin, kernel)
    x = torch.randn(1, 40, D)
    with torch.inference_mode():
        full = compiled(x)
        torch.testing.assert_close(full, lin(x), rtol=1e-5, atol=1e-5)
        for rows in (1, 2, 5, 9, 17):
            assert torch.equal(compiled(x[:, :rows]), full[:, :rows])
        assert compiled(x[:, :0]).shape == (1, 0, D)  # no rows: no kernel call (its blocking divides by the row count)


def test_engine_on_compiled_kernels_keeps_greedy_tokens(tiny, kernels, caplog, monkeypatch):
    caplog.set_level("INFO", logger="trtspec.reference_engine")
    engine = ReferenceEngine(tiny, device="cpu", dtype="float32")
    assert "14 Linear layers on compiled GEMM kernels" in caplog.text
    layers = [m for m in engine.model.modules() if isinstance(m, CompiledLinear)]
    assert len(layers) == 2 * 7 and isinstance(engine._head, CompiledLinear)
    assert not any(type(m) is torch.nn.Linear and m is not engine.model.lm_head for m in engine.model.modules())
    monkeypatch.setattr(device, "LINEAR_KERNELS", "mkl+onednn")
    reference = ReferenceEngine(tiny, device="cpu", dtype="float32")
    for prompt in ([0, 3, 5], [0, 7, 2, 9, 4, 4]):
        req = EngineRequest(input_ids=prompt, output_len=10, return_generation_logits=True)
        got, want = engine.run(req), reference.run(req)
        assert got.tokens == want.tokens
        assert abs(got.generation_logits - want.generation_logits).max() < 1e-4
        # a verify of its own continuation accepts every token, with the decode's bonus token
        new = got.new_tokens
        v = engine.run(EngineRequest(input_ids=prompt, output_len=1, draft_ids=new[:-1]))
        assert v.num_accepted == len(new) - 1 and v.new_tokens == new


def test_on_compiled_kernels_a_positions_logits_are_bitwise_the_same_in_a_decode_a_verify_and_a_batch(tiny, kernels, monkeypatch):
    from trtspec.reference_engine.ragged import Segment
    from trtspec.reference_engine.kv_cache import new_cache

    assert not ReferenceEngine(tiny, device="cpu", dtype="float32").batch_invariant  # the default: one attention call
    monkeypatch.setattr(device, "BATCH_INVARIANT_ATTENTION", True)  # TRTSPEC_BATCH_INVARIANT=1
    engine = ReferenceEngine(tiny, device="cpu", dtype="float32")
    assert engine.batch_invariant
    prompt = [0, 7, 2, 9, 4]
    solo = engine.run(EngineRequest(input_ids=prompt, output_len=5, return_generation_logits=True))
    engine.cache = type(engine.cache)(engine.cache.max_entries, engine.cache.max_bytes)  # the verify's own prefill
    v = engine.run(EngineRequest(input_ids=prompt, output_len=1, draft_ids=solo.new_tokens[:4], return_generation_logits=True))
    assert v.num_accepted == 4 and (v.generation_logits == solo.generation_logits).all()
    # one step of 6 sequences together (a 4-token verify among 1-token rows) against each alone
    seqs = [prompt[:2 + i] + solo.new_tokens[:i] for i in range(6)]

    def segments():
        out = []
        for i, s in enumerate(seqs):
            n = 4 if i == 2 else 1
            seg = Segment(new_cache(engine.model.config), s[:-n], 0, 0)
            engine.forward([seg])
            out.append(Segment(seg.cache, s[-n:], len(s) - n, n))
        return out
    together = segments()
    engine.forward(together)
    alone = segments()
    for seg in alone:
        engine.forward([seg])
    assert all(torch.equal(a.logits, t.logits) for a, t in zip(alone, together))


@pytest.mark.parametrize("broken", ["missing", "stale", "half-written"])
def test_missing_stale_or_half_written_kernels_fall_back_with_a_log_line(tiny, kernels, tmp_path, caplog, broken, monkeypatch):
    directory = tmp_path / "kernels"
    if broken == "stale":
        compiled_linear.compile_kernels([], directory)  # nothing to compile: no directory
        directory.mkdir()
        (directory / compiled_linear.MANIFEST).write_text(json.dumps({"format": compiled_linear.FORMAT, "environment": "another-cpu", "kernels": []}))
    elif broken == "half-written":
        def fail(out, inp, workdir):
            raise KeyboardInterrupt
        monkeypatch.setattr(compiled_linear, "_compile_one", fail)
        with pytest.raises(KeyboardInterrupt):
            compiled_linear.compile_kernels([(D, D)], directory)
        assert not (directory / compiled_linear.MANIFEST).exists()
    engine = ReferenceEngine(tiny, device="cpu", dtype="float32", kernel_dir=directory)
    err = "\n".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "compiled GEMM kernels not used" in err and ("stale" in err if broken == "stale" else "missing" in err)
    assert "mkl+onednn instead" in err
    assert any(isinstance(m, packed_linear.PackedLinear) for m in engine.model.modules())
    assert not any(isinstance(m, CompiledLinear) for m in engine.model.modules())


def test_a_kernel_that_fails_in_a_worker_process_names_its_shape_and_leaves_nothing_finished(tmp_path):
    """Several missing shapes compile in worker processes; a worker's failure (here: shapes no Linear can have,
    refused at once) is raised naming the shape, and leaves no manifest, library or work directory behind."""
    directory = tmp_path / "kernels"
    with pytest.raises(RuntimeError, match=r"compiling the -[12]x32 GEMM kernel failed: .*negative dimension"):
        compiled_linear.compile_kernels([(-1, 32), (-2, 32)], directory, log=lambda m: None, workers=2)
    assert list(directory.iterdir()) == []


def test_build_compiles_the_kernels_into_the_deployment_and_the_repository_points_the_engine_at_them(tiny, tmp_path):
    from trtspec.config import parse_config
    from trtspec.machine import synthetic_machine
    from trtspec.pipeline.plan import make_plan
    from trtspec.repository import generate_repository, list_models

    data = {"name": "ref", "engine": "reference", "device": "cpu", "speculative": {"draft_source": "ngram"},
            "target": {"checkpoint": str(tiny), "dtype": "float32", "linear_kernels": "compiled"}}
    cfg = parse_config(data)
    out = tmp_path / "out"
    plan = make_plan(cfg, out, synthetic_machine("none"))
    step = plan.step("compile-kernels")
    assert step.outputs == [out / "kernels"] and step.expect == ["kernels.json"]
    assert step.argv[1:] == ["-m", "trtspec.reference_engine.compiled_linear", str(out / "kernels"), str(tiny)]
    assert "compile-kernels" in plan.step("repository").depends_on
    compiled_linear.build(out / "kernels", [tiny])  # what the step runs (cached kernels: no compile here)
    assert set(compiled_linear.load_manifest(out / "kernels")) == {(D, D)}
    repo = generate_repository(cfg, out / "model_repository", kernel_dir=out / "kernels")
    params = {k: v.string_value for k, v in list_models(repo)["tensorrt_llm"].parameters.items()}
    assert params["linear_kernels"] == "compiled" and params["kernel_dir"] == str((out / "kernels").resolve())
    # the default adds nothing: no step, no parameters
    plain = parse_config({**data, "target": {"checkpoint": str(tiny), "dtype": "float32"}})
    assert "compile-kernels" not in [s.name for s in make_plan(plain, tmp_path / "plain", synthetic_machine("none")).steps]
    # on a GPU torch's CUDA kernels run: nothing to compile, and doctor says so
    on_gpu = parse_config({**data, "device": "cuda"})
    assert device.roles_to_compile(cfg) == ["target"] and device.roles_to_compile(on_gpu) == []
    assert "CUDA kernels" in device.describe_linear_kernels("compiled", tiny, out / "kernels", "cuda")


def test_linear_kernels_is_refused_outside_the_reference_engine(tiny):
    from trtspec.config import ConfigError, parse_config

    with pytest.raises((ConfigError, ValueError), match="linear_kernels applies to engine: reference"):
        parse_config({"name": "x", "engine": "tensorrt_llm", "speculative": {"draft_source": "ngram"}, "target": {"checkpoint": str(tiny), "dtype": "float16",
                                                                          "linear_kernels": "compiled"}}, check_paths=False)


def test_an_engine_serves_with_one_torch_thread_on_a_cpu_unless_told_otherwise():
    from trtspec.reference_engine.device import CPU_THREADS_PER_ENGINE, serving_threads

    assert serving_threads("cpu", {}) == CPU_THREADS_PER_ENGINE == 1
    assert serving_threads("cuda", {}) is None  # a GPU's engine: torch's default
    assert serving_threads("cpu", {"TRTSPEC_TORCH_THREADS": "2"}) == 2
    assert serving_threads("cpu", {"TRTSPEC_TORCH_THREADS": "0"}) is None


@pytest.mark.slow
def test_a_served_engine_runs_on_the_deployments_compiled_kernels(tiny, kernels, tmp_path, monkeypatch):
    """Through Triton: the model process loads <out>/kernels; its logits are bitwise those of an in-process engine
    on the same kernels (other kernels differ in the last bits). Nothing in the server's environment sets its
    threads: a CPU engine serves with one whoever starts it (with torch's default, `trtspec serve` of a built
    repository ran without the kernels, 2.5x slower per token than the bench measured)."""
    import numpy as np
    import engine_client

    from trtspec.config import parse_config
    from trtspec.repository import generate_repository
    from trtspec.server import ServerOptions, create_server

    cfg = parse_config({"name": "compiled", "engine": "reference", "device": "cpu", "speculative": {"draft_source": "ngram"},
                        "target": {"checkpoint": str(tiny), "dtype": "float32", "linear_kernels": "compiled"},
                        "limits": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 80}})
    compiled_linear.build(tmp_path / "kernels", [tiny])
    repo = generate_repository(cfg, tmp_path / "model_repository", kernel_dir=tmp_path / "kernels")
    prompt, n = [0, 7, 2, 9, 4], 6
    local = ReferenceEngine(tiny, device="cpu", dtype="float32", kernel_dir=tmp_path / "kernels")
    want = local.run(EngineRequest(input_ids=prompt, output_len=n, return_generation_logits=True))
    monkeypatch.setattr(device, "LINEAR_KERNELS", "mkl+onednn")
    other = ReferenceEngine(tiny, device="cpu", dtype="float32").run(EngineRequest(input_ids=prompt, output_len=n, return_generation_logits=True))
    assert not np.array_equal(other.generation_logits, want.generation_logits)  # the check below can tell them apart
    monkeypatch.delenv("TRTSPEC_TORCH_THREADS", raising=False)
    opts = ServerOptions(repo, http_port="auto", grpc_port="auto", metrics_port="auto",
                         model_control_mode="explicit", load_models=["tensorrt_llm"])
    with create_server(opts) as s:
        s.wait_ready(300)
        r = engine_client.infer(s.endpoints.grpc_address, "tensorrt_llm", engine_client.inputs({
            "input_ids": np.array([prompt], np.int32), "input_lengths": np.array([[len(prompt)]], np.int32),
            "request_output_len": np.array([[n]], np.int32), "return_generation_logits": np.array([[True]])}))
    got = r.as_numpy("generation_logits")[0, 0]
    assert np.array_equal(got, want.generation_logits)
