"""Writes the Triton model repository of a deployment from the templates in model_repository/.

Templates are real config.pbtxt files. Each one is parsed with Triton's ModelConfig protobuf and the
deployment's values are set by field name, then written back; nothing is filled by string
substitution, so no `${...}` can stay unfilled. The engine flavours differ only in how the
`tensorrt_llm` / `tensorrt_llm_draft` models are implemented; both declare the same tensors.

Repository (reference or tensorrt_llm flavour):
  preprocessing, postprocessing      target tokenizer
  tensorrt_llm, tensorrt_llm_draft   target and draft engines
  tensorrt_llm_target_only           reference Medusa: the target without the heads, for the target-only endpoints
                                     (the target engine speculates for every request it serves)
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

from trtspec.config import BuildConfig, EngineKind, checkpoint_path, plan_max_num_tokens
from trtspec.spec.drafters import drafts_in_target
from trtspec.spec.methods import in_engine
from trtspec.reference_engine.tensor_io import NEXT_DRAFT_IDS, NEXT_DRAFT_LEN
from trtspec.contract import LOOP_TOKEN_INPUTS, REQUEST_FIELDS, RESPONSE_OUTPUTS, RESPONSE_STATS, STAT, nvidia
from trtspec.contract.models import BASELINE, BASELINE_LOOP, DRAFT, ENSEMBLE, LOOP, TARGET, TARGET_ONLY
from trtspec.guided import (
    BACKEND as GUIDED_BACKEND, BACKEND_PARAMETER, GUIDE_START, TOKENIZER_INFO_FILE, TOKENIZER_INFO_PARAMETER,
    GuidedSettings, load_tokenizer_info, write_tokenizer_info,
)
from trtspec.llmapi.repository import write_llmapi_models
from trtspec.spec.loop import LoopSettings, settings_parameter
from trtspec.repository_reader import RepositoryError, read_repository
from trtspec.medusa import DEFAULT_CHOICES, to_pbtxt

TEMPLATES = Path(__file__).resolve().parent / "model_repository"

TEXT = "text"


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
    if any(t.name == name for t in tensors):  # one declaration per name (end_id is a token input and a field)
        return
    t = tensors.add(name=name, data_type=mc.DataType.Value(f"TYPE_{dtype}"), dims=list(dims))
    if optional:
        t.optional = True


# what the loop returns besides the statistics: the tokens a response adds, the tokens generated before them
# (a window, as detokenization context) and the running length
_LOOP_TOKEN_OUTPUTS = (("output_ids", (-1,)), ("prefix_ids", (-1,)), ("sequence_length", (1,)))


def _contract(version: str | None, model: str) -> nvidia.ModelIO:
    try:
        return nvidia.model_io(nvidia.version_for(version), model)
    except ValueError as e:
        raise RepositoryError(f"tensorrt_llm_version: {e}") from None


def _outputs(config: mc.ModelConfig, nvidia_model: str, version: str | None) -> None:
    """trtspec's statistics and outputs, then every output NVIDIA's `nvidia_model` declares in `version` that is not
    declared yet
    (those the loop cannot compute are never sent, as TensorRT-LLM leaves out outputs a request did not enable)."""
    for s in RESPONSE_STATS:
        _add_tensor(config.output, s.name, s.dtype, (-1,) if s.vector else (1,))
    for o in RESPONSE_OUTPUTS:
        _add_tensor(config.output, o.name, o.dtype, o.dims)
    for t in _contract(version, nvidia_model).outputs:
        if not any(o.name == t.name for o in config.output):
            t.to_pb(config.output.add())


def _request_fields(config: mc.ModelConfig, *, endpoint: bool) -> None:
    """Every request field under its client names (a text endpoint: text_input and max_tokens required), and for
    the loop model also under the loop's TensorRT-LLM names (runtime_top_k, streaming, ...)."""
    for f in REQUEST_FIELDS:
        for name in (f.name, *f.aliases) if endpoint else f.names:
            _add_tensor(config.input, name, f.dtype, f.dims, optional=not (f.required and endpoint))


