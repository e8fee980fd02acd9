"""Shared fixtures: real models (a tiny one made here, the demo pair), real repositories, real servers."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def make_tiny_llama(path: Path, vocab: int = 12, layers: int = 2, seed: int = 0) -> Path:
    """A small random Llama the tests make themselves: real model code, milliseconds per forward."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # sharpen the output layer so distributions are far from uniform
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-target"), seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-draft"), layers=1, seed=1)


@pytest.fixture(scope="session")
def demo_pair():
    from trtspec.demo_pair import prepare_demo_pair

    return prepare_demo_pair()


def loop_settings(*, draft_disabled: bool = False, max_input_len: int = 2048, **speculative):
    """LoopSettings as a deployment would get them; `speculative` are build-config `speculative:` fields."""
    from trtspec.config import SpeculativeConfig
    from trtspec.loop import LoopSettings

    return LoopSettings(
        speculative=SpeculativeConfig(**speculative), max_input_len=max_input_len, draft_disabled=draft_disabled
    )


ECHO_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
ECHO_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def write_python_model(repo: Path, name: str, config: str, model_py: str) -> None:
    """A Python-backend model `name` (version 1) in the repository at `repo`."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(model_py))


def write_echo_repository(root: Path) -> Path:
    """A one-model repository (`echo`: Y = X) for tests of the server itself, not of the models."""
    write_python_model(root, "echo", ECHO_CONFIG, ECHO_MODEL)
    return root
