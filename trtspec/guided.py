"""Guided decoding (structured output) as TensorRT-LLM does it, for the reference engine and the loop.

TensorRT-LLM's guided decoder (cpp/tensorrt_llm/batch_manager/guidedDecoder.cpp, read at NVIDIA/TensorRT-LLM
000a01de66f0eab4ab05640711f0253f50f5209c; the Triton backend's parsing in inflight_batcher_llm/src/utils.cc and
model_instance_state.cc of triton-inference-server/tensorrtllm_backend v0.19.0 = c1e1963):
* the backend maps `guided_decoding_guide_type` json / json_schema / regex / ebnf_grammar to the executor's
  GuidedDecodingParams (`guided_decoding_guide` the schema, regex or grammar; none for json);
* one xgrammar GrammarCompiler per engine, from the tokenizer information NVIDIA's
  generate_xgrammar_tokenizer_info.py writes (`encoded_vocab`, `tokenizer_str`, `stop_token_ids` = the
  tokenizer's eos), built as xgrammar's TokenizerInfo::FromHuggingFace with the engine's vocabulary size;
* a matcher per request, created at its first context step: the prompt is not matched, the guide starts at the
  first generated token; each step fills the next-token bitmask, which masks the logits (-inf) before sampling;
  the end token is a stop token of the tokenizer info, allowed only where the grammar may end.

Speculation stays exact under a guide because every position the target verifies is masked by the matcher's state
after the draft tokens before it (the draft's logits too, for rejection sampling), and a draft token the grammar
refuses has probability 0 there, so it is rejected: the target's greedy choice and its masked distribution are what
target-only decoding would use. The loop cuts proposals at the first refused token (no draft certain to fail).

Each loop call is a new engine request with the running sequence as input, so the reference engine takes one
extension input, GUIDE_START: where in input_ids the guided output starts (the prompt's length); it replays the
matcher over the output before it. TensorRT-LLM's engine has no such input and masks one position per step (its
bitmask has one row per request, advanced by one token per step), so there a guided request is one engine call
for its whole output, without drafting (`guided_without_drafting` in its statistics).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from threading import Lock
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from trtspec.contract.fields import GUIDE_TYPES, RequestError

if TYPE_CHECKING:
    from trtspec.spec.drafters import Proposal

NEEDS_GUIDE = ("json_schema", "regex", "ebnf_grammar")

# the file NVIDIA's generate_xgrammar_tokenizer_info.py writes, and its parameter in tensorrt_llm's config.pbtxt
TOKENIZER_INFO_FILE = "xgrammar_tokenizer_info.json"
TOKENIZER_INFO_PARAMETER = "xgrammar_tokenizer_info_path"
BACKEND_PARAMETER = "guided_decoding_backend"
BACKEND = "xgrammar"

# trtspec's extension input of the reference engine: where the guided output starts in input_ids
GUIDE_START = "guided_decoding_start"


@dataclass(frozen=True)
class Guide:
    type: str
    text: str | None = None

    def check(self) -> None:
        if self.type not in GUIDE_TYPES:
            raise RequestError(f"guided_decoding_guide_type must be one of {', '.join(GUIDE_TYPES)}, got {self.type!r}")
        if self.type in NEEDS_GUIDE and not self.text:
            raise RequestError(f"guided_decoding_guide_type {self.type} needs guided_decoding_guide (the schema, regex "
                               "or grammar)")


def guide_of(guide_type: str | None, guide: str | None) -> Guide | None:
    """The request's guide, checked; None without one (a guide without a type is refused: it would be ignored)."""
    if not guide_type:
        if guide:
            raise RequestError("guided_decoding_guide needs guided_decoding_guide_type (json, json_schema, regex, ebnf_grammar)")
        return None
    g = Guide(str(guide_type), guide or None)
    g.check()
    return g


# ---------------------------------------------------------------------------------------------- tokenizer info


