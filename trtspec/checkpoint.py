"""Offline inspection of Hugging Face checkpoints, and the draft/target pair check.

Nothing here loads weights or imports a model library: parameter counts come from ``config.json``
(a llama-style formula: GQA, tied embeddings, biases, MoE experts) or, when the config does not describe
a decoder we know, from the *headers* of the safetensors files (8-byte length + JSON; tensors are never
read). The tokenizer's fingerprint: `trtspec.tokenizer_identity`.

Why the pair check matters (``shared/docs/trtllm-spec.md`` §5 #6): the speculative loop feeds
*target*-tokenizer ids to the draft. A draft with another vocabulary yields near-zero acceptance, and
with draft logits TensorRT-LLM fails with "Incompatible buffer sizes" (TRTLLM#2789).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtspec.medusa import MedusaError, check_against_target, choices_problems, inspect_heads
from trtspec.tokenizer_identity import TOKENIZER_FILES, tokenizer_identity

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1}

# The draft should be much cheaper than the target; above this ratio speculation rarely pays off.
DRAFT_SIZE_WARN_RATIO = 1 / 3


class CheckpointError(Exception):
    """A checkpoint directory that cannot be inspected; the message is meant for the user."""


@dataclass
class CheckpointInfo:
    path: Path
    architecture: str | None
    model_type: str | None
    num_params: int | None
    params_source: str | None  # "config" | "safetensors" | None
    torch_dtype: str | None
    vocab_size: int | None  # config.json
    tokenizer_vocab_size: int | None  # distinct ids in the tokenizer (vocab + added tokens)
    hidden_size: int | None
    num_layers: int | None
    num_attention_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    intermediate_size: int | None
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    tokenizer_fingerprint: str | None
    tokenizer_files: list[str] = field(default_factory=list)
    weights_bytes_on_disk: int = 0
    config: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def embedding_params(self) -> int:
        """Parameters of one vocab x hidden matrix (the embedding; the LM head has as many)."""
        if self.vocab_size and self.hidden_size:
            return self.vocab_size * self.hidden_size
        return 0

    @property
    def engine_params(self) -> int | None:
        """Parameters TensorRT-LLM stores: a tied LM head is materialized as its own matrix."""
        if self.num_params is None:
            return None
        return self.num_params + (self.embedding_params if self.tie_word_embeddings else 0)

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1, pp: int = 1) -> int | None:
        """KV-cache bytes one token occupies on one GPU of a tp x pp layout."""
        if not (self.num_layers and self.num_kv_heads and self.head_dim):
            return None
        layers = math.ceil(self.num_layers / pp)
        kv_heads = max(1, math.ceil(self.num_kv_heads / tp))  # fewer kv heads than ranks: replicated
        return 2 * layers * kv_heads * self.head_dim * dtype_bytes

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("config")
        d["path"] = str(self.path)
        return d


@dataclass
class PairReport:
    target: CheckpointInfo
    draft: CheckpointInfo
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # (level, code, message) in the order found; preflight turns them into Findings.
    findings: list[tuple[str, str, str]] = field(default_factory=list)  # (level, code, message)

    @property
    def ok(self) -> bool:
        return not self.errors

    def _add(self, level: str, code: str, message: str) -> None:
        (self.errors if level == "error" else self.warnings).append(message)
        self.findings.append((level, code, message))


# ----------------------------------------------------------------------------------------- inspection


def inspect_checkpoint(path: str | Path) -> CheckpointInfo:
    """Read a HF checkpoint directory (config.json, tokenizer files, safetensors headers) offline."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {path}")
    if not cfg_file.is_file():
        raise CheckpointError(f"no config.json in {path}; expected a Hugging Face checkpoint directory")
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{cfg_file}: cannot read it as JSON: {e}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{cfg_file}: expected a JSON object")
    # Multimodal wrappers keep the decoder in text_config.
    c = raw
    if "hidden_size" not in raw and isinstance(raw.get("text_config"), dict):
        c = {**raw["text_config"], **{k: v for k, v in raw.items() if k in ("architectures", "torch_dtype")}}

    archs = raw.get("architectures") or []
    hidden = _int(c.get("hidden_size"))
    heads = _int(c.get("num_attention_heads"))
    kv_heads = _int(c.get("num_key_value_heads")) or heads
    head_dim = _int(c.get("head_dim")) or (hidden // heads if hidden and heads else None)
    tied = bool(c.get("tie_word_embeddings", raw.get("tie_word_embeddings", False)))

    params = _params_from_config(c, tied)
    source = "config" if params is not None else None
    if params is None:
        params = _params_from_safetensors(path)
        source = "safetensors" if params is not None else None

    tok_size, fingerprint, tok_files = tokenizer_identity(path)
    return CheckpointInfo(
        path=path,
        architecture=archs[0] if archs else None,
        model_type=raw.get("model_type"),
        num_params=params,
        params_source=source,
        torch_dtype=raw.get("torch_dtype") or raw.get("dtype") or c.get("torch_dtype"),
        vocab_size=_int(c.get("vocab_size")),
        tokenizer_vocab_size=tok_size,
        hidden_size=hidden,
        num_layers=_int(c.get("num_hidden_layers")),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_int(c.get("intermediate_size")),
        max_position_embeddings=_int(c.get("max_position_embeddings")),
        tie_word_embeddings=tied,
        tokenizer_fingerprint=fingerprint,
        tokenizer_files=tok_files,
        weights_bytes_on_disk=sum(p.stat().st_size for p in _weight_files(path)),
        config=raw,
    )


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _params_from_config(c: dict[str, Any], tied: bool) -> int | None:
    """Llama-style decoder parameter count: embeddings, attention (GQA), gated MLP (or MoE), norms, head."""
    hidden, layers = _int(c.get("hidden_size")), _int(c.get("num_hidden_layers"))
    heads, inter = _int(c.get("num_attention_heads")), _int(c.get("intermediate_size"))
    vocab = _int(c.get("vocab_size"))
    if not all((hidden, layers, heads, inter, vocab)):
        return None
    kv_heads = _int(c.get("num_key_value_heads")) or heads
    head_dim = _int(c.get("head_dim")) or hidden // heads
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    mt = c.get("model_type", "")

    attn = hidden * q_dim + 2 * hidden * kv_dim + q_dim * hidden
    if c.get("attention_bias"):  # llama-style: q, k, v and o biases
        attn += q_dim + 2 * kv_dim + hidden
    elif mt in ("qwen2", "qwen2_moe"):  # Qwen2 has q/k/v biases and no o bias
        attn += q_dim + 2 * kv_dim

    mlp = 3 * hidden * inter + (2 * inter + hidden if c.get("mlp_bias") else 0)
    experts = _int(c.get("num_local_experts")) or _int(c.get("num_experts"))
    if experts:
        expert_inter = _int(c.get("moe_intermediate_size")) or inter
        mlp = experts * 3 * hidden * expert_inter + hidden * experts  # experts + router
        shared = _int(c.get("shared_expert_intermediate_size"))
        if shared:
            mlp += 3 * hidden * shared + hidden
    norms = 2 * hidden
    per_layer = attn + mlp + norms
    embed = vocab * hidden
    return embed + layers * per_layer + hidden + (0 if tied else embed)


def _weight_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        files = sorted(path.glob("pytorch_model*.bin")) + sorted(path.glob("*.pt"))
    return files


def read_safetensors_header(file: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor names, dtypes, shapes, offsets), tensors unread."""
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{file}: too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > 100 * 1024 * 1024:
            raise CheckpointError(f"{file}: implausible safetensors header size {n}")
        try:
            return json.loads(f.read(n))
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{file}: bad safetensors header: {e}") from None


def _params_from_safetensors(path: Path) -> int | None:
    index = path / "model.safetensors.index.json"
    files: list[Path]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
        except (OSError, json.JSONDecodeError):
            weight_map = {}
        files = sorted({path / f for f in weight_map.values()})
    else:
        files = sorted(path.glob("*.safetensors"))
    files = [f for f in files if f.is_file()]
    if not files:
        return None
    total = 0
    for f in files:
        for name, meta in read_safetensors_header(f).items():
            if name == "__metadata__" or not isinstance(meta, dict):
                continue
            total += math.prod(meta.get("shape") or [1])
    return total


# ------------------------------------------------------------------------------------------ pair check


def check_pair(
    target: CheckpointInfo | str | Path, draft: CheckpointInfo | str | Path, *, use_draft_logits: bool = False
) -> PairReport:
    """Check that a draft can serve a target: same vocabulary and tokenizer, and clearly smaller."""
    t = target if isinstance(target, CheckpointInfo) else inspect_checkpoint(target)
    d = draft if isinstance(draft, CheckpointInfo) else inspect_checkpoint(draft)
    r = PairReport(target=t, draft=d)

    if t.vocab_size and d.vocab_size and t.vocab_size != d.vocab_size:
        r._add(
            "error",
            "vocab-mismatch",
            f"draft vocab_size {d.vocab_size} != target vocab_size {t.vocab_size} "
            f"(draft {d.path}, target {t.path}): draft and target must share one vocabulary. The loop feeds "
            "target-tokenizer ids to the draft, so acceptance collapses, and with draft logits TensorRT-LLM fails "
            "with 'Incompatible buffer sizes'. Use a draft from the target's model family (same tokenizer).",
        )
    if t.tokenizer_fingerprint and d.tokenizer_fingerprint and t.tokenizer_fingerprint != d.tokenizer_fingerprint:
        r._add(
            "error",
            "tokenizer-mismatch",
            f"draft and target tokenizers differ (fingerprint {d.tokenizer_fingerprint[:12]} vs "
            f"{t.tokenizer_fingerprint[:12]}): the same token id means different text to each model, so the draft's "
            "guesses are mostly rejected. Use a draft trained with the target's tokenizer "
            f"(compare tokenizer.json in {d.path} and {t.path}).",
        )
    for role, info in (("target", t), ("draft", d)):
        if info.tokenizer_fingerprint is None:
            r._add(
                "warning",
                "tokenizer-missing",
                f"{role} checkpoint {info.path} has no tokenizer files (tokenizer.json, tokenizer.model or "
                "vocab.json): cannot verify that draft and target share a tokenizer.",
            )
    if t.num_params and d.num_params and d.num_params > t.num_params * DRAFT_SIZE_WARN_RATIO:
        r._add(
            "warning",
            "draft-too-large",
            f"the draft has {format_params(d.num_params)} parameters, {d.num_params / t.num_params:.0%} of the "
            f"target's {format_params(t.num_params)} (more than 1/3): each draft token then costs too much for "
            "speculation to pay off. Pick a draft under ~1/10 of the target's size.",
        )
    for role, info in (("target", t), ("draft", d)):
        if info.vocab_size and info.tokenizer_vocab_size and info.vocab_size != info.tokenizer_vocab_size:
            if info.vocab_size > info.tokenizer_vocab_size:
                what = (
                    f"{role} config vocab_size {info.vocab_size} is padded beyond its tokenizer's "
                    f"{info.tokenizer_vocab_size} tokens"
                )
            else:
                what = (
                    f"{role} config vocab_size {info.vocab_size} is smaller than its tokenizer's "
                    f"{info.tokenizer_vocab_size} tokens (ids past the embedding will fail)"
                )
            advice = (
                "speculative.use_draft_logits is on: set it to false (token-only acceptance) if requests fail"
                if use_draft_logits
                else "keep speculative.use_draft_logits: false (token-only acceptance)"
            )
            r._add(
                "warning",
                "padded-vocab",
                f"{what}. Padded vocabularies are what makes draft_logits fail with 'Incompatible buffer sizes' "
                f"in TensorRT-LLM when draft and target pad differently (TRTLLM#2789); {advice}.",
            )
    return r


def format_params(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def format_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


def checkpoint_fingerprint(path: str | Path) -> str:
    """A cheap identity of a checkpoint's contents: config.json and tokenizer files hashed, weight files
    by name, size and mtime (hashing 140 GB of weights on every run is not an option)."""
    path = Path(path)
    h = hashlib.sha256()
    for name in ("config.json", "generation_config.json", "model.safetensors.index.json", *TOKENIZER_FILES):
        f = path / name
        if f.is_file():
            h.update(name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    for f in sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin", ".pt", ".gguf")):
        st = f.stat()
        h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


# ------------------------------------------------------------------------------------- drafting heads

# Architectures TensorRT-LLM, vLLM and SGLang load an EAGLE-3 head by (vLLM's registry maps both names);
# TensorRT-LLM also treats any Llama draft config carrying draft_vocab_size as EAGLE-3.
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
# Where a head's config pins the target layers it was trained on (EAGLE / SpecForge layout).
_CAPTURE_KEYS = ("eagle_aux_hidden_state_layer_ids", "eagle3_layers_to_capture")
# config.json keys that count a target's MTP layers (DeepSeek-V3 / GLM-4.5 spell it num_nextn_predict_layers).
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


def default_capture_layers(num_layers: int) -> list[int]:
    """TensorRT-LLM's default EAGLE-3 capture layers for an L-layer target: outputs of {1, L//2-1, L-4}."""
    return sorted({1, num_layers // 2 - 1, num_layers - 4})


def eagle3_capture_layers(head: CheckpointInfo) -> list[int] | None:
    """The capture layers a head's config pins, or None (then TensorRT-LLM's default applies)."""
    for where in (head.config.get("eagle_config") or {}, head.config):
        for key in _CAPTURE_KEYS:
            if isinstance(where.get(key), list):
                return [int(i) for i in where[key]]
    return None


def _tensor_shapes(path: Path) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for f in sorted(path.glob("*.safetensors")):
        for name, meta in read_safetensors_header(f).items():
            if name != "__metadata__" and isinstance(meta, dict):
                shapes[name] = list(meta.get("shape") or [])
    return shapes


def _read_tensor(path: Path, suffix: str) -> Any:
    from safetensors import safe_open

    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                if name == suffix or name.endswith("." + suffix):
                    return st.get_tensor(name)
    return None


def check_eagle3_head(
    target: CheckpointInfo, head: CheckpointInfo, capture_layers: list[int] | None = None
) -> list[tuple[str, str, str]]:
    """Can this EAGLE-3 head draft for this target? (level, code, message) findings, each naming the field
    and the fix. `capture_layers`: the deployment's explicit setting, else the head's, else TensorRT-LLM's default."""
    out: list[tuple[str, str, str]] = []
    cfg = f"{head.path}/config.json"
    dvs = _int(head.config.get("draft_vocab_size"))
    if head.architecture not in EAGLE3_ARCHITECTURES:
        if dvs is None:
            out.append(("error", "head-architecture",
                        f"{cfg}: architectures is {head.architecture!r}, not an EAGLE-3 head; TensorRT-LLM, vLLM and "
                        f"SGLang load a head as {EAGLE3_ARCHITECTURES[0]} (with draft_vocab_size). Point "
                        "draft.checkpoint at an EAGLE-3 head, or use speculative.method: draft_model for an ordinary "
                        "draft model"))
        else:
            out.append(("warning", "head-architecture",
                        f"{cfg}: architectures is {head.architecture!r}; TensorRT-LLM takes it as EAGLE-3 because "
                        f"draft_vocab_size is set, but vLLM and SGLang need {EAGLE3_ARCHITECTURES[0]}: set "
                        f'architectures: ["{EAGLE3_ARCHITECTURES[0]}"]'))
    if head.vocab_size and target.vocab_size and head.vocab_size != target.vocab_size:
        out.append(("error", "head-vocab",
                    f"{cfg}: vocab_size {head.vocab_size} != the target's {target.vocab_size}: the head embeds target "
                    "token ids, so it must be trained for this target's tokenizer (vocab_size = the target's)"))
    if dvs is not None and target.vocab_size and not 0 < dvs <= target.vocab_size:
        out.append(("error", "head-draft-vocab",
                    f"{cfg}: draft_vocab_size {dvs} must be between 1 and the target's vocab_size {target.vocab_size}"))
    th = _int(head.config.get("target_hidden_size")) or head.hidden_size
    if th and target.hidden_size and th != target.hidden_size:
        key = "target_hidden_size" if head.config.get("target_hidden_size") else "hidden_size"
        out.append(("error", "head-hidden-size",
                    f"{cfg}: {key} {th} != the target's hidden_size {target.hidden_size}: the head reads the target's "
                    "hidden states, so it must be trained for this target"))
    L = target.num_layers
    layers = capture_layers if capture_layers is not None else eagle3_capture_layers(head)
    where = "eagle3_layers_to_capture" if capture_layers is not None else f"{cfg} eagle_aux_hidden_state_layer_ids"
    if layers is None and L:
        layers = default_capture_layers(L)
        where = f"TensorRT-LLM's default capture layers for {L} target layers"
    if L and layers:
        bad = [i for i in layers if not -1 <= i < L]
        if bad:
            out.append(("error", "head-capture-layers",
                        f"{where}: layers {bad} are outside the target's {L} layers (0..{L - 1}, -1 = last): the head "
                        "was trained for a deeper target; use a head trained for this target"))
    shapes = _tensor_shapes(head.path)
    fc = next((s for n, s in shapes.items() if n == "fc.weight" or n.endswith(".fc.weight")), None)
    if fc and layers and th and len(fc) == 2 and fc[1] != len(layers) * th:
        out.append(("error", "head-fc",
                    f"{head.path}: fc.weight is {fc}, expected [{head.hidden_size}, {len(layers)} x {th}] for "
                    f"{len(layers)} capture layers of hidden size {th}: capture layers and head disagree"))
    d2t_shape = next((s for n, s in shapes.items() if n == "d2t" or n.endswith(".d2t")), None)
    if dvs is not None and target.vocab_size and dvs != target.vocab_size:
        if d2t_shape is None:
            out.append(("error", "head-d2t",
                        f"{head.path}: no d2t tensor, but draft_vocab_size {dvs} < vocab_size {target.vocab_size}: "
                        "runtimes map draft ids to target ids as id + d2t[id]; save d2t (int64, [draft_vocab_size])"))
        elif d2t_shape != [dvs]:
            out.append(("error", "head-d2t",
                        f"{head.path}: d2t has shape {d2t_shape}, expected [{dvs}] (draft_vocab_size)"))
        else:
            d2t = _read_tensor(head.path, "d2t")
            if d2t is not None:
                import torch

                ids = torch.arange(dvs, dtype=torch.int64) + d2t.to(torch.int64)
                lo, hi = int(ids.min()), int(ids.max())
                if lo < 0 or hi >= target.vocab_size:
                    out.append(("error", "head-d2t",
                                f"{head.path}: d2t maps draft ids to target ids {lo}..{hi}, outside the target's "
                                f"vocabulary 0..{target.vocab_size - 1}: d2t[i] must be target_id - i"))
    return out


def mtp_layers(target: CheckpointInfo) -> int:
    for key in MTP_LAYER_KEYS:
        n = _int(target.config.get(key))
        if n:
            return n
    return 0


def check_mtp_target(target: CheckpointInfo, served_model_types: dict[str, str]) -> list[tuple[str, str, str]]:
    """Does this target ship MTP layers TensorRT-LLM can run? `served_model_types`: model_type -> family."""
    out: list[tuple[str, str, str]] = []
    cfg = f"{target.path}/config.json"
    if mtp_layers(target) < 1:
        out.append(("error", "mtp-layers",
                    f"{cfg}: no MTP layers ({' / '.join(MTP_LAYER_KEYS)} missing or 0): speculative.method: mtp "
                    "drafts with the target's own multi-token-prediction layers; use a target trained with them "
                    "(DeepSeek-V3/R1, GLM-4.5, ...) or method: eagle3 / draft_model"))
    if target.model_type not in served_model_types:
        out.append(("error", "mtp-architecture",
                    f"{cfg}: model_type {target.model_type!r} ({target.architecture}) is not one TensorRT-LLM serves "
                    f"with MTP ({', '.join(sorted(served_model_types))}); use method: eagle3 or draft_model for this "
                    "target"))
    return out


def check_medusa_heads(
    target: CheckpointInfo, heads: CheckpointInfo, choices: list[list[int]] | None, engine: str
) -> list[tuple[str, str, str]]:
    """Can this Medusa head set speculate for this target? (level, code, message) findings: its layout (what
    TensorRT-LLM's examples/medusa/convert_checkpoint.py reads), hidden size, vocabulary, and the tree's depth
    against its number of heads."""

    try:
        info = inspect_heads(heads.path)
    except MedusaError as e:
        return [("error", "medusa-layout", f"draft.checkpoint: {e}")]
    out: list[tuple[str, str, str]] = []
    try:
        check_against_target(info, target.hidden_size or info.hidden_size, target.vocab_size or (info.vocab_size or 0),
                             f"draft.checkpoint {heads.path}")
    except MedusaError as e:
        code = "medusa-hidden-size" if "hidden_size" in str(e) else "medusa-vocab"
        out.append(("error", code, str(e)))
    if choices is not None:
        for p in choices_problems(choices, info.num_heads):
            out.append(("error", "medusa-choices", f"speculative.{p}"))
    if info.shared_lm_head and engine == "tensorrt_llm":
        out.append(("error", "medusa-lm-head",
                    f"draft.checkpoint {heads.path}: the heads share the target's LM head (config.json lm_head: "
                    "target), but TensorRT-LLM's load_medusa_hf reads each head's own; write them out with `python -m "
                    "trtspec.reference_engine.medusa materialize HEADS TARGET OUT` and point draft.checkpoint at OUT"))
    return out
