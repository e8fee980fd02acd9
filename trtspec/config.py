"""The build config: one YAML file describes one deployment (draft + target, engines, Triton).

Loading validates every field. Errors name the field path, the bad value and what is allowed,
because a typo'd key silently ignored is how NVIDIA's templates end up half-filled.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator


from trtspec.contract.fields import DRAFT_LENGTH_POLICIES, NUM_DRAFT_TOKENS
from trtspec.spec.drafters import SELECTIONS
from trtspec.spec.methods import NAMES as METHOD_NAMES, default_method, problems as method_problems
from trtspec.medusa import choices_problems


class ConfigError(Exception):
    """A build config that cannot be used; the message is meant for the user as is."""


class _Strict(BaseModel):
    # Unknown keys are errors: `max_draft_length:` must not be silently ignored.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EngineKind(str, Enum):
    tensorrt_llm = "tensorrt_llm"  # TensorRT-LLM engines served by the tensorrtllm backend (GPU)
    reference = "reference"  # the Python-backend reference engine (HF model in torch; CPU or CUDA)
    llmapi = "llmapi"  # TensorRT-LLM's LLM API (PyTorch backend, no engine build) in trtspec's Triton model


# auto: engine: reference only, which picks bf16 where the CPU computes it natively and exactly and fp32 elsewhere
Dtype = Literal["auto", "float16", "bfloat16", "float32"]

# The reference engine's weight-product kernels on CPU (float32, one torch thread per engine, as served):
# auto: the engine's default (reference_engine.device.LINEAR_KERNELS: mkl+onednn, or TRTSPEC_LINEAR_KERNELS);
# compiled: Inductor CPP GEMM kernels for this CPU, compiled by `trtspec build` (reference_engine.compiled_linear).
LinearKernels = Literal["auto", "mkl+onednn", "onednn", "mkl", "compiled"]

# The reference engine's default prefix-cache budget per model: the demo target's KV cache is 45 KiB per
# token (float32), so this holds ~5,800 tokens, e.g. 8 streams of 700.


class ModelConfig(_Strict):
    """One model of the pair (target or draft)."""

    checkpoint: str = Field(description="HF checkpoint directory, or demo:target / demo:draft / demo:draft-untrained")
    dtype: Dtype = Field(
        default="float16",
        description="weights and activations; auto (reference engine): bfloat16 where the CPU computes it natively "
        "and its bf16 was measured batch-invariant (AMX), float32 elsewhere; TensorRT-LLM builds in the given dtype",
    )
    tp_size: Annotated[int, Field(ge=1, le=64, description="tensor-parallel GPUs (TensorRT-LLM)")] = 1
    pp_size: Annotated[int, Field(ge=1, le=64, description="pipeline-parallel stages (TensorRT-LLM)")] = 1
    quantization: Literal["none", "fp8"] = Field(
        default="none", description="fp8: ModelOpt post-training quantization (draft only; compute capability >= 8.9)"
    )
    gpu_device_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, description="GPUs this model runs on; default: planned by trtspec"
    )
    kv_cache_free_gpu_mem_fraction: Annotated[float, Field(gt=0.0, le=1.0)] | None = Field(
        default=None, description="default: derived from the memory estimate instead of NVIDIA's fixed 0.5"
    )
    instance_count: Annotated[int, Field(ge=1, le=64, description="Triton model instances of this engine")] = 1
    kv_cache_max_bytes: ByteSize | None = Field(
        default=None,
        description="engine: reference only: bytes of KV cache kept for prefix reuse (e.g. 256MiB, 2GB; 0: no reuse); "
        "least recently used entries are evicted. The CPU analogue of kv_cache_free_gpu_mem_fraction. Default: "
        "enough for limits.max_batch_size sequences of limits.max_seq_len tokens (less evicts a running stream's "
        "cache between its iterations, and each iteration then recomputes the whole sequence)",
    )

    linear_kernels: LinearKernels = Field(
        default="auto",
        description="engine: reference only (float32 on CPU, one torch thread per engine): the kernels of the weight "
        "products. auto: the engine's default, mkl+onednn (MKL for 1 row, oneDNN-packed weights for 2+); compiled: "
        "GEMM kernels Inductor's CPP template generates for this CPU, compiled once by `trtspec build` (about 1 min; "
        "cached per torch build and CPU) and loaded in under a second: a verify of 4 drafts ~20% cheaper, its "
        "products bitwise the same at any row count (with TRTSPEC_BATCH_INVARIANT=1 the whole engine is; "
        "docs/benchmarks/engine.md); where they are missing or stale the engine logs it and uses mkl+onednn",
    )

    @field_validator("kv_cache_max_bytes", mode="before")
    @classmethod
    def _byte_size(cls, v: Any) -> Any:
        try:
            size = TypeAdapter(ByteSize).validate_python(v)
        except ValidationError:
            raise ValueError("not a size; write a byte count or a size with a unit, like 256MiB or 2GB") from None
        if size < 0:
            raise ValueError("negative; use 0 to keep no cache, or a size like 256MiB")
        return size

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @model_validator(mode="after")
    def _devices_match_parallelism(self) -> "ModelConfig":
        if self.gpu_device_ids is not None and len(self.gpu_device_ids) != self.world_size:
            raise ValueError(
                f"gpu_device_ids lists {len(self.gpu_device_ids)} GPU(s) but tp_size*pp_size = {self.world_size}; "
                f"list exactly {self.world_size} device id(s)"
            )
        return self


class AdaptivePolicy(_Strict):
    """The goodput controller (draft_length_policy: adaptive, trtspec.spec.controller.GoodputController): each
    iteration it drafts the k (0 included) and source with the most expected tokens per second, from acceptance
    and engine costs it measures online, shared by the deployment's loop processes."""

    probe_every: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=8, description="target steps (a plain run's tokens count each) without drafting from a source after "
        "which the controller tries it once more (a probe), so it comes back when acceptance or load changes")
    prior_drafts: Annotated[float, Field(ge=0.0)] = Field(
        default=4.0, description="drafts' worth of pessimistic prior (acceptance 0) a fresh deployment starts "
        "from: it starts at k = 0 and drafts once probes show drafting pays; the prior's weight fades as drafts "
        "are seen (prior_drafts * min(1, prior_drafts / drafts seen))")
    request_weight: Annotated[float, Field(ge=0.0)] = Field(
        default=8.0, description="how many of a request's own drafts weigh as much as the deployment's "
        "acceptance estimate (its own history takes over as it grows)")
    cost_smoothing: Annotated[float, Field(gt=0.0, le=1.0)] = Field(
        default=0.1, description="weight of a new cost sample in the measured draft and verify costs (by k and "
        "requests in flight): higher follows load changes faster, lower is steadier")
    batched_steps: bool | None = Field(
        default=None, description="whether the engines run the requests in flight as batched steps that cost little "
        "more for more rows (a GPU's in-flight batcher): a draft call is priced as shared by the requests drafting in "
        "it, and a draft row by what it adds to the step; false: as the reference engine runs them on a CPU, where "
        "a draft call overlaps other requests' target steps rather than batch (each request pays its whole call) "
        "and a draft row costs what one more request adds to a plain step; unset: false for the reference engine "
        "on a CPU, else true")
    acceptance_decay: Annotated[float, Field(gt=0.0, le=1.0)] = Field(
        default=0.99, description="per draft, the weight left to older drafts in the deployment's acceptance "
        "estimate (0.99: about the last 100 drafts of a source)")


