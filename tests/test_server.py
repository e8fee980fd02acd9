"""trtspec.server: a real tritonserver (the nvidia-pytriton one on CPU machines) with tiny Python-backend models,
plus the argv/env of the TensorRT-LLM launch modes and the `serve` command."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import write_python_model
from trtspec.server import (
    LocalTritonServer,
    ServerError,
    ServerOptions,
    ServerStartError,
    TritonNotFoundError,
    TrtllmTritonServer,
    failed_models_from_log,
    find_tritonserver,
    plan_launch,
    prepare_bundled_backends,
    read_repository,
    run_launch,
)
from trtspec.server.base import interesting_lines
from trtspec.processes import process_group_members
from trtspec.server.installation import bundled_tritonserver_root, trtspec_import_root

AUTO = dict(http_port="auto", grpc_port="auto", metrics_port="auto")

# ---------------------------------------------------------------------------------------------------------------
# Tiny model repositories

ADD_CONFIG = """
backend: "python"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 2 ] }
]
output [
  { name: "SUM" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

ADD_MODEL = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils  # first: importing it runs trtspec's sys.path hook


class TritonPythonModel:
    def initialize(self, args):
        try:
            import tinyhelper  # from ServerOptions.pythonpath
            helper = tinyhelper.VALUE
        except ImportError:
            helper = "no-helper"
        try:
            import trtspec  # the package under test, from the checkout
            version = trtspec.__version__
        except ImportError:
            version = "no-trtspec"
        self.info = f"{helper}|{version}|{os.environ.get('TRTSPEC_TEST_MARK')}"

    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "B").as_numpy()
            info = np.array([[self.info.encode()]] * a.shape[0], dtype=object)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", a + b), pb_utils.Tensor("INFO", info)]))
        return out
'''

STREAM_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

STREAM_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            for i in range(3):
                out = pb_utils.Tensor("OUT", np.array([n * 10 + i], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

BROKEN_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

BROKEN_MODEL = '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("boom: broken on purpose")
'''


def _tritonserver_or_skip(cache_dir: Path):
    try:
        return find_tritonserver(cache_dir=cache_dir)
    except TritonNotFoundError as e:
        pytest.skip(f"no tritonserver: {e}")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trtspec-cache")
    _tritonserver_or_skip(path)
    return path


@pytest.fixture(scope="module")
def helper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pyhelper")
    (d / "tinyhelper.py").write_text("VALUE = 'helper-ok'\n")
    return d


@pytest.fixture(scope="module")
def good_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    write_python_model(repo, "add", ADD_CONFIG, ADD_MODEL)
    write_python_model(repo, "stream3", STREAM_CONFIG, STREAM_MODEL)
    return repo


@pytest.fixture(scope="module")
def broken_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("broken-repo")
    write_python_model(repo, "stream3", STREAM_CONFIG, STREAM_MODEL)
    write_python_model(repo, "bad", BROKEN_CONFIG, BROKEN_MODEL)
    return repo


@pytest.fixture(scope="module")
def server(good_repo: Path, cache_dir: Path, helper_dir: Path):
    srv = LocalTritonServer(
        ServerOptions(
            good_repo, **AUTO, cache_dir=cache_dir, pythonpath=[helper_dir],
            extra_env={"TRTSPEC_TEST_MARK": "mark-ok"},
        )
    )
    srv.start()
    try:
        srv.wait_ready(60)
        yield srv
    finally:
        srv.stop()


# ---------------------------------------------------------------------------------------------------------------
# A real server


@pytest.mark.slow
def test_ready_models_and_metrics(server: LocalTritonServer) -> None:
    import urllib.request

    ep = server.endpoints
    assert len({ep.http_port, ep.grpc_port, ep.metrics_port}) == 3
    assert server.is_ready() and server.returncode is None
    states = {m["name"]: m["state"] for m in server.models()}
    assert states == {"add": "READY", "stream3": "READY"}
    with urllib.request.urlopen(ep.metrics, timeout=5) as r:
        assert b"nv_inference_request_success" in r.read()


@pytest.mark.slow
def test_http_infer(server: LocalTritonServer) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.endpoints.http_address)
    a = np.array([[1, 2], [3, 4]], dtype=np.float32)
    b = np.array([[10, 20], [30, 40]], dtype=np.float32)
    inputs = [httpclient.InferInput("A", a.shape, "FP32"), httpclient.InferInput("B", b.shape, "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add", inputs)
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    # the Python model saw extra_env and, with the bundled tritonserver (whose stub runs this Python), imported
    # trtspec and a ServerOptions.pythonpath module (a system tritonserver's stub has its own Python)
    import trtspec

    info = result.as_numpy("INFO")[0, 0].decode()
    if server.installation.kind == "bundled":
        assert info == f"helper-ok|{trtspec.__version__}|mark-ok"
    else:
        assert info.endswith("|mark-ok")


@pytest.mark.slow
def test_grpc_infer(server: LocalTritonServer) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.endpoints.grpc_address)
    assert client.is_server_ready()
    a = np.array([[0.5, 1.5]], dtype=np.float32)
    inputs = [grpcclient.InferInput("A", a.shape, "FP32"), grpcclient.InferInput("B", a.shape, "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer("add", inputs)
    np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * a)
    client.close()


@pytest.mark.slow
def test_grpc_stream_decoupled(server: LocalTritonServer) -> None:
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.endpoints.grpc_address)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        inp = grpcclient.InferInput("N", [1], "INT32")
        inp.set_data_from_numpy(np.array([7], dtype=np.int32))
        client.async_stream_infer("stream3", [inp], request_id="r1", enable_empty_final_response=True)
        values = []
        while True:
            result, error = results.get(timeout=20)
            assert error is None, error
            response = result.get_response()
            if result.as_numpy("OUT") is not None:
                values.append(int(result.as_numpy("OUT")[0]))
            if response.parameters["triton_final_response"].bool_param:
                break
        assert values == [70, 71, 72]
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.slow
def test_broken_model_raises_with_name_and_log(broken_repo: Path, cache_dir: Path) -> None:
    srv = LocalTritonServer(broken_repo, **AUTO, cache_dir=cache_dir)
    srv.start()
    try:
        with pytest.raises(ServerStartError) as info:
            srv.wait_ready(60)
    finally:
        srv.stop()
    err = info.value
    assert "bad" in err.failed_models and "boom: broken on purpose" in err.failed_models["bad"]
    assert "stream3" not in err.failed_models
    msg = str(err)
    assert "Models that failed to load:" in msg and "- bad: " in msg and "model.py" in msg
    assert 5 <= len(err.log_lines) <= 40 and "Last" in msg and "  | " in msg
    assert err.returncode not in (None, 0)
    assert process_group_members(srv.pid) == []


