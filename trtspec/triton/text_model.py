"""The text endpoints (`ensemble`, and `baseline` with drafting off) as one decoupled Python BLS model.

Text in, text out, with the request interface of NVIDIA's ensemble (trtspec.contract.REQUEST_FIELDS): it
tokenizes in-process (trtspec.text, as the `preprocessing` model does), runs the speculative loop in-process
(the engines are BLS calls, as in the `speculative` model) and detokenizes each chunk in-process. Being one
model rather than an ensemble of three, a client's cancellation (an explicit gRPC cancel, a closed SSE
connection, a dropped client) reaches the loop, which stops within one target call; Triton's ensemble
scheduler does not pass cancellation on to a decoupled step.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from trtspec import triton_io as io
from trtspec.contract import REQUEST_FIELDS
from trtspec.loop import LoopRequest, Step
from trtspec.text import TextCodec
from trtspec.triton.loop_model import PREFIX_WINDOW, LoopModel, loop_request, response_tensors


class TextModel(LoopModel):
    def __init__(self, pb_utils: Any, args: Mapping[str, Any]):
        super().__init__(pb_utils, args)
        p = io.model_parameters(args)
        self.codec = TextCodec(
            p["tokenizer_dir"],
            add_special_tokens=p.get("add_special_tokens", "false").lower() == "true",
            skip_special_tokens=p.get("skip_special_tokens", "true").lower() == "true",
        )

    def parse(self, request: Any) -> LoopRequest:
        get = lambda name, default=None: io.scalar(self.pb, request, name, default)  # noqa: E731
        return loop_request(
            self.codec.encode_prompt(get("text_input")),
            int(get("max_tokens", 0)),
            get("end_id", self.codec.end_id),
            get("pad_id", self.codec.pad_id),
            {f.name: get(f.name) for f in REQUEST_FIELDS if f.loop_input is not None},
            **{name: self.codec.encode_words(io.strings(self.pb, request, name), name) for name in ("stop_words", "bad_words")},
        )

    def response_tensors(self, tokens: list[int], before: list[int], chunk: Step) -> dict[str, np.ndarray]:
        out = response_tensors(tokens, before, chunk)
        del out["prefix_ids"]
        text = self.codec.decode_chunk(before[-PREFIX_WINDOW:], tokens)
        out["text_output"] = np.array([[text.encode("utf-8")]], dtype=np.object_)
        return out
