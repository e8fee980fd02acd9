"""Text to token ids with the target's tokenizer (offline; trtspec.text), as NVIDIA's preprocessing model: a batch
of QUERY rows, stop/bad words, embedding-bias words, end and pad ids. Inputs it cannot serve (decoder queries,
images, video, prompt tables) are refused by name. A bad request gets an error, not a crash."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec import triton_io as io
from trtspec.text import TextCodec

SERVED = {"QUERY", "REQUEST_OUTPUT_LEN", "BAD_WORDS_DICT", "STOP_WORDS_DICT", "EMBEDDING_BIAS_WORDS",
          "EMBEDDING_BIAS_WEIGHTS", "END_ID", "PAD_ID"}


def _rows(a, n):
    """A [batch, ...] input as n rows (None when absent)."""
    return [None] * n if a is None else [a[i] for i in range(n)]


def _pad(rows, fill):
    width = max(1, max(len(r) for r in rows))
    return np.array([list(r) + [fill] * (width - len(r)) for r in rows], dtype=np.int32)


class TritonPythonModel:
    def initialize(self, args):
        p = io.model_parameters(args)
        self.codec = TextCodec(p["tokenizer_dir"],
                               add_special_tokens=p.get("add_special_tokens", "false").lower() == "true")
        self.refused = [t["name"] for t in json.loads(args["model_config"])["input"] if t["name"] not in SERVED]

    def _one(self, request):
        for name in self.refused:
            if io.tensor(pb_utils, request, name) is not None:
                raise io.RequestError(f"{name}: not served by trtspec (text-only decoder models); leave {name} out")
        query = io.tensor(pb_utils, request, "QUERY")
        n = query.shape[0]
        get = lambda name: _rows(io.tensor(pb_utils, request, name), n)  # noqa: E731
        text = lambda v: io.utf8(v, "QUERY") if isinstance(v, bytes) else str(v)  # noqa: E731
        words = lambda row, name: [io.utf8(w, name) if isinstance(w, bytes) else str(w)  # noqa: E731
                                   for w in ([] if row is None else row.reshape(-1))]
        ids, stops, bads, biases = [], [], [], []
        for i, (q, stop, bad, bw, bwt) in enumerate(zip(query, get("STOP_WORDS_DICT"), get("BAD_WORDS_DICT"),
                                                         get("EMBEDDING_BIAS_WORDS"), get("EMBEDDING_BIAS_WEIGHTS"))):
            ids.append(self.codec.encode_prompt(text(q.reshape(-1)[0]), "QUERY"))
            stops.append(io.to_words_list(self.codec.encode_words(words(stop, "STOP_WORDS_DICT"), "stop_words"))[0])
            bads.append(io.to_words_list(self.codec.encode_words(words(bad, "BAD_WORDS_DICT"), "bad_words"))[0])
            weights = [] if bwt is None else bwt.reshape(-1).tolist()
            biases.append(self.codec.embedding_bias(words(bw, "EMBEDDING_BIAS_WORDS"), weights) or [])
        end = [self.codec.end_id if v is None else int(v.reshape(-1)[0]) for v in get("END_ID")]
        pad = [self.codec.pad_id if v is None else int(v.reshape(-1)[0]) for v in get("PAD_ID")]
        out_len = io.tensor(pb_utils, request, "REQUEST_OUTPUT_LEN").reshape(n, -1).astype(np.int32)
        none = lambda v: -1 if v is None else v  # noqa: E731

        def words_batch(rows):
            width = max(r.shape[-1] for r in rows)
            padded = [np.pad(r, ((0, 0), (0, width - r.shape[-1])), constant_values=-1) for r in rows]
            return np.stack(padded).astype(np.int32)

        width = max(len(b) for b in biases)
        bias = np.array([b + [0.0] * (width - len(b)) for b in biases], dtype=np.float32).reshape(n, width)
        tensors = {
            "INPUT_ID": _pad(ids, pad[0] if pad[0] is not None else 0),
            "REQUEST_INPUT_LEN": np.array([[len(x)] for x in ids], dtype=np.int32),
            "REQUEST_OUTPUT_LEN": out_len,
            "STOP_WORDS_IDS": words_batch(stops),
            "BAD_WORDS_IDS": words_batch(bads),
            "EMBEDDING_BIAS": bias,
            "OUT_END_ID": np.array([[none(v)] for v in end], dtype=np.int32),
            "OUT_PAD_ID": np.array([[none(v)] for v in pad], dtype=np.int32),
        }
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except io.RequestError as e:
                responses.append(pb_utils.InferenceResponse(error=io.error(pb_utils, e)))
            except Exception as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocessing: {e}")))
        return responses