@pytest.mark.slow
def test_failed_model_found_through_the_repository_index(broken_repo: Path, cache_dir: Path) -> None:
    # exit_on_error=False: Triton stays up (live, not ready); wait_ready asks v2/repository/index at once
    srv = LocalTritonServer(broken_repo, **AUTO, cache_dir=cache_dir, exit_on_error=False,
                            disable_auto_complete_config=True)
    srv.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(ServerStartError, match="up but not ready") as info:
            srv.wait_ready(60)
        assert time.monotonic() - t0 < 30
        assert srv.returncode is None  # still running: the caller decides
        assert list(info.value.failed_models) == ["bad"] and "boom" in info.value.failed_models["bad"]
        assert {m["name"]: m["state"] for m in srv.models()} == {"bad": "UNAVAILABLE", "stream3": "READY"}
    finally:
        srv.stop()
    assert process_group_members(srv.pid) == []


@pytest.mark.slow
def test_stop_leaves_no_process(good_repo: Path, cache_dir: Path, helper_dir: Path) -> None:
    options = ServerOptions(good_repo, **AUTO, cache_dir=cache_dir, pythonpath=[helper_dir],
                            disable_auto_complete_config=True, exit_timeout_s=5)
    with LocalTritonServer(options) as srv:
        pid = srv.pid
        assert pid is not None
        members = process_group_members(pid)
        assert pid in members and len(members) >= 3  # tritonserver + one stub per model instance
        prefix = srv._shm_prefix
        assert list(Path("/dev/shm").glob(f"{prefix}*"))
    assert srv.returncode == 0
    assert process_group_members(pid) == []
    for p in members:
        assert not Path(f"/proc/{p}").exists() or "Z" in Path(f"/proc/{p}/stat").read_text().split(")")[-1][:3]
    assert not list(Path("/dev/shm").glob(f"{prefix}*"))
    assert srv.stop() == 0  # idempotent


# ---------------------------------------------------------------------------------------------------------------
# No server needed


