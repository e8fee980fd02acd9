"""The text endpoints (`ensemble`, and `baseline` with drafting off): an adapter.
The logic is trtspec.triton.text_model.TextModel."""

import triton_python_backend_utils as pb_utils

from trtspec.triton.text_model import TextModel


class TritonPythonModel:
    def initialize(self, args):
        self.model = TextModel(pb_utils, args)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        self.model.finalize()
