"""Writes the Triton model repository of a deployment from the templates in model_repository/.

Templates are real config.pbtxt files. Each one is parsed with Triton's ModelConfig protobuf and the
deployment's values are set by field name, then written back; nothing is filled by string
substitution, so no `${...}` can stay unfilled. The engine flavours differ only in how the
`tensorrt_llm` / `tensorrt_llm_draft` models are implemented; both declare the same tensors.

Repository (reference or tensorrt_llm flavour):
  preprocessing, postprocessing      target tokenizer
  tensorrt_llm, tensorrt_llm_draft   target and draft engines
  speculative, baseline_loop         the speculative loop (token ids in and out), and target-only
  ensemble, baseline                 the text endpoints: tokenizer + the same loop + detokenizer in one
                                     decoupled model (so a client's cancellation reaches the loop)

Repository (llmapi flavour, trtspec.llmapi.repository): `ensemble` hosts TensorRT-LLM's LLM (speculation
inside it), `baseline` a second, target-only LLM when llmapi.baseline_endpoint is set.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.config import BuildConfig, EngineKind, checkpoint_path
from trtspec.contract import LOOP_TOKEN_INPUTS, REQUEST_FIELDS, RESPONSE_STATS, nvidia
from trtspec.loop import LoopSettings
from trtspec.pipeline.preflight import plan_max_num_tokens
from trtspec.triton.loop_model import settings_parameter

TEMPLATES = Path(__file__).resolve().parent / "model_repository"

TARGET, DRAFT = "tensorrt_llm", "tensorrt_llm_draft"
LOOP, BASELINE_LOOP = "speculative", "baseline_loop"
ENSEMBLE, BASELINE = "ensemble", "baseline"  # the text endpoints (model_repository/text)
TEXT = "text"


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


def _add_tensor(tensors, name: str, dtype: str, dims: tuple[int, ...], optional: bool = False) -> None:
    t = tensors.add(name=name, data_type=mc.DataType.Value(f"TYPE_{dtype}"), dims=list(dims))
    if optional:
        t.optional = True


# what the loop returns besides the statistics: the tokens a response adds, the tokens generated before them
# (a window, as detokenization context) and the running length
_LOOP_TOKEN_OUTPUTS = (("output_ids", (-1,)), ("prefix_ids", (-1,)), ("sequence_length", (1,)))


def _stat_outputs(config: mc.ModelConfig) -> None:
    for s in RESPONSE_STATS:
        _add_tensor(config.output, s.name, s.dtype, (-1,) if s.vector else (1,))


def loop_io(config: mc.ModelConfig) -> None:
    """The loop model's declared tensors, from trtspec.contract."""
    for name, dtype, dims, optional in LOOP_TOKEN_INPUTS:
        _add_tensor(config.input, name, dtype, dims, optional)
    for f in REQUEST_FIELDS:
        if f.loop_input is not None:
            _add_tensor(config.input, f.loop_input, f.dtype, f.dims, optional=True)
    for name, dims in _LOOP_TOKEN_OUTPUTS:
        _add_tensor(config.output, name, "INT32", dims)
    _stat_outputs(config)


def endpoint_io(config: mc.ModelConfig) -> None:
    """A text endpoint's declared tensors (the interface of NVIDIA's ensemble; any flavour), from trtspec.contract."""
    for f in REQUEST_FIELDS:
        _add_tensor(config.input, f.name, f.dtype, f.dims, optional=not f.required)
    _add_tensor(config.output, "text_output", "STRING", (1,))
    _add_tensor(config.output, "output_ids", "INT32", (-1,))
    _add_tensor(config.output, "sequence_length", "INT32", (1,))
    _stat_outputs(config)


def loop_settings(cfg: BuildConfig, *, baseline: bool, uses_model: bool, engine_input_names: dict[str, str]) -> LoopSettings:
    return LoopSettings(
        speculative=cfg.speculative,
        max_input_len=cfg.limits.max_input_len,
        target_model=TARGET,
        draft_model=DRAFT if uses_model else None,
        draft_disabled=baseline,
        engine_input_names=engine_input_names,
        max_concurrent_requests=max(64, cfg.limits.max_batch_size),
    )


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


LEGACY_ENGINE_NAMES = {"min_tokens": "min_length", "seed": "random_seed"}


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
        # dynamic batching: the requests that arrive while a batch runs form the next one (trtspec.batching
        # steps each batch's requests together)
        config.ClearField("parameters")
        _set_params(
            config,
            checkpoint=checkpoint_path(cfg, role).resolve(),
            device=cfg.device,
            dtype=model.dtype,
            kv_cache_entries=2 * cfg.limits.max_batch_size,
            max_input_len=cfg.limits.max_input_len,
            # the in-flight batcher's limits (trtspec.batching): requests per step and tokens per step
            max_batch_size=cfg.limits.max_batch_size,
            max_num_tokens=plan_max_num_tokens(cfg),
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
        if cfg.engine is EngineKind.llmapi:
            from trtspec.llmapi.repository import write_llmapi_models

            w = _Writer(cfg, partial)
            write_llmapi_models(cfg, partial, w.write, load_template(TEXT), draft_dir=draft_engine_dir,
                                version=version, kv_fraction=fractions.get("target"))
        else:
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
    aliases = LEGACY_ENGINE_NAMES if legacy_tensor_names(version) else {}
    for loop_name, baseline in ((LOOP, False), (BASELINE_LOOP, True)):
        c = w.batch(load_template(LOOP))
        c.name = loop_name
        c.instance_group[0].count = cfg.triton.speculative_instance_count if not baseline else 1
        loop_io(c)
        _set_params(c, **settings_parameter(loop_settings(cfg, baseline=baseline, uses_model=uses_model, engine_input_names=aliases)))
        w.write(c, TEMPLATES / LOOP / "1" / "model.py")

    for name, baseline in ((ENSEMBLE, False), (BASELINE, True)):
        c = w.batch(load_template(TEXT))
        c.name = name
        c.instance_group[0].count = cfg.triton.speculative_instance_count if not baseline else 1
        endpoint_io(c)
        settings = loop_settings(cfg, baseline=baseline, uses_model=uses_model, engine_input_names=aliases)
        _set_params(c, tokenizer_dir=tokenizer_dir, **settings_parameter(settings))
        w.write(c, TEMPLATES / TEXT / "1" / "model.py")


def list_models(repo: Path) -> dict[str, mc.ModelConfig]:
    """Every model of a repository, parsed (used by `serve` and the tests)."""
    from trtspec.server.launch import read_repository

    return {m.path.name: m.config for m in read_repository(repo) if m.config is not None}
