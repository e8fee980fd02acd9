"""Medusa head sets and trees, without torch: the checkpoint layout, `medusa_choices` and the tree they make.

A Medusa-1 head set (FasterDecoding/Medusa, the layout TensorRT-LLM's examples/medusa/convert_checkpoint.py reads
through tensorrt_llm/models/medusa/weight.py load_medusa_hf): `config.json` with `medusa_num_heads` and
`medusa_num_layers`, and `medusa_lm_head.safetensors` with, per head h, `{h}.{l}.linear.weight` [H, H] and
`{h}.{l}.linear.bias` [H] for each of its residual blocks l (x + SiLU(W x + b)), then `{h}.{L}.weight` [V, H], the
head's own LM head. Head h reads the target's last hidden state at position t and proposes the token at t + 2 + h
(the target's own LM head gives t + 1).

A head set may leave its LM heads out and say `"lm_head": "target"` in config.json: it then shares the target's LM
head (frozen), which keeps a head set for a small target a few MB instead of ~57 MB per head (the shipped demo set).
TensorRT-LLM's loader needs the LM heads written out; `materialize` does that.

The reference engine's side (the heads' forward, the KV of the accepted path): trtspec/reference_engine/medusa.py.

`medusa_choices` are paths into the heads' top-k, as TensorRT-LLM and Medusa spell them: [1, 0] is "head 0's
second token, then head 1's first". The tree is verified in one forward pass: each node attends to the committed
sequence and its own ancestors (trtspec.reference_engine.ragged), at position root + depth.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

CONFIG_FILE = "config.json"
TENSORS_FILE = "medusa_lm_head.safetensors"
SHARED_LM_HEAD = "target"  # config.json "lm_head": the heads share the target's LM head

# The default tree is small (a step costs what its rows cost): the top-1 chain of
# every head plus the second choice of the first head, 1 + 5 rows for 3+ heads.
DEFAULT_CHOICES: tuple[tuple[int, ...], ...] = ((0,), (0, 0), (1,), (0, 0, 0), (0, 1))


class MedusaError(ValueError):
    pass


@dataclass(frozen=True)
class HeadsInfo:
    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int | None  # None: the heads share the target's LM head
    shared_lm_head: bool


def _tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def inspect_heads(path: str | Path) -> HeadsInfo:
    """The head set's shape from config.json and the tensors' headers (no weights read)."""
    path = Path(path)
    cfg_file, tensors = path / CONFIG_FILE, path / TENSORS_FILE
    if not cfg_file.is_file() or not tensors.is_file():
        raise MedusaError(f"{path}: a Medusa head set needs {CONFIG_FILE} and {TENSORS_FILE} (the layout TensorRT-LLM's "
                          "examples/medusa/convert_checkpoint.py --medusa_model_dir reads)")
    cfg = json.loads(cfg_file.read_text())
    if "medusa_num_heads" not in cfg:
        raise MedusaError(f"{cfg_file}: no medusa_num_heads: not a Medusa head set")
    n, layers = int(cfg["medusa_num_heads"]), int(cfg.get("medusa_num_layers", 1))
    shapes = _tensor_shapes(tensors)
    w0 = shapes.get("0.0.linear.weight")
    if w0 is None or len(w0) != 2 or w0[0] != w0[1]:
        raise MedusaError(f"{tensors}: 0.0.linear.weight must be [hidden, hidden], got {w0}")
    hidden = w0[0]
    shared = cfg.get("lm_head") == SHARED_LM_HEAD
    vocab = None
    for h in range(n):
        for l in range(layers):
            for key, want in ((f"{h}.{l}.linear.weight", (hidden, hidden)), (f"{h}.{l}.linear.bias", (hidden,))):
                if shapes.get(key) != want:
                    raise MedusaError(f"{tensors}: {key} must be {list(want)} for {n} heads of {layers} layers, got {shapes.get(key)}")
        if not shared:
            lm = shapes.get(f"{h}.{layers}.weight")
            if lm is None or len(lm) != 2 or lm[1] != hidden or (vocab is not None and lm[0] != vocab):
                raise MedusaError(f"{tensors}: {h}.{layers}.weight (head {h}'s LM head) must be [vocab, {hidden}], got {lm}"
                                  f" (or set \"lm_head\": \"{SHARED_LM_HEAD}\" in {CONFIG_FILE} to share the target's)")
            vocab = lm[0]
    return HeadsInfo(n, layers, hidden, vocab, shared)


def check_against_target(info: HeadsInfo, hidden_size: int, vocab_size: int, where: str) -> None:
    """Refuse a head set made for another target, naming the field."""
    if info.hidden_size != hidden_size:
        raise MedusaError(f"{where}: the Medusa heads' hidden_size is {info.hidden_size}, the target's {hidden_size}: "
                          "these heads were trained for another target")
    if info.vocab_size is not None and info.vocab_size != vocab_size:
        raise MedusaError(f"{where}: the Medusa heads' vocab_size is {info.vocab_size}, the target's {vocab_size}: "
                          "these heads were trained for another target")


def choices_problems(choices: Sequence[Sequence[int]], num_heads: int | None = None) -> list[str]:
    """What is wrong with a medusa_choices tree (empty: fine)."""
    out = []
    seen = {tuple(c) for c in choices}
    if len(seen) != len(choices):
        out.append("medusa_choices has a path twice")
    for c in choices:
        if not c or any(int(i) < 0 for i in c):
            out.append(f"medusa_choices path {list(c)}: paths are non-empty lists of top-k ranks >= 0")
        elif len(c) > 1 and tuple(c[:-1]) not in seen:
            out.append(f"medusa_choices path {list(c)}: its parent {list(c[:-1])} is not in the tree")
    depth = max((len(c) for c in choices), default=0)
    if num_heads is not None and depth > num_heads:
        out.append(f"medusa_choices is {depth} deep but the head set has {num_heads} heads (a path's length is the "
                   "heads it reads)")
    return out


def default_choices(num_heads: int) -> list[list[int]]:
    return [list(c) for c in DEFAULT_CHOICES if len(c) <= num_heads]


def to_pbtxt(choices: Sequence[Sequence[int]]) -> str:
    """The tensorrt_llm model's medusa_choices parameter: "{0}, {0, 0}, {1}" (tensorrtllm_backend
    inflight_batcher_llm/src/utils.cc csvStrToVecVecInt: '}'-delimited, '{' stripped, comma-separated ints)."""
    return ", ".join("{" + ", ".join(str(int(i)) for i in c) + "}" for c in choices)


def from_pbtxt(text: str) -> list[list[int]]:
    """to_pbtxt's inverse, as the backend reads it (csvStrToVecVecInt)."""
    out = []
    for part in text.split("}"):
        part = part.strip().lstrip(",").strip().lstrip("{")
        if part:
            out.append([int(x) for x in part.split(",")])
    return out