def loop_io(config: mc.ModelConfig, version: str | None = None) -> None:
    """The loop model's declared tensors, from trtspec.contract: token ids under TensorRT-LLM's names, or text as
    NVIDIA's tensorrt_llm_bls takes it (every BLS input of `version`), per request."""
    for name, dtype, dims, optional in LOOP_TOKEN_INPUTS:
        _add_tensor(config.input, name, dtype, dims, optional=True)
    _request_fields(config, endpoint=False)
    _add_tensor(config.output, "text_output", "STRING", (-1,))
    for name, dims in _LOOP_TOKEN_OUTPUTS:
        _add_tensor(config.output, name, "INT32", dims)
    _outputs(config, "tensorrt_llm_bls", version)


def endpoint_io(config: mc.ModelConfig, version: str | None = None) -> None:
    """A text endpoint's declared tensors (every input and output of NVIDIA's ensemble of `version`, plus trtspec's;
    any flavour), from trtspec.contract."""
    _request_fields(config, endpoint=True)
    _add_tensor(config.output, "text_output", "STRING", (-1,))
    _add_tensor(config.output, "output_ids", "INT32", (-1,))
    _add_tensor(config.output, "sequence_length", "INT32", (1,))
    _outputs(config, "ensemble", version)


def pre_post_io(config: mc.ModelConfig, version: str | None) -> None:
    """preprocessing / postprocessing declare exactly NVIDIA's I/O of `version` (contract data), then their extras
    from the template (postprocessing's optional PREFIX_IDS, the context for streamed chunks)."""
    extras = [t for t in config.input]
    del config.input[:]
    del config.output[:]
    io = _contract(version, config.name)
    for t in io.inputs:
        t.to_pb(config.input.add())
    for t in io.outputs:
        t.to_pb(config.output.add())
    for t in extras:
        if not any(i.name == t.name for i in config.input):
            config.input.add().CopyFrom(t)


def guided_settings(cfg: BuildConfig, version: str | None, final_root: Path) -> GuidedSettings | None:
    """How the deployment serves guided requests: None where its release's tensorrt_llm model declares no guide
    inputs (before 0.19), xgrammar is not installed, or the target has no fast tokenizer (then guided requests are
    refused by name)."""
    import importlib.util

    declared = any(t.name == "guided_decoding_guide_type" for t in _contract(version, TARGET).inputs)
    if not declared or importlib.util.find_spec("xgrammar") is None:
        return None
    if load_tokenizer_info(checkpoint_path(cfg, "target")) is None:
        return None
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(str(checkpoint_path(cfg, "target"))).vocab_size)
    return GuidedSettings(
        tokenizer_info=str((final_root / TARGET / TOKENIZER_INFO_FILE).resolve()),
        vocab_size=vocab,
        # TensorRT-LLM's engine masks one position per step and restarts the guide per request (trtspec.guided)
        mode="per_call" if cfg.engine is EngineKind.reference else "one_call",
    )


def _guided_params(config: mc.ModelConfig, guided: GuidedSettings | None, reference: bool) -> None:
    """NVIDIA's tensorrt_llm parameters for guided decoding (model_instance_state.cc getGuidedDecodingConfigFromParams),
    and the reference engine's extension input (where the guided output starts)."""
    if guided is None:
        return
    _set_params(config, **{BACKEND_PARAMETER: GUIDED_BACKEND, TOKENIZER_INFO_PARAMETER: guided.tokenizer_info})
    if reference:
        _add_tensor(config.input, GUIDE_START, "INT32", (1,), optional=True)


def target_only_engine(cfg: BuildConfig) -> bool:
    """Whether the target-only endpoints get an engine of their own: the reference engine with Medusa heads
    speculates for every request it serves, as TensorRT-LLM's Medusa engine does, so a target-only endpoint on it
    would measure Medusa against Medusa. (The engine flow's target-only endpoints share the Medusa engine:
    docs/medusa.md.)"""
    return cfg.engine is EngineKind.reference and in_engine(cfg.speculative.method)


def loop_settings(cfg: BuildConfig, *, baseline: bool, uses_model: bool, engine_input_names: dict[str, str],
                  guided: GuidedSettings | None = None, version: str | None = None) -> LoopSettings:
    spec = cfg.speculative
    # in-engine speculation (Medusa): its statistics are the engine's perf metrics, where the version declares them
    outputs = {t.name for t in _contract(version, TARGET).outputs}
    engine_reports_drafts = in_engine(spec.method) and STAT.total_draft_tokens in outputs
    if spec.adaptive.batched_steps is None:  # resolved here, where the device is known
        batched = not (cfg.engine == "reference" and cfg.device != "cuda")
        spec = spec.model_copy(update={"adaptive": spec.adaptive.model_copy(update={"batched_steps": batched})})
    return LoopSettings(
        guided=guided,
        speculative=spec,
        max_input_len=cfg.limits.max_input_len,
        target_model=TARGET_ONLY if baseline and target_only_engine(cfg) else TARGET,
        draft_model=DRAFT if uses_model else None,
        draft_disabled=baseline,
        engine_reports_drafts=engine_reports_drafts,
        engine_input_names=engine_input_names,
        max_concurrent_requests=max(64, cfg.limits.max_batch_size),
    )


