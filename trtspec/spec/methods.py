"""How a deployment speculates (`speculative.method`): the one table of speculation methods.

Each method says what it drafts with (a draft checkpoint of which kind, or none), which engine flavours
serve it, and TensorRT-LLM's decoding type for it. The build config's validation is derived from this table;
the per-version spelling of the decoding type lives with the llmapi data (trtspec/llmapi/).
"""

from __future__ import annotations

from dataclasses import dataclass

# What `draft.checkpoint` must be for a method.
DRAFT_MODEL, EAGLE3_HEAD, MEDUSA_HEADS = "draft_model", "eagle3_head", "medusa_heads"


@dataclass(frozen=True)
class Method:
    name: str
    draft: str | None  # kind of checkpoint draft.checkpoint must be (DRAFT_MODEL / EAGLE3_HEAD); None: no draft section
    engines: tuple[str, ...]  # EngineKind values that serve it
    decoding: str  # TensorRT-LLM's decoding type (canonical name; each version's spelling: trtspec.llmapi)
    summary: str
    refused: dict[str, str]  # engine -> why not and what to use instead
    in_engine: bool = False  # the engine speculates by itself (no trtspec drafting): the loop passes runs through


_ENGINE_FLOW_NO = (
    "TensorRT-LLM's engine flow (trtllm-build, 0.17-1.2.1) has no {what} in trtspec's loop; "
    "use engine: llmapi (TensorRT-LLM's PyTorch backend)"
)

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "draft_model", DRAFT_MODEL, ("reference", "tensorrt_llm", "llmapi"), "DraftTarget",
            "a separate, smaller draft model proposes k tokens; the target verifies them", {},
        ),
        Method(
            "eagle3", EAGLE3_HEAD, ("reference", "llmapi"), "Eagle3",
            "an EAGLE-3 head (draft.checkpoint) drafts from the target's own hidden states",
            {"tensorrt_llm": _ENGINE_FLOW_NO.format(what="EAGLE-3 head")},
        ),
        Method(
            "mtp", None, ("llmapi",), "MTP",
            "the target's own multi-token-prediction layers draft (no draft checkpoint)",
            {
                "tensorrt_llm": _ENGINE_FLOW_NO.format(what="MTP drafting"),
                "reference": "the reference engine has no MTP layers; use engine: llmapi (on a GPU) or "
                "method: eagle3 / draft_model",
            },
        ),
        Method(
            "medusa", MEDUSA_HEADS, ("reference", "tensorrt_llm"), "Medusa",
            "Medusa heads (draft.checkpoint) on the target's last hidden state propose a tree (speculative."
            "medusa_choices) that the target verifies in one step, inside the engine",
            {
                # tensorrt_llm/llmapi/llm_args.py (1.0-1.2.1): MedusaDecodingConfig.supports_backend is False for
                # "pytorch", and tensorrt_llm/_torch/speculative/ has no Medusa worker (docs/medusa.md)
                "llmapi": "TensorRT-LLM's LLM API parses MedusaDecodingConfig, but its PyTorch backend does not run "
                "Medusa (MedusaDecodingConfig.supports_backend('pytorch') is False in 1.0-1.2.1); use engine: "
                "tensorrt_llm (trtllm-build's Medusa engine) or method: eagle3",
            },
            in_engine=True,
        ),
        Method(
            "ngram", None, ("reference", "tensorrt_llm", "llmapi"), "NGram",
            "prompt lookup: drafts are copied from earlier text of the request (no draft checkpoint)", {},
        ),
    )
}

NAMES = tuple(METHODS)


def in_engine(method: str | None) -> bool:
    """The engine speculates by itself (Medusa): trtspec's loop drafts nothing and passes plain runs through."""
    return method is not None and METHODS[method].in_engine


def default_method(has_draft: bool, draft_source: str, engine: str) -> str:
    """The method of a config that does not name one (configs written before `method` existed)."""
    if draft_source == "ngram" and (not has_draft or engine == "llmapi"):
        return "ngram"
    return "draft_model"


def problems(method: str, engine: str, has_draft: bool, draft_source: str) -> list[str]:
    """What a config with this method cannot do, each naming the field and the fix (empty: fine)."""
    m = METHODS[method]
    out = []
    if engine not in m.engines:
        why = m.refused.get(engine, f"served only by engine: {' / '.join(m.engines)}")
        out.append(f"speculative.method: {method} with engine: {engine}: {why}")
    if m.draft is not None and not has_draft:
        if m.draft == EAGLE3_HEAD:
            out.append("draft is required with speculative.method: eagle3: add a draft: section whose checkpoint "
                       "is the EAGLE-3 head")
        elif m.draft == MEDUSA_HEADS:
            out.append("draft is required with speculative.method: medusa: add a draft: section whose checkpoint "
                       "is the Medusa head set (config.json with medusa_num_heads, medusa_lm_head.safetensors)")
        else:
            out.append(f"draft is required with speculative.method: draft_model (draft_source: {draft_source}): "
                       "add a draft: section, or set speculative.draft_source: ngram for prompt lookup only")
    if method == "mtp" and has_draft:
        out.append("draft: method mtp drafts with the target's own MTP layers, not a draft checkpoint; "
                   "remove the draft: section")
    if method == "ngram" and draft_source != "ngram":
        out.append(f"speculative.draft_source: {draft_source}: method ngram drafts by prompt lookup only; "
                   "set draft_source: ngram (or leave it out)")
    if m.in_engine and draft_source != "model":
        out.append(f"speculative.draft_source: {draft_source}: method {method} speculates inside the engine; leave "
                   "draft_source at model")
    if engine == "llmapi" and method != "ngram" and draft_source == "ngram":
        out.append(f"speculative.draft_source: ngram: TensorRT-LLM speculates with one drafter; with method {method} "
                   "leave draft_source at model (or use method: ngram)")
    return out
