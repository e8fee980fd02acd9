"""Writes the Triton model repository of a deployment from the templates in model_repository/.

Templates are real config.pbtxt files. Each one is parsed with Triton's ModelConfig protobuf and the
deployment's values are set by field name, then written back; nothing is filled by string
substitution, so no `${...}` can stay unfilled. The engine flavours differ only in how the
`tensorrt_llm` / `tensorrt_llm_draft` models are implemented; both declare the same tensors.

Repository (reference or tensorrt_llm flavour):
  preprocessing, postprocessing      target tokenizer
  tensorrt_llm, tensorrt_llm_draft   target and draft engines
  ngram_draft                        prompt-lookup drafter (any request may pick draft_source)
  speculative, ensemble              the speculative loop and text-in/text-out endpoint
  baseline_loop, baseline            the same, target-only (the A/B baseline)
"""

from __future__ import annotations

import shutil
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.config import BuildConfig, EngineKind, checkpoint_path
from trtspec.contract import nvidia

TEMPLATES = Path(__file__).resolve().parent / "model_repository"

TARGET, DRAFT, NGRAM = "tensorrt_llm", "tensorrt_llm_draft", "ngram_draft"
LOOP, BASELINE_LOOP = "speculative", "baseline_loop"
ENSEMBLE, BASELINE = "ensemble", "baseline"


class RepositoryError(Exception):
    pass


def load_template(model: str) -> mc.ModelConfig:
    path = TEMPLATES / model / "config.pbtxt"
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def render(config: mc.ModelConfig) -> str:
    text = text_format.MessageToString(config)
    if "${" in text:  # defensive: values come from the user's config, and must never look like templates
        raise RepositoryError(f"model {config.name}: a value contains '${{': {text[text.index('${') :][:80]}")
    return text


def _set_params(config: mc.ModelConfig, **values: object) -> None:
    for key, value in values.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        config.parameters[key].string_value = str(value)


def engine_io(config: mc.ModelConfig, trtllm_version: str | None) -> mc.ModelConfig:
    """Declare exactly the inputs/outputs of NVIDIA's `tensorrt_llm` model for `trtllm_version` (its contract
    data; the newest supported one when unset): tensor names such as min_length/min_tokens come from there."""
    try:
        contract = nvidia.model_io(nvidia.version_for(trtllm_version), TARGET)
    except ValueError as e:
        raise RepositoryError(f"tensorrt_llm_version: {e}") from None
    del config.input[:]
    del config.output[:]
    for t in contract.inputs:
        t.to_pb(config.input.add())
    for t in contract.outputs:
        t.to_pb(config.output.add())
    return config


def legacy_tensor_names(trtllm_version: str | None) -> bool:
    """TensorRT-LLM before 0.20 names min_tokens `min_length` and seed `random_seed` (from the contract data)."""
    io = nvidia.model_io(nvidia.version_for(trtllm_version), TARGET)
    return any(t.name == "min_length" for t in io.inputs)


class _Writer:
    def __init__(self, cfg: BuildConfig, root: Path):
        self.cfg, self.root = cfg, root

    def write(self, config: mc.ModelConfig, model_py: Path | None = None) -> None:
        d = self.root / config.name
        (d / "1").mkdir(parents=True, exist_ok=True)
        (d / "config.pbtxt").write_text(render(config))
        if model_py is not None:
            shutil.copy2(model_py, d / "1" / "model.py")

    def batch(self, config: mc.ModelConfig) -> mc.ModelConfig:
        config.max_batch_size = self.cfg.limits.max_batch_size
        if config.HasField("dynamic_batching"):
            del config.dynamic_batching.preferred_batch_size[:]
            config.dynamic_batching.preferred_batch_size.append(self.cfg.limits.max_batch_size)
        return config


def _engine_config(
    cfg: BuildConfig,
    role: str,
    name: str,
    engine_dir: Path | None,
    trtllm_version: str | None,
    kv_fraction: float | None,
) -> mc.ModelConfig:
    model = getattr(cfg, role)
    config = engine_io(load_template(TARGET), trtllm_version)
    config.name = name
    config.instance_group[0].count = model.instance_count
    if cfg.engine is EngineKind.reference:
        config.backend = "python"
        config.ClearField("dynamic_batching")  # one request per execute(): steps of many requests interleave
        config.ClearField("parameters")
        _set_params(
            config,
            checkpoint=checkpoint_path(cfg, role).resolve(),
            device=cfg.device,
            dtype=model.dtype,
            kv_cache_entries=2 * cfg.limits.max_batch_size,
            max_input_len=cfg.limits.max_input_len,
            use_draft_vocab=role == "draft",  # a draft checkpoint's draft_vocab.json, if it has one
            exclude_input_in_output=False,  # the loop reads the whole sequence back, as NVIDIA's BLS does
        )
        return config
    if engine_dir is None:
        raise RepositoryError(f"{name}: the tensorrt_llm flavour needs the {role} engine directory")
    devices = model.gpu_device_ids if model.gpu_device_ids is not None else list(range(model.world_size))
    _set_params(
        config,
        gpt_model_path=Path(engine_dir).resolve(),
        gpu_device_ids=",".join(str(d) for d in devices),
        kv_cache_free_gpu_mem_fraction=kv_fraction if kv_fraction is not None else 0.5,
        max_beam_width=1,
    )
    return config


