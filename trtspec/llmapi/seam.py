"""The one place the llmapi Triton model gets the LLM API from: TensorRT-LLM where it is installed (GPU
machines, NVIDIA's containers), otherwise trtspec's CPU stand-in with the same subset of the API."""

from __future__ import annotations

import os

FORCE_STANDIN = "TRTSPEC_LLMAPI_STANDIN"  # "1": use the stand-in even where tensorrt_llm imports


def load_api():
    """(LLM, SamplingParams, implementation name)."""
    if os.environ.get(FORCE_STANDIN) != "1":
        try:
            from tensorrt_llm import LLM, SamplingParams

            return LLM, SamplingParams, "tensorrt_llm"
        except ImportError:
            pass
    from trtspec.llmapi.standin import LLM, SamplingParams

    return LLM, SamplingParams, "trtspec.llmapi.standin"
