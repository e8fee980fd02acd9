"""`trtspec k8s`: manifests for the example configs validate against Kubernetes' schemas and follow the config."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.config import load_config
from trtspec.k8s.manifests import DEFAULT_HEALTH_PORT, DEFAULT_OPENAI_PORT, QUEUE_METRIC
from trtspec.k8s.validate import validate_object
from trtspec.repository import BASELINE, ENSEMBLE, LOOP
from trtspec.server import ServerOptions

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "build_configs"
H100_8B = CONFIGS / "llama-3.1-8b_llama-3.2-1b_h100.yaml"
GPU_EXAMPLES = {
    # config -> the node it is written for, and the GPUs one replica needs (target tp x pp + a draft GPU of its own)
    "llama-3.1-8b_llama-3.2-1b_h100.yaml": ("h100x8", 1, "NVIDIA-H100-80GB-HBM3"),
    "llama-3.1-70b_llama-3.2-1b_h200_fp8.yaml": ("h200x8", 5, "NVIDIA-H200"),
    # llmapi: the draft runs inside the target's LLM, on the target's GPUs
    "llama-3.1-8b_llama-3.2-1b_h100_llmapi.yaml": ("h100x8", 1, "NVIDIA-H100-80GB-HBM3"),
    "llama-3.1-70b_llama-3.2-1b_h200_fp8_llmapi.yaml": ("h200x8", 4, "NVIDIA-H200"),
    # EAGLE-3 head and MTP layers draft inside the target's forward
    "llama-3.1-8b_eagle3_h100_llmapi.yaml": ("h100x8", 1, "NVIDIA-H100-80GB-HBM3"),
    "deepseek-v3_mtp_h200_llmapi.yaml": ("h200x8", 8, "NVIDIA-H200"),
    # Medusa heads inside the target's engine: no draft GPU
    "llama-3.1-8b_medusa_h100.yaml": ("h100x8", 1, "NVIDIA-H100-80GB-HBM3"),
}


def run_k8s(config: Path, out: Path, *args: str) -> tuple[int, str, dict[str, list[dict]]]:
    result = CliRunner().invoke(cli, ["k8s", str(config), "-o", str(out), *args])
    files = {}
    if out.is_dir():
        files = {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d] for p in sorted(out.glob("*.yaml"))}
    return result.exit_code, result.output, files


def write_config(tmp_path: Path, change) -> Path:
    data = yaml.safe_load(H100_8B.read_text())
    change(data)
    p = tmp_path / "config.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def server(files: dict) -> dict:
    pod = files["deployment.yaml"][0]["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "server")


def gpus(files: dict) -> int:
    return int(server(files)["resources"]["limits"]["nvidia.com/gpu"])


def test_gpu_examples_cover_every_gpu_config():
    gpu_configs = {p.name for p in CONFIGS.glob("*.yaml") if load_config(p, check_paths=False).device != "cpu"
                   and load_config(p, check_paths=False).engine.value != "reference"}
    assert gpu_configs == set(GPU_EXAMPLES)


@pytest.mark.parametrize("name", sorted(GPU_EXAMPLES))
def test_gpu_example_manifests_validate_and_carry_the_plan(tmp_path, name):
    spec, n_gpus, product = GPU_EXAMPLES[name]
    config = CONFIGS / name
    cfg = load_config(config, check_paths=False)
    rc, out, files = run_k8s(config, tmp_path / "k8s", "--gpus", spec)
    assert rc == 0, out

    kust = files.pop("kustomization.yaml")[0]
    adapter = files.pop("prometheus-adapter-values.yaml")[0]
    assert sorted(kust["resources"]) == sorted(set(files) - {"build-job.yaml"})
    for fname, docs in files.items():  # the files as written, validated again from disk
        for doc in docs:
            assert validate_object(doc) == [], (fname, doc["kind"])

    srv = server(files)
    assert gpus(files) == n_gpus
    pod = files["deployment.yaml"][0]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": product}
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in srv["volumeMounts"]
    # `trtspec serve`'s own health endpoint: Triton's stays 200 while a model's process is dead
    assert srv["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "health"}
    assert srv["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "health"}
    assert srv["args"][srv["args"].index("--health-port") + 1] == str(DEFAULT_HEALTH_PORT)
    assert srv["startupProbe"]["periodSeconds"] * srv["startupProbe"]["failureThreshold"] >= 1800
    assert srv["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    # preStop, then the bound `trtspec serve` stops within
    assert pod["terminationGracePeriodSeconds"] > int(srv["lifecycle"]["preStop"]["exec"]["command"][1]) + ServerOptions("repo").stop_bound_s
    assert srv["args"][:2] == ["serve", f"/models/trtspec-out/{cfg.name}/model_repository"]

    t = cfg.triton
    ports = {p["name"]: p["port"] for p in files["service.yaml"][0]["spec"]["ports"]}
    assert ports == {"http": t.http_port, "grpc": t.grpc_port, "metrics": t.metrics_port, "openai": DEFAULT_OPENAI_PORT,
                     "health": DEFAULT_HEALTH_PORT}

    hpa = files["hpa.yaml"][0]["spec"]
    assert hpa["scaleTargetRef"]["kind"] == "Deployment"
    metric = hpa["metrics"][0]["pods"]["metric"]
    assert metric["name"] == QUEUE_METRIC
    (watched,) = metric["selector"]["matchExpressions"]
    assert watched["key"] == "model" and watched["operator"] == "In"
    assert {ENSEMBLE, BASELINE, LOOP} <= set(watched["values"])  # text traffic enters the text endpoints
    assert adapter["rules"]["custom"][0]["name"]["as"] == QUEUE_METRIC
    assert files["podmonitor.yaml"][0]["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert "build-job.yaml" in files and "pvc.yaml" in files


def test_demo_config_is_a_cpu_deployment_built_by_an_init_container(tmp_path):
    rc, out, files = run_k8s(CONFIGS / "demo.yaml", tmp_path / "k8s")
    assert rc == 0, out
    pod = files["deployment.yaml"][0]["spec"]["template"]["spec"]
    assert "resources" not in server(files) and "nodeSelector" not in pod
    assert pod["initContainers"][0]["args"][0] == "build"
    assert "pvc.yaml" not in files and "build-job.yaml" not in files  # demo checkpoints come with the package


def test_target_larger_than_a_node_is_a_leaderworkerset(tmp_path):
    def tp16(d):
        d["target"].update(tp_size=16)
        d["target"].pop("gpu_device_ids")
        d["draft"].pop("gpu_device_ids")

    rc, out, files = run_k8s(write_config(tmp_path, tp16), tmp_path / "k8s", "--gpus", "h100x8")
    assert rc == 0, out
    assert "deployment.yaml" not in files
    lws = files["leaderworkerset.yaml"][0]
    assert validate_object(lws) == []
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2
    for key in ("leaderTemplate", "workerTemplate"):
        c = lwt[key]["spec"]["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "slots=8" in lwt["leaderTemplate"]["spec"]["containers"][0]["command"][2]
    leader = {"leaderworkerset.sigs.k8s.io/worker-index": "0"}
    assert leader.items() <= files["service.yaml"][0]["spec"]["selector"].items()
    assert files["hpa.yaml"][0]["spec"]["scaleTargetRef"]["kind"] == "LeaderWorkerSet"
    assert any(d["kind"] == "Role" for d in files["rbac.yaml"])


def _set(path: str, value):
    def change(d):
        *parents, key = path.split(".")
        node = d
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value

    return change


@pytest.mark.parametrize(
    "changes, args, check",
    [
        # the target on two GPUs, the draft sharing GPU 0
        ([_set("target.tp_size", 2), _set("target.gpu_device_ids", [0, 1])], [], lambda f: gpus(f) == 2),
        # the draft moved to a GPU of its own
        ([_set("draft.gpu_device_ids", [1])], [], lambda f: gpus(f) == 2),
        # pipeline parallel counts too
        ([_set("target.pp_size", 2), _set("target.gpu_device_ids", None), _set("draft.gpu_device_ids", None)], [],
         lambda f: gpus(f) == 3),
        # an HTTP port of its own follows into the container, the probes' port name, the Service and serve's flags
        ([_set("triton.http_port", 9100)], [],
         lambda f: {"name": "http", "port": 9100, "targetPort": "http", "protocol": "TCP"} in f["service.yaml"][0]["spec"]["ports"]
         and {"name": "http", "containerPort": 9100, "protocol": "TCP"} in server(f)["ports"]
         and server(f)["args"][server(f)["args"].index("--http-port") + 1] == "9100"),
        ([], ["--no-openai"], lambda f: "openai" not in {p["name"] for p in f["service.yaml"][0]["spec"]["ports"]}),
        ([], ["--openai-port", "9300"],
         lambda f: {"name": "openai", "port": 9300, "targetPort": "openai", "protocol": "TCP"} in f["service.yaml"][0]["spec"]["ports"]),
        ([], ["--gpus", "h200x8"],
         lambda f: f["deployment.yaml"][0]["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H200"),
        ([], ["--min-replicas", "2", "--max-replicas", "6"],
         lambda f: (f["hpa.yaml"][0]["spec"]["minReplicas"], f["hpa.yaml"][0]["spec"]["maxReplicas"]) == (2, 6)
         and f["deployment.yaml"][0]["spec"]["replicas"] == 2),
    ],
)
def test_manifests_follow_one_change(tmp_path, changes, args, check):
    def change(d):
        for c in changes:
            c(d)

    base_rc, _, base = run_k8s(H100_8B, tmp_path / "base", "--gpus", "h100x8")
    rc, out, files = run_k8s(write_config(tmp_path, change), tmp_path / "k8s", "--gpus", "h100x8", *args)
    assert base_rc == 0 and rc == 0, out
    assert check(files) and not check(base)


@pytest.mark.parametrize(
    "change, args, field",
    [
        # 12 ranks do not fill whole 8-GPU nodes
        (_set("target.tp_size", 12), [], "target.tp_size x target.pp_size = 12"),
        (lambda d: None, ["--gpus", "h100x8", "--gpus-per-node", "4"], None),  # fits: 1 GPU
        (_set("draft.gpu_device_ids", [3]), [], "draft.gpu_device_ids: [3]"),  # GPUs 1-2 of the pod unused
        # the 8B config's draft on a GPU of its own, on 1-GPU nodes
        (_set("draft.gpu_device_ids", [1]), ["--gpus", "h100"], "draft.gpu_device_ids: [1]: the target's 1 GPU(s) + the draft's own 1"),
        (_set("triton.grpc_port", 0), [], "triton.grpc_port: 0"),
        (_set("triton.metrics_port", 9000), [], "--openai-port: port 9000 is also triton.metrics_port"),
        (_set("target.checkpoint", "/data/Llama-3.1-8B"), [], "target.checkpoint: '/data/Llama-3.1-8B' is not under --models-path"),
        (lambda d: None, ["--build-dir", "/workspace/out"], "--build-dir: /workspace/out is not under --models-path"),
        (lambda d: None, ["--gpus", "h100x4,l40s"], "--gpus: one node pool has one GPU product"),
        (lambda d: None, ["--min-replicas", "5"], "--min-replicas 5 is above --max-replicas 4"),
    ],
)
def test_bad_combinations_are_named_errors(tmp_path, change, args, field):
    def fix_tp(d):
        change(d)
        if d["target"]["tp_size"] != 1:
            d["target"].pop("gpu_device_ids")

    gpus_args = [] if "--gpus" in args else ["--gpus", "h100x8"]
    rc, out, _ = run_k8s(write_config(tmp_path, fix_tp), tmp_path / "k8s", *gpus_args, *args)
    if field is None:
        assert rc == 0, out
        return
    assert rc == 2, out
    assert out.startswith("error: ") and field in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1


def test_validation_rejects_what_the_cluster_would(tmp_path):
    rc, _, files = run_k8s(H100_8B, tmp_path / "k8s", "--gpus", "h100x8")
    assert rc == 0
    dep = copy.deepcopy(files["deployment.yaml"][0])
    dep["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # misspelt
    assert any("'resource' was unexpected" in e for e in validate_object(dep))
    mon = copy.deepcopy(files["podmonitor.yaml"][0])
    mon["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"
    assert validate_object(mon)


def test_dry_run_prints_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a relative output folder would land
    out = tmp_path / "k8s"
    result = CliRunner().invoke(cli, ["k8s", str(H100_8B), "-o", str(out), "--dry-run", "--gpus", "h100x8"])
    assert result.exit_code == 0, result.output
    assert "# ---- deployment.yaml" in result.output and "kind: HorizontalPodAutoscaler" in result.output
    assert not list(tmp_path.iterdir())
    # the same command without --dry-run writes there: the check above can fail
    assert CliRunner().invoke(cli, ["k8s", str(H100_8B), "-o", str(out), "--gpus", "h100x8"]).exit_code == 0
    assert (out / "deployment.yaml").is_file()


def test_help_teaches():
    result = CliRunner().invoke(cli, ["k8s", "--help"])
    assert result.exit_code == 0
    for words in ("LeaderWorkerSet", "nvidia.com/gpu.product", "--storage", "--no-openai", "build-job.yaml", "exit code 2"):
        assert words in result.output


def test_grafana_dashboard_configmap_is_the_checked_in_board_for_the_sidecar(tmp_path):
    import json

    from trtspec.k8s import dashboard

    rc, out, files = run_k8s(CONFIGS / "demo.yaml", tmp_path / "k8s")
    assert rc == 0, out
    (cm,) = files["grafana-dashboard.yaml"]
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (board_json,) = cm["data"].values()
    board = json.loads(board_json)
    checked_in = (ROOT / "deploy" / "grafana" / "trtspec-dashboard.json").read_text()
    assert board_json == checked_in, "deploy/grafana/trtspec-dashboard.json drifted: python -m trtspec.k8s.dashboard > deploy/grafana/trtspec-dashboard.json"
    titles = {p["title"] for p in board["panels"]}
    assert {"Acceptance by draft position", "Tokens per target call", "Iterations without a draft, and why",
            "Mean request latency", "Queue", "Engine busy"} <= titles
    # every panel queries something, and each query names the model variable the board filters by
    for p in board["panels"]:
        if p["type"] != "row":
            assert p["targets"] and all("$model" in t["expr"] for t in p["targets"]), p["title"]


def test_dashboard_query_parser_finds_the_metric_names():
    from trtspec.k8s.dashboard import queried_metrics

    board = {"panels": [{"targets": [{"expr": 'sum by (model) (rate(a_total{model=~"$m"}[5m])) / sum(rate(b_x[1m]))'},
                                      {"expr": "sum by (model, state) (gauge_y{model=~\"x\"})"}]}]}
    assert queried_metrics(board) == {"a_total", "b_x", "gauge_y"}


def test_api_key_comes_from_a_secret_in_every_pod_that_serves(tmp_path):
    want = {"name": "TRTSPEC_API_KEY", "valueFrom": {"secretKeyRef": {"name": "trtspec-api-key", "key": "api-key"}}}
    rc, out, files = run_k8s(H100_8B, tmp_path / "k8s", "--gpus", "h100x8", "--api-key-secret", "trtspec-api-key")
    assert rc == 0, out
    assert want in server(files)["env"] and validate_object(files["deployment.yaml"][0]) == []
    assert "kubectl create secret generic trtspec-api-key" in out
    # the key is read by `trtspec serve`, never written into a manifest
    assert not any("secretKeyRef" in str(c) or "TRTSPEC_API_KEY" in str(c) for c in server(files)["args"])

    def tp16(d):
        d["target"].update(tp_size=16)
        d["target"].pop("gpu_device_ids")
        d["draft"].pop("gpu_device_ids")

    rc, out, files = run_k8s(write_config(tmp_path, tp16), tmp_path / "lws", "--gpus", "h100x8",
                             "--api-key-secret", "trtspec-api-key")
    assert rc == 0, out
    lwt = files["leaderworkerset.yaml"][0]["spec"]["leaderWorkerTemplate"]
    leader_env = lwt["leaderTemplate"]["spec"]["containers"][0]["env"]
    assert want in leader_env and any(e["name"].startswith("OMPI_MCA") for e in leader_env)
    assert want not in lwt["workerTemplate"]["spec"]["containers"][0]["env"]  # the MPI ranks serve no HTTP


def test_without_a_secret_the_openai_api_is_open_and_says_so(tmp_path):
    rc, out, files = run_k8s(H100_8B, tmp_path / "k8s", "--gpus", "h100x8")
    assert rc == 0 and "--api-key-secret NAME protects it" in out
    assert not any(e["name"] == "TRTSPEC_API_KEY" for e in server(files)["env"])


@pytest.mark.parametrize("args, field", [
    (["--api-key-secret", "Bad_Name"], "--api-key-secret: 'Bad_Name' is not a Secret name"),
    (["--api-key-secret", "key", "--no-openai"], "--api-key-secret protects the OpenAI API"),
])
def test_api_key_secret_errors_name_the_option(tmp_path, args, field):
    rc, out, _ = run_k8s(H100_8B, tmp_path / "k8s", "--gpus", "h100x8", *args)
    assert rc == 2 and out.startswith("error: ") and field in out, out
