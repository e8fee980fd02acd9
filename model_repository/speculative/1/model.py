"""The loop models (`speculative`, `baseline_loop`) and the text endpoints (`ensemble`, `baseline`): an adapter.
The logic is trtspec.triton.loop_model.LoopModel (token ids, or text as NVIDIA's ensemble and tensorrt_llm_bls take it)."""

import triton_python_backend_utils as pb_utils

from trtspec.triton.loop_model import LoopModel


class TritonPythonModel:
    def initialize(self, args):
        self.model = LoopModel(pb_utils, args)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        self.model.finalize()