def engine_io(config: mc.ModelConfig, trtllm_version: str | None) -> mc.ModelConfig:
    """Declare exactly the inputs/outputs of NVIDIA's `tensorrt_llm` model for `trtllm_version` (its contract
    data; the newest supported one when unset): tensor names such as min_length/min_tokens come from there."""
    contract = _contract(trtllm_version, TARGET)
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
    kernel_dir: Path | None = None,
    speculates: bool = True,
) -> mc.ModelConfig:
    """`speculates` false: the target as target-only (no Medusa heads)."""
    model = getattr(cfg, role)
    config = engine_io(load_template(TARGET), trtllm_version)
    config.name = name
    config.instance_group[0].count = model.instance_count
    if cfg.engine is EngineKind.reference:
        config.backend = "python"
        # dynamic batching hands execute() what arrived together; execute() only queues it for trtspec.reference_engine.batching,
        # whose scheduler steps every request in flight together
        config.ClearField("parameters")
        _set_params(
            config,
            checkpoint=checkpoint_path(cfg, role).resolve(),
            device=cfg.device,
            dtype=model.dtype,
            kv_cache_entries=2 * cfg.limits.max_batch_size,
            # the default budget is the engine's to size: it knows its KV bytes per token
            **({} if model.kv_cache_max_bytes is None else {"kv_cache_max_bytes": int(model.kv_cache_max_bytes)}),
            kv_cache_max_tokens=cfg.limits.max_batch_size * cfg.limits.max_seq_len,
            max_input_len=cfg.limits.max_input_len,
            # the in-flight batcher's limits (trtspec.reference_engine.batching): requests per step and tokens per step
            max_batch_size=cfg.limits.max_batch_size,
            max_num_tokens=plan_max_num_tokens(cfg),
            use_draft_vocab=role == "draft",  # a draft checkpoint's draft_vocab.json, if it has one
            exclude_input_in_output=False,  # the loop reads the whole sequence back, as NVIDIA's BLS does
            **({} if model.linear_kernels == "auto" else {"linear_kernels": model.linear_kernels}),
            # compiled kernels: the deployment's own copy (trtspec build's compile-kernels step)
            **({"kernel_dir": Path(kernel_dir).resolve()}
               if kernel_dir is not None and model.linear_kernels == "compiled" else {}),
        )
        if role == "target" and speculates and in_engine(cfg.speculative.method):
            _set_params(config, medusa_heads=checkpoint_path(cfg, "draft").resolve(), **_medusa_params(cfg))
        if role == "target" and drafts_in_target(cfg):
            _set_params(config, eagle3_head=checkpoint_path(cfg, "draft").resolve())
            _add_tensor(config.input, NEXT_DRAFT_LEN, "INT32", (1,), optional=True)
            _add_tensor(config.output, NEXT_DRAFT_IDS, "INT32", (-1,))
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
    if role == "target" and in_engine(cfg.speculative.method):
        # NVIDIA's tensorrt_llm parameters (config.pbtxt of 0.17-1.2.1; docs/medusa.md)
        _set_params(config, decoding_mode="medusa", **_medusa_params(cfg))
    return config


def _medusa_params(cfg: BuildConfig) -> dict[str, str]:
    """medusa_choices in the tensorrt_llm model's format; unset: the engine's default (the reference engine's
    trtspec.medusa.DEFAULT_CHOICES cut to its heads; TensorRT-LLM's own default is mc_sim_7b_63, so it is written)."""

    choices = cfg.speculative.medusa_choices
    if choices is None and cfg.engine is not EngineKind.reference:
        choices = [list(c) for c in DEFAULT_CHOICES]
    return {} if choices is None else {"medusa_choices": to_pbtxt(choices)}


