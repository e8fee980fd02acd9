"""The tensorrtllm backend's tensor contract: an EngineRequest from a request's input tensors (refusing what the
engine cannot honour, by name) and the output tensors for an EngineResult."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from trtspec.contract.fields import STAT, RequestError
from trtspec.guided import guide_from_tensors
from trtspec.reference_engine.request import EngineRequest, EngineResult
from trtspec.spec.speculative import SamplingParams

# The reference engine's in-engine drafting (EAGLE-3, as TensorRT-LLM's one-model path): how many draft tokens
# to propose for the next call, and the proposal, returned with this call's answer.
NEXT_DRAFT_LEN, NEXT_DRAFT_IDS = "next_draft_len", "next_draft_ids"

# TensorRT-LLM inputs this engine cannot honour, with what they would do: a request carrying one is refused
# with its name, never served as if it were absent. Values that change nothing are accepted (see DEFAULTS).
UNSUPPORTED_INPUTS: dict[str, str] = {
    **dict.fromkeys(("lora_task_id", "lora_weights", "lora_config"), "LoRA adapters"),
    **dict.fromkeys(("prompt_embedding_table", "prompt_vocab_size", "prompt_table_extra_ids"), "prompt tuning tables"),
    **dict.fromkeys(
        ("encoder_input_features", "encoder_output_lengths", "decoder_input_ids", "decoder_input_lengths",
         "cross_attention_mask", "skip_cross_attn_blocks"),
        "encoder-decoder / multimodal inputs",
    ),
    **dict.fromkeys(("mrope_rotary_cos_sin", "mrope_position_deltas"), "multimodal rotary embeddings"),
    **dict.fromkeys(
        ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size"), "lookahead decoding"
    ),
    "context_phase_params": "disaggregated serving",
    "draft_acceptance_threshold": "a fixed acceptance threshold for draft logits",
}

# Inputs whose TensorRT-LLM default leaves the output unchanged: accepted at that value, refused otherwise.
# beam_width / num_return_sequences 1 is the only mode here; len_penalty, early_stopping and
# beam_search_diversity_rate only act in beam search, so at beam width 1 they change nothing (as in the
# executor); the top-p decay inputs' defaults are executor.h's.
DEFAULTS: dict[str, float] = {
    "beam_width": 1,
    "num_return_sequences": 1,
    "runtime_top_p_min": 1e-6,
    "runtime_top_p_decay": 1.0,
    "runtime_top_p_reset_ids": -1,
}


# Outputs the reference engine gives a non-streamed answer only (TensorRT-LLM slices them per streamed response)
STREAMED_WHOLE = ("return_log_probs", "return_generation_logits", "return_context_logits")


TensorGetter = Callable[[str], "np.ndarray | None"]


class RequestTensorError(ValueError):
    """A request whose tensors cannot be served; the message is for the client."""


def request_from_tensors(get: TensorGetter, max_input_len: int | None = None) -> EngineRequest | None:
    """An EngineRequest from the tensorrtllm backend's input tensors (`get(name)` -> array or None); None for a
    `stop` request (NVIDIA's BLS cancels that way; here a request runs to completion and a stop is answered
    with an empty response). Inputs the reference engine cannot honour are refused by name."""

    def scalar(name: str, default: Any = None) -> Any:
        a = get(name)
        return default if a is None or a.size == 0 else a.reshape(-1)[0].item()

    def words(name: str) -> list[list[int]]:
        from trtspec.triton_io import words_list

        return words_list(get(name))

    if scalar("stop", False):
        return None
    streaming = bool(scalar("streaming", False))
    if streaming:
        for name in STREAMED_WHOLE:
            if scalar(name, False):
                raise RequestTensorError(f"{name} with streaming=true: the reference engine returns these for a "
                                         "whole answer only; send streaming=false")
    for name, what in UNSUPPORTED_INPUTS.items():
        if get(name) is not None:
            raise RequestTensorError(f"{name}: {what} are not supported by the reference engine; leave {name} out")
    for name, default in DEFAULTS.items():
        v = scalar(name)
        if v is not None and not np.isclose(float(v), default):
            raise RequestTensorError(f"{name}={v}: the reference engine only serves {name}={default:g} (TensorRT-LLM's default)")
    ids = get("input_ids")
    input_ids = [] if ids is None else ids.reshape(-1).astype(np.int64).tolist()
    input_ids = input_ids[: int(scalar("input_lengths", len(input_ids)))]
    if not input_ids:
        raise RequestTensorError("input_ids is empty")
    if max_input_len and len(input_ids) > max_input_len:
        raise RequestTensorError(f"input length {len(input_ids)} exceeds max_input_len {max_input_len}")
    next_draft_len = int(scalar(NEXT_DRAFT_LEN, 0))
    if next_draft_len < 0:
        raise RequestTensorError(f"{NEXT_DRAFT_LEN} must be >= 0, got {next_draft_len}")
    output_len = int(scalar("request_output_len", 0))
    if output_len <= 0:
        raise RequestTensorError(f"request_output_len must be > 0, got {output_len}")
    draft = get("draft_input_ids")
    draft_ids = None if draft is None else draft.reshape(-1).astype(np.int64).tolist()
    draft_logits = get("draft_logits")
    if draft_logits is not None:
        draft_logits = draft_logits.reshape(-1, draft_logits.shape[-1])
    try:
        guide, guide_start = guide_from_tensors(get)
    except RequestError as e:
        raise RequestTensorError(str(e)) from None
    bias = get("embedding_bias")
    top_p = float(scalar("runtime_top_p", 0.0))
    return EngineRequest(
        input_ids=input_ids,
        output_len=output_len,
        streaming=streaming,
        draft_ids=draft_ids or None,
        draft_logits=draft_logits,
        end_id=scalar("end_id"),
        sampling=SamplingParams(
            temperature=float(scalar("temperature", 0.0)),
            top_k=int(scalar("runtime_top_k", 0)),
            top_p=top_p if top_p > 0 else 1.0,
        ),
        seed=scalar("seed", scalar("random_seed")),  # the name depends on the TensorRT-LLM version (contract data)
        min_tokens=int(scalar("min_tokens", scalar("min_length", 0))),
        stop_words=words("stop_words_list"),
        bad_words=words("bad_words_list"),
        # empty = no bias: NVIDIA's preprocessing emits an empty EMBEDDING_BIAS without bias words and its BLS forwards it
        embedding_bias=None if bias is None or bias.size == 0 else bias.reshape(-1).astype(np.float32),
        repetition_penalty=scalar("repetition_penalty"),
        presence_penalty=scalar("presence_penalty"),
        frequency_penalty=scalar("frequency_penalty"),
        next_draft_len=next_draft_len,
        return_generation_logits=bool(scalar("return_generation_logits", False)),
        return_context_logits=bool(scalar("return_context_logits", False)),
        return_log_probs=bool(scalar("return_log_probs", False)),
        guide=guide,
        guide_start=guide_start,
    )


def token_tensors(tokens: Any) -> dict[str, np.ndarray]:
    """output_ids ([1, beam 1, n]) and sequence_length (n) of a response carrying `tokens`."""
    ids = np.asarray(tokens, dtype=np.int32).reshape(1, 1, -1)
    return {"output_ids": ids, "sequence_length": np.asarray([[ids.shape[-1]]], dtype=np.int32)}


def result_tensors(
    result: EngineResult, get: TensorGetter, exclude_input_default: bool = False, arrival_ns: int = 0,
    scheduled_ns: int = 0, streamed_tokens: int | None = None,
) -> dict[str, np.ndarray]:
    """The tensorrtllm backend's output tensors for one result (beam width 1), as its fillTritonResponse returns
    them (model_instance_state.cc): an output the request did not enable is left out, not zeroed. Streamed, this is
    the final response: its output_ids are the tokens no earlier response carried (`streamed_tokens` of them did),
    whatever exclude_input_in_output says (the executor's createResult sends a streamed request only what it has
    not sent, never the input), and sequence_length counts them."""

    def flag(name: str, default: bool = False) -> bool:
        a = get(name)
        return default if a is None or a.size == 0 else bool(a.reshape(-1)[0])

    def t(value: Any, dtype: Any) -> np.ndarray:
        return np.asarray(value, dtype=dtype)

    exclude = flag("exclude_input_in_output", exclude_input_default)
    if streamed_tokens is not None:
        out = token_tensors(result.new_tokens[streamed_tokens:])
    else:
        out = token_tensors(result.new_tokens if exclude else result.tokens)
    if result.generation_logits is not None:
        out["generation_logits"] = t(result.generation_logits[None, None], np.float32)
    if result.context_logits is not None:
        out["context_logits"] = t(result.context_logits[None], np.float32)
    if result.log_probs is not None:
        out["output_log_probs"] = t(np.reshape(result.log_probs, (1, 1, -1)), np.float32)
        out["cum_log_probs"] = t([[sum(result.log_probs)]], np.float32)
    if flag("return_perf_metrics"):
        k, a = result.num_drafted, result.num_accepted
        new_blocks, reused_blocks, total_blocks = result.kv_blocks()
        for name, value, dtype in (
            ("kv_cache_alloc_new_blocks", new_blocks, np.int32),
            ("kv_cache_reused_blocks", reused_blocks, np.int32),
            ("kv_cache_alloc_total_blocks", total_blocks, np.int32),
            ("arrival_time_ns", arrival_ns, np.int64),
            ("first_scheduled_time_ns", scheduled_ns, np.int64),
            ("first_token_time_ns", result.first_token_ns, np.int64),
            ("last_token_time_ns", result.last_token_ns, np.int64),
            (STAT.acceptance_rate, a / k if k else 0.0, np.float32),
            (STAT.total_accepted_draft_tokens, a, np.int32),
            (STAT.total_draft_tokens, k, np.int32),
        ):
            out[name] = t([[value]], dtype)
    if flag("return_num_input_tokens"):
        out["num_input_tokens"] = t([[result.input_len]], np.int32)
    if result.next_draft_ids is not None:
        out[NEXT_DRAFT_IDS] = t(result.next_draft_ids, np.int32).reshape(1, -1)
    if flag("return_num_output_tokens"):
        out["num_output_tokens"] = t([[len(result.new_tokens)]], np.int32)
    return out


def run_tensors(engine: Any, tensors: Any) -> dict[str, np.ndarray]:
    """One request served in process as the engine model serves it through Triton: `tensors` (a mapping of the
    request's input tensors) in, its output tensors out; `engine`: anything with `run(EngineRequest)` (a
    ReferenceEngine, or its batch scheduler)."""
    return result_tensors(engine.run(request_from_tensors(tensors.get)), tensors.get)