def test_bundled_backend_dir_has_stub_for_this_python(tmp_path: Path) -> None:
    root = bundled_tritonserver_root()
    if root is None:
        pytest.skip("nvidia-pytriton not installed")
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(prepare_bundled_backends(cache_dir=tmp_path)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1]
    dest = results[0]
    assert dest.parent == tmp_path / "triton-backends" and dest.name.endswith(f"-py{sys.version_info[0]}.{sys.version_info[1]}")
    stub = dest / "backends" / "python" / "triton_python_backend_stub"
    assert (dest / "backends" / "python" / "libtriton_python.so").is_file()
    assert stub.is_file() and os.access(stub, os.X_OK)
    assert [p.name for p in tmp_path.joinpath("triton-backends").iterdir()] == [dest.name]  # no temp leftovers
    mtime = stub.stat().st_mtime_ns
    assert prepare_bundled_backends(cache_dir=tmp_path) == dest and stub.stat().st_mtime_ns == mtime


def test_bundled_command_and_env(tmp_path: Path, helper_dir: Path) -> None:
    if bundled_tritonserver_root() is None:
        pytest.skip("nvidia-pytriton not installed")
    srv = LocalTritonServer(
        tmp_path, http_port=18000, grpc_port=18001, metrics_port=18002, tritonserver="bundled", cache_dir=tmp_path,
        model_control_mode="explicit", load_models=["a", "b"], log_verbose=1, pythonpath=[helper_dir],
        disable_auto_complete_config=True,
    )
    argv = srv.command()
    assert argv[0].endswith("pytriton/tritonserver/bin/tritonserver")
    backends = tmp_path / "triton-backends"
    for flag in (f"--model-repository={tmp_path.resolve()}", "--http-port=18000", "--grpc-port=18001",
                 "--metrics-port=18002", "--model-control-mode=explicit", "--load-model=a", "--load-model=b",
                 "--log-verbose=1", "--disable-auto-complete-config", "--exit-on-error=true"):
        assert flag in argv
    assert any(a.startswith(f"--backend-directory={backends}") and a.endswith("/backends") for a in argv)
    assert any(a.startswith("--backend-config=python,shm-region-prefix-name=trtspec") for a in argv)
    env = srv.environment({"PATH": "/usr/bin", "PYTHONPATH": "/old"})
    pythonpath = env["PYTHONPATH"].split(os.pathsep)
    assert pythonpath[0] == str(helper_dir.resolve()) and pythonpath[-1] == "/old"
    assert str(trtspec_import_root()) in pythonpath
    assert any(p.endswith("site-packages") for p in pythonpath)
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    # the stub ignores PYTHONPATH (-E): the same paths travel in variables the patched pb_utils reads
    assert env["TRTSPEC_STUB_PYTHONPATH"].split(os.pathsep)[0] == str(helper_dir.resolve())
    assert any(p.endswith("site-packages") for p in env["TRTSPEC_STUB_SITEDIRS"].split(os.pathsep))
    utils = next(backends.iterdir()) / "backends" / "python" / "triton_python_backend_utils.py"
    assert "TRTSPEC_STUB_PYTHONPATH" in utils.read_text().split("import numpy")[0]
    assert "nvidia_pytriton.libs" in env["LD_LIBRARY_PATH"].split(os.pathsep)[0]
    # a second server gets its own shm prefix
    other = LocalTritonServer(tmp_path, tritonserver="bundled", cache_dir=tmp_path)
    assert other._shm_prefix != srv._shm_prefix


def test_failed_models_from_log_lines() -> None:
    lines = [
        'E1121 06:07:11.671057 3231 model_lifecycle.cc:642] "failed to load \'env\' version 1: Internal: '
        "ModuleNotFoundError: No module named 'numpy'\\n\\nAt:\\n  /x/triton_python_backend_utils.py(30): <module>\\n\"",
        "| other | 1       | UNAVAILABLE: Internal: boom   |",
        "| fine  | 1       | READY                          |",
    ]
    failed = failed_models_from_log(lines)
    assert set(failed) == {"env", "other"}
    assert failed["env"].splitlines()[0] == "Internal: ModuleNotFoundError: No module named 'numpy'"
    assert "triton_python_backend_utils.py(30)" in failed["env"]
    assert failed["other"] == "Internal: boom"
    table = ["+---+", "| Option | Value |", "+---+", "| server_id | triton |", "+---+", "after",
             'I1 server.cc:345] "Timeout 29: Found 1 live models and 0 in-flight non-inference requests"']
    assert interesting_lines(table) == ["after"]


def test_missing_repository_is_a_clear_error(tmp_path: Path, cache_dir: Path) -> None:
    with pytest.raises(ServerStartError, match="does not exist"):
        LocalTritonServer(tmp_path / "nope", cache_dir=cache_dir).start()


# ---------------------------------------------------------------------------------------------------------------
# TensorRT-LLM launch modes (argv / env only)

