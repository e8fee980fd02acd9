"""The reference engine: a Hugging Face causal LM with the semantics of TensorRT-LLM's executor.

One call = one TensorRT-LLM request:
  * without draft tokens: generate up to `output_len` tokens (greedy or sampled), honouring
    end_id, min_tokens, stop and bad words; optionally return the generation logits;
  * with draft tokens: verify all of them in ONE forward pass over sequence + draft and return
    the accepted prefix plus one target token (greedy comparison, token comparison under
    sampling, or rejection sampling against the draft's logits).
The output always includes the input (exclude_input_in_output = false), as the loop expects.

Prefix KV-cache reuse plays the role of TensorRT-LLM's enable_kv_cache_reuse: the loop resends
the whole running sequence every iteration, so each call only computes the tokens that are new
since the longest cached prefix.
"""

from __future__ import annotations

import copy
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from trtspec.speculative import (
    SamplingParams,
    find_stop,
    probabilities,
    sample,
    verify_by_target_sample,
    verify_greedy,
    verify_rejection,
)


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
    return_generation_logits: bool = False


@dataclass
class EngineResult:
    tokens: list[int]  # input + new tokens
    generation_logits: np.ndarray | None = None  # [new, V] raw logits of the generated positions
    num_draft_tokens: int = 0
    num_accepted: int = 0
    reused_tokens: int = 0  # how many input tokens came from the prefix cache
    computed_tokens: int = 0


