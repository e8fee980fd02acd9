"""trtspec.text and trtspec.triton_io: what the text endpoints refuse (fast, no server)."""

from __future__ import annotations

import numpy as np
import pytest

from trtspec import triton_io as io
from trtspec.contract import RequestError
from trtspec.text import TextCodec


@pytest.fixture(scope="module")
def codec(tmp_path_factory):
    """A real word-level tokenizer (whitespace splits words, so a blank word has no tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, "hello": 2, "world": 3, "stop": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>").save_pretrained(path)
    return TextCodec(path)


def test_prompt_and_words(codec):
    assert codec.encode_prompt("hello world") == [2, 3]
    assert codec.encode_words(["stop", "", "hello world"], "stop_words") == [[4], [2, 3]]  # "" is skipped
    assert codec.end_id == 1 and codec.pad_id == 1


def test_a_word_with_no_tokens_is_refused_by_name(codec):
    with pytest.raises(RequestError, match=r"bad_words: '   ' tokenizes to no tokens"):
        codec.encode_words(["stop", "   "], "bad_words")


@pytest.mark.parametrize("text", ["", "  \n"])
def test_empty_prompt_is_refused(codec, text):
    with pytest.raises(RequestError, match="text_input is empty"):
        codec.encode_prompt(text)


class _Tensor:
    def __init__(self, a):
        self.a = a

    def as_numpy(self):
        return self.a


class _PbUtils:
    """Triton's get_input_tensor_by_name over a dict of arrays."""

    @staticmethod
    def get_input_tensor_by_name(request, name):
        return _Tensor(request[name]) if name in request else None


def test_strings_that_are_not_utf8_are_refused_not_replaced():
    req = {"text_input": np.array([[b"caf\xe9"]], dtype=np.object_), "stop_words": np.array([[b"ok", b"\xff"]], dtype=np.object_)}
    with pytest.raises(RequestError, match=r"text_input is not valid UTF-8 \(unexpected end of data at byte 3\)"):
        io.scalar(_PbUtils, req, "text_input")
    with pytest.raises(RequestError, match="stop_words is not valid UTF-8"):
        io.strings(_PbUtils, req, "stop_words")
    ok = {"text_input": np.array([["café".encode()]], dtype=np.object_)}
    assert io.scalar(_PbUtils, ok, "text_input") == "café"
