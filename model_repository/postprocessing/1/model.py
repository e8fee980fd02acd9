"""Token ids to text, incrementally and statelessly.

A streamed chunk arrives with the tokens generated before it (PREFIX_IDS). The text of the chunk is
decode(prefix + chunk) minus decode(prefix), where an unfinished multi-byte character at the end of
either is held back (it is completed by a later chunk), so streamed text concatenates to exactly the
text of the whole output.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec import triton_io as io
from trtspec.detokenize import chunk_text


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        p = io.model_parameters(args)
        self.tokenizer = AutoTokenizer.from_pretrained(p["tokenizer_dir"])
        self.skip_special = p.get("skip_special_tokens", "true").lower() == "true"

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                new = io.ids(pb_utils, request, "TOKENS_BATCH") or []
                prefix = io.ids(pb_utils, request, "PREFIX_IDS") or []
                text = chunk_text(self.tokenizer, prefix, new, self.skip_special)
                out = np.array([[text.encode("utf-8")]], dtype=np.object_)
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)]))
            except Exception as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {e}")))
        return responses