def tokenizer_info_dict(tokenizer: Any) -> dict[str, Any]:
    """What TensorRT-LLM's `_xgrammar_tokenizer_info` (tensorrt_llm/llmapi/tokenizer.py) writes for a fast tokenizer:
    the vocabulary by id, the backend tokenizer's JSON and the eos token as the only stop token."""
    vocab = tokenizer.get_vocab()
    return {
        "encoded_vocab": [t for t, _ in sorted(vocab.items(), key=lambda x: x[1])],
        "tokenizer_str": tokenizer.backend_tokenizer.to_str(),
        "stop_token_ids": [tokenizer.eos_token_id],
    }


def load_tokenizer_info(tokenizer_dir: str | Path) -> dict[str, Any] | None:
    """The tokenizer info of a Hugging Face fast tokenizer; None where there is none (as NVIDIA's script, which
    needs one; then the deployment refuses guided requests)."""
    try:
        from transformers import AutoTokenizer

        return tokenizer_info_dict(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    except Exception:  # noqa: BLE001 - the tokenizers library raises a bare Exception for a file it cannot parse
        return None


def write_tokenizer_info(tokenizer_dir: str | Path, out_dir: Path, info: dict[str, Any] | None = None) -> Path:
    info = info if info is not None else load_tokenizer_info(tokenizer_dir)
    if info is None:
        raise ValueError(f"{tokenizer_dir}: no Hugging Face fast tokenizer to take xgrammar's tokenizer info from")
    path = out_dir / TOKENIZER_INFO_FILE
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info))
    return path


class GuidedSettings(BaseModel):
    """How a deployment serves guided requests (a LoopSettings field, and the reference engine's parameters)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer_info: str  # path of xgrammar_tokenizer_info.json
    vocab_size: int  # the engines' vocabulary (the bitmask's width)
    # per_call: the engine (reference) applies the guide at every position of every call, from GUIDE_START, so the
    # loop drafts; one_call: TensorRT-LLM's engine: one call for the whole output, no drafting
    mode: Literal["per_call", "one_call"] = "per_call"


_COMPILERS: dict[tuple[str, int], Any] = {}
_LOCK = Lock()


def compiler(tokenizer_info: str | Path, vocab_size: int) -> Any:
    """The process's GrammarCompiler for this tokenizer info (xgrammar caches compiled grammars in it)."""
    import xgrammar as xgr

    key = (str(tokenizer_info), vocab_size)
    with _LOCK:
        if key not in _COMPILERS:
            info = json.loads(Path(tokenizer_info).read_text())
            # TokenizerInfo::FromHuggingFace(encoded_vocab, tokenizer_str, vocab_size, stop_token_ids)
            meta = xgr.TokenizerInfo._detect_metadata_from_hf(info["tokenizer_str"])
            tok = xgr.TokenizerInfo(info["encoded_vocab"], xgr.VocabType(meta["vocab_type"]), vocab_size=vocab_size,
                                    stop_token_ids=info["stop_token_ids"], add_prefix_space=meta["add_prefix_space"])
            _COMPILERS[key] = xgr.GrammarCompiler(tok)
            _VOCABS[key] = _by_bytes(tok.decoded_vocab)
        return _COMPILERS[key]


_VOCABS: dict[tuple[str, int], dict[bytes, int]] = {}


def _by_bytes(decoded: Sequence[bytes]) -> dict[bytes, int]:
    """Each token's bytes -> its id (the first id where several decode alike); special tokens (empty) left out."""
    out: dict[bytes, int] = {}
    for i, b in enumerate(decoded):
        if b:
            out.setdefault(bytes(b), i)
    return out


def tokenize_greedy(text: bytes, vocab: dict[bytes, int], longest: int) -> list[int]:
    """Longest-match tokens of `text` (the usual split for byte-level BPE vocabularies, not always BPE's own)."""
    out, i = [], 0
    while i < len(text):
        for n in range(min(longest, len(text) - i), 0, -1):
            t = vocab.get(text[i : i + n])
            if t is not None:
                out.append(t)
                i += n
                break
        else:
            break
    return out