# speculative's key for SpeculativeConfig.max_k (TensorRT-LLM's name for the bound)
MAX_DRAFT_LEN = "max_draft_len"


class SpeculativeConfig(_Strict):
    # Code names the draft-length fields for what they are (max_k, default_k); the YAML keeps TensorRT-LLM's and
    # the request field's names (the only keys it accepts for them), and dumps write them.
    model_config = ConfigDict(serialize_by_alias=True)

    @classmethod
    def of(cls, max_k: int, default_k: int, **fields: Any) -> "SpeculativeConfig":
        """A config built in code, its draft lengths given by their code names."""
        return cls.model_validate({MAX_DRAFT_LEN: max_k, NUM_DRAFT_TOKENS: default_k, **fields})

    method: Literal[METHOD_NAMES] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="how the deployment drafts (trtspec/spec/methods.py): draft_model, eagle3 (draft.checkpoint is an "
        "EAGLE-3 head), medusa (draft.checkpoint is a Medusa head set; the engine verifies its tree), mtp (the target's "
        "own MTP layers), ngram; default: draft_model with a draft, ngram without",
    )
    medusa_choices: list[list[Annotated[int, Field(ge=0)]]] | None = Field(
        default=None,
        description="method medusa: the candidate tree, as paths of top-k ranks per head (TensorRT-LLM's "
        "medusa_choices, e.g. [[0], [0, 0], [1]]); it must have at most max_draft_len nodes and be no deeper than "
        "the head set; unset: [[0], [0, 0], [1], [0, 0, 0], [0, 1]] (cut to the head set's depth)",
    )
    max_k: Annotated[int, Field(ge=1, le=64, alias=MAX_DRAFT_LEN, description="most draft tokens per iteration (the target engine's --max_draft_len)")] = 8
    default_k: Annotated[int, Field(ge=0, le=64, alias=NUM_DRAFT_TOKENS, description="a request's draft length k when it asks for none (fixed: every iteration; adaptive: the most the controller picks); default: 4, or max_draft_len if smaller")] = 4
    use_draft_logits: bool = Field(default=False, description="with sampling: rejection sampling against the draft's distribution (false: token comparison)")
    draft_length_policy: Literal[DRAFT_LENGTH_POLICIES] = Field(  # type: ignore[valid-type]
        default="adaptive",
        description="adaptive: the goodput controller picks k (0 included) and the source each iteration from measured "
        "acceptance and costs, so drafting that does not pay at the current load steps aside (the default, so that a "
        "config does not speculate itself slower than target-only); fixed: always num_draft_tokens (for measuring a "
        "given k)",
    )
    adaptive: AdaptivePolicy = Field(default=AdaptivePolicy(), description="the controller's settings")
    draft_source: Literal[tuple(SELECTIONS)] = Field(  # type: ignore[valid-type]
        default="model",
        description="who proposes: model (the deployment's drafter), ngram (prompt lookup, in the loop's process), "
        "hybrid (prompt lookup when it finds a match, else the model)",
    )
    ngram_max: Annotated[int, Field(ge=1, le=16, description="longest suffix n-gram prompt lookup matches")] = 3
    ngram_min: Annotated[int, Field(ge=1, le=16, description="shortest suffix n-gram prompt lookup matches")] = 1
    max_concurrency: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="drafting stops while more requests than this are in flight in the deployment (they share "
        "the engine's batch, where a draft costs more than it saves); unset: no limit",
    )
    ngram_above_max_concurrency: bool = Field(
        default=False,
        description="above max_concurrency only the draft model steps aside: n-gram (prompt lookup) drafts go on "
        "(draft_source ngram or hybrid); they cost no engine step, only verify rows where the text repeats itself",
    )
    draft_len_schedule: dict[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        description="requests in flight -> most draft tokens, e.g. {1: 4, 4: 2, 8: 0}: from each count upward a "
        "request drafts at most that many (TensorRT-LLM's draft_len_schedule, as a cap on the request's k); "
        "unset: no cap",
    )

    @model_validator(mode="after")
    def _k_within_max(self) -> "SpeculativeConfig":
        if self.default_k > self.max_k and "default_k" not in self.model_fields_set:
            object.__setattr__(self, "default_k", self.max_k)  # the default follows a smaller max
        if self.default_k > self.max_k:
            raise ValueError(
                f"num_draft_tokens ({self.default_k}) is larger than max_draft_len ({self.max_k}); "
                "the target engine is built for at most max_draft_len draft tokens (TensorRT-LLM asserts "
                "'Number of draft tokens is larger than maximum number of draft tokens')"
            )
        if self.medusa_choices is not None:

            bad = choices_problems(self.medusa_choices)
            if not self.medusa_choices:
                bad.append("medusa_choices is empty")
            if len(self.medusa_choices) > self.max_k:
                bad.append(f"medusa_choices has {len(self.medusa_choices)} nodes but max_draft_len is {self.max_k} "
                           "(TensorRT-LLM's engine verifies at most max_draft_len draft tokens a step: raise it)")
            if self.method not in (None, "medusa"):
                bad.append(f"medusa_choices applies to method medusa only (this config has method {self.method})")
            if bad:
                raise ValueError("; ".join(bad))
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) must be <= ngram_max ({self.ngram_max})")
        over = {n: k for n, k in (self.draft_len_schedule or {}).items() if k > self.max_k}
        if over:
            raise ValueError(
                f"draft_len_schedule: draft lengths {over} exceed max_draft_len ({self.max_k}); "
                "lower them or raise max_draft_len"
            )
        return self

    def too_long(self, option: str, ks: list[int]) -> str | None:
        """What is wrong with the draft lengths an option asks for (any over max_k), or None."""
        over = [k for k in ks if k > self.max_k]
        if not over:
            return None
        return f"{option} {', '.join(map(str, over))}: larger than this config's speculative.{MAX_DRAFT_LEN} ({self.max_k})"


