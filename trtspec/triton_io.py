"""Reading and writing Triton tensors inside Python-backend models (used by every model.py we ship).

Kept free of `triton_python_backend_utils` at import time: the module is passed in, so the helpers
can be unit-tested without a server.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtspec.contract.errors import ErrorKind, RequestError, encode, kind_of

# Triton's code per kind where the Python backend has codes (a bad request: INVALID_ARG, HTTP 400 on Triton's own
# endpoints); the kind itself travels in the message (trtspec.contract.errors), which every client gets.
_CODES = {ErrorKind.BAD_REQUEST: "INVALID_ARG"}


def error(pb_utils: Any, error: BaseException, where: str = "") -> Any:
    """The TritonError of `error`, its kind encoded (trtspec.contract.errors); `where`: the model answering."""
    message = encode(error, where)
    code = getattr(pb_utils.TritonError, _CODES.get(kind_of(error), ""), None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


def tensor(pb_utils: Any, request: Any, name: str) -> np.ndarray | None:
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def scalar(pb_utils: Any, request: Any, name: str, default: Any = None) -> Any:
    """A [1]-shaped (or reshaped-to-[]) input as a Python scalar; `default` when absent."""
    a = tensor(pb_utils, request, name)
    if a is None or a.size == 0:
        return default
    v = a.reshape(-1)[0]
    if isinstance(v, bytes):
        return utf8(v, name)
    return v.item() if hasattr(v, "item") else v


def utf8(value: bytes, name: str) -> str:
    """Strict: text that is not valid UTF-8 is refused, never silently replaced."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"{name} is not valid UTF-8 ({e.reason} at byte {e.start}); send UTF-8 text") from None


def strings(pb_utils: Any, request: Any, name: str) -> list[str]:
    """A STRING input of any shape as a list of str (strict UTF-8); [] when absent."""
    a = tensor(pb_utils, request, name)
    if a is None:
        return []
    return [utf8(v, name) if isinstance(v, bytes) else str(v) for v in a.reshape(-1)]


def ids(pb_utils: Any, request: Any, name: str) -> list[int] | None:
    a = tensor(pb_utils, request, name)
    return None if a is None else a.reshape(-1).astype(np.int64).tolist()  # tolist: C speed, Python ints


def words_list(a: np.ndarray | None) -> list[list[int]]:
    """TensorRT-LLM's [2, n] words format (flat ids; exclusive end offsets, -1 padded) to sequences."""
    if a is None or a.size == 0:
        return []
    a = a.reshape(-1, 2, a.shape[-1])[0]
    flat, offsets = a[0].tolist(), [int(o) for o in a[1].tolist() if o >= 0]
    out, start = [], 0
    for end in offsets:
        if end > start:
            out.append([int(t) for t in flat[start:end]])
        start = end
    return out


def to_words_list(seqs: list[list[int]]) -> np.ndarray:
    """Sequences to the [1, 2, n] words tensor (inverse of words_list)."""
    flat = [t for s in seqs for t in s]
    offsets = list(np.cumsum([len(s) for s in seqs]).tolist()) if seqs else []
    n = max(1, len(flat))
    arr = np.full((1, 2, n), -1, dtype=np.int32)
    arr[0, 0, : len(flat)] = flat
    arr[0, 0, len(flat) :] = 0
    arr[0, 1, : len(offsets)] = offsets
    return arr


def model_parameters(args: dict) -> dict[str, str]:
    import json

    cfg = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
