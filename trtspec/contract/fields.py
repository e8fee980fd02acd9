"""Request fields and response statistics of a trtspec endpoint, as one table each.

A request field is named once, as clients send it to the text endpoints (`ensemble`, `baseline`); where the
loop model takes it under TensorRT-LLM's tensor name (`top_k` -> `runtime_top_k`), that alias is in the row.
`LoopRequest` uses the client name. A response statistic is named once, the same on the wire, in
`SpecStats` and in Prometheus (with its counter name in the row).

Adding a statistic: one row in RESPONSE_STATS plus its computation in `trtspec.spec.metrics.SpecStats`.
RESPONSE_OUTPUTS are the outputs trtspec adds to NVIDIA's, per generated token, when a request asks for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from trtspec.contract.errors import RequestError
from trtspec.spec.drafters import SELECTIONS

DRAFT_LENGTH_POLICIES = ("fixed", "adaptive")

# the draft length k a request asks for: its field here, the build config's default for it, the bench's results
NUM_DRAFT_TOKENS = "num_draft_tokens"

# The guide types the pinned backends map to TensorRT-LLM's GuidedDecodingParams (the C++ backend's utils.cc
# getGuidedDecodingParamsFromTensors and the Python backend's model.py, tensorrtllm_backend v0.19.0 = c1e1963).
# The C++ backend ignores any other value; here it is refused.
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")

# Triton data types used here -> numpy
NUMPY = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "FP16": np.float16, "UINT8": np.uint8,
         "BOOL": np.bool_, "STRING": np.object_}


Check = Callable[[Any], "str | None"]  # value -> what is wrong with it, or None


def _finite_at_least(lo: float) -> Check:
    return lambda v: None if math.isfinite(v) and v >= lo else f"must be a finite number >= {lo:g}"


def _at_least(lo: int) -> Check:
    return lambda v: None if v >= lo else f"must be >= {lo}"


def _one_of(choices: tuple[str, ...]) -> Check:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


def _unit_interval(v: float) -> str | None:
    return None if math.isfinite(v) and 0.0 < v <= 1.0 else "must be in (0, 1]"


def _finite(v: float) -> str | None:
    return None if math.isfinite(v) else "must be a finite number"


def _between(lo: int, hi: int) -> Check:
    return lambda v: None if lo <= v <= hi else f"must be between {lo} and {hi}"


def _only(value: Any, why: str) -> Check:
    """Accepted at the value that changes nothing; any other value is refused with `why`."""
    return lambda v: None if v == value else f"can only be {value!r} here ({why})"


@dataclass(frozen=True)
class RequestField:
    name: str  # as clients send it to `ensemble` / `baseline`, and the LoopRequest attribute
    dtype: str  # Triton type without the TYPE_ prefix
    doc: str
    dims: tuple[int, ...] = (1,)
    required: bool = False
    loop_input: str | None = None  # the loop model's input name (a LoopRequest attribute); None: not a loop setting
    check: Check | None = None
    choices: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()  # other names clients send it under (NVIDIA's names before TensorRT-LLM 0.20)
    engine_input: str | None = None  # the tensorrt_llm input the loop forwards it to on every draft and verify call
    refuse: str | None = None  # never served: a request carrying it is refused, naming this

    @property
    def names(self) -> tuple[str, ...]:
        """Every input name it is declared and read under: its name, the loop's name, the aliases."""
        return tuple(dict.fromkeys(n for n in (self.name, self.loop_input, *self.aliases) if n))

    @property
    def numpy(self) -> type:
        return NUMPY[self.dtype]

    def validate(self, value: Any) -> None:
        if value is None:
            return
        if self.refuse:
            raise RequestError(f"{self.name}: {self.refuse}: not served by trtspec; leave {self.name} out")
        problem = self.check(value) if self.check else None
        if problem:
            raise RequestError(f"{self.name} {problem}, got {value!r}")


def _refused(name: str, dtype: str, what: str, dims: tuple[int, ...] = (1,)) -> RequestField:
    return RequestField(name, dtype, f"refused: {what}", dims=dims, refuse=what)