class LlmapiConfig(_Strict):
    """TensorRT-LLM's own load controls for `engine: llmapi` (fields of its DecodingBaseConfig and LLM())."""

    max_num_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="tokens per scheduler step; default: planned like the engine flow's"
    )
    max_concurrency: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="speculation off above this many requests in flight"
    )
    draft_len_schedule: dict[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        description="batch size -> draft length, e.g. {1: 4, 8: 2, 32: 0}, each key a batch size from which its length "
        "applies upward (speculative.draft_len_schedule's meaning; set one of the two); must map 1 to max_draft_len",
    )
    acceptance_window: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="requests in the rolling mean of acceptance length (0 or unset: off)"
    )
    acceptance_length_threshold: Annotated[float, Field(ge=0.0)] | None = Field(
        default=None, description="speculation off for good once the rolling mean acceptance length drops below"
    )
    disable_overlap_scheduler: bool = Field(
        default=True, description="TensorRT-LLM's draft-target docs run two-model speculation without the overlap scheduler"
    )
    eagle3_two_model: bool = Field(
        default=False,
        description="method eagle3: run the head as a separate draft model (TensorRT-LLM's eagle3_one_model: false), so "
        "that schedule bands of 0 and max_concurrency stop drafting; otherwise, on releases whose one-model path has no "
        "floor for it (1.2.x), trtspec writes them as 1 (docs/eagle3.md)",
    )
    baseline_endpoint: bool = Field(
        default=False,
        description="also serve `baseline`, a second, target-only LLM (the target's memory twice): the in-server A/B",
    )

    @model_validator(mode="after")
    def _window_and_threshold(self) -> "LlmapiConfig":
        if (self.acceptance_window is None) != (self.acceptance_length_threshold is None):
            raise ValueError(
                "acceptance_window and acceptance_length_threshold work together: set both (or neither)"
            )
        return self