def compile_guide(comp: Any, guide: Guide) -> Any:
    """The compiled grammar, as GuidedDecoder::build compiles each guide type; a guide that does not compile is a
    RequestError naming it."""
    import xgrammar as xgr

    try:
        if guide.type == "json":
            return comp.compile_builtin_json_grammar()
        if guide.type == "json_schema":
            return comp.compile_json_schema(guide.text)
        if guide.type == "regex":
            return comp.compile_grammar(xgr.Grammar.from_regex(guide.text))
        return comp.compile_grammar(xgr.Grammar.from_ebnf(guide.text))
    except Exception as e:  # xgrammar raises RuntimeError / ValueError / its own errors for a bad guide
        why = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).strip())  # xgrammar's log prefix: time, source line
        raise RequestError(f"guided_decoding_guide: the {guide.type} guide does not compile: {why}") from None


class Matcher:
    """A request's grammar state: the allowed next tokens as a boolean mask, and tokens accepted or rolled back."""

    def __init__(self, compiled: Any, vocab_size: int):
        import xgrammar as xgr

        self.m = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self._bits = xgr.allocate_token_bitmask(1, vocab_size)

    def allowed(self) -> np.ndarray:
        """[vocab] bool: the tokens the grammar allows next (only stop tokens once it has ended)."""
        self.m.fill_next_token_bitmask(self._bits)
        packed = self._bits.numpy().reshape(-1).view(np.uint8)
        return np.unpackbits(packed, bitorder="little")[: self.vocab_size].astype(bool)

    def mask(self, row: np.ndarray) -> np.ndarray:
        """The logits row with every token the grammar refuses at -inf (the bitmask kernel's effect)."""
        allowed = self.last_allowed = self.allowed()
        out = np.array(row, dtype=np.float32, copy=True)
        out[: len(allowed)][~allowed[: len(out)]] = -np.inf
        if len(out) > len(allowed):
            out[len(allowed):] = -np.inf
        return out

    def accept(self, token: int) -> bool:
        return bool(self.m.accept_token(int(token)))

    def advance(self, tokens: Sequence[int]) -> int:
        """Accepts tokens in order up to the first one refused; how many were accepted."""
        n = 0
        for t in tokens:
            if self.terminated or not self.accept(t):  # nothing follows an accepted end token
                break
            n += 1
        return n

    def rollback(self, n: int) -> None:
        if n:
            self.m.rollback(n)

    @property
    def terminated(self) -> bool:
        return bool(self.m.is_terminated())


class GuideCache:
    """Compiled grammars of one process by guide (xgrammar caches too, but keyed on the text only after parsing)."""

    def __init__(self, tokenizer_info: str | Path, vocab_size: int, entries: int = 64):
        self.comp = compiler(tokenizer_info, vocab_size)
        self.by_bytes = _VOCABS[(str(tokenizer_info), vocab_size)]
        self.longest = max(map(len, self.by_bytes), default=1)
        self.vocab_size = vocab_size
        self.entries = entries
        self._compiled: OrderedDict[Guide, Any] = OrderedDict()
        self._lock = Lock()

    def matcher(self, guide: Guide) -> Matcher:
        with self._lock:
            compiled = self._compiled.get(guide)
            if compiled is not None:
                self._compiled.move_to_end(guide)
        if compiled is None:
            compiled = compile_guide(self.comp, guide)
            with self._lock:
                self._compiled[guide] = compiled
                while len(self._compiled) > self.entries:
                    self._compiled.popitem(last=False)
        return Matcher(compiled, self.vocab_size)


_CACHES: dict[tuple[str, int], GuideCache] = {}


