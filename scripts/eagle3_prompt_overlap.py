#!/usr/bin/env python
"""Where the demo EAGLE-3 head's training prompts meet the prompts trtspec sends (bench, demo, tests) and the
held-out evaluation set (trtspec/assets/eval/heldout_chat.jsonl): exact texts, topics and instruction forms.

The training prompts are rebuilt exactly as scripts/train_eagle3.py made them (make_jobs, seed 0, the first
--gen-limit jobs of provenance.json's replay command). Prints JSON; provenance.json records its result.

    python scripts/eagle3_prompt_overlap.py [--record]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import sys
import time
from argparse import Namespace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

HELDOUT = REPO / "trtspec" / "assets" / "eval" / "heldout_chat.jsonl"
PROVENANCE = REPO / "trtspec" / "assets" / "demo_eagle3" / "provenance.json"
CHAT_RE = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)


def _training_module():
    spec = importlib.util.spec_from_file_location("train_eagle3", REPO / "scripts" / "train_eagle3.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def training_prompts(limit: int | None = None) -> list[dict]:
    """The training jobs' texts in generation order: {"text", "kind", "topic", "form"} (make_jobs, tokenizer left out)."""
    mod = _training_module()
    if limit is None:
        replay = json.loads(PROVENANCE.read_text())["replay"]
        limit = int(re.search(r"--gen-limit (\d+)", replay).group(1))
    mod.encode_prompt = lambda tok, user, system_prompt: ("chat", user)
    mod._as_ids = lambda x: x
    fake_tok = lambda text: {"input_ids": ("plain", text)}  # noqa: E731
    jobs = mod.make_jobs(fake_tok, Namespace(**mod.JOB_DEFAULTS))[:limit]
    return [{"text": j["prompt"][1], "kind": j["kind"]} for j in jobs]


def training_forms() -> list[str]:
    mod = _training_module()
    return list(mod.FORMS) + list(mod.PLAIN_FORMS)


def training_topics() -> list[str]:
    return _training_module().train_topics()


def _user_text(text: str) -> str:
    m = CHAT_RE.search(text)
    return (m.group(1) if m else text).strip()


def _literal_prompts(path: Path) -> list[str]:
    """Prompt texts a Python file sends: CHAT.format(...) / chat(...) arguments and literals holding a chat turn."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            target = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
            if (name == "format" and target in ("CHAT", "TEMPLATE")) or name in ("chat", "chat_text"):
                a = node.args[0]
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    out.append(a.value)
                elif isinstance(a, ast.JoinedStr):
                    out.append("".join(v.value for v in a.values if isinstance(v, ast.Constant)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "<|im_start|>user" in node.value:
            out.append(_user_text(node.value))
    return [t for t in out if len(t.split()) >= 2 and "{" not in t]


def project_prompts() -> dict[str, list[str]]:
    """The user texts of every prompt set trtspec sends: the bench's built-in kinds, the demo's, the tests' and the
    README's examples (the held-out set excluded)."""
    from trtspec.bench.prompts import builtin_prompts

    sets = {f"bench:{p.kind}": [] for p in builtin_prompts()}
    for p in builtin_prompts():
        sets[f"bench:{p.kind}"].append(_user_text(p.text))
    from trtspec.commands import demo

    sets["demo"] = [demo.EXAMPLE_PROMPT] + sets["bench:grounded"] + sets["bench:chat"]
    tests = []
    for path in sorted((REPO / "tests").glob("*.py")):
        tests += _literal_prompts(path)
    sets["tests"] = sorted(set(tests))
    readme = (REPO / "README.md").read_text()
    sets["readme"] = sorted(set(re.findall(r'"content": "([^"]+)"', readme) + re.findall(r'content="([^"]+)"', readme)))
    return sets


def heldout_prompts() -> list[str]:
    return [json.loads(line)["user"] for line in HELDOUT.read_text().splitlines() if line.startswith("{")]


def _has_topic(text: str, topic: str) -> bool:
    t = topic.lower()
    t = t[4:] if t.startswith("the ") else t
    return re.search(rf"\b{re.escape(t)}\b", text.lower()) is not None


def _form_re(form: str) -> re.Pattern:
    parts = re.split(r"\{[tTp]\}", form)
    return re.compile(".+".join(re.escape(p) for p in parts), re.S | re.I)


def _shingles(text: str, n: int = 4) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z']+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def audit() -> dict:
    train = training_prompts()
    train_texts = {t["text"] for t in train}
    topics, forms = training_topics(), training_forms()
    form_res = [(f, _form_re(f)) for f in forms]
    form_shingles = set().union(*(_shingles(re.sub(r"\{[tTp]\}", " ", f)) for f in forms))
    out: dict = {"training_prompts": len(train), "training_topics": len(topics), "training_forms": len(forms), "sets": {}}
    sets = dict(project_prompts(), heldout=heldout_prompts())
    for name, texts in sets.items():
        exact = [t for t in texts if t in train_texts]
        by_topic = {t: [tp for tp in topics if _has_topic(t, tp)] for t in texts}
        by_form = {t: [f for f, r in form_res if r.fullmatch(t)] for t in texts}
        near_form = {t: sorted(" ".join(s) for s in _shingles(t) & form_shingles) for t in texts}
        out["sets"][name] = {
            "prompts": len(texts),
            "exact_training_prompt": exact,
            "sharing_a_training_topic": {t: v for t, v in by_topic.items() if v},
            "in_a_training_form": {t: v for t, v in by_form.items() if v},
            "sharing_4_words_with_a_training_form": {t: v for t, v in near_form.items() if v},
        }
    return out


def disjoint(result: dict) -> bool:
    """No prompt set shares a text, topic, form or 4-word phrase of a form with the training prompts."""
    return not any(v for s in result["sets"].values() for k, v in s.items() if k != "prompts")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", action="store_true", help="write the result into the head's provenance.json")
    args = ap.parse_args()
    result = audit()
    print(json.dumps(result, indent=1))
    if args.record:
        info = json.loads(PROVENANCE.read_text())
        info["prompt_overlap"] = {"command": "python scripts/eagle3_prompt_overlap.py --record",
                                  "measured": time.strftime("%Y-%m-%d"),
                                  "disjoint_from_project_prompts": disjoint(result), **result}
        PROVENANCE.write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