def generate_repository(
    cfg: BuildConfig,
    output_dir: Path,
    *,
    target_engine_dir: Path | None = None,
    draft_engine_dir: Path | None = None,
    trtllm_version: str | None = None,
    kv_cache_fractions: dict[str, float] | None = None,
    kernel_dir: Path | None = None,
    final_dir: Path | None = None,
) -> Path:
    """Writes `output_dir` (replacing it only once the new one is complete) and returns it. `final_dir`: where the
    repository is served from, if it is moved there after (the paths of files inside it point there)."""
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
            w, base = _Writer(cfg, partial), load_template(TEXT)
            endpoint_io(base)
            write_llmapi_models(cfg, partial, w.write, base, draft_dir=draft_engine_dir,
                                version=version, kv_fraction=fractions.get("target"))
        else:
            _write_models(cfg, partial, version, fractions, target_engine_dir, draft_engine_dir, kernel_dir,
                          Path(final_dir or output_dir))
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
    kernel_dir: Path | None = None,
    final_root: Path | None = None,
) -> None:
    spec = cfg.speculative
    # an EAGLE-3 head drafts inside the target engine, Medusa heads speculate in it: no tensorrt_llm_draft model
    uses_model = cfg.draft is not None and spec.draft_source in ("model", "hybrid") and not drafts_in_target(cfg) \
        and not in_engine(spec.method)
    w = _Writer(cfg, partial)
    tokenizer_dir = checkpoint_path(cfg, "target").resolve()
    guided = guided_settings(cfg, version, final_root or partial.with_name(partial.name.removesuffix(".partial")))

    for name, count in (
        ("preprocessing", cfg.triton.preprocessing_instance_count),
        ("postprocessing", cfg.triton.postprocessing_instance_count),
    ):
        c = w.batch(load_template(name))
        c.instance_group[0].count = count
        pre_post_io(c, version)
        _set_params(c, tokenizer_dir=tokenizer_dir)
        w.write(c, TEMPLATES / name / "1" / "model.py")

    engine_py = TEMPLATES / "reference_engine" / "1" / "model.py" if cfg.engine is EngineKind.reference else None
    reference = cfg.engine is EngineKind.reference
    # the target, and where it speculates by itself for every request, the target-only endpoints' own copy of it
    for name, speculates in ((TARGET, True), *(((TARGET_ONLY, False),) if target_only_engine(cfg) else ())):
        target = _engine_config(cfg, "target", name, target_engine_dir, version, fractions.get("target"), kernel_dir,
                                speculates=speculates)
        _guided_params(target, guided, reference)
        w.write(w.batch(target), engine_py)
    if guided is not None:  # what NVIDIA's generate_xgrammar_tokenizer_info.py writes
        write_tokenizer_info(tokenizer_dir, partial / TARGET)
    if cfg.draft is not None and uses_model:
        draft = _engine_config(cfg, "draft", DRAFT, draft_engine_dir, version, fractions.get("draft"), kernel_dir)
        _guided_params(draft, guided, reference)  # the draft's logits are masked too (same vocabulary)
        w.write(w.batch(draft), engine_py)
    aliases = LEGACY_ENGINE_NAMES if legacy_tensor_names(version) else {}
    # token ids in (speculative, baseline_loop) or text in (ensemble, baseline): one LoopModel serves both
    for name, template, declare_io, baseline in (
        (LOOP, LOOP, loop_io, False), (BASELINE_LOOP, LOOP, loop_io, True),
        (ENSEMBLE, TEXT, endpoint_io, False), (BASELINE, TEXT, endpoint_io, True),
    ):
        c = w.batch(load_template(template))
        c.name = name
        # the target-only endpoints get as many as the speculative ones: a comparison against fewer would flatter it
        c.instance_group[0].count = cfg.triton.speculative_instance_count
        declare_io(c, version)
        settings = loop_settings(cfg, baseline=baseline, uses_model=uses_model, engine_input_names=aliases,
                                 guided=guided, version=version)
        _set_params(c, tokenizer_dir=tokenizer_dir, **settings_parameter(settings))
        w.write(c, TEMPLATES / LOOP / "1" / "model.py")


def list_models(repo: Path) -> dict[str, mc.ModelConfig]:
    """Every model of a repository, parsed (used by `serve` and the tests)."""
    return {m.path.name: m.config for m in read_repository(repo) if m.config is not None}
