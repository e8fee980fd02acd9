"""Text to token ids with the target's tokenizer (offline). A bad request gets an error, not a crash."""

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec import triton_io as io


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        p = io.model_parameters(args)
        self.tokenizer = AutoTokenizer.from_pretrained(p["tokenizer_dir"])
        self.add_special_tokens = p.get("add_special_tokens", "false").lower() == "true"
        self.end_id = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.end_id

    def _words(self, request, name):
        a = io.tensor(pb_utils, request, name)
        words = [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in ([] if a is None else a.reshape(-1))]
        seqs = [self.tokenizer.encode(w, add_special_tokens=False) for w in words if w]
        return io.to_words_list([s for s in seqs if s])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                text = io.scalar(pb_utils, request, "QUERY", "")
                if not text or not text.strip():
                    raise io.RequestError("text_input is empty")
                ids = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)
                out_len = io.scalar(pb_utils, request, "REQUEST_OUTPUT_LEN", 0)
                end_id = io.scalar(pb_utils, request, "END_ID", self.end_id)
                pad_id = io.scalar(pb_utils, request, "PAD_ID", self.pad_id)
                i32 = lambda v: np.array([[v]], dtype=np.int32)  # noqa: E731
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor("INPUT_ID", np.array([ids], dtype=np.int32)),
                            pb_utils.Tensor("REQUEST_INPUT_LEN", i32(len(ids))),
                            pb_utils.Tensor("REQUEST_OUTPUT_LEN", i32(out_len)),
                            pb_utils.Tensor("STOP_WORDS_IDS", self._words(request, "STOP_WORDS_DICT")),
                            pb_utils.Tensor("BAD_WORDS_IDS", self._words(request, "BAD_WORDS_DICT")),
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