# Speculative settings the llmapi flavour cannot honour: TensorRT-LLM decides the draft length per batch
# (draft_len_schedule), samples drafts itself and has no combined n-gram + model source.
_LLMAPI_STOPS_DRAFTING = "with llmapi TensorRT-LLM stops drafting itself: use llmapi.max_concurrency"
LLMAPI_REFUSED = {
    NUM_DRAFT_TOKENS: "TensorRT-LLM's LLM API has no per-request draft length; use max_draft_len and llmapi.draft_len_schedule",
    "use_draft_logits": "TensorRT-LLM's two-model path decides rejection sampling itself; leave use_draft_logits out",
    "draft_length_policy": "trtspec's adaptive policy runs in trtspec's loop (engine: tensorrt_llm / reference); "
    "with llmapi use llmapi.draft_len_schedule, max_concurrency or acceptance_window",
    "adaptive": "the goodput controller runs in trtspec's loop; with llmapi use llmapi.draft_len_schedule (trtspec tune)",
    "ngram_min": "TensorRT-LLM's NGram drafter has no minimum n-gram size (only max_matching_ngram_size = ngram_max)",
    "max_concurrency": _LLMAPI_STOPS_DRAFTING,
    "ngram_above_max_concurrency": _LLMAPI_STOPS_DRAFTING,
}


