"""A tokenizer's identity, read offline from a checkpoint directory: how many token ids it has and a fingerprint, a
sha256 over the normalized vocabulary, merges and added/special tokens, so that two checkpoints that map token ids to
the same strings get the same fingerprint even when their ``tokenizer.json`` differ in formatting or unrelated fields.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "special_tokens_map.json",
    "tokenizer_config.json",
)


def tokenizer_identity(path: str | Path) -> tuple[int | None, str | None, list[str]]:
    """(number of distinct token ids, fingerprint, tokenizer files found) for a checkpoint directory."""
    path = Path(path)
    found = [n for n in TOKENIZER_FILES if (path / n).is_file()]
    tj = path / "tokenizer.json"
    if tj.is_file():
        try:
            raw = tj.read_bytes()
        except OSError:
            raw = b""
        result = _fingerprint_tokenizer_bytes(hashlib.sha256(raw).hexdigest(), raw)
        if result is not None:
            return (*result, found)
    return (*_fingerprint_legacy_files(path), found)


_TOKENIZER_CACHE: dict[str, tuple[int | None, str] | None] = {}


def _fingerprint_tokenizer_bytes(digest: str, raw: bytes) -> tuple[int | None, str] | None:
    """Memoized on the file's bytes: a 128k-token tokenizer.json takes ~0.2 s to normalize."""
    if digest not in _TOKENIZER_CACHE:
        try:
            data = json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            data = None
        ok = isinstance(data, dict) and isinstance(data.get("model"), dict)
        _TOKENIZER_CACHE[digest] = _fingerprint_tokenizer_json(data) if ok else None  # type: ignore[arg-type]
    return _TOKENIZER_CACHE[digest]


def _fingerprint_tokenizer_json(data: dict[str, Any]) -> tuple[int | None, str]:
    model = data["model"]
    vocab_raw = model.get("vocab")
    ids: dict[int, str] = {}
    if isinstance(vocab_raw, dict):  # BPE / WordPiece / WordLevel: token -> id
        ids = {int(i): str(t) for t, i in vocab_raw.items()}
    elif isinstance(vocab_raw, list):  # Unigram: [token, score] in id order
        ids = {i: str(e[0] if isinstance(e, list) else e) for i, e in enumerate(vocab_raw)}
    merges = [" ".join(m) if isinstance(m, list) else str(m) for m in (model.get("merges") or [])]
    added = sorted(
        (int(t["id"]), str(t.get("content")), bool(t.get("special")))
        for t in (data.get("added_tokens") or [])
        if isinstance(t, dict) and "id" in t
    )
    all_ids = set(ids) | {a[0] for a in added}
    normalized = {
        "model": model.get("type"),
        "vocab": sorted(ids.items()),
        "merges": merges,
        "added_tokens": added,
    }
    return (len(all_ids) or None, _sha(normalized))


def _fingerprint_legacy_files(path: Path) -> tuple[int | None, str | None]:
    """vocab.json + merges.txt (GPT-2 style) or tokenizer.model (SentencePiece), plus added tokens."""
    parts: dict[str, Any] = {}
    size: int | None = None
    vj, mt, sp = path / "vocab.json", path / "merges.txt", path / "tokenizer.model"
    if vj.is_file():
        try:
            vocab = json.loads(vj.read_text(encoding="utf-8"))
            parts["vocab"] = sorted((int(i), str(t)) for t, i in vocab.items())
            size = len(vocab)
        except (OSError, json.JSONDecodeError, ValueError, AttributeError):
            pass
    if mt.is_file():
        lines = mt.read_text(encoding="utf-8", errors="replace").splitlines()
        parts["merges"] = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#version")]
    if sp.is_file():
        parts["sentencepiece"] = hashlib.sha256(sp.read_bytes()).hexdigest()
    if not parts:
        return None, None
    at = path / "added_tokens.json"
    if at.is_file():
        try:
            added = json.loads(at.read_text(encoding="utf-8"))
            parts["added_tokens"] = sorted((int(i), str(t)) for t, i in added.items())
            if "vocab" in parts:
                size = len({i for i, _ in parts["vocab"]} | {i for i, _ in parts["added_tokens"]})
        except (OSError, json.JSONDecodeError, ValueError, AttributeError):
            pass
    stm = path / "special_tokens_map.json"
    if stm.is_file():
        try:
            parts["special_tokens"] = json.loads(stm.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            pass
    return size, _sha(parts)


def _sha(obj: Any) -> str:
    blob = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()
