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
from trtspec.triton.loop_model import PREFIX_WINDOW, LoopModel, response_tensors


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
        prompt = self.codec.encode_prompt(get("text_input"))
        end_id, pad_id = get("end_id", self.codec.end_id), get("pad_id", self.codec.pad_id)
        values = {f.name: get(f.name) for f in REQUEST_FIELDS if f.loop_input is not None}
        values = {k: v for k, v in values.items() if v is not None and v != ""}
        words = {
            name: self.codec.encode_words(io.strings(self.pb, request, name), name) for name in ("stop_words", "bad_words")
        }
        return LoopRequest(
            prompt=prompt,
            max_tokens=int(get("max_tokens", 0)),
            end_id=None if end_id is None or end_id < 0 else end_id,
            pad_id=None if pad_id is None or pad_id < 0 else pad_id,
            **words,
            **values,
        )

    def response_tensors(self, tokens: list[int], before: list[int], chunk: Step) -> dict[str, np.ndarray]:
        out = response_tensors(tokens, before, chunk)
        del out["prefix_ids"]
        text = self.codec.decode_chunk(before[-PREFIX_WINDOW:], tokens)
        out["text_output"] = np.array([[text.encode("utf-8")]], dtype=np.object_)
        return out
