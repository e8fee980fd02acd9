"""Offline validation of the manifests: Kubernetes objects against the OpenAPI schemas kubernetes-validate
ships (strict: unknown fields are errors), the rest against trtspec.k8s.schemas."""

from __future__ import annotations

from typing import Any

import jsonschema
import kubernetes_validate

from trtspec.k8s.manifests import ADAPTER_VALUES, Bundle
from trtspec.k8s.schemas import CRD_SCHEMAS, PROMETHEUS_ADAPTER_VALUES

# The Kubernetes release whose schemas the manifests are checked against (kubernetes-validate >= 1.33 has them).
KUBERNETES_VERSION = "1.33"


def _where(e: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in e.absolute_path) or "(top level)"


def _jsonschema_errors(doc: Any, schema: dict[str, Any], prefix: str = "") -> list[str]:
    v = jsonschema.Draft202012Validator(schema)
    return [f"{prefix}{_where(e)}: {e.message}" for e in sorted(v.iter_errors(doc), key=lambda e: list(e.absolute_path))]


def _kubernetes_errors(doc: dict[str, Any], version: str, prefix: str = "") -> list[str]:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{prefix}{_where(e)}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{prefix}no schema: {e.message}"]
    return []


def validate_object(doc: dict[str, Any], version: str = KUBERNETES_VERSION) -> list[str]:
    """Problems with one object (empty: valid), each as 'field.path: message'."""
    schema = CRD_SCHEMAS.get((doc.get("apiVersion"), doc.get("kind")))  # type: ignore[arg-type]
    if schema is None:
        return _kubernetes_errors(doc, version)
    errors = _jsonschema_errors(doc, schema)
    if doc.get("kind") == "LeaderWorkerSet" and not errors:
        # the pod templates are plain PodTemplateSpecs: check them with Kubernetes' own schema
        lwt = doc["spec"]["leaderWorkerTemplate"]
        for key in ("leaderTemplate", "workerTemplate"):
            if key in lwt:
                wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": lwt[key]}
                errors += [
                    e.replace("template.", f"spec.leaderWorkerTemplate.{key}.", 1)
                    for e in _kubernetes_errors(wrapped, version)
                ]
    return errors


def validate_adapter_values(doc: dict[str, Any]) -> list[str]:
    return _jsonschema_errors(doc, PROMETHEUS_ADAPTER_VALUES)


def validate_bundle(bundle: Bundle, version: str = KUBERNETES_VERSION) -> list[str]:
    """Every problem in every file of the bundle, as 'file: kind/name: field.path: message'."""
    errors = []
    for m in bundle.manifests:
        for doc in m.docs:
            if m.filename == ADAPTER_VALUES:
                errors += [f"{m.filename}: {e}" for e in validate_adapter_values(doc)]
                continue
            what = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name', '')}".rstrip("/")
            errors += [f"{m.filename}: {what}: {e}" for e in validate_object(doc, version)]
    return errors
