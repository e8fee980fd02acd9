"""Text to token ids with the target's tokenizer (offline; trtspec.text). A bad request gets an error, not a crash."""

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec import triton_io as io
from trtspec.text import TextCodec


class TritonPythonModel:
    def initialize(self, args):
        p = io.model_parameters(args)
        self.codec = TextCodec(p["tokenizer_dir"], add_special_tokens=p.get("add_special_tokens", "false").lower() == "true")

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                ids = self.codec.encode_prompt(io.scalar(pb_utils, request, "QUERY", ""))
                out_len = io.scalar(pb_utils, request, "REQUEST_OUTPUT_LEN", 0)
                end_id = io.scalar(pb_utils, request, "END_ID", self.codec.end_id)
                pad_id = io.scalar(pb_utils, request, "PAD_ID", self.codec.pad_id)
                stop = self.codec.encode_words(io.strings(pb_utils, request, "STOP_WORDS_DICT"), "stop_words")
                bad = self.codec.encode_words(io.strings(pb_utils, request, "BAD_WORDS_DICT"), "bad_words")
                i32 = lambda v: np.array([[v]], dtype=np.int32)  # noqa: E731
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor("INPUT_ID", np.array([ids], dtype=np.int32)),
                            pb_utils.Tensor("REQUEST_INPUT_LEN", i32(len(ids))),
                            pb_utils.Tensor("REQUEST_OUTPUT_LEN", i32(out_len)),
                            pb_utils.Tensor("STOP_WORDS_IDS", io.to_words_list(stop)),
                            pb_utils.Tensor("BAD_WORDS_IDS", io.to_words_list(bad)),
                            pb_utils.Tensor("OUT_END_ID", i32(-1 if end_id is None else end_id)),
                            pb_utils.Tensor("OUT_PAD_ID", i32(-1 if pad_id is None else pad_id)),
                        ]
                    )
                )
            except io.RequestError as e:
                responses.append(pb_utils.InferenceResponse(error=io.bad_request(pb_utils, e)))
            except Exception as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocessing: {e}")))
        return responses
