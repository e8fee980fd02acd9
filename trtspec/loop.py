"""The speculative loop, one implementation for both engine flavours.

Each iteration asks a drafter for k tokens, sends the running sequence plus `draft_input_ids` (and
`draft_logits` when asked) to the target in ONE call, and takes the target's answer: the accepted
prefix plus one target token. The loop talks to its engines only through `call(model, tensors)`,
so it runs unchanged against TensorRT-LLM engines, the reference engine, or a test double.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

import numpy as np

from trtspec.speculative import DraftLengthPolicy, PayoffGate, SpecStats, find_stop

# (model name, input tensors, requested outputs) -> output tensors; raises EngineCallError on failure
EngineCall = Callable[[str, Mapping[str, np.ndarray], list[str]], Mapping[str, np.ndarray]]


class EngineCallError(RuntimeError):
    pass


class LoopRequestError(ValueError):
    """The request itself is wrong; the client gets this message."""


DRAFT_SOURCES = ("model", "ngram", "hybrid")
DRAFT_LENGTH_POLICIES = ("fixed", "adaptive")


@dataclass(frozen=True)
class LoopSettings:
    target_model: str = "tensorrt_llm"
    draft_model: str | None = "tensorrt_llm_draft"
    ngram_model: str | None = None
    max_draft_len: int = 8
    default_num_draft_tokens: int = 4
    default_draft_source: str = "model"
    adaptive: bool = False
    adaptive_min_k: int = 1
    adaptive_pause_below: float = 0.2
    adaptive_window: int = 4
    adaptive_probe_every: int = 8
    adaptive_payoff: bool = True  # adaptive only: skip a source whose drafts are slower than plain steps
    max_input_len: int = 2048  # engines' limit: the running sequence (prompt + generated) is resent as input
    draft_disabled: bool = False  # the target-only baseline endpoint
    min_tokens_name: str = "min_tokens"  # TensorRT-LLM < 0.20: min_length
    seed_name: str = "seed"  # TensorRT-LLM < 0.20: random_seed


@dataclass
class LoopRequest:
    prompt: list[int]
    max_tokens: int
    num_draft_tokens: int | None = None
    use_draft_logits: bool = False
    draft_source: str | None = None
    draft_length_policy: str | None = None  # fixed | adaptive; None: the deployment's
    end_id: int | None = None
    pad_id: int | None = None
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words_tensor: np.ndarray | None = None
    stop_words_tensor: np.ndarray | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None


@dataclass
class Chunk:
    """Tokens accepted in one iteration (what a streamed response carries)."""

    new_tokens: list[int]
    generated_before: list[int]
    stats: SpecStats
    source_counts: dict[str, int]
    final: bool = False


def validate(req: LoopRequest, s: LoopSettings) -> None:
    if not req.prompt:
        raise LoopRequestError("the prompt is empty (text_input must not be empty)")
    if req.max_tokens <= 0:
        raise LoopRequestError(f"max_tokens must be > 0, got {req.max_tokens}")
    k = s.default_num_draft_tokens if req.num_draft_tokens is None else req.num_draft_tokens
    if k < 0:
        raise LoopRequestError(f"num_draft_tokens must be >= 0, got {k}")
    if k > s.max_draft_len:
        raise LoopRequestError(
            f"num_draft_tokens {k} is larger than max_draft_len {s.max_draft_len} "
            "(the target engine was built for at most max_draft_len draft tokens)"
        )
    if req.draft_source is not None and req.draft_source not in DRAFT_SOURCES:
        raise LoopRequestError(f"draft_source must be one of {', '.join(DRAFT_SOURCES)}, got {req.draft_source!r}")
    if req.draft_length_policy is not None and req.draft_length_policy not in DRAFT_LENGTH_POLICIES:
        raise LoopRequestError(
            f"draft_length_policy must be one of {', '.join(DRAFT_LENGTH_POLICIES)}, got {req.draft_length_policy!r}"
        )
    total = len(req.prompt) + req.max_tokens
    if total > s.max_input_len:
        raise LoopRequestError(
            f"prompt ({len(req.prompt)} tokens) + max_tokens ({req.max_tokens}) = {total} exceeds max_input_len "
            f"{s.max_input_len}: the loop resends the running sequence to the engines each iteration; "
            "shorten the prompt, lower max_tokens, or rebuild with a larger limits.max_input_len"
        )


def _i32(*v: int) -> np.ndarray:
    return np.array([list(v)], dtype=np.int32)


class SpeculativeLoop:
    def __init__(self, settings: LoopSettings, call: EngineCall):
        self.s = settings
        self.call = call

    # -------------------------------------------------------------- engine requests

    def _common(self, req: LoopRequest) -> dict[str, np.ndarray]:
        t: dict[str, np.ndarray] = {"streaming": np.array([[False]])}
        if req.end_id is not None:
            t["end_id"] = _i32(req.end_id)
        if req.pad_id is not None:
            t["pad_id"] = _i32(req.pad_id)
        if req.temperature is not None:
            t["temperature"] = np.array([[req.temperature]], dtype=np.float32)
        if req.top_k is not None:
            t["runtime_top_k"] = _i32(req.top_k)
        if req.top_p is not None:
            t["runtime_top_p"] = np.array([[req.top_p]], dtype=np.float32)
        if req.seed is not None:
            t[self.s.seed_name] = np.array([[req.seed]], dtype=np.uint64)
        if req.bad_words_tensor is not None:
            t["bad_words_list"] = req.bad_words_tensor
        return t

    @staticmethod
    def _new_tokens(out: Mapping[str, np.ndarray], seq_len: int) -> list[int]:
        ids = np.asarray(out["output_ids"]).reshape(-1)
        n = int(np.asarray(out["sequence_length"]).reshape(-1)[0])
        return [int(x) for x in ids[seq_len:n]]

    def _draft(self, model: str, seq: list[int], k: int, req: LoopRequest, want_logits: bool):
        tensors = self._common(req)
        tensors.update(
            input_ids=np.array([seq], dtype=np.int32),
            input_lengths=_i32(len(seq)),
            request_output_len=_i32(k),
            return_generation_logits=np.array([[want_logits]]),
        )
        tensors[self.s.min_tokens_name] = _i32(k)  # the draft must not stop early
        wanted = ["output_ids", "sequence_length"] + (["generation_logits"] if want_logits else [])
        out = self.call(model, tensors, wanted)
        tokens = self._new_tokens(out, len(seq))[:k]
        logits = None
        if want_logits and tokens and "generation_logits" in out:
            g = np.asarray(out["generation_logits"], dtype=np.float32)
            logits = g.reshape(-1, g.shape[-1])[-len(tokens) :][None]
        return tokens, logits

    def _verify(self, seq: list[int], draft: list[int], logits: np.ndarray | None, req: LoopRequest) -> list[int]:
        tensors = self._common(req)
        tensors.update(
            input_ids=np.array([seq], dtype=np.int32),
            input_lengths=_i32(len(seq)),
            request_output_len=_i32(len(draft) + 1),
        )
        if draft:
            tensors["draft_input_ids"] = np.array([draft], dtype=np.int32)
            if logits is not None:
                tensors["draft_logits"] = logits
        if req.stop_words_tensor is not None:
            tensors["stop_words_list"] = req.stop_words_tensor
        out = self.call(self.s.target_model, tensors, ["output_ids", "sequence_length"])
        return self._new_tokens(out, len(seq))

    # -------------------------------------------------------------- the loop

    def _drafters(self, source: str) -> list[tuple[str, str]]:
        """(source name, model name) in the order they are asked; the first proposal wins."""
        if self.s.draft_disabled:
            return []
        order = {"model": ["model"], "ngram": ["ngram"], "hybrid": ["ngram", "model"]}[source]
        names = {"model": self.s.draft_model, "ngram": self.s.ngram_model}
        return [(src, names[src]) for src in order if names[src]]

    def run(self, req: LoopRequest) -> Iterator[Chunk]:
        """Yields one Chunk per target call (the last has final=True). Raises LoopRequestError."""
        validate(req, self.s)
        k_req = self.s.default_num_draft_tokens if req.num_draft_tokens is None else req.num_draft_tokens
        source = req.draft_source or self.s.default_draft_source
        drafters = self._drafters(source)
        adaptive = self.s.adaptive if req.draft_length_policy is None else req.draft_length_policy == "adaptive"
        gate = (
            PayoffGate(window=max(4, self.s.adaptive_window), probe_every=self.s.adaptive_probe_every)
            if adaptive and self.s.adaptive_payoff and drafters
            else None
        )
        policy = DraftLengthPolicy(
            k_req if drafters else 0,
            adaptive=adaptive,
            min_k=self.s.adaptive_min_k,
            # measured payoff decides pauses better than an acceptance threshold (what pays depends on cost)
            pause_below=0.0 if gate is not None else self.s.adaptive_pause_below,
            window=self.s.adaptive_window,
            probe_every=self.s.adaptive_probe_every,
        )
        stats = SpecStats()
        source_counts: dict[str, int] = {}
        seq, generated = list(req.prompt), []
        failed: set[str] = set()
        while True:
            remaining = req.max_tokens - len(generated)
            k = policy.next_k(remaining)
            if gate is not None and k and gate.wants_plain_step():
                k = 0
            draft, logits, used = [], None, None
            t_start = time.perf_counter()
            for src, model in drafters:
                if k == 0 or src in failed or (gate is not None and not gate.allows(src)):
                    continue
                try:
                    draft, logits = self._draft(model, seq, k, req, req.use_draft_logits and src == "model")
                except EngineCallError:
                    # a missing or failing drafter must not fail the request: go on without it
                    failed.add(src)
                    stats.num_fallbacks += 1
                    continue
                if draft:
                    used = src
                    break
            new = self._verify(seq, draft, logits, req)
            if not new:
                raise EngineCallError(f"{self.s.target_model} returned no new token")
            accepted = 0
            while accepted < min(len(draft), len(new)) and new[accepted] == draft[accepted]:
                accepted += 1
            if gate is not None and stats.num_iterations > 0:  # the first call carries the prefill
                gate.record(used, accepted + 1, time.perf_counter() - t_start)
            stats.record(len(draft), accepted)
            policy.update(len(draft), accepted)
            if used:
                source_counts[used] = source_counts.get(used, 0) + accepted
            new = new[:remaining]
            done = len(generated) + len(new) >= req.max_tokens
            if req.end_id is not None and req.end_id in new:
                new, done = new[: new.index(req.end_id)], True  # the end token itself is not output
            if req.stop_words:
                cut = find_stop(generated + new, req.stop_words, start=len(generated))
                if cut is not None:
                    new, done = (generated + new)[len(generated) : cut], True
            before = list(generated)
            generated += new
            seq += new
            yield Chunk(new, before, stats, source_counts, final=done)
            if done:
                return