class EngineLimits(_Strict):
    max_batch_size: Annotated[int, Field(ge=1, le=4096, description="requests the engines batch in one step")] = 8
    max_input_len: Annotated[int, Field(ge=1, description="prompt + generated tokens of one request (the loop resends the running sequence)")] = 2048
    max_seq_len: Annotated[int, Field(ge=2, description="the engines' sequence limit: max_input_len plus room for a draft")] = 2304

    @model_validator(mode="after")
    def _seq_covers_input(self) -> "EngineLimits":
        if self.max_seq_len <= self.max_input_len:
            raise ValueError(
                f"max_seq_len ({self.max_seq_len}) must be larger than max_input_len ({self.max_input_len}): "
                "the loop resends prompt + generated tokens as input each iteration"
            )
        return self


class TritonConfig(_Strict):
    http_port: Annotated[int, Field(ge=0, le=65535, description="Triton's HTTP port (KServe v2, generate)")] = 8000
    grpc_port: Annotated[int, Field(ge=0, le=65535, description="Triton's gRPC port")] = 8001
    metrics_port: Annotated[int, Field(ge=0, le=65535, description="Prometheus metrics (Triton's and trtspec's)")] = 8002
    speculative_instance_count: Annotated[int, Field(ge=1, le=256, description="loop model instances: requests served at once per endpoint")] = 1
    preprocessing_instance_count: Annotated[int, Field(ge=1, le=64, description="tokenizer model instances (NVIDIA's clients)")] = 1
    postprocessing_instance_count: Annotated[int, Field(ge=1, le=64, description="detokenizer model instances (NVIDIA's clients)")] = 1