def _penalty(name: str, engine: str, doc: str, check: Check = _finite) -> RequestField:
    return RequestField(name, "FP32", doc, loop_input=engine, engine_input=engine, check=check)


def _choice(name: str, choices: tuple[str, ...], doc: str) -> RequestField:
    return RequestField(name, "STRING", doc, loop_input=name, check=_one_of(choices), choices=choices)


# the most alternatives per token a request may ask for (OpenAI's limit for chat's top_logprobs)
MAX_TOP_LOG_PROBS = 20

REQUEST_FIELDS: tuple[RequestField, ...] = (
    RequestField("text_input", "STRING", "the prompt", required=True),
    RequestField("max_tokens", "INT32", "tokens to generate at most", required=True, check=_at_least(1)),
    RequestField(NUM_DRAFT_TOKENS, "INT32", "draft length k (default: the deployment's; 0: no drafting); "
                 "with draft_length_policy adaptive the most the controller may pick",
                 loop_input=NUM_DRAFT_TOKENS, check=_at_least(0)),
    RequestField("use_draft_logits", "BOOL", "rejection sampling against the draft's distribution",
                 loop_input="use_draft_logits"),
    _choice("draft_source", tuple(SELECTIONS), "who proposes draft tokens"),
    _choice("draft_length_policy", DRAFT_LENGTH_POLICIES,
            f"fixed: k draft tokens every iteration; adaptive: the goodput controller picks k (0 to {NUM_DRAFT_TOKENS}) "
            "and the source each iteration"),
    RequestField("stream", "BOOL", "stream accepted tokens as they come", loop_input="streaming"),
    RequestField("temperature", "FP32", "0 or unset: greedy", loop_input="temperature", engine_input="temperature",
                 check=_finite_at_least(0.0)),
    RequestField("top_k", "INT32", "0: no top-k cut", loop_input="runtime_top_k", engine_input="runtime_top_k",
                 check=_at_least(0)),
    RequestField("top_p", "FP32", "nucleus mass", loop_input="runtime_top_p", engine_input="runtime_top_p",
                 check=_unit_interval),
    RequestField("seed", "UINT64", "sampling seed", loop_input="seed", aliases=("random_seed",), engine_input="seed"),
    RequestField("min_tokens", "INT32", "the end token is not generated before this many tokens", loop_input="min_tokens",
                 aliases=("min_length",), check=_at_least(0)),
    _penalty("repetition_penalty", "repetition_penalty", "divides the logits of tokens already in the sequence",
             check=lambda v: None if math.isfinite(v) and v > 0 else "must be a finite number > 0"),
    _penalty("presence_penalty", "presence_penalty", "subtracted once from tokens already in the sequence"),
    _penalty("frequency_penalty", "frequency_penalty", "subtracted per occurrence of tokens already in the sequence"),
    _penalty("length_penalty", "len_penalty", "beam search only: changes nothing at beam width 1"),
    RequestField("exclude_input_in_output", "BOOL", "false: a non-streamed output starts with the prompt "
                 "(default: the generated tokens only)", loop_input="exclude_input_in_output"),
    RequestField("embedding_bias_words", "STRING", "words whose tokens get embedding_bias_weights added to their logits",
                 dims=(-1,)),
    RequestField("embedding_bias_weights", "FP32", "one weight per embedding_bias_words entry", dims=(-1,)),
    RequestField("return_num_input_tokens", "BOOL", "return num_input_tokens (the prompt's tokens)",
                 loop_input="return_num_input_tokens"),
    RequestField("return_num_output_tokens", "BOOL", "return num_output_tokens (tokens generated so far)",
                 loop_input="return_num_output_tokens"),
    RequestField("beam_width", "INT32", "1 (beam search is not served)", check=_only(1, "beam search is not served")),
    RequestField("num_return_sequences", "INT32", "1", check=_only(1, "one sequence per request")),
    RequestField("return_log_probs", "BOOL", "return output_log_probs (the target's log-probability of each token it "
                 "emits, the same with and without speculation) and cum_log_probs", loop_input="return_log_probs"),
    RequestField("top_log_probs", "INT32", f"N (at most {MAX_TOP_LOG_PROBS}): return output_top_ids and output_top_log_probs, "
                 "the target's N most likely tokens at each generated token's position (0: none)",
                 loop_input="top_log_probs", check=_between(0, MAX_TOP_LOG_PROBS)),
    RequestField("return_context_logits", "BOOL", "false",
                 check=_only(False, "logits are not returned with speculative decoding, as in NVIDIA's BLS")),
    RequestField("return_generation_logits", "BOOL", "false",
                 check=_only(False, "logits are not returned with speculative decoding, as in NVIDIA's BLS")),
    RequestField("end_id", "INT32", "end token (default: the tokenizer's)"),
    RequestField("pad_id", "INT32", "pad token (default: the tokenizer's)"),
    RequestField("stop_words", "STRING", "stop strings (the output ends with the first one)", dims=(-1,)),
    RequestField("bad_words", "STRING", "strings never generated", dims=(-1,)),
    RequestField("return_perf_metrics", "BOOL", "accepted for NVIDIA's clients; statistics are always returned",
                 loop_input="return_perf_metrics", aliases=("return_kv_cache_reuse_stats",)),  # 0.17's name
    _refused("decoder_text_input", "STRING", "encoder-decoder models"),
    _refused("prompt_embedding_table", "FP16", "prompt tuning tables", dims=(-1, -1)),
    _refused("prompt_table_extra_id", "UINT64", "prompt tuning tables"),
    _refused("prompt_vocab_size", "INT32", "prompt tuning tables"),
    _refused("lora_task_id", "UINT64", "LoRA adapters"),
    _refused("lora_weights", "FP16", "LoRA adapters", dims=(-1, -1)),
    _refused("lora_config", "INT32", "LoRA adapters", dims=(-1, 3)),
    RequestField("guided_decoding_guide_type", "STRING", f"guided decoding (xgrammar, as TensorRT-LLM): "
                 f"{', '.join(GUIDE_TYPES)}; the output follows the guide, with speculation exact under it",
                 loop_input="guided_decoding_guide_type", check=_one_of(GUIDE_TYPES), choices=GUIDE_TYPES),
    RequestField("guided_decoding_guide", "STRING", "the JSON schema, regular expression or EBNF grammar "
                 "(none for json)", loop_input="guided_decoding_guide"),
    _refused("image_input", "FP16", "image inputs (multimodal models)", dims=(-1, 3, -1, -1)),
    _refused("image_bytes_input", "UINT8", "image inputs (multimodal models)", dims=(-1, -1, -1, -1)),
    _refused("image_url_input", "STRING", "image inputs (multimodal models)"),
    _refused("video_bytes_input", "UINT8", "video inputs (multimodal models)", dims=(-1, -1, -1, -1)),
)

