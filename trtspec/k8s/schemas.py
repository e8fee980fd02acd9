"""JSON schemas for the objects kubernetes-validate has no schema for (CRDs, kustomize, Helm values).

Each covers the fields trtspec writes, with their types and enums as the upstream definition gives them,
and forbids unknown keys where trtspec writes them, so a misspelt field fails here instead of in the
cluster. Pod templates inside a LeaderWorkerSet are checked separately against Kubernetes' own
PodTemplateSpec schema (trtspec.k8s.validate).
"""

from __future__ import annotations

from typing import Any


def _obj(props: dict[str, Any], required: list[str] = (), closed: bool = True) -> dict[str, Any]:  # type: ignore[assignment]
    s: dict[str, Any] = {"type": "object", "properties": props, "required": list(required)}
    if closed:
        s["additionalProperties"] = False
    return s


_STR = {"type": "string"}
_INT = {"type": "integer"}
_LABELS = {"type": "object", "additionalProperties": _STR}
_META = _obj({"name": _STR, "namespace": _STR, "labels": _LABELS, "annotations": _LABELS}, ["name"])
_SELECTOR = _obj({"matchLabels": _LABELS, "matchExpressions": {"type": "array"}})
_POD_TEMPLATE = _obj({"metadata": {"type": "object"}, "spec": {"type": "object"}}, closed=False)


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _obj(
        {"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": _META, "spec": spec},
        ["apiVersion", "kind", "metadata", "spec"],
    )


LEADER_WORKER_SET = _resource(
    "leaderworkerset.x-k8s.io/v1",
    "LeaderWorkerSet",
    _obj(
        {
            "replicas": {"type": "integer", "minimum": 0},
            "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
            "leaderWorkerTemplate": _obj(
                {
                    "size": {"type": "integer", "minimum": 1},
                    "restartPolicy": {"enum": ["Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"]},
                    "leaderTemplate": _POD_TEMPLATE,
                    "workerTemplate": _POD_TEMPLATE,
                },
                ["workerTemplate"],
            ),
        },
        ["leaderWorkerTemplate"],
    ),
)
LEADER_WORKER_SET["$comment"] = (
    "kubernetes-sigs/lws config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml "
    "@060ab4da17eea1f0865fcbd3236bb1075e2cea32 (v1: spec.replicas, startupPolicy, leaderWorkerTemplate.{size,"
    "restartPolicy,leaderTemplate,workerTemplate}; workerTemplate and leaderWorkerTemplate required)"
)

_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_ENDPOINT = _obj({"port": _STR, "path": _STR, "interval": _DURATION, "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]}})

POD_MONITOR = _resource(
    "monitoring.coreos.com/v1",
    "PodMonitor",
    _obj({"selector": _SELECTOR, "podMetricsEndpoints": {"type": "array", "items": _ENDPOINT}}, ["selector"]),
)
POD_MONITOR["$comment"] = (
    "prometheus-operator/prometheus-operator example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml "
    "@6adcebc5076c34f4f55f8f5f7b1e528929373ac7 (v1: spec.selector required; podMetricsEndpoints[].{port,path,"
    "interval,scheme}, interval's pattern as given there)"
)

KUSTOMIZATION = _obj(
    {
        "apiVersion": {"const": "kustomize.config.k8s.io/v1beta1"},
        "kind": {"const": "Kustomization"},
        "namespace": _STR,
        "resources": {"type": "array", "items": _STR, "minItems": 1},
    },
    ["apiVersion", "kind", "resources"],
)
KUSTOMIZATION["$comment"] = "kubernetes-sigs/kustomize api/types/kustomization.go (Kustomization: namespace, resources)"

_RULE = _obj(
    {
        "seriesQuery": _STR,
        "resources": _obj({"overrides": {"type": "object", "additionalProperties": _obj({"resource": _STR}, ["resource"])}}),
        "name": _obj({"matches": _STR, "as": _STR}, ["matches"]),
        "metricsQuery": _STR,
    },
    ["seriesQuery", "metricsQuery"],
)
PROMETHEUS_ADAPTER_VALUES = _obj({"rules": _obj({"custom": {"type": "array", "items": _RULE, "minItems": 1}}, closed=False)}, ["rules"], closed=False)
PROMETHEUS_ADAPTER_VALUES["$comment"] = (
    "prometheus-community/helm-charts charts/prometheus-adapter/values.yaml rules.custom; rule fields from "
    "kubernetes-sigs/prometheus-adapter docs/config.md (seriesQuery, resources.overrides, name.matches/as, metricsQuery)"
)

# (apiVersion, kind) -> schema
CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): LEADER_WORKER_SET,
    ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR,
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"): KUSTOMIZATION,
}