class BuildConfig(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="the deployment's name: the OpenAI model name, output folders, Kubernetes objects")] = "trtspec"
    engine: EngineKind = Field(
        default=EngineKind.reference,
        description="tensorrt_llm: trtllm-build engines (GPU); llmapi: TensorRT-LLM's LLM API (GPU, no engine build); "
        "reference: the HF model in torch with the same tensor contract (CPU or CUDA)",
    )
    target: ModelConfig = Field(description="the model whose output is served")
    draft: ModelConfig | None = Field(default=None, description="omit only with speculative.draft_source: ngram")
    speculative: SpeculativeConfig = Field(default=SpeculativeConfig(), description="how the deployment drafts")
    limits: EngineLimits = Field(default=EngineLimits(), description="the engines' batch and sequence limits")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="reference engine placement; TensorRT-LLM engines always run on GPUs"
    )
    tensorrt_llm_version: str | None = Field(
        default=None, description="version the engines are built and served with; default: the installed one"
    )
    triton: TritonConfig = Field(default=TritonConfig(), description="ports and model instances of the Triton server")
    llmapi: LlmapiConfig | None = Field(default=None, description="engine: llmapi only: TensorRT-LLM's load controls")

    @field_validator("tensorrt_llm_version")
    @classmethod
    def _version_format(cls, v: str | None) -> str | None:
        if v is not None:
            parts = v.split(".")
            if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
                raise ValueError(f"expected a version like '1.1.0', got {v!r}")
        return v

    @model_validator(mode="after")
    def _pair(self) -> "BuildConfig":
        spec = self.speculative
        explicit = spec.method is not None
        if not explicit:
            # Configs written before `method` keep their meaning; set without re-validating (validate_assignment).
            object.__setattr__(spec, "method", default_method(self.draft is not None, spec.draft_source, self.engine.value))
        elif spec.method == "ngram" and "draft_source" not in spec.model_fields_set:
            object.__setattr__(spec, "draft_source", "ngram")
        bad = method_problems(spec.method, self.engine.value, self.draft is not None, spec.draft_source)
        if bad:
            raise ValueError("; ".join(bad))
        if self.draft is not None and self.draft.quantization == "fp8" and self.engine is EngineKind.reference:
            raise ValueError(
                "draft.quantization: fp8 needs engine: tensorrt_llm or llmapi (the reference engine runs HF weights as they are)"
            )
        if self.engine is not EngineKind.reference:
            for role in ("target", "draft"):
                m = getattr(self, role)
                if m is not None and m.dtype == "auto":
                    raise ValueError(f"{role}.dtype: auto applies to engine: reference; write float16, bfloat16 or float32")
                if m is not None and m.linear_kernels != "auto":
                    raise ValueError(f"{role}.linear_kernels applies to engine: reference; remove it")
                if m is not None and "kv_cache_max_bytes" in m.model_fields_set:
                    raise ValueError(
                        f"{role}.kv_cache_max_bytes applies to engine: reference; TensorRT-LLM sizes its KV cache "
                        f"with {role}.kv_cache_free_gpu_mem_fraction"
                    )
        if self.engine is EngineKind.llmapi:
            self._check_llmapi()
        elif self.llmapi is not None:
            raise ValueError(f"llmapi: applies to engine: llmapi only (this config has engine: {self.engine.value})")
        return self

    def _check_llmapi(self) -> None:
        spec = self.speculative
        given = {yaml_key(SpeculativeConfig, name) for name in spec.model_fields_set}
        refused = [f"speculative.{k}: {why}" for k, why in LLMAPI_REFUSED.items() if k in given]
        if spec.draft_source == "hybrid":
            refused.append(
                "speculative.draft_source: hybrid is trtspec's loop; TensorRT-LLM speculates with one drafter "
                "(model = DraftTarget, ngram = NGram)"
            )
        if self.target.quantization != "none":
            refused.append("target.quantization: only the draft is quantized by trtspec; give an FP8 HF checkpoint as target.checkpoint instead")
        if self.draft is not None and spec.method in ("draft_model", "eagle3") and self.draft.world_size != 1:
            refused.append(
                "draft.tp_size/pp_size: TensorRT-LLM runs the draft inside the target's LLM with the target's mapping; "
                "leave them at 1"
            )
        ids = self.target.gpu_device_ids
        if ids is not None and ids != list(range(len(ids))):
            refused.append(
                f"target.gpu_device_ids: {ids}: TensorRT-LLM's LLM() has no device-id argument and places its ranks on "
                f"the first {len(ids)} GPU(s) it sees; expose the GPUs you want to the container (docker --gpus "
                f"'\"device={','.join(map(str, ids))}\"' or CUDA_VISIBLE_DEVICES={','.join(map(str, ids))}) and write "
                f"gpu_device_ids: {list(range(len(ids)))}, or leave gpu_device_ids out"
            )
        lim = self.llmapi or LlmapiConfig()
        if spec.draft_len_schedule is not None and lim.draft_len_schedule is not None:
            refused.append("llmapi.draft_len_schedule: set the schedule once, as speculative.draft_len_schedule")
        if refused:
            raise ValueError("engine: llmapi cannot honour these settings:\n    " + "\n    ".join(refused))
        which = "speculative" if spec.draft_len_schedule is not None else "llmapi"
        sched = spec.draft_len_schedule or lim.draft_len_schedule
        if sched is not None:
            if sched.get(1) != spec.max_k:
                raise ValueError(
                    f"{which}.draft_len_schedule must map batch size 1 to max_draft_len ({spec.max_k}); "
                    f"got {sched.get(1)!r} (TensorRT-LLM enforces schedule[1] == max_draft_len)"
                )
            over = {b: k for b, k in sched.items() if k > spec.max_k}
            if over:
                raise ValueError(f"{which}.draft_len_schedule: draft lengths {over} exceed max_draft_len ({spec.max_k})")

    @property
    def source_dir(self) -> Path | None:
        return getattr(self, "_source_dir", None)