TRTLLM_CONFIG = """
name: "{name}"
backend: "tensorrtllm"
max_batch_size: 8
model_transaction_policy {{ decoupled: false }}
parameters {{ key: "gpt_model_path" value {{ string_value: "/engines/{name}" }} }}
parameters {{ key: "gpu_device_ids" value {{ string_value: "{gpus}" }} }}
"""


def _trtllm_repo(root: Path, names: list[str]) -> Path:
    repo = root / "repo"
    for i, name in enumerate(names):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(TRTLLM_CONFIG.format(name=name, gpus=str(i)))
    for name in ("preprocessing", "postprocessing", "tensorrt_llm_bls"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n')
    (repo / "ensemble" / "1").mkdir(parents=True)
    (repo / "ensemble" / "config.pbtxt").write_text('name: "ensemble"\nplatform: "ensemble"\n')
    return repo


def _rank(repo: Path, i: int, extra: list[str]) -> list[str]:
    return ["-n", "1", "/opt/tritonserver/bin/tritonserver", f"--model-repository={repo.resolve()}",
            "--grpc-port=8001", "--http-port=8000", "--metrics-port=8002", *extra,
            "--disable-auto-complete-config", f"--backend-config=python,shm-region-prefix-name=prefix{i}_"]


def test_repository_backends_are_parsed(tmp_path: Path) -> None:
    repo = _trtllm_repo(tmp_path, ["tensorrt_llm", "tensorrt_llm_draft"])
    # an unfilled NVIDIA template still yields its backend (line scan fallback)
    (repo / "template" / "1").mkdir(parents=True)
    (repo / "template" / "config.pbtxt").write_text(
        'name: "template"\nbackend: "tensorrtllm"\nmax_batch_size: ${triton_max_batch_size}\n')
    models = {m.name: m for m in read_repository(repo)}
    assert {n for n, m in models.items() if m.is_trtllm} == {"tensorrt_llm", "tensorrt_llm_draft", "template"}
    assert models["ensemble"].platform == "ensemble" and models["preprocessing"].backend == "python"
    assert models["tensorrt_llm_draft"].parameter("gpu_device_ids") == "1"
    assert models["template"].parse_error and models["template"].config is None


def test_orchestrator_mode_for_draft_and_target(tmp_path: Path) -> None:
    repo = _trtllm_repo(tmp_path, ["tensorrt_llm", "tensorrt_llm_draft"])
    plan = plan_launch(repo, triton_version="24.07", num_gpus=2)
    assert plan.mode == "orchestrator" and plan.trtllm_models == ["tensorrt_llm", "tensorrt_llm_draft"]
    assert plan.env == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    pools = ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false",
             "--cuda-memory-pool-byte-size=0:0", "--cuda-memory-pool-byte-size=1:0"]
    assert plan.argv == ["mpirun", "--allow-run-as-root", *_rank(repo, 0, pools)]
    # Triton <= 24.06: no memory-pool flags
    old = plan_launch(repo, triton_version="24.06", num_gpus=2)
    assert old.argv == ["mpirun", "--allow-run-as-root", *_rank(repo, 0, [])]
    # spawned workers: world_size must be 1
    with pytest.raises(ServerError, match="world_size must be 1"):
        plan_launch(repo, world_size=2, triton_version="25.03", num_gpus=1)
    # fast logits: no spawning, world_size = 1 + TP_draft + TP_target; ranks != 0 load only the TRT-LLM models
    fast = plan_launch(repo, world_size=3, disable_spawn_processes=True, triton_version="25.03", num_gpus=2)
    assert fast.env == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "0"}
    load = ["--model-control-mode=explicit", "--load-model=tensorrt_llm", "--load-model=tensorrt_llm_draft"]
    assert fast.argv == ["mpirun", "--allow-run-as-root", *_rank(repo, 0, []), ":", *_rank(repo, 1, load), ":",
                         *_rank(repo, 2, load)]
    assert "TRTLLM_ORCHESTRATOR=1" in fast.shell() and " : -n 1 " in fast.shell()


def test_leader_mode_mpirun_ranks(tmp_path: Path) -> None:
    repo = _trtllm_repo(tmp_path, ["tensorrt_llm"])
    plan = plan_launch(repo, world_size=2, log_verbose=3, log_file="/tmp/triton_log.txt", exit_timeout_s=10)
    assert plan.mode == "leader" and plan.env == {}
    rank0 = _rank(repo, 0, ["--log-verbose=3", "--log-file=/tmp/triton_log.txt"])
    rank1 = _rank(repo, 1, ["--model-control-mode=explicit", "--load-model=tensorrt_llm"])
    for r in (rank0, rank1):
        r.insert(4, "--exit-timeout-secs=10")
    assert plan.argv == ["mpirun", "--allow-run-as-root", *rank0, ":", *rank1]
    over = plan_launch(repo, oversubscribe=True, tritonserver="/x/tritonserver", http_port=9000)
    assert over.argv[:6] == ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "1", "/x/tritonserver"]
    assert "--http-port=9000" in over.argv