def generate_repository(
    cfg: BuildConfig,
    output_dir: Path,
    *,
    target_engine_dir: Path | None = None,
    draft_engine_dir: Path | None = None,
    trtllm_version: str | None = None,
    kv_cache_fractions: dict[str, float] | None = None,
) -> Path:
    """Writes `output_dir` (replacing it only once the new one is complete) and returns it."""
    output_dir = Path(output_dir)
    version = trtllm_version or cfg.tensorrt_llm_version
    fractions = dict(kv_cache_fractions or {})
    for role in ("target", "draft"):
        m = getattr(cfg, role)
        if m is not None and m.kv_cache_free_gpu_mem_fraction is not None:
            fractions.setdefault(role, m.kv_cache_free_gpu_mem_fraction)
    partial = output_dir.with_name(output_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        _write_models(cfg, partial, version, fractions, target_engine_dir, draft_engine_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # nothing half-written is left looking finished
        raise
    if output_dir.exists():
        shutil.rmtree(output_dir)
    partial.rename(output_dir)
    return output_dir


def _write_models(
    cfg: BuildConfig,
    partial: Path,
    version: str | None,
    fractions: dict[str, float],
    target_engine_dir: Path | None,
    draft_engine_dir: Path | None,
) -> None:
    spec = cfg.speculative
    uses_model = cfg.draft is not None and spec.draft_source in ("model", "hybrid")
    uses_ngram = True  # weightless and cheap: every deployment can take draft_source per request
    w = _Writer(cfg, partial)
    tokenizer_dir = checkpoint_path(cfg, "target").resolve()

    for name, count in (
        ("preprocessing", cfg.triton.preprocessing_instance_count),
        ("postprocessing", cfg.triton.postprocessing_instance_count),
    ):
        c = w.batch(load_template(name))
        c.instance_group[0].count = count
        _set_params(c, tokenizer_dir=tokenizer_dir)
        w.write(c, TEMPLATES / name / "1" / "model.py")

    engine_py = TEMPLATES / "reference_engine" / "1" / "model.py" if cfg.engine is EngineKind.reference else None
    w.write(w.batch(_engine_config(cfg, "target", TARGET, target_engine_dir, version, fractions.get("target"))), engine_py)
    if cfg.draft is not None and uses_model:
        w.write(w.batch(_engine_config(cfg, "draft", DRAFT, draft_engine_dir, version, fractions.get("draft"))), engine_py)
    if uses_ngram:
        c = w.batch(engine_io(load_template(TARGET), version))
        c.name, c.backend = NGRAM, "python"
        c.ClearField("dynamic_batching")
        c.ClearField("parameters")
        _set_params(c, ngram_max=spec.ngram_max, ngram_min=spec.ngram_min)
        w.write(c, TEMPLATES / NGRAM / "1" / "model.py")

    legacy = legacy_tensor_names(version)
    for loop_name, disabled in ((LOOP, False), (BASELINE_LOOP, True)):
        c = w.batch(load_template(LOOP))
        c.name = loop_name
        c.instance_group[0].count = cfg.triton.speculative_instance_count if not disabled else 1
        _set_params(
            c,
            target_model_name=TARGET,
            draft_model_name=DRAFT if uses_model else "",
            ngram_model_name=NGRAM if uses_ngram else "",
            max_draft_len=spec.max_draft_len,
            num_draft_tokens=spec.num_draft_tokens,
            draft_source=spec.draft_source,
            draft_length_policy=spec.draft_length_policy,
            adaptive_min_draft_len=spec.adaptive.min_draft_len,
            adaptive_pause_below_acceptance=spec.adaptive.pause_below_acceptance,
            adaptive_window=spec.adaptive.window,
            adaptive_probe_every=spec.adaptive.probe_every,
            adaptive_measure_payoff=spec.adaptive.measure_payoff,
            max_input_len=cfg.limits.max_input_len,
            max_concurrent_requests=max(64, cfg.limits.max_batch_size),
            draft_disabled=disabled,
            engine_min_tokens_name="min_length" if legacy else "min_tokens",
            engine_seed_name="random_seed" if legacy else "seed",
        )
        w.write(c, TEMPLATES / LOOP / "1" / "model.py")

    for ens_name, loop_name in ((ENSEMBLE, LOOP), (BASELINE, BASELINE_LOOP)):
        c = w.batch(load_template(ENSEMBLE))
        c.name = ens_name
        for step in c.ensemble_scheduling.step:
            if step.model_name == LOOP:
                step.model_name = loop_name
        w.write(c)


def list_models(repo: Path) -> dict[str, mc.ModelConfig]:
    """Every model of a repository, parsed (used by `serve` and the tests)."""
    out = {}
    for cfg_path in sorted(Path(repo).glob("*/config.pbtxt")):
        out[cfg_path.parent.name] = text_format.Parse(cfg_path.read_text(), mc.ModelConfig())
    return out