def guide_cache(settings: GuidedSettings) -> GuideCache:
    key = (settings.tokenizer_info, settings.vocab_size)
    with _LOCK:
        cache = _CACHES.get(key)
    if cache is None:
        cache = GuideCache(settings.tokenizer_info, settings.vocab_size)
        with _LOCK:
            cache = _CACHES.setdefault(key, cache)
    return cache


# ---------------------------------------------------------------------------------------------- the loop's side


class GuidedRequest:
    """A guided request in the loop: the tensors its engine calls carry, and its grammar state over the output
    accepted so far, which cuts proposals at the first token the grammar refuses."""

    def __init__(self, guide: Guide, settings: GuidedSettings, prompt_len: int, forced_max: int = 0):
        self.guide, self.settings, self.prompt_len = guide, settings, prompt_len
        self.forced_max = forced_max if settings.mode == "per_call" else 0
        self.cache = guide_cache(settings)
        self.matcher = self.cache.matcher(guide)  # compiles: a bad guide is a RequestError here

    @classmethod
    def start(cls, req: Any, loop_settings: Any) -> "GuidedRequest | None":
        """`loop_settings`: the deployment's LoopSettings. None without a guide; a RequestError for a bad one."""
        guide = guide_of(getattr(req, "guided_decoding_guide_type", None), getattr(req, "guided_decoding_guide", None))
        if guide is None:
            return None
        settings = loop_settings.guided
        if settings is None:
            raise RequestError("guided_decoding_guide_type: this deployment does not serve guided decoding (its "
                               "TensorRT-LLM release's backend declares no guide inputs, or xgrammar is not installed)")
        # the target-only endpoint, or a request that asks for no drafting, drafts nothing, not even what is forced
        k = loop_settings.requested_k(req)
        forced = 0 if loop_settings.draft_disabled or not k else loop_settings.speculative.max_k
        return cls(guide, settings, len(req.prompt), forced)

    @property
    def drafts(self) -> bool:
        """Whether the engine verifies drafts under the guide (the reference engine), or not (TensorRT-LLM's)."""
        return self.settings.mode == "per_call"

    def engine_tensors(self) -> dict[str, np.ndarray]:
        t = {"guided_decoding_guide_type": np.array([[self.guide.type.encode()]], dtype=np.object_)}
        if self.guide.text is not None:
            t["guided_decoding_guide"] = np.array([[self.guide.text.encode()]], dtype=np.object_)
        if self.drafts:
            t[GUIDE_START] = np.array([[self.prompt_len]], dtype=np.int32)
        return t

    def plain(self, plain: int, remaining: int) -> int:
        """Tokens a call without a draft asks for: all that remain where the engine restarts the guide per call."""
        return plain if self.drafts else remaining

    def cut(self, proposal: "Proposal", plain: int = 1) -> "Proposal":
        """The proposal up to the first token the grammar refuses (its logits rows with it). An iteration without a
        proposal that would step one token (`plain` 1) drafts what the grammar forces instead: the text it allows
        alone from here (a schema's keys and punctuation, xgrammar's jump-forward string), as tokens; the target
        verifies them in one call instead of one call each (it may split the text differently: then it rejects
        from there)."""
        from dataclasses import replace

        if not proposal.tokens:
            forced = self.forced() if plain == 1 else []
            return replace(proposal, tokens=forced) if forced else proposal
        n = self.matcher.advance(proposal.tokens)
        self.matcher.rollback(n)
        if n == len(proposal.tokens):
            return proposal
        logits = proposal.logits[:, :n] if proposal.logits is not None and n else None
        return replace(proposal, tokens=proposal.tokens[:n], logits=logits)

    def forced(self) -> list[int]:
        """The tokens of the text the grammar forces from here (at most forced_max), its state unchanged."""
        if not self.forced_max or self.matcher.terminated:
            return []
        text = self.matcher.m.find_jump_forward_string().encode("utf-8")
        tokens = tokenize_greedy(text, self.cache.by_bytes, self.cache.longest)[: self.forced_max]
        n = self.matcher.advance(tokens)
        self.matcher.rollback(n)
        return tokens[:n]

    def accept(self, new: Sequence[int]) -> None:
        """The output the target accepted (always within the grammar: the engine sampled it masked)."""
        self.matcher.advance(new)

    def mask_rows(self, rows: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
        """The logits rows of `tokens`' positions with what the grammar refuses there at -inf: row i with its state
        after tokens[:i], the distribution the engine sampled tokens[i] from. Its state is unchanged."""
        out = np.array(rows, dtype=np.float32, copy=True)
        n = 0
        for i, t in enumerate(tokens[: len(out)]):
            if self.matcher.terminated:
                break
            out[i] = self.matcher.mask(out[i])
            if not self.matcher.accept(t):
                break
            n += 1
        self.matcher.rollback(n)
        return out


# ---------------------------------------------------------------------------------------------- the engine's side


def guide_from_tensors(get: Any) -> tuple[Guide | None, int | None]:
    """(the guide, GUIDE_START) from a tensorrtllm-backend request's tensors."""

    def string(name: str) -> str | None:
        a = get(name)
        if a is None or a.size == 0:
            return None
        v = a.reshape(-1)[0]
        return v.decode("utf-8") if isinstance(v, bytes) else str(v)

    start = get(GUIDE_START)
    return guide_of(string("guided_decoding_guide_type"), string("guided_decoding_guide")), (
        None if start is None or start.size == 0 else int(start.reshape(-1)[0]))


class EngineGuide:
    """The reference engine's matcher for one request: replayed over the output already in input_ids, then
    masking each new position as TensorRT-LLM's GuidedDecoder masks each step."""

    def __init__(self, cache: GuideCache, guide: Guide, input_ids: Sequence[int], start: int | None):
        self.matcher = cache.matcher(guide)
        start = len(input_ids) if start is None else start
        if not 0 <= start <= len(input_ids):
            raise ValueError(f"{GUIDE_START} {start} is outside input_ids (length {len(input_ids)})")
        done = list(input_ids[start:])
        if self.matcher.advance(done) != len(done):
            raise ValueError("input_ids after guided_decoding_start do not follow the guide")

    def mask(self, row: np.ndarray) -> np.ndarray:
        return self.matcher.mask(row)

    def accept(self, token: int) -> bool:
        return self.matcher.accept(token)


def dead_end(row: np.ndarray, allowed: np.ndarray, end_id: int | None, position: int) -> np.ndarray:
    """A masked logits row with no finite entry (the grammar allows only tokens the request's processing removed:
    the end token under min_tokens, bad words, a draft vocabulary) made a distribution again, so that sampling never
    sees a row of -inf (its softmax is NaN): where the grammar may end there, the end token is certain (the guide
    wins over min_tokens: nothing else may follow); otherwise the request fails with the reason, as TensorRT-LLM's
    guided decoder fails a request whose bitmask row allows nothing."""
    if np.isfinite(row).any():
        return row
    if end_id is not None and 0 <= end_id < len(allowed) and allowed[end_id]:
        out = np.full_like(row, -np.inf)
        out[end_id] = 0.0
        return out
    raise ValueError(f"guided decoding: at output position {position} the guide allows only tokens that the request "
                     "itself excludes (bad_words, min_tokens, embedding_bias or a draft vocabulary): no token can follow")


def guide_masks(guide: EngineGuide, draft: Sequence[int]) -> list[np.ndarray]:
    """The allowed tokens at each verified position: position i after draft[:i], up to and including the first
    draft token the grammar refuses (that token has probability 0 there, so verification stops at it and the
    positions after it are never used)."""
    masks = []
    for i in range(len(draft) + 1):
        masks.append(guide.matcher.allowed())
        # a draft end token the grammar accepts ends the sequence: no position after it is verified
        if i == len(draft) or not guide.accept(draft[i]) or guide.matcher.terminated:
            break
    return masks
