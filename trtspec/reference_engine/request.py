"""What one call to the engine asks for and what it returns (one TensorRT-LLM request, beam width 1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Generator

import numpy as np

from trtspec.spec.speculative import SamplingParams

if TYPE_CHECKING:
    from trtspec.guided import Guide
    from trtspec.reference_engine.ragged import Segment

# What ReferenceEngine.steps returns: yields the segment each step computes, returns the result.
Steps = Generator["Segment", None, "EngineResult"]

# The KV-cache accounting unit for the kv_cache_* outputs: trtllm-build's default tokens_per_block.
TOKENS_PER_BLOCK = 32


@dataclass
class EngineRequest:
    input_ids: list[int]
    output_len: int
    draft_ids: list[int] | None = None
    draft_logits: np.ndarray | None = None  # [k, V], used for rejection sampling when sampling
    end_id: int | None = None
    sampling: SamplingParams = SamplingParams()
    seed: int | None = None
    min_tokens: int = 0
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    embedding_bias: np.ndarray | None = None  # [V], added to the logits
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    return_generation_logits: bool = False
    return_context_logits: bool = False
    return_log_probs: bool = False
    next_draft_len: int = 0  # EAGLE-3 in the engine: draft this many tokens for the next call (next_draft_ids)
    guide: "Guide | None" = None  # guided decoding (trtspec.guided)
    guide_start: int | None = None  # where the guided output starts in input_ids (None: after it, as TensorRT-LLM)
    streaming: bool = False  # answered a step's new tokens at a time (TensorRT-LLM's streaming=true)
    # streaming: called on the engine's thread with each step's new tokens, except the finishing step's, which the
    # final answer carries (as the executor's last streamed response does); never the end token
    on_tokens: Callable[[list[int]], None] | None = None


@dataclass
class EngineResult:
    tokens: list[int]  # input + new tokens (the end token is never among them)
    input_len: int = 0
    generation_logits: np.ndarray | None = None  # [new, V] raw logits of the generated positions
    context_logits: np.ndarray | None = None  # [input_len, V] raw logits of the input positions
    log_probs: list[float] | None = None  # per new token, of the processed distribution
    num_drafted: int = 0  # draft tokens this call verified (TensorRT-LLM's perf metrics count them)
    num_accepted: int = 0
    reused_tokens: int = 0  # how many input tokens came from the prefix cache
    computed_tokens: int = 0
    first_token_ns: int = 0  # time.monotonic_ns() (the executor's steady clock) when the first token was known
    last_token_ns: int = 0
    next_draft_ids: list[int] | None = None  # the in-engine head's draft for the call after this one

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.input_len :]

    def kv_blocks(self) -> tuple[int, int, int]:
        """(newly allocated, reused, total) KV blocks of TOKENS_PER_BLOCK for this request's sequence."""
        total = -(-len(self.tokens) // TOKENS_PER_BLOCK)
        reused = self.reused_tokens // TOKENS_PER_BLOCK
        return total - reused, reused, total
