"""The llmapi flavour's Triton models: `ensemble` (speculative) and, when asked, `baseline` (a second,
target-only LLM). Each is the llmapi Python model with its model.yaml; its config.pbtxt is the `ensemble`
template's, so the request and response names are the ensemble's by construction."""

from __future__ import annotations

from pathlib import Path

import yaml
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.config import BuildConfig, LlmapiConfig, checkpoint_path
from trtspec.contract.models import BASELINE, ENSEMBLE
from trtspec.llmapi import model_yaml
from trtspec.llmapi.serving import GUIDED_REFUSAL
from trtspec.spec.methods import METHODS

MODEL_PY = Path(__file__).resolve().parent.parent / "model_repository" / "llmapi" / "1" / "model.py"


def endpoint_config(base: mc.ModelConfig, name: str, max_batch_size: int) -> mc.ModelConfig:
    """`base`: the text endpoint's config, with its declared tensors (trtspec.repository.endpoint_io)."""
    c = mc.ModelConfig()
    c.CopyFrom(base)
    c.name, c.platform, c.backend = name, "", "python"
    c.max_batch_size = max_batch_size
    c.ClearField("ensemble_scheduling")
    c.model_transaction_policy.decoupled = True
    del c.instance_group[1:]  # one instance: the LLM places itself on its GPUs
    c.instance_group[0].count = 1
    return c


def model_yamls(cfg: BuildConfig, draft_dir: Path | None = None, version: str | None = None,
                kv_fraction: float | None = None) -> dict[str, dict]:
    """model.yaml per endpoint. `draft_dir`: the draft to load (an FP8 export), default the config's draft."""

    target = checkpoint_path(cfg, "target").resolve()
    if draft_dir is None and cfg.draft is not None and METHODS[cfg.speculative.method].draft is not None:
        draft_dir = checkpoint_path(cfg, "draft").resolve()
    out = {ENSEMBLE: model_yaml.generate(cfg, target, draft_dir, version=version, kv_fraction=kv_fraction)}
    if (cfg.llmapi or LlmapiConfig()).baseline_endpoint:
        out[BASELINE] = model_yaml.generate(cfg, target, None, version=version, kv_fraction=kv_fraction,
                                            speculative=False)
    return out


def write_llmapi_models(cfg: BuildConfig, root: Path, write, base: mc.ModelConfig, **yaml_args) -> None:
    """`write(config, model_py)` is the repository writer's; `base` the text endpoint's config (endpoint_config)."""
    for name, doc in model_yamls(cfg, **yaml_args).items():
        config = endpoint_config(base, name, cfg.limits.max_batch_size)
        why = model_yaml.guided_refusal(cfg, yaml_args.get("version"), speculative=name == ENSEMBLE)
        if why is not None:
            config.parameters[GUIDED_REFUSAL].string_value = why
        write(config, MODEL_PY)
        (root / name / "1" / "model.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
