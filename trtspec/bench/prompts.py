"""Prompts for `trtspec bench`: a built-in varied set, or a JSONL file.

Built-in kinds (8 prompts each):

* ``chat``: open questions, wrapped in the SmolLM2 / ChatML chat template
  (``<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n``).
* ``code``: the start of a source file (Python, shell, SQL, JS), completed as is: code completion.
* ``grounded``: a short passage plus an instruction to summarise, rewrite or extract from it (chat template).
  The answer reuses the passage's words, which is where drafting tends to pay most.

JSONL: one object per line, ``{"prompt": "...", "kind": "..."}`` (``kind`` optional, default ``custom``;
an optional ``id`` names the prompt in the per-request results). The prompt is sent as is: apply the
model's chat template yourself if it needs one. Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

KINDS = ("chat", "code", "grounded")


class PromptError(ValueError):
    """A prompt file or selection that cannot be used; the message is meant for the user."""


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: str
    text: str


def chat(user: str) -> str:
    """The SmolLM2-Instruct (ChatML) chat template for one user turn."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


_CHAT = (
    "What is the difference between weather and climate? Answer in a few sentences.",
    "Give me three tips for sleeping better.",
    "Explain what a black hole is to a ten-year-old.",
    "Why is the sky blue?",
    "Write a short, friendly email inviting my team to a picnic on Friday.",
    "What are the main causes of inflation?",
    "Suggest a name for a bakery that sells only bread, and say why.",
    "How do vaccines train the immune system?",
)

_CODE = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import json\n\n\ndef load_config(path):\n    \"\"\"Read a JSON config file and return it as a dict.\"\"\"\n",
    "class Stack:\n    \"\"\"A last-in, first-out stack.\"\"\"\n\n    def __init__(self):\n",
    "def is_prime(n: int) -> bool:\n",
    "#!/bin/bash\n# Back up the home directory into a dated tar.gz file\n",
    "-- The ten customers with the largest total order value\nSELECT",
    "function debounce(fn, delay) {\n",
    "def binary_search(items, target):\n    \"\"\"Return the index of target in the sorted list items, or -1.\"\"\"\n",
)

_PASSAGES = (
    "The Great Barrier Reef, off the coast of Queensland, Australia, is the world's largest coral reef system. "
    "It is made of almost 3,000 individual reefs and 900 islands stretching over 2,300 kilometres. The reef "
    "can be seen from outer space and is built by billions of tiny organisms known as coral polyps. Warming "
    "seas have caused several mass bleaching events since 1998.",
    "Ada Lovelace was an English mathematician born in 1815. She worked with Charles Babbage on his proposed "
    "Analytical Engine, a mechanical general-purpose computer. Her notes on the engine include what is often "
    "called the first computer program: an algorithm to compute Bernoulli numbers. She also saw that the "
    "machine could handle symbols as well as numbers.",
    "Our office will move to 12 Harbour Street on March 3. The old building closes at 5 pm on February 28, "
    "and nobody can enter it after that. Parking at the new site is free for the first month. Please pack "
    "your desk into the labelled boxes by February 27, and contact Maria Lopez with any questions.",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make "
    "glucose and oxygen. It takes place mainly in the leaves, inside cells that contain chloroplasts. The "
    "green pigment chlorophyll absorbs light energy, which drives the reactions. Almost all life on Earth "
    "depends on it, directly or indirectly.",
)

_GROUNDED_TASKS = (
    (0, "Summarise the following passage in two sentences."),
    (1, "Summarise the following passage in one sentence."),
    (2, "Rewrite the following notice in a more formal tone."),
    (3, "Rewrite the following passage for a young child."),
    (0, "List every number mentioned in the following passage, with what it measures."),
    (1, "Extract the names of all people mentioned in the following passage."),
    (2, "Extract every date and deadline from the following notice as a bulleted list."),
    (3, "Extract the inputs and outputs of the process described in the following passage."),
)


def builtin_prompts(kinds: Iterable[str] = KINDS) -> list[Prompt]:
    """The built-in prompts of the given kinds, interleaved (chat, code, grounded, chat, ...) so that any
    prefix of the list is still varied."""
    kinds = list(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise PromptError(f"unknown prompt kind(s) {', '.join(unknown)}; choose from {', '.join(KINDS)}")
    if not kinds:
        raise PromptError(f"no prompt kind selected; choose from {', '.join(KINDS)}")
    sets = {
        "chat": [chat(q) for q in _CHAT],
        "code": list(_CODE),
        "grounded": [chat(f"{task}\n\n{_PASSAGES[p]}") for p, task in _GROUNDED_TASKS],
    }
    out: list[Prompt] = []
    for i in range(max(len(sets[k]) for k in kinds)):
        for k in kinds:
            if i < len(sets[k]):
                out.append(Prompt(f"{k}-{i}", k, sets[k][i]))
    return out


def load_prompts(path: str | Path) -> list[Prompt]:
    """Prompts from a JSONL file (see the module docstring)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise PromptError(f"cannot read prompt file {path}: {e.strerror or e}") from None
    out: list[Prompt] = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise PromptError(f"{path}:{n}: not valid JSON ({e})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise PromptError(f'{path}:{n}: expected an object like {{"prompt": "...", "kind": "chat"}}')
        if not obj["prompt"]:
            raise PromptError(f"{path}:{n}: the prompt is empty")
        kind = obj.get("kind", "custom")
        if not isinstance(kind, str) or not kind:
            raise PromptError(f"{path}:{n}: kind must be a non-empty string")
        out.append(Prompt(str(obj.get("id", f"{path.stem}-{len(out)}")), kind, obj["prompt"]))
    if not out:
        raise PromptError(f"{path} holds no prompt")
    return out


def parse_kinds(spec: str | Sequence[str]) -> list[str]:
    """`chat,code` -> ["chat", "code"]; `all` -> every kind."""
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if items == ["all"]:
        return list(KINDS)
    unknown = [k for k in items if k not in KINDS]
    if unknown:
        raise PromptError(f"unknown prompt kind(s) {', '.join(unknown)}; choose from {', '.join(KINDS)} (or all)")
    return items
