"""Incremental detokenization without state: the text a chunk of tokens adds after a prefix.

decode(prefix + chunk) minus decode(prefix). A partial UTF-8 sequence at the end of either decodes to
U+FFFD and is held back until a later chunk completes it, so the chunks of a stream concatenate to the
text of the whole output (which is held to the same rule).
"""

from __future__ import annotations

from typing import Any, Sequence

_INCOMPLETE = "\ufffd"


def chunk_text(tokenizer: Any, prefix: Sequence[int], new: Sequence[int], skip_special_tokens: bool = True) -> str:
    if not new:
        return ""
    decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens).rstrip(_INCOMPLETE)  # noqa: E731
    before = decode(prefix) if prefix else ""
    after = decode(list(prefix) + list(new))
    # byte-level BPE decodes prefixes to prefixes; guard the rare tokenizer that rewrites earlier text
    i = 0
    while i < min(len(before), len(after)) and before[i] == after[i]:
        i += 1
    return after[i:]
