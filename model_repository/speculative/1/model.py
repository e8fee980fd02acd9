"""The speculative loop model (`speculative`, and `baseline_loop` with drafting off): an adapter.
The logic is trtspec.triton.loop_model.LoopModel (token ids, or text as NVIDIA's tensorrt_llm_bls takes it)."""

import triton_python_backend_utils as pb_utils

from trtspec.triton.loop_model import LoopModel


class TritonPythonModel:
    def initialize(self, args):
        self.model = LoopModel(pb_utils, args)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        self.model.finalize()