# What preprocessing makes of the text fields, as the loop model takes it (TensorRT-LLM's tensor names).
LOOP_TOKEN_INPUTS: tuple[tuple[str, str, tuple[int, ...], bool], ...] = (
    # (name, dtype, dims, optional)
    ("input_ids", "INT32", (-1,), False),
    ("input_lengths", "INT32", (1,), False),
    ("request_output_len", "INT32", (1,), False),
    ("end_id", "INT32", (1,), True),
    ("pad_id", "INT32", (1,), True),
    ("stop_words_list", "INT32", (2, -1), True),
    ("bad_words_list", "INT32", (2, -1), True),
    ("embedding_bias", "FP32", (-1,), True),
)


def field_by_name(name: str) -> RequestField:
    for f in REQUEST_FIELDS:
        if f.name == name or name in f.aliases:
            return f
    raise KeyError(name)


@dataclass(frozen=True)
class Stat:
    """One statistic in every response: a `SpecStats` attribute of the same name."""

    name: str
    dtype: str  # INT32 or FP32
    doc: str
    vector: bool = False  # dims [-1]: one value per draft position / per draft source
    counter: str | None = None  # Prometheus counter summing it over requests (None: derived, not summed)
    label: str | None = None  # the counter's label for a vector stat (position, source)


