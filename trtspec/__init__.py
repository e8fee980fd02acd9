"""trtspec: speculative decoding (draft + target) served by Triton Inference Server."""

__version__ = "0.1.0"