def _describe_error(err: dict[str, Any], raw: Any) -> str:
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = err["loc"][:-1]
        allowed = _allowed_keys(parent)
        hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
        return f"{loc}: unknown key{hint}"
    if kind == "missing":
        return f"{loc}: required field is missing"
    value = err.get("input")
    msg = err["msg"]
    if kind.startswith("value_error"):
        msg = msg.removeprefix("Value error, ")
        return f"{loc}: {msg}" if "(" in msg or loc == "(top level)" else f"{loc}: {value!r}: {msg}"
    return f"{loc}: got {value!r}: {msg}"


def yaml_key(model: type[BaseModel], name: str) -> str:
    """A field's key in the YAML: its alias where code names it otherwise."""
    return model.model_fields[name].alias or name


def _allowed_keys(loc: tuple) -> list[str]:
    model: Any = BuildConfig
    for part in loc:
        name = next((n for n in model.model_fields if yaml_key(model, n) == part), None)
        if name is None:
            return []
        ann = model.model_fields[name].annotation
        model = next((a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return []
    return sorted(yaml_key(model, n) for n in model.model_fields)


def parse_config(data: Any, source_dir: Path | None = None, check_paths: bool = True) -> BuildConfig:
    """Validate a config mapping. Relative checkpoint paths resolve against `source_dir`."""
    if not isinstance(data, dict):
        raise ConfigError(f"a build config is a YAML mapping, got {type(data).__name__}")
    try:
        cfg = BuildConfig.model_validate(data)
    except ValidationError as e:
        lines = [_describe_error(err, data) for err in e.errors()]
        raise ConfigError("invalid build config:\n  " + "\n  ".join(lines)) from None
    object.__setattr__(cfg, "_source_dir", source_dir)
    if check_paths:
        problems = []
        for role in ("target", "draft"):
            m: ModelConfig | None = getattr(cfg, role)
            if m is None or m.checkpoint.startswith("demo:"):
                continue
            p = resolve_path(m.checkpoint, source_dir)
            if not p.is_dir():
                problems.append(f"{role}.checkpoint: {m.checkpoint!r}: directory not found ({p})")
            elif not (p / "config.json").is_file():
                problems.append(f"{role}.checkpoint: {m.checkpoint!r}: no config.json in {p}; expected a Hugging Face checkpoint directory")
        if problems:
            raise ConfigError("invalid build config:\n  " + "\n  ".join(problems))
    return cfg


def resolve_path(ref: str, source_dir: Path | None) -> Path:
    p = Path(ref).expanduser()
    if not p.is_absolute() and source_dir is not None:
        p = source_dir / p
    return p


def load_config(path: str | Path, check_paths: bool = True) -> BuildConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"build config not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    try:
        return parse_config(data, source_dir=path.resolve().parent, check_paths=check_paths)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def plan_max_num_tokens(cfg: BuildConfig) -> int:
    """>= max_input_len (a whole prompt fits one step without chunked context) and >= max_batch_size*(K+1)
    (every sequence can verify K draft tokens + 1 in one step; TensorRT-LLM raises it to that anyway)."""
    L = cfg.limits
    return max(L.max_input_len, L.max_batch_size * (cfg.speculative.max_k + 1))


def checkpoint_path(cfg: BuildConfig, role: Literal["target", "draft"]) -> Path:
    """The checkpoint directory of a role, preparing the demo pair when the config names it."""
    m = getattr(cfg, role)
    if m is None:
        raise ConfigError(f"this config has no {role}")
    if m.checkpoint.startswith("demo:"):
        from trtspec.demo_pair import resolve_checkpoint

        return Path(resolve_checkpoint(m.checkpoint))
    return resolve_path(m.checkpoint, cfg.source_dir)
