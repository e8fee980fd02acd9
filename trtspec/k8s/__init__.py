"""`trtspec k8s`: Kubernetes manifests for a built deployment (topology, manifests, offline validation)."""

from trtspec.k8s.manifests import Bundle, K8sOptions, Manifest, build_bundle
from trtspec.k8s.topology import K8sError, Topology, plan_topology

__all__ = ["Bundle", "K8sError", "K8sOptions", "Manifest", "Topology", "build_bundle", "plan_topology"]
