"""`trtspec k8s CONFIG -o DIR`: validated Kubernetes manifests (kustomize) for the deployment CONFIG builds."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from trtspec.commands._common import UserError, console, err_console
from trtspec.commands.serve import serve
from trtspec.config import ConfigError, load_config
from trtspec.k8s.manifests import (
    API_KEY_SECRET_KEY,
    DEFAULT_IMAGE,
    DEFAULT_OPENAI_PORT,
    QUEUE_METRIC,
    K8sOptions,
    build_bundle,
)
from trtspec.k8s.topology import K8sError, plan_topology
from trtspec.k8s.validate import KUBERNETES_VERSION, validate_bundle
from trtspec.machine import GpuSpecError, nvml_gpus, parse_gpu_spec
from trtspec.openai.auth import API_KEY_ENV

HELP = f"""Write Kubernetes manifests for the deployment CONFIG describes, validated offline.

\b
DIR gets a kustomize folder (`kubectl apply -k DIR`):
  deployment.yaml       replicas of `trtspec serve` on the built model repository;
                        nvidia.com/gpu = what one replica's placement needs (target
                        tp x pp, plus the draft's GPUs when gpu_device_ids put it on
                        its own), /dev/shm in memory, startup/readiness/liveness on
                        /v2/health/*, preStop + grace period that drain streams
  leaderworkerset.yaml  instead, when one replica is larger than a node (target
                        tp x pp > GPUs per node): one group of whole nodes, MPI
                        ranks started from the leader (+ rbac.yaml)
  service.yaml          http, grpc, metrics (ports from the config's triton:), openai
                        (with --api-key-secret NAME its key comes from that Secret)
  hpa.yaml              autoscaling/v2 on {QUEUE_METRIC}
                        of the speculative loop model, per pod
  podmonitor.yaml       Prometheus scrape of the metrics port
  configmap.yaml, pvc.yaml
and, applied on their own: build-job.yaml (`trtspec build` onto the models
volume, --storage pvc) and prometheus-adapter-values.yaml (the adapter rule
that serves the metric to the HPA). See docs/deploy-k8s.md.

\b
Storage (--storage): pvc (default for TensorRT-LLM): checkpoints and the build
output live on a PersistentVolumeClaim at --models-path, built once by
build-job.yaml; the repository refers to engines by absolute path, so build and
serve mount it at the same path. init (default for engine: reference): an init
container runs `trtspec build` at pod start (no engines: seconds).

\b
Nodes: --gpus describes one node like `trtspec build --gpus` (h100x8, h200x8):
its GPU product becomes the nvidia.com/gpu.product node selector, its GPU count
decides whether a replica fits one node. Default: this machine's GPUs.

\b
Every object is checked against Kubernetes {KUBERNETES_VERSION}'s OpenAPI schemas
(kubernetes-validate, strict); LeaderWorkerSet, PodMonitor and kustomization
against schemas of the fields trtspec writes. Combinations that cannot run
(a replica that does not fill whole nodes, gaps in gpu_device_ids, port 0)
are errors naming the field, exit code 2.

\b
Examples:
  trtspec k8s build_configs/llama-3.1-8b_llama-3.2-1b_h100.yaml -o k8s/ --gpus h100x8
  trtspec k8s CONFIG --dry-run --gpus h200x8 --image registry.example.com/trtspec:25.12
  trtspec k8s CONFIG -o k8s/ --gpus h100x8 --min-replicas 2 --max-replicas 8 --no-openai
  trtspec k8s CONFIG -o k8s/ --gpus h100x8 --api-key-secret trtspec-api-key
"""


class InputError(UserError):
    """Bad input or a combination that cannot run: exit code 2, one line."""

    exit_code = 2

    def show(self, file: object = None) -> None:  # noqa: ARG002 - click's signature
        err_console.print(f"[bold red]error:[/] {self.message}", soft_wrap=True)


@click.command("k8s", help=HELP, short_help="Write validated Kubernetes manifests (Deployment/LWS, Service, HPA).")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--output", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory to write the manifests to (created).")
@click.option("--dry-run", is_flag=True, help="Print the manifests instead of writing them.")
@click.option("--image", default=DEFAULT_IMAGE, show_default=True,
              help="Container image: the repository's Dockerfile, pushed where the nodes pull from.")
@click.option("--gpus", default=None, metavar="SPEC", help="One node's GPUs, e.g. h100x8, h200x8 (as `trtspec build --gpus`).")
@click.option("--gpus-per-node", type=click.IntRange(1, 64), default=None,
              help="GPUs per node, when it differs from the --gpus count (or without --gpus).")
@click.option("--name", default=None, help="Name of the objects [default: the config's name as a DNS label].")
@click.option("--namespace", default=None, help="Namespace (written into kustomization.yaml).")
@click.option("--storage", type=click.Choice(["pvc", "init"]), default=None,
              help="Where the model repository comes from (see above) [default: pvc, init for engine: reference].")
@click.option("--models-path", default="/models", show_default=True,
              help="Where the models volume is mounted; checkpoints and the build output must be under it.")
@click.option("--build-dir", default=None,
              help="The build output on the models volume [default: <models-path>/trtspec-out/<config name>].")
@click.option("--pvc", default=None, help="Use this existing PersistentVolumeClaim instead of writing pvc.yaml.")
@click.option("--pvc-size", default="500Gi", show_default=True, help="Size of the claim pvc.yaml asks for.")
@click.option("--openai-port", type=click.IntRange(1, 65535), default=DEFAULT_OPENAI_PORT, show_default=True,
              help="Port of the OpenAI-compatible endpoint in the pod and the Service.")
@click.option("--no-openai", is_flag=True, help="No OpenAI-compatible port.")
@click.option("--api-key-secret", default=None, metavar="NAME",
              help=f"Protect the OpenAI API with the key in Secret NAME (its '{API_KEY_SECRET_KEY}' entry; create it "
                   f"with `kubectl create secret generic NAME --from-literal={API_KEY_SECRET_KEY}=KEY`): the server container gets it "
                   f"as ${API_KEY_ENV}, as `trtspec serve --api-key` [default: the API is open].")
@click.option("--min-replicas", type=click.IntRange(1), default=1, show_default=True, help="HPA minimum (and initial replicas).")
@click.option("--max-replicas", type=click.IntRange(1), default=4, show_default=True, help="HPA maximum.")
@click.option("--target-queue", default="1", show_default=True,
              help="HPA target: average requests per pod waiting for a loop instance (a quantity, e.g. 1, 500m).")
@click.option("--startup-timeout", type=click.IntRange(60), default=1800, show_default=True,
              help="Seconds a pod may take to load its engines before it is restarted.")
@click.option("--shm-size", default="2Gi", show_default=True, help="Size limit of the memory-backed /dev/shm.")
def command(
    config: Path,
    output: Path | None,
    dry_run: bool,
    image: str,
    gpus: str | None,
    gpus_per_node: int | None,
    name: str | None,
    namespace: str | None,
    storage: str | None,
    models_path: str,
    build_dir: str | None,
    pvc: str | None,
    pvc_size: str,
    openai_port: int,
    no_openai: bool,
    api_key_secret: str | None,
    min_replicas: int,
    max_replicas: int,
    target_queue: str,
    startup_timeout: int,
    shm_size: str,
) -> None:
    if output is None and not dry_run:
        raise InputError("-o/--output: say where to write the manifests (or --dry-run to print them)")
    try:
        # the checkpoints live on the cluster's volume, not here
        cfg = load_config(config, check_paths=False)
        node_gpus = parse_gpu_spec(gpus) if gpus else nvml_gpus()[0]
        topo = plan_topology(cfg, node_gpus, gpus_per_node)
        opts = K8sOptions(
            image=image, name=name, namespace=namespace, storage=storage,  # type: ignore[arg-type]
            models_path=models_path, build_dir=build_dir, pvc=pvc, pvc_size=pvc_size,
            openai_port=None if no_openai else openai_port, api_key_secret=api_key_secret,
            min_replicas=min_replicas, max_replicas=max_replicas,
            target_queue=target_queue, startup_timeout_s=startup_timeout, shm_size=shm_size,
            serve_flags=frozenset(o for p in serve.params for o in p.opts),
        )  # fmt: skip
        bundle = build_bundle(cfg, topo, opts)
    except (ConfigError, GpuSpecError, K8sError) as e:
        raise InputError(escape(str(e))) from None
    errors = validate_bundle(bundle)
    if errors:
        raise UserError(escape("the manifests do not validate (a trtspec bug, please report):\n  " + "\n  ".join(errors)))

    if dry_run:
        for m in bundle.manifests:
            click.echo(f"# ---- {m.filename}")
            click.echo(bundle.render(m), nl=False)
    else:
        assert output is not None
        output.mkdir(parents=True, exist_ok=True)
        for m in bundle.manifests:
            (output / m.filename).write_text(bundle.render(m))
    out_console = err_console if dry_run else console

    def say(text: str) -> None:
        out_console.print(text, soft_wrap=True)

    t = bundle.topology
    if t.gpus_per_replica:
        where = f"{t.pods_per_replica} pods x {t.gpus_per_pod} GPUs" if t.multi_node else f"{t.gpus_per_pod} GPU(s)"
        say(f"one replica: {where}" + (f" on {t.product}" if t.product else "") + f"; placement {t.placement}")
    else:
        say("one replica: CPU only")
    for note in bundle.notes:
        say(f"note: {escape(note)}")
    say(f"validated against Kubernetes {KUBERNETES_VERSION} schemas ({len(bundle.objects())} objects)")
    if not dry_run:
        say(f"wrote {len(bundle.manifests)} files to {escape(str(output))}; apply with: kubectl apply -k {escape(str(output))}")
