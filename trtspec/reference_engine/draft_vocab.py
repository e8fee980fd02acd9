"""A draft checkpoint's reduced vocabulary: the token ids its LM head may propose, and that head's rows."""

from __future__ import annotations

from pathlib import Path

import torch


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
