"""What the llmapi Triton model does between Triton tensors and the LLM API, free of Triton imports.

Request names are the `ensemble` endpoint's (its config.pbtxt is the template of this model's), so clients,
`trtspec infer` and `trtspec bench` do not see which flavour serves them. Statistics are the ones TensorRT-LLM
reports per request (acceptance_rate, total_accepted_draft_tokens, total_draft_tokens; num_iterations from
the request's first and last scheduler iteration); the loop-only ones (per-position counts, num_drafts,
draft fallbacks) have no TensorRT-LLM source and are left out of the response rather than faked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from trtspec.contract import NUM_DRAFT_TOKENS, REQUEST_FIELDS, STAT, RequestError
from trtspec.contract.limits import RequestLimits
from trtspec.spec.metrics import SpecStats

# the statistics TensorRT-LLM reports per request (trtspec.contract names); the others have no source there
REPORTED_STATS = (STAT.acceptance_rate, STAT.total_accepted_draft_tokens, STAT.total_draft_tokens, STAT.num_iterations,
                  STAT.acceptance_derived)

Getter = Callable[[str], Any]  # (input name) -> python scalar, list of str, or None


@dataclass
class ParsedRequest:
    prompt: str
    streaming: bool
    sampling: dict[str, Any]


# request fields the LLM API honours (the others that change the output are refused by name)
SERVED = {"text_input", "max_tokens", NUM_DRAFT_TOKENS, "use_draft_logits", "draft_source", "draft_length_policy",
          "stream", "temperature", "top_k", "top_p", "seed", "min_tokens", "end_id", "pad_id", "stop_words",
          "bad_words", "return_perf_metrics"}
# accepted at the value that changes nothing (their checks in trtspec.contract refuse any other)
NEUTRAL = {"beam_width", "num_return_sequences", "return_log_probs", "return_context_logits",
           "return_generation_logits"}


# the Triton backend's guided_decoding_guide_type -> the LLM API's GuidedDecodingParams field (its value: the guide;
# json takes no guide: json_object True). As the executor maps GuidedDecodingParams back to its guide types.
GUIDED_FIELDS = {"json": "json_object", "json_schema": "json", "regex": "regex", "ebnf_grammar": "grammar"}
GUIDED = {"guided_decoding_guide_type", "guided_decoding_guide"}
# the endpoint's config parameter that says why it refuses guided requests (absent: it serves them)
GUIDED_REFUSAL = "guided_decoding_refused"


def guided_params(guide_type: str | None, guide: str | None, refused: str | None) -> dict[str, Any] | None:
    """GuidedDecodingParams' arguments for the request's guide (trtspec.guided checks it); None without one.
    `refused`: why this endpoint serves no guided requests (its TensorRT-LLM release and speculation), or None."""
    from trtspec.guided import guide_of

    g = guide_of(guide_type, guide)
    if g is None:
        return None
    if refused is not None:
        raise RequestError(f"guided_decoding_guide_type: not available on this endpoint (engine: llmapi): {refused}")
    key = GUIDED_FIELDS[g.type]
    return {key: True if key == "json_object" else g.text}


def parse(get: Getter, default_draft_len: int, guided_refused: str | None = None) -> ParsedRequest:
    """`guided_refused`: why the endpoint serves no guided requests (None: it serves them)."""
    for f in REQUEST_FIELDS:  # a field read under an older name (min_length, random_seed) is read as its own
        sent = [n for n in (f.name, *f.aliases) if get(n) not in (None, "", [])]
        if sent and f.refuse:
            f.validate(True)
        if sent and f.name not in SERVED | NEUTRAL | GUIDED:
            raise RequestError(f"{sent[0]}: not available with engine: llmapi; leave it out")
        if sent and sent[0] != f.name:
            get = (lambda g, alias, name: lambda n: g(alias) if n == name else g(n))(get, sent[0], f.name)
    text = get("text_input")
    if not text or not str(text).strip():
        raise RequestError("text_input is empty")
    for f in REQUEST_FIELDS:  # the checks every flavour applies (trtspec.contract), max_tokens >= 1 among them
        if f.dims == (1,) and f.dtype != "STRING":
            f.validate(get(f.name))
    max_tokens = int(get("max_tokens"))
    k = get(NUM_DRAFT_TOKENS)
    RequestLimits(max_k=default_draft_len).check(None, max_tokens, None if k is None else int(k))
    if get("return_log_probs"):
        raise RequestError("return_log_probs: not available with engine: llmapi in this release; use engine: "
                           "tensorrt_llm or reference, or leave it out")
    if get("use_draft_logits"):
        raise RequestError("use_draft_logits: not available with engine: llmapi (TensorRT-LLM verifies drafts itself)")
    source = get("draft_source")
    if source and source not in ("model", "ngram"):
        raise RequestError(f"draft_source {source!r}: engine: llmapi speculates with its configured drafter only")
    sampling: dict[str, Any] = {"max_tokens": max_tokens, "return_perf_metrics": True}
    for name, key, cast in (
        ("temperature", "temperature", float),
        ("top_k", "top_k", int),
        ("top_p", "top_p", float),
        ("seed", "seed", int),
        ("min_tokens", "min_tokens", int),
        ("end_id", "end_id", int),
        ("pad_id", "pad_id", int),
    ):
        v = get(name)
        if v is not None:
            sampling[key] = cast(v)
    for name, key in (("stop_words", "stop"), ("bad_words", "bad")):
        words = [w for w in (get(name) or []) if w]
        if words:
            sampling[key] = words
    guided = guided_params(get("guided_decoding_guide_type"), get("guided_decoding_guide"), guided_refused)
    if guided is not None:
        sampling["guided_decoding"] = guided  # GuidedDecodingParams(**guided) at the model
    return ParsedRequest(str(text), bool(get("stream")), sampling)


def stats_of(output: Any, max_k: int = 0) -> SpecStats:
    """trtspec's counters from one CompletionOutput's TensorRT-LLM perf metrics. Where the engine reports no
    acceptance but produced more tokens than it ran steps (TensorRT-LLM's PyTorch path returned zeros for every
    speculative mode until PR #17082, mid-2026), they are derived from tokens and steps and marked so."""
    st = SpecStats()
    pm = getattr(output, "request_perf_metrics", None)
    if pm is None:
        return st
    sd = pm.speculative_decoding
    st.total_draft_tokens = int(sd.total_draft_tokens)
    st.total_accepted_draft_tokens = int(sd.total_accepted_draft_tokens)
    st.num_iterations = int(pm.last_iter) - int(pm.first_iter) + 1
    tokens = len(getattr(output, "token_ids", None) or [])
    if st.total_draft_tokens == 0 and max_k > 0 and tokens > st.num_iterations:
        # every step yields one token of its own plus the drafts it accepted; the context step drafts nothing
        st.total_accepted_draft_tokens = tokens - st.num_iterations
        st.total_draft_tokens = max(st.total_accepted_draft_tokens, (st.num_iterations - 1) * max_k)
        st.acceptance_derived = 1
    return st


def response_tensors(text: str, token_ids: list[int], stats: SpecStats) -> dict[str, np.ndarray]:
    arrays = stats.to_arrays()
    return {
        "text_output": np.array([[text.encode("utf-8")]], dtype=np.object_),
        "output_ids": np.asarray(token_ids, dtype=np.int32).reshape(1, -1),
    } | {name: arrays[name] for name in REPORTED_STATS}
