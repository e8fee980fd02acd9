"""Token ids to text, as NVIDIA's postprocessing model: TOKENS_BATCH [batch, beam, tokens] with SEQUENCE_LENGTH
[batch, beam] -> OUTPUT [batch, beam], each beam's first SEQUENCE_LENGTH tokens decoded.

Incremental and stateless for streamed chunks: with PREFIX_IDS (the tokens generated before the chunk) the text
of a chunk is decode(prefix + chunk) minus decode(prefix), where an unfinished multi-byte character at the end of
either is held back (it is completed by a later chunk), so streamed text concatenates to the whole output's text.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec import triton_io as io
from trtspec.detokenize import chunk_text


class TritonPythonModel:
    def initialize(self, args):
        from trtspec.text import load_tokenizer

        p = io.model_parameters(args)
        self.tokenizer = load_tokenizer(p["tokenizer_dir"])
        self.skip_special = p.get("skip_special_tokens", "true").lower() == "true"

    def _one(self, request):
        tokens = io.tensor(pb_utils, request, "TOKENS_BATCH")
        tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])
        lengths = io.tensor(pb_utils, request, "SEQUENCE_LENGTH").reshape(tokens.shape[0], -1)
        prefix = io.tensor(pb_utils, request, "PREFIX_IDS")
        out = []
        for b in range(tokens.shape[0]):
            before = [] if prefix is None else prefix[b].reshape(-1).tolist()
            row = []
            for beam in range(tokens.shape[1]):
                new = tokens[b, beam, : int(lengths[b, beam])].tolist()
                row.append(chunk_text(self.tokenizer, before, new, self.skip_special).encode("utf-8"))
            out.append(row)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", np.array(out, dtype=np.object_))])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except Exception as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {e}")))
        return responses
