"""The reference engine: a Hugging Face causal LM with the semantics of TensorRT-LLM's executor.

One call = one TensorRT-LLM request:
  * without draft tokens: generate up to `output_len` tokens (greedy or sampled);
  * with draft tokens: verify all of them in ONE forward pass over sequence + draft and return
    the accepted prefix plus one target token (greedy comparison, token comparison under
    sampling, or rejection sampling against the draft's logits).

What TensorRT-LLM's executor does, this does (the reasons are cited where they are applied):
  * the end token ends the sequence and is never part of the output or of its length
    (externalDraftTokensKernels.cu: "Do not increase seq len when EOS is generated"): a verify whose
    next target token is the end token returns the input plus the accepted prefix only, and one whose
    first token is the end token returns the input unchanged; stop words stay in the output;
  * the logits of each step go through penaltyKernels.cu's order: + embedding_bias, x / temperature,
    then for every token already in prompt + output: repetition (divide a positive logit, multiply a
    negative one), presence (subtract once), frequency (subtract count x penalty); then the end token
    is masked while fewer than min_tokens were generated; then bad words are masked; then top-k/top-p;
  * output log probs are log-softmax of those processed logits at the chosen token (full vocabulary);
    generation and context logits are the model's raw logits, as the engine gathers them.

Prefix KV-cache reuse plays the role of TensorRT-LLM's enable_kv_cache_reuse: the loop resends
the whole running sequence every iteration, so each call only computes the tokens that are new
since the longest cached prefix.

A request is a generator of forward steps (`steps`); `run` serves one alone, and trtspec.batching's scheduler
steps many together, one forward pass over all of them per step (the executor's in-flight batching).
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import functools
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, Sequence

import numpy as np
import torch

from trtspec.ragged import ATTENTION, RaggedBatch, Segment, register as register_attention
from trtspec.speculative import (
    SamplingParams,
    find_stop,
    probabilities,
    sample,
    verify_by_target_sample,
    verify_greedy,
    verify_rejection,
)


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
    **dict.fromkeys(("guided_decoding_guide_type", "guided_decoding_guide"), "guided decoding"),
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


@dataclass
class EngineResult:
    tokens: list[int]  # input + new tokens (the end token is never among them)
    input_len: int = 0
    generation_logits: np.ndarray | None = None  # [new, V] raw logits of the generated positions
    context_logits: np.ndarray | None = None  # [input_len, V] raw logits of the input positions
    log_probs: list[float] | None = None  # per new token, of the processed distribution
    num_draft_tokens: int = 0
    num_accepted: int = 0
    reused_tokens: int = 0  # how many input tokens came from the prefix cache
    computed_tokens: int = 0
    first_token_ns: int = 0  # time.monotonic_ns() (the executor's steady clock) when the first token was known
    last_token_ns: int = 0

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.input_len :]

    def kv_blocks(self) -> tuple[int, int, int]:
        """(newly allocated, reused, total) KV blocks of TOKENS_PER_BLOCK for this request's sequence."""
        total = -(-len(self.tokens) // TOKENS_PER_BLOCK)
        reused = self.reused_tokens // TOKENS_PER_BLOCK
        return total - reused, reused, total


def _kv_tensors(cache: Any) -> list[torch.Tensor]:
    """Every key and value tensor a DynamicCache holds (transformers >= 4.56 keeps them per layer object)."""
    if hasattr(cache, "layers"):
        return [t for layer in cache.layers for t in (layer.keys, layer.values) if t is not None]
    return [*cache.key_cache, *cache.value_cache]


def cache_nbytes(cache: Any) -> int:
    return sum(t.nbytes for t in _kv_tensors(cache))


def share_prefix(cache: Any, n: int) -> Any:
    """A new DynamicCache holding the first `n` positions of `cache` as views of its tensors (no copy).

    Safe because a DynamicCache never writes into its tensors: update() concatenates into new ones and
    crop() slices, so whatever the sharer does leaves the owner's tensors as they were."""
    shared = copy.copy(cache)
    if hasattr(cache, "layers"):
        shared.layers = [copy.copy(layer) for layer in cache.layers]
    else:
        shared.key_cache, shared.value_cache = list(cache.key_cache), list(cache.value_cache)
    drop = shared.get_seq_length() - n
    if drop > 0:
        shared.crop(-drop)
    return shared


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_memory() -> None:
    """Hand freed heap pages back to the OS. glibc keeps freed KV tensors (each below its mmap threshold
    once that has adapted) in its arenas, so without this a burst's peak stays the process's size."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class _DeferredTrim:
    """Runs `action` (`release_memory`) once, `delay_s` after the first request since the last run. malloc_trim walks the
    whole heap (measured: 15 ms median, 77 ms max, on a fragmented 0.5 GB heap), too slow for every eviction
    of a full cache; deferred, it runs at most once per `delay_s` and always within `delay_s` of the last
    eviction, also when no request follows (the end of a burst)."""

    def __init__(self, delay_s: float = 1.0, action: Callable[[], None] = release_memory) -> None:
        self.delay_s, self.action = delay_s, action
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def request(self) -> None:
        if _malloc_trim() is None:
            return
        with self._lock:
            if self._timer is None:
                self._timer = threading.Timer(self.delay_s, self._run)
                self._timer.daemon = True
                self._timer.start()

    def _run(self) -> None:
        with self._lock:
            self._timer = None
        self.action()  # ctypes releases the GIL: the engine's thread runs on meanwhile


_TRIM = _DeferredTrim()


@dataclass
class _Entry:
    tokens: list[int]
    committed: int
    cache: Any
    nbytes: int


class PrefixCache:
    """KV caches keyed by the tokens they hold; a call uses the one sharing the longest prefix.

    An entry remembers how many of its tokens were committed (the input of the call that made it;
    the draft tokens after them may be rejected). A cache whose committed tokens the new sequence
    continues is the request's own: it is taken out while in use and put back afterwards. A cache
    that only shares a shorter prefix (another request with the same chat template or system prompt)
    is lent as views of its tensors (`share_prefix`), so concurrent requests never crop each other's caches.

    The entries held (not those taken out by running requests) are bounded by `max_entries` and by
    `max_bytes` of key/value tensors; the least recently used (put or hit by `take`) go first, and the
    freed memory is handed back to the OS.
    """

    def __init__(self, max_entries: int = 16, max_bytes: int | None = None):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: "OrderedDict[int, _Entry]" = OrderedDict()
        self._next = 0

    def take(self, tokens: Sequence[int]) -> tuple[Any | None, int]:
        best_key, best_len = None, 0
        for key, entry in self._entries.items():
            n = _common_prefix(entry.tokens, tokens)
            if n > best_len:
                best_key, best_len = key, n
        if best_key is None:
            return None, 0
        entry = self._entries[best_key]
        if best_len >= entry.committed:
            del self._entries[best_key]
            self.nbytes -= entry.nbytes
            return entry.cache, best_len
        self._entries.move_to_end(best_key)
        return share_prefix(entry.cache, best_len), best_len

    def put(self, tokens: list[int], cache: Any, committed: int | None = None) -> None:
        size = cache_nbytes(cache)
        self._entries[self._next] = _Entry(tokens, len(tokens) if committed is None else committed, cache, size)
        self._next += 1
        self.nbytes += size
        evicted = False
        while self._entries and (
            len(self._entries) > self.max_entries or (self.max_bytes is not None and self.nbytes > self.max_bytes)
        ):
            _, old = self._entries.popitem(last=False)
            self.nbytes -= old.nbytes
            evicted = True
        if evicted:
            _TRIM.request()

    def __len__(self) -> int:
        return len(self._entries)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix. Slice comparisons run in C; a Python loop over every cached
    sequence would cost a fraction of a millisecond per call."""
    a, b = list(a), list(b)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


# Optional file in a draft checkpoint: the token ids its LM head may propose (like EAGLE-3's reduced
# draft vocabulary). Scoring only those rows of a 49k-row head is most of a small draft's cost.
DRAFT_VOCAB_FILE = "draft_vocab.json"


def load_draft_vocab(checkpoint: str | Path, vocab_size: int) -> list[int] | None:
    """The ids listed in the checkpoint's draft_vocab.json ({"ids": [...]}), validated; None without one."""
    path = Path(checkpoint) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    import json

    try:
        ids = json.loads(path.read_text())["ids"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: expected a JSON object with an 'ids' list ({e})") from None
    if not ids or not all(isinstance(i, int) and 0 <= i < vocab_size for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"{path}: 'ids' must be distinct token ids in [0, {vocab_size})")
    return sorted(ids)


def draft_head(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """The LM head restricted to `ids`, transposed to [hidden, n] (one GEMM reads it as stored)."""
    out_emb = model.get_output_embeddings()
    if getattr(out_emb, "bias", None) is not None or getattr(model.config, "final_logit_softcapping", None):
        raise ValueError(f"{DRAFT_VOCAB_FILE} needs a plain linear LM head (no bias, no softcapping)")
    w = out_emb.weight.detach()
    return w[torch.tensor(ids, dtype=torch.long, device=w.device)].t().contiguous()


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def tune_for_cpu(model: torch.nn.Module) -> None:
    """Make verifying k + 1 tokens on CPU cheaper (demo target, 1 thread, interleaved runs: a verify of
    4 draft tokens went from 1.76x to 1.53x a 1-token step at 200 tokens of context, 1.94x to 1.63x at
    1,024; the 1-token step itself unchanged).

    * grouped-query attention inside SDPA: with more than one query row transformers passes a mask,
      and then (unless forced) expands K and V to every head — a copy of the whole KV cache per layer
      per call, which is what made verify cost grow with context. Forcing it is exact on CPU.
    * with one torch thread (how trtspec serves on CPU), Linear weights stored column-major: the GEMM
      kernels then read them as they are instead of packing them for every call with more than one
      row. With 2 threads it slowed the 1-token step (by 16%), so it is left out there.
    """
    os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    if torch.get_num_threads() != 1:
        return
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m.weight.is_contiguous():
            m.weight.data = m.weight.data.t().contiguous().t()


def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class ReferenceEngine:
    def __init__(
        self,
        checkpoint: str | Path,
        device: str = "auto",
        dtype: str = "float32",
        cache_entries: int = 16,
        cache_bytes: int | None = None,
        cache_tokens: int | None = None,
        salt: int = 0,
        use_draft_vocab: bool = False,
    ):
        from transformers import AutoModelForCausalLM

        self.device = pick_device(device)
        if self.device == "cpu" and dtype != "float32":
            dtype = "float32"  # half precision matmuls are several times slower on CPU
        self.model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=_DTYPES[dtype]).to(self.device)
        self.model.eval()
        register_attention()
        self.model.set_attn_implementation(ATTENTION)
        if self.device == "cpu":
            tune_for_cpu(self.model)
        self.vocab_size = int(self.model.config.vocab_size)
        # With a draft vocabulary the head scores only those ids; every other logit is -inf, so greedy and
        # sampled proposals and the draft logits returned for rejection sampling all stay within it.
        self.draft_vocab: torch.Tensor | None = None
        ids = load_draft_vocab(checkpoint, self.vocab_size) if use_draft_vocab else None
        if ids is not None:
            try:
                self._draft_head_t = draft_head(self.model, ids)
            except ValueError as e:
                raise ValueError(f"{checkpoint}: {e}") from None
            self.draft_vocab = torch.tensor(ids, dtype=torch.long, device=self.device)
        if cache_bytes is None and cache_tokens:  # a budget in tokens: this model's KV bytes per token decide
            cache_bytes = cache_tokens * self.kv_bytes_per_token()
        self.cache = PrefixCache(cache_entries, cache_bytes)
        self.salt = salt  # decorrelates the random streams of the draft and the target under one seed

    def kv_bytes_per_token(self) -> int:
        """Measured: the KV cache one token leaves behind (any architecture, dtype and head layout)."""
        from transformers import DynamicCache

        segment = Segment(DynamicCache(config=self.model.config), [0], 0, 1)
        self.forward([segment])
        return cache_nbytes(segment.cache)

    # ------------------------------------------------------------------ forward with prefix reuse

    def _open(self, tokens: list[int], need_logits: int = 1) -> tuple[Segment, int]:
        """The segment that computes what `tokens` adds to its longest cached prefix (the cache taken out of
        the prefix cache), and how many tokens the cache served."""
        from transformers import DynamicCache

        cache, reuse = self.cache.take(tokens)
        reuse = min(reuse, len(tokens) - need_logits)
        if cache is None or reuse == 0:
            cache, reuse = DynamicCache(config=self.model.config), 0
        elif cache.get_seq_length() > reuse:
            cache.crop(reuse - cache.get_seq_length())  # negative: drop that many (transformers 4.x and 5.x)
        return Segment(cache, list(tokens[reuse:]), reuse, need_logits), reuse

    def forward(self, segments: list[Segment]) -> None:
        """One forward pass over all segments; sets each one's logits (raw, float32) and extends its cache.
        Only the wanted rows go through the LM head: with a 49k vocabulary the head over a whole prompt
        would cost as much as the prefill itself."""
        batch = RaggedBatch(segments)
        ids, pos, rows = batch.inputs(self.device)
        with torch.inference_mode():
            if self.draft_vocab is None:
                out = self.model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=rows, **batch.kwargs())
                logits = out.logits[0].float()
            else:
                out = self.model.base_model(input_ids=ids, position_ids=pos, use_cache=False, **batch.kwargs())
                scores = (out.last_hidden_state[0, rows] @ self._draft_head_t).float()
                logits = torch.full((len(rows), self.vocab_size), float("-inf"), device=scores.device)
                logits[:, self.draft_vocab] = scores
        batch.split_logits(logits)

    def _rng(self, req: EngineRequest) -> np.random.Generator:
        kind = 1 if req.draft_ids else 0
        if req.seed is None:
            return np.random.default_rng()
        return np.random.default_rng([int(req.seed), len(req.input_ids), kind, self.salt])

    @staticmethod
    def _process(raw: np.ndarray, context: Sequence[int], req: EngineRequest, generated: int) -> np.ndarray:
        """The logits the executor samples from, in penaltyKernels.cu's order (module docstring)."""
        x = np.array(raw, dtype=np.float32)
        if req.embedding_bias is not None:
            x += req.embedding_bias
        if req.sampling.temperature > 0:  # unset (0 here) is TensorRT-LLM's default 1.0
            x /= np.float32(req.sampling.temperature)
        rep, pres, freq = req.repetition_penalty, req.presence_penalty, req.frequency_penalty
        if rep not in (None, 1.0) or pres or freq:
            ids, counts = np.unique(np.asarray(context, dtype=np.int64), return_counts=True)
            keep = ids < len(x)
            ids, counts = ids[keep], counts[keep]
            v = x[ids]
            if rep not in (None, 1.0):
                v = np.where(v < 0, v * rep, v / rep)
            if pres:
                v = v - pres
            if freq:
                v = v - freq * counts
            x[ids] = v
        banned = [w[-1] for w in req.bad_words if w and list(context[len(context) - len(w) + 1 :]) == list(w[:-1])]
        if req.end_id is not None and generated < req.min_tokens:
            banned.append(req.end_id)
        banned = [b for b in banned if 0 <= b < len(x)]
        if banned:
            x[banned] = -np.inf
        return x

    @staticmethod
    def _sampling(req: EngineRequest) -> SamplingParams:
        """Temperature is already in the processed logits: what is left is top-k/top-p (or greedy)."""
        return req.sampling if req.sampling.greedy else dataclasses.replace(req.sampling, temperature=1.0)

    @staticmethod
    def _log_prob(row: np.ndarray, token: int) -> float:
        finite = row[np.isfinite(row)]
        m = finite.max()
        return float(row[token] - m - np.log(np.exp(finite - m).sum()))

    # ------------------------------------------------------------------ the two request kinds

    def run(self, req: EngineRequest) -> EngineResult:
        """Serve one request alone (a batch of one at every step)."""
        steps = self.steps(req)
        try:
            segment = next(steps)
            while True:
                self.forward([segment])
                segment = steps.send(None)
        except StopIteration as done:
            return done.value

    def steps(self, req: EngineRequest) -> Steps:
        """The request as a generator of forward steps: it yields a Segment, expects its logits set (by
        `forward`, alone or batched with other requests' segments), and returns the EngineResult. The
        request is checked here, before the first step."""
        if not req.input_ids:
            raise ValueError("input_ids is empty")
        if req.embedding_bias is not None and req.embedding_bias.shape != (self.vocab_size,):
            raise ValueError(f"embedding_bias must hold one value per vocabulary entry ({self.vocab_size}), got shape {req.embedding_bias.shape}")
        if req.draft_ids:
            return self._verify(req)
        return self._generate(req)

    def _generate(self, req: EngineRequest) -> Steps:
        rng = self._rng(req)
        n_in = len(req.input_ids)
        tokens = list(req.input_ids)
        result = EngineResult(tokens, input_len=n_in)
        logits_rows: list[np.ndarray] = []
        log_probs: list[float] = []
        sampling = self._sampling(req)
        for step in range(req.output_len):
            need = n_in if step == 0 and req.return_context_logits else 1
            segment, reuse = self._open(tokens, need)
            yield segment
            logits, cache, n_computed = segment.logits, segment.cache, len(segment.tokens)
            if step == 0:
                result.reused_tokens = reuse
                if req.return_context_logits:
                    result.context_logits = logits.cpu().numpy().astype(np.float32)
            result.computed_tokens += n_computed
            raw = logits[-1].cpu().numpy()
            self.cache.put(list(tokens), cache)
            if req.return_generation_logits:
                logits_rows.append(raw)
            row = self._process(raw, tokens, req, step)
            t = int(row.argmax()) if sampling.greedy else sample(probabilities(row, sampling), rng)
            result.last_token_ns = time.monotonic_ns()
            result.first_token_ns = result.first_token_ns or result.last_token_ns
            if req.end_id is not None and t == req.end_id:
                break  # the end token is not output and not counted
            tokens.append(t)
            log_probs.append(self._log_prob(row, t))
            if req.stop_words and find_stop(tokens, req.stop_words, start=n_in) is not None:
                break
        if logits_rows:
            result.generation_logits = np.stack(logits_rows).astype(np.float32)
        if req.return_log_probs:
            result.log_probs = log_probs
        return result

    def _verify(self, req: EngineRequest) -> Steps:
        seq, draft = list(req.input_ids), [int(t) for t in req.draft_ids or []]
        k = len(draft)
        need = len(seq) + k if req.return_context_logits else k + 1
        segment, reuse = self._open(seq + draft, need)
        yield segment
        logits, n_computed = segment.logits, len(segment.tokens)
        self.cache.put(seq + draft, segment.cache, committed=len(seq))
        all_rows = logits.cpu().numpy()
        raw = all_rows[-(k + 1) :]
        rows = np.stack([self._process(raw[i], seq + draft[:i], req, i) for i in range(k + 1)])
        sampling = self._sampling(req)
        if sampling.greedy:
            v = verify_greedy(draft, rows.argmax(axis=-1).tolist())
        else:
            rng = self._rng(req)
            p = probabilities(rows, sampling)
            if req.draft_logits is not None and len(req.draft_logits) >= k:
                q = probabilities(np.asarray(req.draft_logits[-k:], dtype=np.float64), req.sampling)
                v = verify_rejection(draft, q, p, rng)
            else:
                v = verify_by_target_sample(draft, p, rng)
        new = v.tokens
        if req.end_id is not None and req.end_id in new:  # the end token ends the sequence, unoutput
            new = new[: new.index(req.end_id)]
        now = time.monotonic_ns()
        return EngineResult(
            seq + new,
            input_len=len(seq),
            generation_logits=raw[: len(new)].astype(np.float32) if req.return_generation_logits and new else None,
            context_logits=all_rows[: len(seq)].astype(np.float32) if req.return_context_logits else None,
            log_probs=[self._log_prob(rows[i], t) for i, t in enumerate(new)] if req.return_log_probs else None,
            num_draft_tokens=k,
            num_accepted=v.num_accepted,
            reused_tokens=reuse,
            computed_tokens=n_computed,
            first_token_ns=now,
            last_token_ns=now,
        )


# ------------------------------------------------------------------ the tensor contract

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
    if scalar("streaming", False):
        raise RequestTensorError(
            "streaming=true needs a decoupled model; the reference engine (like tensorrt_llm deployed with "
            "decoupled_mode false) answers once: send streaming=false"
        )
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
    output_len = int(scalar("request_output_len", 0))
    if output_len <= 0:
        raise RequestTensorError(f"request_output_len must be > 0, got {output_len}")
    draft = get("draft_input_ids")
    draft_ids = None if draft is None else draft.reshape(-1).astype(np.int64).tolist()
    draft_logits = get("draft_logits")
    if draft_logits is not None:
        draft_logits = draft_logits.reshape(-1, draft_logits.shape[-1])
    bias = get("embedding_bias")
    top_p = float(scalar("runtime_top_p", 0.0))
    return EngineRequest(
        input_ids=input_ids,
        output_len=output_len,
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
        return_generation_logits=bool(scalar("return_generation_logits", False)),
        return_context_logits=bool(scalar("return_context_logits", False)),
        return_log_probs=bool(scalar("return_log_probs", False)),
    )


def result_tensors(
    result: EngineResult, get: TensorGetter, exclude_input_default: bool = False, arrival_ns: int = 0, scheduled_ns: int = 0
) -> dict[str, np.ndarray]:
    """The tensorrtllm backend's output tensors for one result (beam width 1), as its fillTritonResponse returns
    them (model_instance_state.cc): an output the request did not enable is left out, not zeroed."""

    def flag(name: str, default: bool = False) -> bool:
        a = get(name)
        return default if a is None or a.size == 0 else bool(a.reshape(-1)[0])

    def t(value: Any, dtype: Any) -> np.ndarray:
        return np.asarray(value, dtype=dtype)

    exclude = flag("exclude_input_in_output", exclude_input_default)
    tokens = t(result.new_tokens if exclude else result.tokens, np.int32)
    out = {"output_ids": tokens.reshape(1, 1, -1), "sequence_length": t([[len(tokens)]], np.int32)}
    if result.generation_logits is not None:
        out["generation_logits"] = t(result.generation_logits[None, None], np.float32)
    if result.context_logits is not None:
        out["context_logits"] = t(result.context_logits[None], np.float32)
    if result.log_probs is not None:
        out["output_log_probs"] = t(np.reshape(result.log_probs, (1, 1, -1)), np.float32)
        out["cum_log_probs"] = t([[sum(result.log_probs)]], np.float32)
    if flag("return_perf_metrics"):
        k, a = result.num_draft_tokens, result.num_accepted
        new_blocks, reused_blocks, total_blocks = result.kv_blocks()
        for name, value, dtype in (
            ("kv_cache_alloc_new_blocks", new_blocks, np.int32),
            ("kv_cache_reused_blocks", reused_blocks, np.int32),
            ("kv_cache_alloc_total_blocks", total_blocks, np.int32),
            ("arrival_time_ns", arrival_ns, np.int64),
            ("first_scheduled_time_ns", scheduled_ns, np.int64),
            ("first_token_time_ns", result.first_token_ns, np.int64),
            ("last_token_time_ns", result.last_token_ns, np.int64),
            ("acceptance_rate", a / k if k else 0.0, np.float32),
            ("total_accepted_draft_tokens", a, np.int32),
            ("total_draft_tokens", k, np.int32),
        ):
            out[name] = t([[value]], dtype)
    if flag("return_num_input_tokens"):
        out["num_input_tokens"] = t([[result.input_len]], np.int32)
    if flag("return_num_output_tokens"):
        out["num_output_tokens"] = t([[len(result.new_tokens)]], np.int32)
    return out