class PrefixCache:
    """A few KV caches keyed by the tokens they hold; a call uses the one sharing the longest prefix.

    An entry remembers how many of its tokens were committed (the input of the call that made it;
    the draft tokens after them may be rejected). A cache whose committed tokens the new sequence
    continues is the request's own: it is taken out while in use and put back afterwards. A cache
    that only shares a shorter prefix (another request with the same chat template or system prompt)
    is copied instead, so concurrent requests never crop each other's caches.
    """

    def __init__(self, max_entries: int = 16):
        self.max_entries = max_entries
        self._entries: "OrderedDict[int, tuple[list[int], int, Any]]" = OrderedDict()
        self._next = 0

    def take(self, tokens: Sequence[int]) -> tuple[Any | None, int]:
        best_key, best_len = None, 0
        for key, (held, _, _) in self._entries.items():
            n = _common_prefix(held, tokens)
            if n > best_len:
                best_key, best_len = key, n
        if best_key is None:
            return None, 0
        _, committed, cache = self._entries[best_key]
        if best_len >= committed:
            del self._entries[best_key]
            return cache, best_len
        return copy.deepcopy(cache), best_len  # someone else's: share the prefix, leave theirs intact

    def put(self, tokens: list[int], cache: Any, committed: int | None = None) -> None:
        self._entries[self._next] = (tokens, len(tokens) if committed is None else committed, cache)
        self._next += 1
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

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
        salt: int = 0,
        use_draft_vocab: bool = False,
    ):
        from transformers import AutoModelForCausalLM

        self.device = pick_device(device)
        if self.device == "cpu" and dtype != "float32":
            dtype = "float32"  # half precision matmuls are several times slower on CPU
        self.model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=_DTYPES[dtype]).to(self.device)
        self.model.eval()
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
        self.cache = PrefixCache(cache_entries)
        self.salt = salt  # decorrelates the random streams of the draft and the target under one seed

    # ------------------------------------------------------------------ forward with prefix reuse

    def _forward(self, tokens: list[int], need_logits: int = 1) -> tuple[torch.Tensor, Any, int, int]:
        """Logits of the last `need_logits` positions of `tokens`, the updated cache, how many tokens
        the cache served and how many were computed. Only those rows go through the LM head: with a
        49k vocabulary the head over a whole prompt would cost as much as the prefill itself."""
        from transformers import DynamicCache

        cache, reuse = self.cache.take(tokens)
        reuse = min(reuse, len(tokens) - need_logits)
        if cache is None or reuse == 0:
            cache, reuse = DynamicCache(config=self.model.config), 0
        elif cache.get_seq_length() > reuse:
            cache.crop(reuse - cache.get_seq_length())  # negative: drop that many (transformers 4.x and 5.x)
        new = torch.tensor([tokens[reuse:]], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            if self.draft_vocab is None:
                out = self.model(input_ids=new, past_key_values=cache, use_cache=True, logits_to_keep=need_logits)
                logits = out.logits[0, -need_logits:].float()
            else:
                out = self.model.base_model(input_ids=new, past_key_values=cache, use_cache=True)
                scores = (out.last_hidden_state[0, -need_logits:] @ self._draft_head_t).float()
                logits = torch.full((need_logits, self.vocab_size), float("-inf"), device=scores.device)
                logits[:, self.draft_vocab] = scores
        return logits, out.past_key_values, reuse, new.shape[1]

    def _rng(self, req: EngineRequest) -> np.random.Generator:
        kind = 1 if req.draft_ids else 0
        if req.seed is None:
            return np.random.default_rng()
        return np.random.default_rng([int(req.seed), len(req.input_ids), kind, self.salt])

    @staticmethod
    def _mask(logits: np.ndarray, context: Sequence[int], req: EngineRequest, generated: int) -> np.ndarray:
        banned = [w[-1] for w in req.bad_words if w and list(context[len(context) - len(w) + 1 :]) == list(w[:-1])]
        if req.end_id is not None and generated < req.min_tokens:
            banned.append(req.end_id)
        if banned:
            logits = logits.copy()
            logits[[b for b in banned if 0 <= b < len(logits)]] = -np.inf
        return logits

    # ------------------------------------------------------------------ the two request kinds

    def run(self, req: EngineRequest) -> EngineResult:
        if not req.input_ids:
            raise ValueError("input_ids is empty")
        if req.draft_ids:
            return self._verify(req)
        return self._generate(req)

    def _generate(self, req: EngineRequest) -> EngineResult:
        rng = self._rng(req)
        tokens = list(req.input_ids)
        logits_rows: list[np.ndarray] = []
        reused, computed = 0, 0
        for step in range(req.output_len):
            logits, cache, reuse, n_computed = self._forward(tokens)
            if step == 0:
                reused = reuse
            computed += n_computed
            row = self._mask(logits[-1].cpu().numpy(), tokens, req, step)
            self.cache.put(list(tokens), cache)
            if req.return_generation_logits:
                logits_rows.append(row)
            t = int(row.argmax()) if req.sampling.greedy else sample(probabilities(row, req.sampling), rng)
            tokens.append(t)
            if req.end_id is not None and t == req.end_id:
                break
            if req.stop_words and find_stop(tokens, req.stop_words, start=len(req.input_ids)) is not None:
                break
        gen_logits = np.stack(logits_rows).astype(np.float32) if logits_rows else None
        return EngineResult(tokens, gen_logits, reused_tokens=reused, computed_tokens=computed)

    def _verify(self, req: EngineRequest) -> EngineResult:
        seq, draft = list(req.input_ids), [int(t) for t in req.draft_ids or []]
        k = len(draft)
        logits, cache, reuse, n_computed = self._forward(seq + draft, need_logits=k + 1)
        self.cache.put(seq + draft, cache, committed=len(seq))
        rows = logits[-(k + 1) :].cpu().numpy()
        rows = np.stack([self._mask(rows[i], seq + draft[:i], req, i) for i in range(k + 1)])
        if req.sampling.greedy:
            v = verify_greedy(draft, rows.argmax(axis=-1).tolist())
        else:
            rng = self._rng(req)
            p = probabilities(rows, req.sampling)
            if req.draft_logits is not None and len(req.draft_logits) >= k:
                q = probabilities(np.asarray(req.draft_logits[-k:], dtype=np.float64), req.sampling)
                v = verify_rejection(draft, q, p, rng)
            else:
                v = verify_by_target_sample(draft, p, rng)
        new = v.tokens
        if req.end_id is not None and req.end_id in new:  # nothing is generated after the end token
            new = new[: new.index(req.end_id) + 1]
        return EngineResult(
            seq + new,
            num_draft_tokens=k,
            num_accepted=v.num_accepted,
            reused_tokens=reuse,
            computed_tokens=n_computed,
        )


# ------------------------------------------------------------------ the tensor contract

TensorGetter = Callable[[str], "np.ndarray | None"]


class RequestTensorError(ValueError):
    """A request whose tensors cannot be served; the message is for the client."""


def request_from_tensors(get: TensorGetter, max_input_len: int | None = None) -> EngineRequest:
    """An EngineRequest from the tensorrtllm backend's input tensors (`get(name)` -> array or None)."""

    def scalar(name: str, default: Any = None) -> Any:
        a = get(name)
        return default if a is None or a.size == 0 else a.reshape(-1)[0].item()

    def words(name: str) -> list[list[int]]:
        from trtspec.triton_io import words_list

        return words_list(get(name))

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
        seed=scalar("seed"),
        min_tokens=int(scalar("min_tokens", 0)),
        stop_words=words("stop_words_list"),
        bad_words=words("bad_words_list"),
        return_generation_logits=bool(scalar("return_generation_logits", False)),
    )


def result_tensors(result: EngineResult, perf_metrics: bool = False) -> dict[str, np.ndarray]:
    """The tensorrtllm backend's output tensors for one result (input + new tokens, beam width 1)."""
    tokens = np.asarray(result.tokens, dtype=np.int32)
    out = {
        "output_ids": tokens.reshape(1, 1, -1),
        "sequence_length": np.array([[len(tokens)]], dtype=np.int32),
    }
    if result.generation_logits is not None:
        out["generation_logits"] = result.generation_logits[None, None]
    if perf_metrics:
        k, a = result.num_draft_tokens, result.num_accepted
        out["acceptance_rate"] = np.array([[a / k if k else 0.0]], dtype=np.float32)
        out["total_accepted_draft_tokens"] = np.array([[a]], dtype=np.int32)
        out["total_draft_tokens"] = np.array([[k]], dtype=np.int32)
    return out
