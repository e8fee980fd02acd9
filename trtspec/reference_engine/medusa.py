"""Medusa heads in the reference engine: the heads' forward on the target's last hidden state, and the KV of the
accepted path (the head set's layout, medusa_choices and the tree: trtspec.medusa)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from trtspec.medusa import CONFIG_FILE, TENSORS_FILE, check_against_target, inspect_heads


class MedusaHeads(torch.nn.Module):
    """The heads: residual blocks per head on the target's last hidden state, then an LM head (own or shared)."""

    def __init__(self, path: str | Path, target: torch.nn.Module):
        super().__init__()
        from safetensors.torch import load_file

        path = Path(path)
        self.info = info = inspect_heads(path)
        cfg = target.config
        check_against_target(info, int(cfg.hidden_size), int(cfg.vocab_size), str(path))
        t = load_file(str(path / TENSORS_FILE))
        ref = target.get_output_embeddings().weight
        dtype, device = ref.dtype, ref.device
        self.w = [[t[f"{h}.{l}.linear.weight"].to(device, dtype) for l in range(info.num_layers)] for h in range(info.num_heads)]
        self.b = [[t[f"{h}.{l}.linear.bias"].to(device, dtype) for l in range(info.num_layers)] for h in range(info.num_heads)]
        self.lm = [ref.detach() if info.shared_lm_head else t[f"{h}.{info.num_layers}.weight"].to(device, dtype)
                   for h in range(info.num_heads)]

    @torch.inference_mode()
    def top(self, hidden: torch.Tensor, k: Sequence[int],
            shared_head: Callable[[torch.Tensor], torch.Tensor] | None = None,
            product_rows: int = 1) -> list[list[list[int]]]:
        """Per hidden row of [B, H] (a step's requests together), each head's k[h] best tokens (heads past len(k)
        are not run). Heads that share the target's LM head run their rows through it together, in products of
        max(B, `product_rows`) rows (the head's weights are read once a product: TreeSize.product_rows), on
        `shared_head` where given (the engine's own product for it, its kernel); own LM heads, one product each."""
        blocks = []
        for h in range(len(k)):
            x = hidden
            for w, b in zip(self.w[h], self.b[h]):
                x = x + torch.nn.functional.silu(torch.nn.functional.linear(x, w, b))
            blocks.append(x)
        if self.info.shared_lm_head:
            lm = self.lm[0]
            head = shared_head if shared_head is not None else (lambda x: torch.mm(lm, x.t()).t())
            rows = torch.cat(blocks)
            logits = torch.cat([head(p) for p in rows.split(max(hidden.shape[0], product_rows))])
            per_head = logits.float().split(hidden.shape[0])
        else:
            per_head = [torch.mm(self.lm[h], x.t()).t().float() for h, x in enumerate(blocks)]
        out: list[list[list[int]]] = [[] for _ in range(hidden.shape[0])]
        for logits, kh in zip(per_head, k):
            for row, best in zip(out, torch.topk(logits, kh).indices.tolist()):
                row.append(best)
        return out


def keep_rows(cache: Any, first: int, rows: list[int]) -> None:
    """Keep, of the cache's positions from `first` on, only `rows` (ascending, relative to first), moved down to
    first, first + 1, ...: the accepted path's KV; a rejected branch leaves nothing behind."""
    n = first + len(rows)
    if rows != list(range(len(rows))):
        idx = torch.tensor([first + r for r in rows], dtype=torch.long)
        with torch.inference_mode():  # the cache's tensors were made in the forward's inference mode
            _move(cache, idx, first, n)
    if cache.get_seq_length() > n:
        cache.crop(n - cache.get_seq_length())  # negative: drop that many (transformers 4.x and 5.x)


def _move(cache: Any, idx: torch.Tensor, first: int, n: int) -> None:
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        layer.keys[..., first:n, :] = layer.keys[..., idx.to(layer.keys.device), :]
        layer.values[..., first:n, :] = layer.values[..., idx.to(layer.values.device), :]


def materialize(heads: str | Path, target: str | Path, out: str | Path, dtype: str = "float16") -> Path:
    """A head set that shares the target's LM head, written out with each head's own copy of it (what TensorRT-LLM's
    load_medusa_hf reads)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    heads, out = Path(heads), Path(out)
    info = inspect_heads(heads)
    t = load_file(str(heads / TENSORS_FILE))
    if info.shared_lm_head:
        lm = AutoModelForCausalLM.from_pretrained(str(target)).get_output_embeddings().weight.detach()
        for h in range(info.num_heads):
            t[f"{h}.{info.num_layers}.weight"] = lm.clone()
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(getattr(torch, dtype)).contiguous() for k, v in t.items()}, str(out / TENSORS_FILE))
    cfg = json.loads((heads / CONFIG_FILE).read_text())
    cfg.pop("lm_head", None)
    (out / CONFIG_FILE).write_text(json.dumps(cfg, indent=1) + "\n")
    return out


class TreeWork:
    """The engine's tree steps: how many, how long the accepted path was (acceptance per depth: the share of
    steps whose path reached it), and how many nodes each step verified (0: the root alone, a plain step)."""

    def __init__(self) -> None:
        self.steps = 0  # steps that verified nodes
        self.paths: list[int] = []  # entry d: steps whose accepted path was d long
        self.sizes: list[int] = []  # entry m: steps that verified the tree's first m nodes (0 included)

    def record(self, length: int, size: int) -> None:
        self.sizes += [0] * (size + 1 - len(self.sizes))
        self.sizes[size] += 1
        if not size:
            return
        self.steps += 1
        self.paths += [0] * (length + 1 - len(self.paths))
        self.paths[length] += 1

    def reached(self) -> list[float]:
        """Per depth d = 1, 2, ...: the share of steps whose accepted path reached d (head d-1's acceptance)."""
        return [sum(self.paths[d:]) / self.steps if self.steps else 0.0 for d in range(1, len(self.paths))]


if __name__ == "__main__":  # python -m trtspec.reference_engine.medusa materialize HEADS TARGET OUT
    import sys

    if len(sys.argv) != 5 or sys.argv[1] != "materialize":
        sys.exit("usage: python -m trtspec.reference_engine.medusa materialize HEADS TARGET OUT")
    print(materialize(*sys.argv[2:]))
