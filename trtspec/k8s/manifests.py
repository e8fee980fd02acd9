"""Kubernetes manifests for a trtspec deployment, as plain dicts built from the build config and its topology.

One replica is one pod running `trtspec serve` on the built model repository (a Deployment), or, when the
target spans nodes, one LeaderWorkerSet group whose leader runs `trtspec serve` with MPI ranks on the
workers. Around it: a Service (HTTP, gRPC, metrics, OpenAI), a HorizontalPodAutoscaler on Triton's queue
depth of the models requests enter (summed per pod), a PodMonitor, and the prometheus-adapter rule that turns the metric
into a per-pod custom metric.

Storage: ``pvc`` (default for engines built by TensorRT-LLM and any flavour trtspec does not know to be
cheap to build): a PersistentVolumeClaim holds the checkpoints and the build output; the repository refers
to engines and tokenizer by absolute path, so the build writes to the same volume at the same mount path
(``build-job.yaml`` runs it). ``init`` (default for the reference engine, which has no engines): an init
container runs `trtspec build` into an emptyDir at pod start, which takes seconds.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

import yaml

from trtspec.config import BuildConfig, EngineKind
from trtspec.k8s import dashboard
from trtspec.k8s.topology import GPU_PRODUCT_LABEL, GPU_RESOURCE, K8sError, Topology
from trtspec.openai.auth import API_KEY_ENV
from trtspec.contract.models import ENTRY_MODELS
from trtspec.server import ServerOptions
from trtspec.server.health import DEFAULT_HEALTH_PORT

# The tag docs/deploy-gpu.md gives the image the repository's Dockerfile builds; push it where nodes pull from.
DEFAULT_IMAGE = "trtspec:25.12"
DEFAULT_OPENAI_PORT = 9000
# Triton's per-model queue depth: requests waiting for a free instance of the model.
QUEUE_METRIC = "nv_inference_pending_request_count"
CONFIG_MOUNT = "/etc/trtspec"
WORK_DIR = "/var/run/trtspec"  # emptyDir: the init-built repository, the demo cache, the MPI hostfile
SHM_VOLUME = "dshm"
RSH_AGENT = "kubectl-exec"
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_LEADER_SELECTOR = {"leaderworkerset.sigs.k8s.io/worker-index": "0"}
# Triton drains in-flight requests for --exit-timeout-secs after SIGINT; `trtspec serve` kills it after that + a grace.
DRAIN_S = int(ServerOptions.exit_timeout_s + ServerOptions.kill_grace_s)
PRESTOP_SLEEP_S = 10  # endpoints controllers and kube-proxy stop sending new requests before the drain starts
SERVE_OPENAI_FLAG = "--openai-port"
# `trtspec serve`'s probe endpoint: Triton's own /v2/health/ready stays 200 when a model's process has died
SERVE_HEALTH_FLAG = "--health-port"
ADAPTER_VALUES = "prometheus-adapter-values.yaml"
# the key in the API-key Secret: kubectl create secret generic NAME --from-literal=api-key=...
API_KEY_SECRET_KEY = "api-key"
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a DNS subdomain, as Kubernetes names Secrets

Storage = Literal["pvc", "init"]


def queue_selector() -> dict[str, Any]:
    """The queue series the autoscaler watches: those of the models requests enter (the adapter sums them per pod).
    The loop model alone would miss the text endpoints, which run the loop in-process."""
    return {"matchExpressions": [{"key": "model", "operator": "In", "values": list(ENTRY_MODELS)}]}


@dataclass
class K8sOptions:
    image: str = DEFAULT_IMAGE
    name: str | None = None  # default: the config's name, made a DNS label
    namespace: str | None = None
    storage: Storage | None = None  # default: see default_storage()
    models_path: str = "/models"
    build_dir: str | None = None  # default: <models_path>/trtspec-out/<config name>
    pvc: str | None = None  # an existing claim; default: a new one named <name>-models
    pvc_size: str = "500Gi"
    openai_port: int | None = DEFAULT_OPENAI_PORT  # None: no OpenAI port
    api_key_secret: str | None = None  # a Secret whose api-key protects the OpenAI API; None: the API is open
    min_replicas: int = 1
    max_replicas: int = 4
    target_queue: str = "1"
    startup_timeout_s: int = 1800
    shm_size: str = "2Gi"
    serve_flags: frozenset[str] = field(default_factory=frozenset)  # options `trtspec serve` has


@dataclass
class Manifest:
    filename: str
    docs: list[dict[str, Any]]
    applied: bool = True  # listed in kustomization.yaml (False: applied on its own, or a Helm values file)
    kubernetes: bool = True  # False: not a Kubernetes object (Helm values)


@dataclass
class Bundle:
    manifests: list[Manifest]
    topology: Topology
    notes: list[str] = field(default_factory=list)

    def get(self, filename: str) -> Manifest:
        return next(m for m in self.manifests if m.filename == filename)

    def objects(self) -> list[dict[str, Any]]:
        return [d for m in self.manifests if m.kubernetes for d in m.docs]

    def render(self, m: Manifest) -> str:
        return yaml.dump_all(m.docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the config, scripts) as literal blocks, readable in the ConfigMap; no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_Dumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)
)


def dns_name(name: str) -> str:
    """A config name as a DNS-1035 label prefix (Service and pod names): lowercase, dashes, <= 40 characters
    so that suffixes (-models, -build, LeaderWorkerSet pod indexes) stay within 63."""
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40].rstrip("-")
    return s if s[:1].isalpha() else f"trtspec-{s}".rstrip("-")


def default_storage(cfg: BuildConfig) -> Storage:
    return "init" if cfg.engine is EngineKind.reference else "pvc"


def _checkpoint_paths(cfg: BuildConfig) -> dict[str, str]:
    return {r: m.checkpoint for r in ("target", "draft")
            if (m := getattr(cfg, r)) is not None and not m.checkpoint.startswith("demo:")}


def _under(path: str, root: str) -> bool:
    return PurePosixPath(root) in (PurePosixPath(path), *PurePosixPath(path).parents)


def _check(cfg: BuildConfig, opts: K8sOptions, storage: Storage, build_dir: str) -> None:
    t = cfg.triton
    ports = {"triton.http_port": t.http_port, "triton.grpc_port": t.grpc_port, "triton.metrics_port": t.metrics_port}
    if opts.openai_port is not None:
        ports["--openai-port"] = opts.openai_port
    if SERVE_HEALTH_FLAG in opts.serve_flags:
        ports[SERVE_HEALTH_FLAG] = DEFAULT_HEALTH_PORT
    for key, port in ports.items():
        if port == 0:
            raise K8sError(f"{key}: 0 picks a free port at start, a Service needs a fixed one; set {key} (e.g. 8000)")
    seen: dict[int, str] = {}
    for key, port in ports.items():
        if port in seen:
            raise K8sError(f"{key}: port {port} is also {seen[port]}; give each endpoint its own port")
        seen[port] = key
    if opts.api_key_secret is not None:
        if opts.openai_port is None:
            raise K8sError("--api-key-secret protects the OpenAI API, which --no-openai leaves out; drop one of them")
        if not _SECRET_NAME.match(opts.api_key_secret):
            raise K8sError(f"--api-key-secret: {opts.api_key_secret!r} is not a Secret name (lowercase letters, "
                           "digits, '-' and '.', starting and ending with a letter or digit)")
    if opts.min_replicas > opts.max_replicas:
        raise K8sError(f"--min-replicas {opts.min_replicas} is above --max-replicas {opts.max_replicas}; "
                       "raise --max-replicas")
    if not PurePosixPath(opts.models_path).is_absolute():
        raise K8sError(f"--models-path: {opts.models_path!r} must be an absolute path in the container")
    for role, ckpt in _checkpoint_paths(cfg).items():
        if not PurePosixPath(ckpt).is_absolute() or not _under(ckpt, opts.models_path):
            raise K8sError(
                f"{role}.checkpoint: {ckpt!r} is not under --models-path {opts.models_path}; pods read checkpoints "
                f"from the models volume: use an absolute path under {opts.models_path} or set --models-path"
            )
    if storage == "pvc" and not _under(build_dir, opts.models_path):
        raise K8sError(
            f"--build-dir: {build_dir} is not under --models-path {opts.models_path}; the repository refers to its "
            "engines by absolute path, so build onto the models volume (e.g. trtspec build -o "
            f"{opts.models_path}/trtspec-out/{cfg.name})"
        )


def build_bundle(cfg: BuildConfig, topo: Topology, opts: K8sOptions) -> Bundle:
    """Every manifest for `cfg` (raises K8sError for a combination Kubernetes cannot run)."""
    storage = opts.storage or default_storage(cfg)
    build_dir = opts.build_dir or f"{opts.models_path}/trtspec-out/{cfg.name}"
    if storage == "init":
        build_dir = f"{WORK_DIR}/build"
    _check(cfg, opts, storage, build_dir)
    name = opts.name or dns_name(cfg.name)
    needs_pvc = storage == "pvc" or bool(_checkpoint_paths(cfg))
    claim = opts.pvc or f"{name}-models"
    b = _Builder(cfg, topo, opts, name, storage, build_dir, claim if needs_pvc else None)

    manifests = [Manifest("configmap.yaml", [b.configmap()])]
    if needs_pvc and opts.pvc is None:
        manifests.append(Manifest("pvc.yaml", [b.pvc()]))
    if topo.multi_node:
        manifests.append(Manifest("rbac.yaml", b.rbac()))
        manifests.append(Manifest("leaderworkerset.yaml", [b.leaderworkerset()]))
    else:
        manifests.append(Manifest("deployment.yaml", [b.deployment()]))
    manifests += [
        Manifest("service.yaml", [b.service()]),
        Manifest("hpa.yaml", [b.hpa()]),
        Manifest("podmonitor.yaml", [b.podmonitor()]),
        Manifest("grafana-dashboard.yaml", [b.grafana_dashboard()]),
    ]
    if storage == "pvc":
        manifests.append(Manifest("build-job.yaml", [b.build_job()], applied=False))
    manifests.append(Manifest(ADAPTER_VALUES, [b.adapter_values()], applied=False, kubernetes=False))
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
    }
    if opts.namespace:
        kustomization["namespace"] = opts.namespace
    kustomization["resources"] = [m.filename for m in manifests if m.applied]
    manifests.insert(0, Manifest("kustomization.yaml", [kustomization], kubernetes=False))
    notes = list(topo.notes)
    if storage == "pvc":
        notes.append(
            f"storage pvc: run build-job.yaml (or `trtspec build -o {build_dir}` on the volume) before applying"
        )
    if SERVE_OPENAI_FLAG not in opts.serve_flags and opts.openai_port is not None:
        notes.append(f"`trtspec serve` here has no {SERVE_OPENAI_FLAG}: the openai port is in the Service but not "
                     "served")
    if opts.openai_port is not None and opts.api_key_secret is None:
        notes.append("the OpenAI API answers anyone who reaches the Service: --api-key-secret NAME protects it")
    elif opts.api_key_secret is not None:
        notes.append(f"the pods start once Secret {opts.api_key_secret} exists: kubectl create secret generic "
                     f"{opts.api_key_secret} --from-literal={API_KEY_SECRET_KEY}=$(openssl rand -hex 32)")
    return Bundle(manifests, topo, notes)


class _Builder:
    def __init__(
        self, cfg: BuildConfig, topo: Topology, opts: K8sOptions, name: str, storage: Storage, build_dir: str,
        claim: str | None,
    ) -> None:
        self.cfg, self.topo, self.opts, self.name = cfg, topo, opts, name
        self.storage, self.build_dir, self.claim = storage, build_dir, claim
        self.labels = {"app.kubernetes.io/name": "trtspec", "app.kubernetes.io/instance": name}
        t = cfg.triton
        self.ports = {"http": t.http_port, "grpc": t.grpc_port, "metrics": t.metrics_port}
        if opts.openai_port is not None:
            self.ports["openai"] = opts.openai_port
        if SERVE_HEALTH_FLAG in opts.serve_flags:
            self.ports["health"] = DEFAULT_HEALTH_PORT

    def meta(self, suffix: str = "") -> dict[str, Any]:
        return {"name": self.name + suffix, "labels": dict(self.labels)}

    def obj(self, api_version: str, kind: str, suffix: str = "", **body: Any) -> dict[str, Any]:
        """An object named after the deployment (+ suffix), labelled as its part."""
        return {"apiVersion": api_version, "kind": kind, "metadata": self.meta(suffix), **body}

    # ------------------------------------------------------------------------------------------- config

    def configmap(self) -> dict[str, Any]:
        data = {"config.yaml": yaml.safe_dump(self.cfg.model_dump(mode="json", exclude_none=True), sort_keys=False)}
        if self.topo.multi_node:
            # Open MPI's rsh agent: start a rank in a worker pod (host = <pod>.<subdomain>) through the API server.
            data[RSH_AGENT] = ('#!/bin/sh\nhost="$1"; shift\n'
                               'exec kubectl exec "${host%%.*}" -c worker -- /bin/sh -c "$*"\n')
        return self.obj("v1", "ConfigMap", "-config", data=data)

    def pvc(self) -> dict[str, Any]:
        return self.obj(
            "v1", "PersistentVolumeClaim", "-models",
            spec={
                # the build Job writes it once, every replica reads it
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": self.opts.pvc_size}},
            },
        )

    # ------------------------------------------------------------------------------------------- pods

    def serve_args(self) -> list[str]:
        args = ["serve", f"{self.build_dir}/model_repository", "--follow-log",
                "--timeout", str(self.opts.startup_timeout_s)]
        for port_name, flag in (("http", "--http-port"), ("grpc", "--grpc-port"), ("metrics", "--metrics-port")):
            args += [flag, str(self.ports[port_name])]
        if "openai" in self.ports and SERVE_OPENAI_FLAG in self.opts.serve_flags:
            args += [SERVE_OPENAI_FLAG, str(self.ports["openai"])]
        if "health" in self.ports:
            args += [SERVE_HEALTH_FLAG, str(self.ports["health"])]
        cfg = self.cfg
        if cfg.engine is EngineKind.tensorrt_llm and cfg.draft is None and cfg.target.world_size > 1:
            args += ["--world-size", str(cfg.target.world_size)]  # one TensorRT-LLM model: MPI leader mode
        return args

    def volumes(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        vols: list[dict[str, Any]] = [
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": self.opts.shm_size}},
            {"name": "config", "configMap": {"name": f"{self.name}-config", "defaultMode": 0o755}},
            {"name": "work", "emptyDir": {}},
        ]
        mounts: list[dict[str, Any]] = [
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
            {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
            {"name": "work", "mountPath": WORK_DIR},
        ]
        if self.claim:
            vols.append({"name": "models", "persistentVolumeClaim": {"claimName": self.claim, "readOnly": True}})
            mounts.append({"name": "models", "mountPath": self.opts.models_path, "readOnly": True})
        return vols, mounts

    def resources(self) -> dict[str, Any]:
        n = self.topo.gpus_per_pod
        return {"limits": {GPU_RESOURCE: str(n)}} if n else {}

    def env(self) -> list[dict[str, Any]]:
        return [{"name": "TRTSPEC_CACHE", "value": f"{WORK_DIR}/cache"}]  # demo pair, backend stubs: on the emptyDir

    def api_key_env(self) -> list[dict[str, Any]]:
        """`trtspec serve` reads its API key from the environment, and the environment from the Secret (not
        optional: a pod without its key would serve the API open, so it does not start)."""
        if self.opts.api_key_secret is None:
            return []
        ref = {"name": self.opts.api_key_secret, "key": API_KEY_SECRET_KEY}
        return [{"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": ref}}]

    def probes(self) -> dict[str, Any]:
        # `trtspec serve`'s own endpoint when it has one: not ready while a dead model process is being replaced,
        # not live when the deployment cannot come back (then the pod is restarted)
        port, ready, live = ("health", "/health/ready", "/health/live") if "health" in self.ports else (
            "http", "/v2/health/ready", "/v2/health/live")

        def get(path: str, period: int, failures: int) -> dict[str, Any]:
            return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "failureThreshold": failures}

        return {
            "startupProbe": get(ready, 10, math.ceil(self.opts.startup_timeout_s / 10)),
            "readinessProbe": get(ready, 2, 1),
            "livenessProbe": get(live, 15, 4),
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_S)]}}},
        }

    def server_container(self, mounts: list[dict[str, Any]]) -> dict[str, Any]:
        c: dict[str, Any] = {
            "name": "server",
            "image": self.opts.image,
            "command": ["trtspec"],
            "args": self.serve_args(),
            "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in self.ports.items()],
            "env": self.env() + self.api_key_env(),
            **self.probes(),
            "volumeMounts": mounts,
        }
        if self.resources():
            c["resources"] = self.resources()
        return c

    def init_containers(self, mounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.storage != "init":
            return []
        return [self.build_container([m for m in mounts if m["name"] != SHM_VOLUME])]

    def build_container(self, mounts: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "name": "build",
            "image": self.opts.image,
            "command": ["trtspec"],
            "args": ["build", f"{CONFIG_MOUNT}/config.yaml", "--output", self.build_dir],
            "env": self.env(),
            "volumeMounts": mounts,
        }

    def pod_spec(self, containers: list[dict[str, Any]], init: list[dict[str, Any]],
                 vols: list[dict[str, Any]]) -> dict[str, Any]:
        spec: dict[str, Any] = {}
        if init:
            spec["initContainers"] = init
        spec["containers"] = containers
        spec["volumes"] = vols
        spec["terminationGracePeriodSeconds"] = PRESTOP_SLEEP_S + DRAIN_S + 10
        if self.topo.product:
            spec["nodeSelector"] = {GPU_PRODUCT_LABEL: self.topo.product}
        if self.topo.gpus_per_pod:
            spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
        return spec

    def deployment(self) -> dict[str, Any]:
        vols, mounts = self.volumes()
        spec = self.pod_spec([self.server_container(mounts)], self.init_containers(mounts), vols)
        return self.obj(
            "apps/v1", "Deployment",
            spec={
                "replicas": self.opts.min_replicas,
                "selector": {"matchLabels": dict(self.labels)},
                # never two engine loads' worth of GPUs for one replica during a rollout
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                "template": {"metadata": {"labels": dict(self.labels)}, "spec": spec},
            },
        )

    def leaderworkerset(self) -> dict[str, Any]:
        vols, mounts = self.volumes()
        hostfile = f"{WORK_DIR}/hostfile"
        gpn = self.topo.gpus_per_pod
        leader = self.server_container(mounts)
        serve_args = leader.pop("args")
        # The group's hosts, from LeaderWorkerSet's environment: workers are <leader pod>-<i> in its subdomain.
        script = (
            'L="${LWS_LEADER_ADDRESS%%.*}"; D="${LWS_LEADER_ADDRESS#*.}"\n'
            f'echo "$LWS_LEADER_ADDRESS slots={gpn}" > {hostfile}\n'
            f'i=1; while [ "$i" -lt "$LWS_GROUP_SIZE" ]; do echo "$L-$i.$D slots={gpn}" >> {hostfile}; '
            'i=$((i+1)); done\n'
            f"exec trtspec {shlex.join(serve_args)}\n"
        )
        leader["command"] = ["/bin/sh", "-c", script]
        leader["env"] = leader["env"] + [
            {"name": "OMPI_MCA_plm_rsh_agent", "value": f"{CONFIG_MOUNT}/{RSH_AGENT}"},
            {"name": "OMPI_MCA_orte_default_hostfile", "value": hostfile},
        ]
        worker = {
            "name": "worker",
            "image": self.opts.image,
            "command": ["sleep", "infinity"],  # MPI ranks are started in it by the leader
            "env": self.env(),
            "volumeMounts": mounts,
            "resources": self.resources(),
        }
        init = self.init_containers(mounts)
        labels = {"metadata": {"labels": dict(self.labels)}}
        leader_spec = {**self.pod_spec([leader], init, vols), "serviceAccountName": self.name}
        worker_spec = self.pod_spec([worker], init, vols)
        return self.obj(
            LWS_API, "LeaderWorkerSet",
            spec={
                "replicas": self.opts.min_replicas,
                "startupPolicy": "LeaderCreated",
                "leaderWorkerTemplate": {
                    "size": self.topo.pods_per_replica,
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": {**labels, "spec": leader_spec},
                    "workerTemplate": {**labels, "spec": worker_spec},
                },
            },
        )

    def rbac(self) -> list[dict[str, Any]]:
        """The leader starts ranks in its workers with `kubectl exec`: it may exec into pods of its namespace."""
        rbac = "rbac.authorization.k8s.io/v1"
        return [
            self.obj("v1", "ServiceAccount"),
            self.obj(
                rbac, "Role",
                rules=[
                    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]},
                ],
            ),
            self.obj(
                rbac, "RoleBinding",
                subjects=[{"kind": "ServiceAccount", "name": self.name}],
                roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": self.name},
            ),
        ]

    def build_job(self) -> dict[str, Any]:
        """`trtspec build` onto the models volume, once, on a node like the serving ones (engines only load on
        the GPU kind and TensorRT-LLM version that built them)."""
        vols, mounts = self.volumes()
        for v in vols:
            v.get("persistentVolumeClaim", {}).pop("readOnly", None)
        for m in mounts:
            if m["name"] == "models":
                m.pop("readOnly")
        c = self.build_container(mounts)
        if self.resources():
            c["resources"] = self.resources()
        spec = self.pod_spec([c], [], vols)
        del spec["terminationGracePeriodSeconds"]
        spec["restartPolicy"] = "Never"
        return self.obj(
            "batch/v1", "Job", "-build",
            spec={"backoffLimit": 1, "template": {"metadata": {"labels": dict(self.labels)}, "spec": spec}},
        )

    # ------------------------------------------------------------------------------------------- around

    def pod_selector(self) -> dict[str, str]:
        """The pods that serve: every pod of a Deployment, the leader of each LeaderWorkerSet group."""
        return {**self.labels, **(LWS_LEADER_SELECTOR if self.topo.multi_node else {})}

    def service(self) -> dict[str, Any]:
        return self.obj(
            "v1", "Service",
            spec={
                "type": "ClusterIP",
                "selector": self.pod_selector(),
                "ports": [
                    {"name": n, "port": p, "targetPort": n, "protocol": "TCP",
                     **({"appProtocol": "kubernetes.io/h2c"} if n == "grpc" else {})}
                    for n, p in self.ports.items()
                ],
            },
        )

    def hpa(self) -> dict[str, Any]:
        kind, api = ("LeaderWorkerSet", LWS_API) if self.topo.multi_node else ("Deployment", "apps/v1")
        return self.obj(
            "autoscaling/v2", "HorizontalPodAutoscaler",
            spec={
                "scaleTargetRef": {"apiVersion": api, "kind": kind, "name": self.name},
                "minReplicas": self.opts.min_replicas,
                "maxReplicas": self.opts.max_replicas,
                "metrics": [
                    {
                        "type": "Pods",
                        "pods": {
                            "metric": {"name": QUEUE_METRIC, "selector": queue_selector()},
                            "target": {"type": "AverageValue", "averageValue": self.opts.target_queue},
                        },
                    }
                ],
                "behavior": {
                    "scaleUp": {"stabilizationWindowSeconds": 60,
                                "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]},
                    # a replica costs an engine load: keep it through short lulls
                    "scaleDown": {"stabilizationWindowSeconds": 600,
                                  "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]},
                },
            },
        )

    def podmonitor(self) -> dict[str, Any]:
        return self.obj(
            "monitoring.coreos.com/v1", "PodMonitor",
            spec={
                "selector": {"matchLabels": self.pod_selector()},
                "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
            },
        )

    def grafana_dashboard(self) -> dict[str, Any]:
        """The dashboard (trtspec.k8s.dashboard) as a ConfigMap that Grafana's dashboard sidecar loads."""
        cm = self.obj("v1", "ConfigMap", "-grafana-dashboard", data={f"{dashboard.UID}.json": dashboard.render()})
        cm["metadata"]["labels"].update(dashboard.SIDECAR_LABEL)
        return cm

    def adapter_values(self) -> dict[str, Any]:
        """Helm values for prometheus-community/prometheus-adapter: Triton's queue gauge as a per-pod metric."""
        return {
            "rules": {
                "custom": [
                    {
                        "seriesQuery": f'{QUEUE_METRIC}{{namespace!="",pod!=""}}',
                        "resources": {"overrides": {"namespace": {"resource": "namespace"},
                                                    "pod": {"resource": "pod"}}},
                        "name": {"matches": f"^{QUEUE_METRIC}$", "as": QUEUE_METRIC},
                        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
                    }
                ]
            }
        }