@dataclass(frozen=True)
class Tree:
    """The nodes of medusa_choices in Medusa's order (by depth, then path): node i reads head depth[i]-1's rank[i]-th
    token and hangs below parent[i] (-1: the root, the token the target's own head chose)."""

    paths: tuple[tuple[int, ...], ...]
    parent: tuple[int, ...]
    depth: tuple[int, ...]
    topk: tuple[int, ...]  # per head: how many of its best tokens the tree reads

    @classmethod
    def from_choices(cls, choices: Sequence[Sequence[int]]) -> "Tree":
        problems = choices_problems(choices)
        if problems:
            raise MedusaError("; ".join(problems))
        paths = tuple(sorted({tuple(int(i) for i in c) for c in choices}, key=lambda p: (len(p), p)))
        index = {p: i for i, p in enumerate(paths)}
        heads = max(len(p) for p in paths)
        topk = [0] * heads
        for p in paths:
            topk[len(p) - 1] = max(topk[len(p) - 1], p[-1] + 1)
        return cls(paths, tuple(index[p[:-1]] if len(p) > 1 else -1 for p in paths), tuple(len(p) for p in paths),
                   tuple(topk))

    def __len__(self) -> int:
        return len(self.paths)

    def tokens(self, top: list[list[int]]) -> list[int | None]:
        """The nodes' tokens from each head's best tokens (top[h] best first; None: a node of a head not run)."""
        return [top[len(p) - 1][p[-1]] if len(p) <= len(top) else None for p in self.paths]

    def children(self, node: int, size: int | None = None) -> list[int]:
        """Node's children (-1: the root's) among the first `size` nodes (None: all)."""
        return [i for i, p in enumerate(self.parent[:size]) if p == node]

    def prefix_depth(self, size: int) -> int:
        """The heads the first `size` nodes read (0: the root alone). Every prefix of the nodes is a tree: a
        parent comes before its children."""
        return max(self.depth[:size], default=0)


def accept(tree: Tree, nodes: list[int], choose: Any) -> list[int]:
    """The accepted path (node indices, root side first): from the root, `choose(row)` is the target's token after
    row (0: the root, i + 1: node i); a child holding that token is accepted and the walk goes on from it."""
    path: list[int] = []
    row = 0
    while True:
        t = choose(row)
        nxt = next((c for c in tree.children(path[-1] if path else -1) if nodes[c] == t), None)
        if nxt is None:
            return path
        path.append(nxt)
        row = nxt + 1
