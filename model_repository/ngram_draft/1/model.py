"""The n-gram drafter with the draft engine's tensor contract: same inputs and outputs as
tensorrt_llm_draft, so the speculative loop needs no special case. It returns input + proposal; an
empty proposal (no match) makes the loop take a plain target step."""

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec import triton_io as io
from trtspec.ngram import propose


class TritonPythonModel:
    def initialize(self, args):
        p = io.model_parameters(args)
        self.n_max = int(p.get("ngram_max", "3"))
        self.n_min = int(p.get("ngram_min", "1"))

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                seq = io.ids(pb_utils, request, "input_ids") or []
                seq = seq[: int(io.scalar(pb_utils, request, "input_lengths", len(seq)))]
                k = int(io.scalar(pb_utils, request, "request_output_len", 0))
                tokens = np.asarray(seq + propose(seq, k, self.n_max, self.n_min), dtype=np.int32)
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor("output_ids", tokens.reshape(1, 1, -1)),
                            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
                        ]
                    )
                )
            except Exception as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"ngram_draft: {e!r}")))
        return responses