def test_single_mode_without_trtllm(tmp_path: Path) -> None:
    repo = _trtllm_repo(tmp_path, [])
    plan = plan_launch(repo)
    assert plan.mode == "single" and plan.env == {}
    assert plan.argv == _rank(repo, 0, [])[2:]  # no mpirun, no "-n 1"


def test_run_launch_waits_for_the_server(tmp_path: Path) -> None:
    fake = tmp_path / "tritonserver"
    fake.write_text('#!/bin/sh\nsleep 0.3\necho "$TRTLLM_ORCHESTRATOR $*" > "$(dirname "$0")/seen.txt"\nexit 7\n')
    fake.chmod(0o755)
    repo = _trtllm_repo(tmp_path, ["tensorrt_llm", "tensorrt_llm_draft"])
    plan = plan_launch(repo, tritonserver=fake, use_mpi=False, triton_version="24.05")
    t0 = time.monotonic()
    assert run_launch(plan) == 7
    assert time.monotonic() - t0 >= 0.3
    seen = (tmp_path / "seen.txt").read_text()
    assert seen.startswith("1 --model-repository=") and "shm-region-prefix-name=prefix0_" in seen


def test_trtllm_server_uses_the_plan(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "tritonserver"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    repo = _trtllm_repo(tmp_path, ["tensorrt_llm", "tensorrt_llm_draft"])
    srv = TrtllmTritonServer(ServerOptions(repo, http_port=18000, grpc_port=18001, metrics_port=18002,
                                           tritonserver=str(fake), exit_timeout_s=5),
                             use_mpi=True, triton_version="25.03", num_gpus=1)
    argv = srv.command()
    assert argv[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", str(fake.resolve())]
    assert "--http-port=18000" in argv and "--exit-timeout-secs=5" in argv
    assert "--cuda-memory-pool-byte-size=0:0" in argv
    env = srv.environment({"PATH": "/usr/bin"})
    assert env["TRTLLM_ORCHESTRATOR"] == "1" and env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] == "1"
    assert str(trtspec_import_root()) in env.get("PYTHONPATH", "")  # the checkout stays importable


# ---------------------------------------------------------------------------------------------------------------
# `trtspec serve`


def test_serve_help_explains_which_tritonserver() -> None:
    from trtspec.commands import serve

    result = CliRunner().invoke(serve.command, ["--help"])
    assert result.exit_code == 0
    for text in ("TRITONSERVER", "/opt/tritonserver/bin/tritonserver", "nvidia-pytriton", "--http-port", "Ctrl-C"):
        assert text in result.output


@pytest.mark.slow
def test_serve_reports_a_broken_model_without_traceback(broken_repo: Path, cache_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from trtspec.commands import serve

    monkeypatch.setenv("TRTSPEC_CACHE", str(cache_dir))
    result = CliRunner().invoke(serve.command, [str(broken_repo), "--http-port", "0", "--grpc-port", "0",
                                                "--metrics-port", "0", "--timeout", "60"])
    assert result.exit_code == 1
    assert "bad" in result.output and "boom: broken on purpose" in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, ServerError)


@pytest.mark.slow
def test_serve_runs_until_ctrl_c(good_repo: Path, cache_dir: Path, helper_dir: Path) -> None:
    env = dict(os.environ, TRTSPEC_CACHE=str(cache_dir), PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
        [str(trtspec_import_root()), str(helper_dir), os.environ.get("PYTHONPATH", "")]))
    code = "import sys; from trtspec.commands.serve import command; command(prog_name='trtspec serve')"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(good_repo), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore
    seen = []
    try:
        deadline = time.monotonic() + 60
        while not any("Press Ctrl-C" in s for s in seen):
            assert proc.poll() is None or not lines.empty(), "".join(seen)
            assert time.monotonic() < deadline, "".join(seen)
            try:
                seen.append(lines.get(timeout=0.2))
            except queue.Empty:
                pass
        output = "".join(seen)
        assert "Triton is ready" in output and "HTTP     http://127.0.0.1:" in output
        assert "stream3" in output and "READY" in output
        proc.send_signal(signal.SIGINT)
        # Triton waits up to --exit-timeout-secs (10) for its models to unload, and `serve` gives it 10 s more.
        # This also holds when the tests run as a background job of a non-interactive shell, which starts
        # every child with SIGINT ignored: `serve` sets its own SIGINT handler.
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
