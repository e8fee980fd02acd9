"""EAGLE-3 draft head: the checkpoint layout TensorRT-LLM, vLLM and SGLang load, and drafting in the reference engine.

The head (one Llama decoder layer) reads the target's own hidden states: ``fc`` projects the outputs of the
capture layers (concatenated, low to high) to the hidden size; the layer's attention input is
[input_layernorm(embedding of the next token) ; hidden_norm(feature)] (2H wide), its residual is the feature;
``norm`` + ``lm_head`` score a reduced draft vocabulary, mapped to target ids as ``draft_id + d2t[draft_id]``.
The embedding is the target's (the checkpoint carries none). Each further draft step feeds the layer's own
output (before ``norm``) back as the feature.

Positions: the head's entry at position j is built from the target's features at j and token j+1; it predicts
token j+2. Its own KV cache therefore covers positions 0..n-2 of an n-token sequence (``HeadState``).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from trtspec.checkpoint import default_capture_layers
from trtspec.reference_engine.prefix_cache import _common_prefix, same_prefix

ARCHITECTURE = "LlamaForCausalLMEagle3"
CONFIG_FILE = "config.json"
TENSORS_FILE = "model.safetensors"
# The capture-layer ids in config.json (head_config says which loader reads which spelling and convention).
AUX_LAYERS_KEY = "eagle_aux_hidden_state_layer_ids"


class Eagle3Error(ValueError):
    """A head checkpoint that does not fit its target; the message names the field."""


def head_capture_layers(config: dict, target_layers: int) -> list[int]:
    """The outputs of these decoder layers feed the head: eagle_config's ids (layer outputs), else TensorRT-LLM's default."""
    ids = (config.get("eagle_config") or {}).get(AUX_LAYERS_KEY)
    return list(ids) if ids else default_capture_layers(target_layers)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        heads = cfg["num_attention_heads"]
        self.self_attn = Attention(h, heads, cfg["num_key_value_heads"], cfg.get("head_dim") or h // heads)
        self.mlp = MLP(h, cfg["intermediate_size"])
        self.input_layernorm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)


def rope_angles(pos: torch.Tensor, d: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, D] of the Llama rotary embedding at positions pos [T]."""
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=pos.device) / d))
    ang = pos.to(torch.float32)[..., None] * inv
    ang = torch.cat([ang, ang], -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama rotary embedding (rotate-half layout) of x [..., T, D]."""
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Eagle3Head(nn.Module):
    """Weights named as the standard EAGLE-3 checkpoint: fc, midlayer.*, norm, lm_head, d2t, t2d."""

    def __init__(self, cfg: dict, embed: torch.Tensor):
        super().__init__()
        self.cfg = cfg
        h = cfg["hidden_size"]
        n_aux = len(cfg.get("eagle_config", {}).get(AUX_LAYERS_KEY) or [0, 0, 0])
        self.fc = nn.Linear(n_aux * cfg.get("target_hidden_size", h), h, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(h, cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(h, cfg["draft_vocab_size"], bias=False)
        self.register_buffer("d2t", torch.zeros(cfg["draft_vocab_size"], dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg["vocab_size"], dtype=torch.bool))
        self.register_buffer("embed", embed, persistent=False)  # the target's, shared
        self.theta = float(cfg.get("rope_theta", 10000.0))
        self.d2t_list: list[int] = []  # d2t as a list, for drafting one token at a time (set by load_head)

    # -------------------------------------------------------------- pieces (shared by training and drafting)

    def qkv(self, tokens: torch.Tensor, feat: torch.Tensor, pos: torch.Tensor):
        """q [.., heads, T, D], k/v [.., kv_heads, T, D] of entries (token, feature) at positions pos."""
        m, a = self.midlayer, self.midlayer.self_attn
        x = torch.cat([m.input_layernorm(F.embedding(tokens, self.embed)), m.hidden_norm(feat)], dim=-1)
        lead = x.shape[:-2]
        T = x.shape[-2]

        def split(t, n):
            return t.view(*lead, T, n, a.head_dim).transpose(-3, -2)

        cos, sin = rope_angles(pos, a.head_dim, self.theta, x.dtype)
        q = rope(split(a.q_proj(x), a.heads), cos, sin)
        k = rope(split(a.k_proj(x), a.kv_heads), cos, sin)
        return q, k, split(a.v_proj(x), a.kv_heads)

    def finish(self, attn: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        """attn [.., heads, T, D] -> the layer's output state [.., T, H] (before norm): what the next step feeds back."""
        a = self.midlayer.self_attn
        o = attn.transpose(-3, -2).reshape(*attn.shape[:-3], attn.shape[-2], a.heads * a.head_dim)
        h = feat + a.o_proj(o)
        return h + self.midlayer.mlp(self.midlayer.post_attention_layernorm(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    # -------------------------------------------------------------- drafting with a KV cache

    @torch.inference_mode()
    def extend(self, state: "HeadState", tokens: list[int], feats: torch.Tensor) -> torch.Tensor:
        """Append entries at positions state.length.. (tokens[i] is the token after feats[i]'s position);
        returns the last entry's output state [H]."""
        dev = self.fc.weight.device
        pos = torch.arange(state.length, state.length + len(tokens), device=dev)
        return self._attend(state, torch.tensor(tokens, device=dev), self.fc(feats.to(dev, self.fc.weight.dtype)),
                            pos)[-1]

    def _attend(self, state: "HeadState", tokens: torch.Tensor, feat: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(tokens, feat, pos)
        state.append(k, v)
        n, kv = q.shape[-2], state.k.shape[-2]
        mask = None if n == 1 else torch.ones(n, kv, dtype=torch.bool, device=q.device).tril(kv - n)
        out = F.scaled_dot_product_attention(q, state.k, state.v, attn_mask=mask, enable_gqa=True)
        return self.finish(out, feat)

    @torch.inference_mode()
    def draft(self, state: "HeadState", last: torch.Tensor, k: int) -> list[int]:
        """k target ids continuing the sequence whose last entry's output state is `last`; state is left as it was."""
        keep, dev = state.length, last.device
        out, h = [], last
        for i in range(k):
            d = int(self.logits(h).argmax())
            out.append(d + self.d2t_list[d])
            if i + 1 < k:
                h = self._attend(state, torch.tensor([out[-1]], device=dev), h[None],
                                 torch.tensor([state.length], device=dev))[-1]
        state.crop(keep)
        return out


@dataclass
class HeadState:
    """The head's KV cache for one sequence: entries at positions 0..length-1 ([kv_heads, length, D])."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)

    def crop(self, n: int) -> "HeadState":
        if self.k is not None and n < self.length:  # slices: views, never written in place
            self.k, self.v = self.k[..., :n, :], self.v[..., :n, :]
        return self

    def cropped(self, n: int) -> "HeadState":
        return HeadState(self.k, self.v).crop(n)

    @property
    def nbytes(self) -> int:
        return 0 if self.k is None else self.k.nbytes + self.v.nbytes


def read_config(checkpoint: str | Path) -> dict:
    path = Path(checkpoint) / CONFIG_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise Eagle3Error(f"{path}: cannot read the EAGLE-3 head's config ({e})") from None


def check_against_target(cfg: dict, target_cfg: Any, where: str) -> None:
    """The head fits the target: the checks a loader makes, each naming the field."""
    L = int(target_cfg.num_hidden_layers)
    if cfg.get("architectures") not in ([ARCHITECTURE], ["LlamaForCausalLM"]):
        raise Eagle3Error(f"{where}: architectures must be [{ARCHITECTURE!r}], got {cfg.get('architectures')}")
    for key in ("hidden_size", "draft_vocab_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "rms_norm_eps"):
        if key not in cfg:
            raise Eagle3Error(f"{where}: config.json has no {key!r}")
    th = int(cfg.get("target_hidden_size", cfg["hidden_size"]))
    if th != int(target_cfg.hidden_size) or int(cfg["hidden_size"]) != th:
        raise Eagle3Error(f"{where}: hidden_size {cfg['hidden_size']} must equal the target's {target_cfg.hidden_size} "
                          "(the head shares the target's embedding)")
    if int(cfg["vocab_size"]) != int(target_cfg.vocab_size):
        raise Eagle3Error(f"{where}: vocab_size {cfg['vocab_size']} must equal the target's {target_cfg.vocab_size}")
    if not 0 < int(cfg["draft_vocab_size"]) <= int(cfg["vocab_size"]):
        raise Eagle3Error(f"{where}: draft_vocab_size must be in (0, vocab_size]")
    layers = head_capture_layers(cfg, L)
    if len(layers) != 3 or not all(0 <= i < L for i in layers):
        raise Eagle3Error(f"{where}: eagle_config.{AUX_LAYERS_KEY} {layers} must be 3 layer ids in [0, {L})")


def load_head(checkpoint: str | Path, target: nn.Module) -> tuple[Eagle3Head, list[int]]:
    """The head and its capture layers, checked against `target` (a transformers causal LM)."""
    from safetensors.torch import load_file

    cfg = read_config(checkpoint)
    check_against_target(cfg, target.config, str(checkpoint))
    embed = target.get_input_embeddings().weight.detach()
    head = Eagle3Head(cfg, embed.float())
    state = load_file(str(Path(checkpoint) / TENSORS_FILE))
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "t2d"]
    if missing or unexpected:
        raise Eagle3Error(f"{checkpoint}: {TENSORS_FILE} tensors missing {missing[:4]} unexpected {unexpected[:4]}")
    d2t = head.d2t
    if int((torch.arange(len(d2t)) + d2t).min()) < 0 or int((torch.arange(len(d2t)) + d2t).max()) >= cfg["vocab_size"]:
        raise Eagle3Error(f"{checkpoint}: d2t maps draft ids outside the target vocabulary [0, {cfg['vocab_size']})")
    head.d2t_list = head.d2t.tolist()
    head.to(embed.device)  # the target's device: the features it captures stay there
    head.eval()
    for p in head.parameters():
        p.requires_grad = False
    return head, head_capture_layers(cfg, int(target.config.num_hidden_layers))


def head_config(target_cfg: Any, draft_vocab_size: int, layers: list[int]) -> dict:
    """config.json of a head for this target (a Llama config with one layer)."""
    rope_theta = getattr(target_cfg, "rope_theta", None)
    if rope_theta is None:
        rope_theta = (getattr(target_cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": int(target_cfg.hidden_size),
        "intermediate_size": int(target_cfg.intermediate_size),
        "num_attention_heads": int(target_cfg.num_attention_heads),
        "num_key_value_heads": int(target_cfg.num_key_value_heads),
        "head_dim": int(getattr(target_cfg, "head_dim", None) or target_cfg.hidden_size // target_cfg.num_attention_heads),
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": float(target_cfg.rms_norm_eps),
        "rope_theta": float(rope_theta),
        "max_position_embeddings": int(target_cfg.max_position_embeddings),
        "vocab_size": int(target_cfg.vocab_size),
        "draft_vocab_size": int(draft_vocab_size),
        "target_hidden_size": int(target_cfg.hidden_size),
        "tie_word_embeddings": False,
        "bos_token_id": target_cfg.bos_token_id,
        "eos_token_id": target_cfg.eos_token_id,
        "torch_dtype": "float16",
        # SGLang reads eagle_config's ids as layer outputs (it adds 1); vLLM reads the top-level key first, as
        # inputs of layer j (= output of layer j-1). Same three tensors; TensorRT-LLM takes them from
        # eagle3_layers_to_capture in the serving config (its default {1, L//2-1, L-4} is these too).
        "eagle_config": {AUX_LAYERS_KEY: list(layers), "use_aux_hidden_state": True},
        AUX_LAYERS_KEY: [i + 1 for i in layers],
    }


class HeadStore:
    """Head KV caches keyed by the committed sequence they were built for (least recently used dropped first).

    An entry for tokens x_0..x_{n-1} holds the entries at positions 0..n-2; a sequence sharing only a prefix
    of c tokens may use the first c-1 of them (entry j reads token j+1). Taken states are cropped copies of
    views (HeadState never writes its tensors in place), so sharers never disturb each other."""

    def __init__(self, max_entries: int):
        self.max_entries = max(1, max_entries)
        self._entries: "OrderedDict[int, tuple[list[int], HeadState]]" = OrderedDict()
        self._next = 0

    def take(self, tokens: Sequence[int]) -> HeadState:
        best, best_len = None, 0
        for key, (toks, _) in self._entries.items():
            n = _common_prefix(toks, tokens)
            if n > best_len:
                best, best_len = key, n
        if best is None or best_len < 2:
            return HeadState()
        toks, state = self._entries[best]
        if best_len >= len(toks):
            del self._entries[best]
        else:
            self._entries.move_to_end(best)
        return state.cropped(best_len - 1)

    def put(self, tokens: list[int], state: HeadState) -> None:
        # an entry for a prefix of these tokens holds nothing this one does not: a repeated prompt's calls, which
        # borrow its earlier run's longer entry, would each leave one beside it and evict every other prompt's
        stale = [key for key, (toks, _) in self._entries.items() if same_prefix(toks, tokens, len(toks))]
        for key in stale:
            del self._entries[key]
        self._entries[self._next] = (list(tokens), state)
        self._next += 1
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class HeadWork:
    """What the head has done in this engine, counted (the engine's statistics; a k = 0 stretch adds nothing)."""

    captured_rows: int = 0  # target rows whose capture-layer outputs were kept
    extended_positions: int = 0  # entries appended to head KV caches from the target's features
    drafted_tokens: int = 0  # tokens the head proposed

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class InEngineDrafter:
    """An EAGLE-3 head drafting inside the target engine, as TensorRT-LLM's one-model path: during a forward that
    asks for it (`capturing`), forward hooks on the capture layers keep their outputs for the rows the target
    computes; after a request's step the head extends its own KV cache over the newly committed positions and
    drafts k tokens for the next call.

    A call that asks for no draft does no head work at all: no hooks are attached to its forward (unless a
    request batched with it asks for features) and its head cache is not extended. The next call that asks
    for a draft finds the head behind: the engine recomputes the target from the head's length on (prefix
    reuse capped there), and the head catches up on all those positions in one batched extension."""

    def __init__(self, checkpoint: str | Path, target: nn.Module, cache_entries: int):
        self.head, self.layers = load_head(checkpoint, target)
        self.store = HeadStore(cache_entries)
        self.work = HeadWork()
        self._out: dict[int, torch.Tensor] = {}
        self._modules = [target.base_model.layers[i] for i in self.layers]

    def _hook(self, i: int):
        def hook(_mod, _inp, out):
            self._out[i] = out[0] if isinstance(out, tuple) else out
        return hook

    @contextmanager
    def capturing(self) -> Iterator[None]:
        """Hooks on the capture layers for one forward, removed after it (a forward without them runs exactly
        the target's own modules)."""
        handles = [m.register_forward_hook(self._hook(i)) for i, m in zip(self.layers, self._modules)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def features(self, rows: list[tuple[int, int]]) -> list[torch.Tensor]:
        """The last forward's captured outputs for the packed row ranges `rows`, each [e - s, n_layers * H]."""
        out = [self._out[i][0] for i in self.layers]
        self._out.clear()
        feats = [torch.cat([o[s:e] for o in out], dim=-1) for s, e in rows]
        self.work.captured_rows += sum(e - s for s, e in rows)
        return feats

    def begin(self, tokens: Sequence[int]) -> HeadState:
        """The head state for a call on `tokens`: the target must recompute from position state.length on."""
        return self.store.take(tokens)

    def finish(self, state: HeadState, tokens: list[int], start: int, feats: torch.Tensor, k: int) -> list[int]:
        """Extend `state` with the entries of positions state.length..n-2 (features computed from `start` on),
        draft k tokens after `tokens`, and keep the state for the next call."""
        n = len(tokens)
        state.crop(start)
        if state.length != start or n - 1 - start < 1 or feats.shape[0] < n - 1 - start:
            return []
        last = self.head.extend(state, tokens[start + 1 : n], feats[: n - 1 - start])
        self.work.extended_positions += n - 1 - start
        drafts = self.head.draft(state, last, k) if k > 0 else []
        self.work.drafted_tokens += len(drafts)
        self.store.put(tokens, state)
        return drafts
