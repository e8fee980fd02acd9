"""The one place the llmapi Triton model gets the LLM API from: TensorRT-LLM where it is installed (GPU
machines, NVIDIA's containers), otherwise trtspec's CPU stand-in with the same subset of the API."""

from __future__ import annotations

import os

FORCE_STANDIN = "TRTSPEC_LLMAPI_STANDIN"  # "1": use the stand-in even where tensorrt_llm imports


def load_api():
    """(LLM, SamplingParams, implementation name, update_llm_args_with_extra_dict)."""
    if os.environ.get(FORCE_STANDIN) != "1":
        try:
            from tensorrt_llm import LLM, SamplingParams

            try:
                from tensorrt_llm.llmapi.llm_args import update_llm_args_with_extra_dict
            except ImportError:  # 1.0 / 1.1 keep it in llm_utils
                from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict
            return LLM, SamplingParams, "tensorrt_llm", update_llm_args_with_extra_dict
        except ImportError:
            pass
    from trtspec.llmapi.parser import update_llm_args_with_extra_dict
    from trtspec.llmapi.standin import LLM, SamplingParams

    return LLM, SamplingParams, "trtspec.llmapi.standin", update_llm_args_with_extra_dict


def load_guided_params():
    """The LLM API's GuidedDecodingParams, from where load_api takes the LLM."""
    if os.environ.get(FORCE_STANDIN) != "1":
        try:
            from tensorrt_llm.sampling_params import GuidedDecodingParams

            return GuidedDecodingParams
        except ImportError:
            pass
    from trtspec.llmapi.standin import GuidedDecodingParams

    return GuidedDecodingParams