RESPONSE_STATS: tuple[Stat, ...] = (
    Stat("acceptance_rate", "FP32", "accepted / proposed draft tokens"),
    Stat("total_accepted_draft_tokens", "INT32", "draft tokens accepted", counter="spec_decode_num_accepted_tokens"),
    Stat("total_draft_tokens", "INT32", "draft tokens proposed", counter="spec_decode_num_draft_tokens"),
    Stat("num_iterations", "INT32", "target calls (verify steps)", counter="spec_decode_num_iterations"),
    Stat("num_drafts", "INT32", "iterations that proposed draft tokens", counter="spec_decode_num_drafts"),
    Stat("draft_fallbacks", "INT32", "draft calls that failed; the request continued target-only",
         counter="spec_decode_num_fallbacks"),
    Stat("load_paused_iterations", "INT32", "iterations run without a draft because of the requests in flight "
         "(more than speculative.max_concurrency, or a draft_len_schedule entry of 0)",
         counter="spec_decode_num_load_paused_iterations"),
    Stat("acceptance_derived", "INT32", "1: the engine reported no acceptance (TensorRT-LLM's PyTorch path before mid-2026) "
         "and trtspec derived it from tokens and target steps (accepted = tokens - steps; proposed = generation steps x "
         "the most draft tokens a step verifies, an upper bound)", counter="spec_decode_num_derived_acceptance_requests"),
    Stat("guided_without_drafting", "INT32", "1: a guided request on an engine that does not apply the guide to "
         "drafted tokens (TensorRT-LLM's tensorrtllm backend masks one position per step): it ran without drafting, "
         "as one engine call (trtspec.guided)", counter="spec_decode_num_guided_undrafted_requests"),
    Stat("accepted_per_position", "INT32", "accepted draft tokens by position in the draft", vector=True,
         counter="spec_decode_num_accepted_tokens_per_pos", label="position"),
    Stat("proposed_per_position", "INT32", "proposed draft tokens by position in the draft", vector=True,
         counter="spec_decode_num_draft_tokens_per_pos", label="position"),
    Stat("draft_len_counts", "INT32", "iterations by draft length: entry k counts the target calls that verified k "
         "draft tokens (0: a plain step), what the draft-length policy chose", vector=True,
         counter="spec_decode_num_iterations_by_draft_len", label="draft_len"),
    Stat("accepted_by_source", "INT32", "accepted draft tokens by the drafter that proposed them (drafters.SOURCES order)",
         vector=True, counter="spec_decode_num_accepted_tokens_by_source", label="source"),
)



class _StatNames:
    """The statistics' names as attributes (`STAT.total_draft_tokens` is "total_draft_tokens"): code outside the
    table names a statistic through it, so a name not in RESPONSE_STATS fails where it is used."""

    def __getattr__(self, name: str) -> str:
        if any(s.name == name for s in RESPONSE_STATS):
            return name
        raise AttributeError(f"{name} is not a statistic of trtspec.contract.RESPONSE_STATS")


STAT = _StatNames()


def stat_by_name(name: str) -> Stat:
    return next(s for s in RESPONSE_STATS if s.name == name)

@dataclass(frozen=True)
class Output:
    """An output trtspec adds to NVIDIA's: sent only to a request that asks for it (as TensorRT-LLM leaves out
    outputs a request did not enable)."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    doc: str


RESPONSE_OUTPUTS: tuple[Output, ...] = (
    Output("output_top_ids", "INT32", (-1, -1), "with top_log_probs N: [tokens, N], per generated token the target's N "
           "most likely tokens at its position, most likely first (from the target's generation logits at the "
           "request's temperature; penalties and biases are not in them)"),
    Output("output_top_log_probs", "FP32", (-1, -1), "with top_log_probs N: [tokens, N], the log-probabilities of "
           "output_top_ids"),
)
