"""Text to token ids and back with the target's tokenizer: what the `preprocessing` model and the text
endpoints (`ensemble`, `baseline`) do with a request's strings, in one place.

Bad input is refused with a RequestError naming the field (never silently altered): an empty prompt, a stop
or bad word that tokenizes to no tokens (it could never match).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from trtspec.contract import RequestError
from trtspec.detokenize import chunk_text


#: tokenizer classes that are the `tokenizers` library's fast tokenizer itself (transformers 4: the first, 5: both)
_FAST_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer(tokenizer_dir: str | Path) -> Any:
    """The tokenizer AutoTokenizer loads, without importing torch where the class is known from tokenizer_config.json:
    AutoTokenizer reads the model's config through transformers' configuration module, which imports torch (seconds
    of CPU and hundreds of MB in every model process that only tokenizes; measured in docs/benchmarks/faults.md)."""
    try:
        cls = json.loads((Path(tokenizer_dir) / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        cls = None
    if cls in _FAST_TOKENIZER_CLASSES:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


class TextCodec:
    def __init__(self, tokenizer_dir: str | Path, *, add_special_tokens: bool = False, skip_special_tokens: bool = True):
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.add_special_tokens = add_special_tokens
        self.skip_special_tokens = skip_special_tokens
        self.end_id: int | None = self.tokenizer.eos_token_id
        self.pad_id: int | None = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.end_id

    def encode_prompt(self, text: str | None, field: str = "text_input") -> list[int]:
        if not text or not text.strip():
            raise RequestError(f"{field} is empty")
        return self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)

    def encode_words(self, words: Iterable[str], field: str) -> list[list[int]]:
        """Stop or bad words to token sequences. Empty strings are skipped (NVIDIA's clients send "")."""
        out = []
        for w in words:
            if not w:
                continue
            ids = self.tokenizer.encode(w, add_special_tokens=False)
            if not ids:
                raise RequestError(f"{field}: {w!r} tokenizes to no tokens, so it could never match; remove it")
            out.append(ids)
        return out

    def embedding_bias(self, words: Sequence[str], weights: Sequence[float]) -> list[float] | None:
        """NVIDIA's preprocessing rule: each word's weight is added to the bias of every token of the word; one
        value per vocabulary entry. None when no words are given."""
        if len(words) != len(weights):
            raise RequestError(f"embedding_bias_words has {len(words)} entries and embedding_bias_weights {len(weights)}: "
                               "send one weight per word")
        if not words:
            return None
        bias = [0.0] * self.tokenizer.vocab_size
        for word, weight in zip(words, weights):
            for t in self.tokenizer.encode(word, add_special_tokens=False) if word else []:
                if t < len(bias):
                    bias[t] += float(weight)
        return bias

    def decode_chunk(self, prefix: Sequence[int], new: Sequence[int]) -> str:
        """The text `new` adds after `prefix` (trtspec.detokenize.chunk_text)."""
        return chunk_text(self.tokenizer, prefix, new, self.skip_special_tokens)
