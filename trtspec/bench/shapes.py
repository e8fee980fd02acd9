"""The GPUs and model shapes `trtspec simulate` knows without checkpoints: data only, with no imports, so that
`scripts/gpu_step_costs.py` reads them on a bare GPU image (trtspec's dependencies need not be there)."""

from __future__ import annotations

from typing import Any

# Memory bandwidth (bytes/s) and dense bf16 peak (FLOP/s) of the GPUs trtspec knows (trtspec.machine.KNOWN_GPUS),
# from NVIDIA's data sheets (SXM parts).
GPU_PEAKS: dict[str, tuple[float, float]] = {
    "h100": (3.35e12, 989e12),
    "h200": (4.8e12, 989e12),
    "a100": (2.04e12, 312e12),
    "l40s": (0.864e12, 362e12),
    "a10g": (0.6e12, 70e12),
    "b200": (8.0e12, 2250e12),
    "rtx4090": (1.008e12, 165e12),
}

# Public configs (config.json fields) of models the example build configs name, for a simulation without the
# checkpoints at hand.
KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False),
    "llama-3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True),
    "llama-3.1-70b": dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                          intermediate_size=28672, vocab_size=128256, tie_word_embeddings=False),
    "smollm2-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True),
}
