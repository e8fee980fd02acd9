"""Shared fixtures: real models (a tiny one made here, the demo pair), real repositories, real servers."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# `-m "not slow"` skips every test that starts Triton (README): a test that starts tritonserver without the marker
# fails, here, in its setup or its call
_running = {"slow": True, "test": ""}


def pytest_runtest_setup(item):  # before the item's fixtures: a module-scoped server starts in the setup of its first test
    _running.update(slow=item.get_closest_marker("slow") is not None, test=item.nodeid)


_popen_init = subprocess.Popen.__init__


def _is_tritonserver(program: str) -> bool:
    """The tritonserver binary (a test's stand-in script of that name is not)."""
    import shutil

    path = shutil.which(program) if Path(program).name == "tritonserver" else None
    try:
        return path is not None and Path(path).read_bytes()[:4] == b"\x7fELF"
    except OSError:
        return False


def _popen_init_unless_triton_in_a_fast_test(self, args, *rest, **kwargs):
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    if argv and not _running["slow"] and _is_tritonserver(os.fsdecode(argv[0])):
        raise AssertionError(f"{_running['test']} starts tritonserver: mark it @pytest.mark.slow")
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _popen_init_unless_triton_in_a_fast_test


def make_tiny_llama(path: Path, vocab: int = 12, layers: int = 2, seed: int = 0) -> Path:
    """A small random Llama the tests make themselves: real model code, milliseconds per forward."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # sharpen the output layer so distributions are far from uniform
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-target"), seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-draft"), layers=1, seed=1)


@pytest.fixture(scope="session")
def demo_pair():
    from trtspec.demo_pair import prepare_demo_pair

    return prepare_demo_pair()


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (the engine warns where it does not, and bf16 is slow there)."""
    from trtspec.reference_engine.device import choose_precision

    return choose_precision("bfloat16", "cpu").warning is None


def step_together(engine, reqs):
    """Steps every request in one forward per step (the scheduler's in-flight batching, without its thread): each
    request's results, in order."""
    gens = [engine.steps(r) for r in reqs]
    segs = {i: next(g) for i, g in enumerate(gens)}
    results = {}
    while segs:
        engine.forward(list(segs.values()))
        for i in list(segs):
            try:
                segs[i] = gens[i].send(None)
            except StopIteration as done:
                results[i] = done.value
                del segs[i]
    return [results[i] for i in range(len(reqs))]


def loop_settings(*, draft_disabled: bool = False, max_input_len: int = 2048, **speculative):
    """LoopSettings as a deployment would get them; `speculative` are build-config `speculative:` fields. The policy
    is fixed unless asked for: these tests drive a given k (the controller's own tests ask for adaptive)."""
    from trtspec.config import SpeculativeConfig
    from trtspec.spec.loop import LoopSettings

    speculative.setdefault("draft_length_policy", "fixed")
    return LoopSettings(
        speculative=SpeculativeConfig(**speculative), max_input_len=max_input_len, draft_disabled=draft_disabled
    )



def engine_call(engines):
    """The loop's `call` straight to in-process ReferenceEngine objects, through the engine model's own tensor
    request/response code (as the BLS calls it); a model not in `engines` is one that is not ready."""
    from trtspec.spec.loop import EngineCallError
    from trtspec.reference_engine import run_tensors

    def call(model, t, wanted):
        if model not in engines:
            raise EngineCallError(f"{model} is not ready")
        return run_tensors(engines[model], t)

    return call


def load_script(name: str):
    """scripts/NAME.py imported as a module (the scripts are not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ECHO_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
ECHO_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def write_python_model(repo: Path, name: str, config: str, model_py: str) -> None:
    """A Python-backend model `name` (version 1) in the repository at `repo`."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(model_py))


def write_echo_repository(root: Path) -> Path:
    """A one-model repository (`echo`: Y = X) for tests of the server itself, not of the models."""
    write_python_model(root, "echo", ECHO_CONFIG, ECHO_MODEL)
    return root


# The demo pair on the reference engine, one Triton for the session: test_bench (a bench sweep), test_openai_api (its
# OpenAI front end on top) and test_serving (Triton's own endpoints) test different faces of the same deployment, and
# a server start costs ~20 s.
# Tests on it measure counters as deltas and leave every model loaded when they end.
DEMO_PAIR_DEPLOYMENT = {
    "name": "test",
    "engine": "reference",
    "device": "cpu",
    "target": {"checkpoint": "demo:target", "dtype": "float32"},
    # the trained demo draft; TRTSPEC_TEST_DRAFT points the suite at another draft checkpoint
    "draft": {"checkpoint": os.environ.get("TRTSPEC_TEST_DRAFT", "demo:draft"), "dtype": "float32"},
    # fixed: the tests count drafts of a given k; a request asks for adaptive where it tests the controller
    "speculative": {"max_draft_len": 8, "num_draft_tokens": 3, "draft_length_policy": "fixed"},
    "limits": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 320},
    "triton": {"speculative_instance_count": 1},
}


@pytest.fixture(scope="session")
def demo_pair_server(tmp_path_factory):
    """A real Triton serving DEMO_PAIR_DEPLOYMENT (its repository: ``.options.model_repository``), with explicit model
    control so that a test can unload the draft mid-run."""
    from trtspec.config import parse_config
    from trtspec.repository import generate_repository
    from trtspec.server import ServerOptions, create_server

    repo = generate_repository(parse_config(DEMO_PAIR_DEPLOYMENT),
                               tmp_path_factory.mktemp("demo-pair") / "model_repository")
    # exit timeout 3 s: nothing is in flight at the session's end, and a stop that hangs (docs/benchmarks/ci.md,
    # "Found, not fixed") otherwise waits out Triton's default 10 s
    opts = ServerOptions(repo, http_port="auto", grpc_port="auto", metrics_port="auto",
                         model_control_mode="explicit", load_models=["*"], exit_timeout_s=3)
    with create_server(opts) as s:
        s.wait_ready(300)
        yield s
