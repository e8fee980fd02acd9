"""Offline checkpoint inspection, the pair check, and `trtspec doctor` on tiny checkpoints.

The helpers at the top (tiny HF checkpoints with real config.json values and real tokenizer files) are
also used by test_build_plan.py, test_preflight.py and test_build_runner.py.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import struct
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtspec.checkpoint import (
    check_pair,
    checkpoint_fingerprint,
    inspect_checkpoint,
    read_safetensors_header,
)
from trtspec.cli import cli
from trtspec.tokenizer_identity import tokenizer_identity

# ------------------------------------------------------------------------------------------- helpers

# config.json values of the models in build_configs/ (as published on the Hugging Face hub).
LLAMA_31_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "mlp_bias": False,
    "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64, "num_hidden_layers": 80,
    "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
}  # fmt: skip
LLAMA_31_8B = {
    **LLAMA_31_70B, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32,
}  # fmt: skip
LLAMA_32_1B = {
    **LLAMA_31_70B, "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32, "head_dim": 64,
    "num_hidden_layers": 16, "tie_word_embeddings": True,
    "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
    "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 49152, "rms_norm_eps": 1e-05,
}  # fmt: skip
SMOLLM2_DRAFT = {**SMOLLM2_135M, "num_hidden_layers": 4}

DEMO_TARGET = Path.home() / ".cache" / "trtspec" / "demo" / "target"
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "Triton serves the draft and the target; TensorRT-LLM builds their engines.",
    "A shared tokenizer maps every token id to the same text in both models.",
] * 4


def train_bpe_tokenizer(vocab_size: int = 300, specials: tuple[str, ...] = ("<|im_start|>", "<|im_end|>")):
    """A real (tiny) byte-level BPE tokenizer, trained in milliseconds on a fixed corpus (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def write_tokenizer(dest: Path, *, vocab_size: int | None = None, specials: tuple[str, ...] | None = None) -> int:
    """Real tokenizer files in `dest`: the demo target's (SmolLM2, 49152 tokens) when it is prepared and no
    particular vocabulary is asked for, else a tiny trained BPE one. Returns the tokenizer's number of tokens."""
    dest.mkdir(parents=True, exist_ok=True)
    if vocab_size is None and specials is None and (DEMO_TARGET / "tokenizer.json").is_file():
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (DEMO_TARGET / name).is_file():
                shutil.copy(DEMO_TARGET / name, dest / name)
    else:
        specials = specials or ("<|im_start|>", "<|im_end|>")
        tok = train_bpe_tokenizer(vocab_size or 300, specials)
        tok.save(str(dest / "tokenizer.json"))
        (dest / "tokenizer_config.json").write_text(
            json.dumps({"bos_token": specials[0], "eos_token": specials[-1], "tokenizer_class": "PreTrainedTokenizerFast"})
        )
    return tokenizer_identity(dest)[0] or 0


@functools.lru_cache(maxsize=8)
def _synthetic_tokenizer_json(vocab_size: int, n_special: int) -> bytes:
    base = vocab_size - n_special
    vocab = {f"t{i}": i for i in range(base)}
    added = [{"id": base + i, "content": f"<|special_{i}|>", "special": True} for i in range(n_special)]
    doc = {"version": "1.0", "added_tokens": added, "model": {"type": "BPE", "vocab": vocab, "merges": []}}
    return json.dumps(doc).encode()


def write_synthetic_tokenizer(dest: Path, vocab_size: int, n_special: int = 0) -> None:
    """A tokenizer.json with exactly `vocab_size` ids (the last `n_special` as added special tokens), for
    planning tests on large real configs (a 128k-token trained tokenizer would be slow to make)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer.json").write_bytes(_synthetic_tokenizer_json(vocab_size, n_special))


def write_safetensors(path: Path, tensors: dict[str, tuple[list[int], str]]) -> None:
    """A safetensors file with the given (shape, dtype) tensors; data bytes are zeros."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1}
    header, offset = {}, 0
    for name, (shape, dtype) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.write(b"\0" * offset)


def make_checkpoint(
    dest: Path,
    config: dict,
    *,
    tokenizer: str | Path | None = "synthetic",
    tokenizer_vocab: int | None = None,
) -> Path:
    """A HF checkpoint directory: config.json plus tokenizer files.

    tokenizer: "synthetic" (exact vocab size, fast), "bpe" (a real tiny trained tokenizer), a directory to
    copy tokenizer files from, or None (no tokenizer files)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer == "synthetic":
        write_synthetic_tokenizer(dest, tokenizer_vocab or config["vocab_size"], n_special=8)
    elif tokenizer == "bpe":
        write_tokenizer(dest, vocab_size=tokenizer_vocab or 300)  # a trained one, never the demo's
    elif tokenizer is not None:
        for f in Path(tokenizer).iterdir():
            if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "vocab.json", "merges.txt"):
                shutil.copy(f, dest / f.name)
    return dest


def example_config(name: str, checkpoints: dict[str, Path], **overrides) -> dict:
    """An example build config from build_configs/ as a dict, pointed at local checkpoints."""
    root = Path(__file__).resolve().parent.parent / "build_configs"
    data = yaml.safe_load((root / name).read_text())
    for role, p in checkpoints.items():
        data[role]["checkpoint"] = str(p)
    for dotted, value in overrides.items():
        node = data
        *parents, last = dotted.split("__")
        for k in parents:
            node = node.setdefault(k, {})
        node[last] = value
    return data


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def squash(text: str) -> str:
    """Output with line wrapping undone, for substring checks."""
    return re.sub(r"\s+", " ", text)


# ------------------------------------------------------------------------------------------- inspect


def test_llama_parameter_counts_from_config(tmp_path: Path) -> None:
    # Published sizes: Llama-3.1-70B 70.55B, Llama-3.1-8B 8.03B, Llama-3.2-1B 1.24B (tied), SmolLM2-135M 134.5M.
    expected = {
        "70b": (LLAMA_31_70B, 70_553_706_496),
        "8b": (LLAMA_31_8B, 8_030_261_248),
        "1b": (LLAMA_32_1B, 1_235_814_400),
        "smol": (SMOLLM2_135M, 134_515_008),
    }
    for name, (cfg, n) in expected.items():
        info = inspect_checkpoint(make_checkpoint(tmp_path / name, cfg, tokenizer=None))
        assert info.num_params == n, name
        assert info.params_source == "config"
        assert info.architecture == "LlamaForCausalLM" and info.model_type == "llama"
        assert info.torch_dtype == "bfloat16"
    one_b = inspect_checkpoint(tmp_path / "1b")
    assert one_b.tie_word_embeddings and one_b.head_dim == 64 and one_b.num_kv_heads == 8
    # A tied LM head is materialized by TensorRT-LLM: the engine holds one more vocab x hidden matrix.
    assert one_b.engine_params == one_b.num_params + 128256 * 2048
    # KV bytes per token: 2 (K,V) x layers x kv_heads x head_dim x bytes.
    assert inspect_checkpoint(tmp_path / "70b").kv_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2
    assert inspect_checkpoint(tmp_path / "70b").kv_bytes_per_token(2, tp=4) == 2 * 80 * 2 * 128 * 2
    assert inspect_checkpoint(tmp_path / "70b").kv_bytes_per_token(2, tp=16) == 2 * 80 * 1 * 128 * 2  # replicated


def test_parameter_count_falls_back_to_safetensors_headers(tmp_path: Path) -> None:
    d = make_checkpoint(tmp_path / "gpt", {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "vocab_size": 100}, tokenizer=None)
    write_safetensors(d / "model-00001-of-00002.safetensors", {"wte.weight": ([100, 64], "F32"), "h.0.w": ([64, 256], "BF16")})
    write_safetensors(d / "model-00002-of-00002.safetensors", {"h.1.w": ([256, 64], "BF16"), "ln.b": ([64], "F32")})
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"wte.weight": "model-00001-of-00002.safetensors", "h.0.w": "model-00001-of-00002.safetensors",
                                   "h.1.w": "model-00002-of-00002.safetensors", "ln.b": "model-00002-of-00002.safetensors"}})
    )  # fmt: skip
    info = inspect_checkpoint(d)
    assert info.params_source == "safetensors"
    assert info.num_params == 100 * 64 + 64 * 256 + 256 * 64 + 64
    assert read_safetensors_header(d / "model-00002-of-00002.safetensors")["h.1.w"]["shape"] == [256, 64]
    assert info.weights_bytes_on_disk > 0


def test_tokenizer_fingerprint_is_normalized(tmp_path: Path) -> None:
    a = tmp_path / "a"
    n = write_tokenizer(a)
    assert n > 0
    size_a, fp_a, files = tokenizer_identity(a)
    assert "tokenizer.json" in files and size_a == n and fp_a
    # Same tokenizer, different formatting and unrelated fields (normalizer, padding): same fingerprint.
    b = tmp_path / "b"
    b.mkdir()
    data = json.loads((a / "tokenizer.json").read_text())
    data["padding"] = {"strategy": "BatchLongest"}
    data["normalizer"] = None
    (b / "tokenizer.json").write_text(json.dumps(data, indent=4, sort_keys=True))
    assert tokenizer_identity(b)[1] == fp_a
    # Another vocabulary: another fingerprint.
    c = tmp_path / "c"
    write_tokenizer(c, vocab_size=280)
    assert tokenizer_identity(c)[1] != fp_a
    # A renamed special token changes it too.
    d = tmp_path / "d"
    write_tokenizer(d, specials=("<s>", "</s>"))
    assert tokenizer_identity(d)[1] != fp_a


def test_legacy_tokenizer_files_are_fingerprinted(tmp_path: Path) -> None:
    d = tmp_path / "gpt2style"
    d.mkdir()
    (d / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
    (d / "merges.txt").write_text("#version: 0.2\na b\n")
    size, fp, _ = tokenizer_identity(d)
    assert size == 3 and fp
    (d / "merges.txt").write_text("#version: 0.2\na b\n\n")  # whitespace only: same
    assert tokenizer_identity(d)[1] == fp
    assert tokenizer_identity(tmp_path)[1] is None  # no tokenizer files at all


def test_checkpoint_fingerprint_tracks_weights_and_config(tmp_path: Path) -> None:
    d = make_checkpoint(tmp_path / "m", SMOLLM2_DRAFT, tokenizer=None)
    write_safetensors(d / "model.safetensors", {"w": ([4, 4], "F32")})
    fp = checkpoint_fingerprint(d)
    assert checkpoint_fingerprint(d) == fp
    write_safetensors(d / "model.safetensors", {"w": ([4, 8], "F32")})
    assert checkpoint_fingerprint(d) != fp
    fp2 = checkpoint_fingerprint(d)
    (d / "config.json").write_text(json.dumps({**SMOLLM2_DRAFT, "num_hidden_layers": 5}))
    assert checkpoint_fingerprint(d) != fp2


# ------------------------------------------------------------------------------------------ pair check


def test_pair_check_accepts_a_matching_pair(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    write_tokenizer(tok)
    t = make_checkpoint(tmp_path / "t", {**SMOLLM2_135M, "vocab_size": tokenizer_identity(tok)[0]}, tokenizer=tok)
    d = make_checkpoint(tmp_path / "d", {**SMOLLM2_DRAFT, "vocab_size": tokenizer_identity(tok)[0]}, tokenizer=tok)
    r = check_pair(t, d)
    assert r.ok and not r.warnings, r.findings
    assert r.target.tokenizer_fingerprint == r.draft.tokenizer_fingerprint


def test_pair_check_vocab_mismatch_names_both_sizes(tmp_path: Path) -> None:
    t = make_checkpoint(tmp_path / "t", SMOLLM2_135M)
    d = make_checkpoint(tmp_path / "d", {**SMOLLM2_DRAFT, "vocab_size": 32000})
    r = check_pair(t, d)
    assert not r.ok
    assert any("draft vocab_size 32000 != target vocab_size 49152" in e for e in r.errors)
    assert ("error", "vocab-mismatch") in [(lvl, code) for lvl, code, _ in r.findings]


def test_pair_check_tokenizer_mismatch(tmp_path: Path) -> None:
    t = make_checkpoint(tmp_path / "t", {**SMOLLM2_135M, "vocab_size": 300}, tokenizer="bpe", tokenizer_vocab=300)
    d = make_checkpoint(tmp_path / "d", {**SMOLLM2_DRAFT, "vocab_size": 300}, tokenizer="bpe", tokenizer_vocab=290)
    r = check_pair(t, d)
    codes = [c for _, c, _ in r.findings]
    assert "tokenizer-mismatch" in codes
    assert any("tokenizers differ" in e for e in r.errors)


def test_pair_check_warnings_large_draft_and_padded_vocab(tmp_path: Path) -> None:
    # Qwen2.5-style padding: config vocab 151936, tokenizer 151665 tokens.
    t = make_checkpoint(tmp_path / "t", {**LLAMA_31_8B, "vocab_size": 151936}, tokenizer_vocab=151665)
    d = make_checkpoint(tmp_path / "d", {**LLAMA_31_8B, "num_hidden_layers": 16, "vocab_size": 151936}, tokenizer_vocab=151665)
    r = check_pair(t, d, use_draft_logits=True)
    assert r.ok  # warnings only
    codes = [c for _, c, _ in r.findings]
    assert "draft-too-large" in codes and "padded-vocab" in codes
    padded = next(m for _, c, m in r.findings if c == "padded-vocab")
    assert "151936" in padded and "151665" in padded
    assert "Incompatible buffer sizes" in padded and "use_draft_logits" in padded and "false" in padded


def test_pair_check_missing_tokenizer_is_a_warning(tmp_path: Path) -> None:
    t = make_checkpoint(tmp_path / "t", SMOLLM2_135M, tokenizer=None)
    d = make_checkpoint(tmp_path / "d", SMOLLM2_DRAFT, tokenizer=None)
    r = check_pair(t, d)
    assert r.ok and [c for _, c, _ in r.findings] == ["tokenizer-missing", "tokenizer-missing"]


# ------------------------------------------------------------------------------------------- doctor


def _reference_config(tmp_path: Path, target: Path, draft: Path, **extra) -> Path:
    data = {
        "name": "pair",
        "engine": "reference",
        "device": "cpu",
        "target": {"checkpoint": str(target), "dtype": "float32"},
        "draft": {"checkpoint": str(draft), "dtype": "float32"},
        **extra,
    }
    return write_config(tmp_path / "pair.yaml", data)


def test_doctor_reports_the_pair_and_the_machine(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    n = write_tokenizer(tok)
    t = make_checkpoint(tmp_path / "t", {**SMOLLM2_135M, "vocab_size": n}, tokenizer=tok)
    d = make_checkpoint(tmp_path / "d", {**SMOLLM2_DRAFT, "vocab_size": n}, tokenizer=tok)
    res = CliRunner().invoke(cli, ["doctor", str(_reference_config(tmp_path, t, d))], catch_exceptions=False)
    out = squash(res.output)
    assert res.exit_code == 0, res.output
    assert "LlamaForCausalLM" in out and "Model pair" in out and "tokenizer fingerprint" in out
    assert tokenizer_identity(tok)[1][:16] in out
    assert "Machine" in out and "tritonserver" in out and "trtllm-build" in out
    # the demo-shaped pair (draft under a third of the target, same tokenizer) has nothing to warn about
    assert "no problems found" in out and "ok (0 warning(s))" in out


def test_doctor_fails_on_vocab_mismatch_naming_both_sizes(tmp_path: Path) -> None:
    t = make_checkpoint(tmp_path / "t", SMOLLM2_135M)
    d = make_checkpoint(tmp_path / "d", {**SMOLLM2_DRAFT, "vocab_size": 32000})
    res = CliRunner().invoke(cli, ["doctor", str(_reference_config(tmp_path, t, d))])
    assert res.exit_code == 1
    out = squash(res.output)
    assert "draft vocab_size 32000 != target vocab_size 49152" in out
    assert "vocab-mismatch" in out
    assert "Traceback" not in res.output


def test_doctor_fails_on_typo_key_naming_it(tmp_path: Path) -> None:
    t = make_checkpoint(tmp_path / "t", SMOLLM2_135M)
    d = make_checkpoint(tmp_path / "d", SMOLLM2_DRAFT)
    cfg = _reference_config(tmp_path, t, d, speculative={"max_draft_lenght": 4})
    res = CliRunner().invoke(cli, ["doctor", str(cfg)])
    assert res.exit_code == 1
    out = squash(res.output)
    assert "speculative.max_draft_lenght" in out and "unknown key" in out
    assert "Traceback" not in res.output


def test_doctor_with_synthetic_gpus_reports_them(tmp_path: Path) -> None:
    t = make_checkpoint(tmp_path / "t", LLAMA_31_8B)
    d = make_checkpoint(tmp_path / "d", LLAMA_32_1B)
    cfg = write_config(
        tmp_path / "h100.yaml", example_config("llama-3.1-8b_llama-3.2-1b_h100.yaml", {"target": t, "draft": d})
    )
    res = CliRunner().invoke(cli, ["doctor", str(cfg), "--gpus", "h100x1", "-o", str(tmp_path / "out")])
    out = squash(res.output)
    assert "NVIDIA H100 80GB HBM3" in out and "9.0" in out and "synthetic" in out
    assert "kv_cache_free_gpu_mem_fraction" in out
    # This machine has no TensorRT-LLM: doctor says so and exits 1.
    if shutil.which("trtllm-build") is None:
        assert res.exit_code == 1 and "trtllm-build-missing" in out


def test_doctor_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    cfg = _reference_config(tmp_path, tmp_path / "nope", tmp_path / "nope2")
    res = CliRunner().invoke(cli, ["doctor", str(cfg)])
    assert res.exit_code == 1
    assert "target.checkpoint" in squash(res.output) and "directory not found" in squash(res.output)
    assert "Traceback" not in res.output


@pytest.mark.parametrize("spec", ["h200x8"])
def test_doctor_help_teaches(spec: str) -> None:
    res = CliRunner().invoke(cli, ["doctor", "--help"])
    assert res.exit_code == 0
    assert "no NVIDIA driver" in res.output and "--gpus" in res.output and spec[:4] in res.output
