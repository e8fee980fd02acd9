"""The demo EAGLE-3 head (and the Medusa heads, trained on the same generation run) never saw a prompt that trtspec
sends or that acceptance is measured on: the training prompts, rebuilt exactly as scripts/train_eagle3.py made them,
share no text, topic, instruction form or 4-word phrase of a form with the bench, the demo, the tests, the README or
the held-out set (trtspec/assets/eval/heldout_chat.jsonl), and the shipped provenance records that."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def overlap():
    spec = importlib.util.spec_from_file_location("eagle3_prompt_overlap", REPO / "scripts" / "eagle3_prompt_overlap.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("eagle3_prompt_overlap", mod)
    spec.loader.exec_module(mod)
    return mod


def test_no_project_prompt_meets_the_training_prompts(overlap):
    result = overlap.audit()
    assert result["training_prompts"] > 5000
    met = {name: {k: v for k, v in s.items() if k != "prompts" and v} for name, s in result["sets"].items()}
    assert not any(met.values()), f"prompts that meet the heads' training data (pick another prompt): {met}"
    assert {"bench:chat", "bench:grounded", "demo", "tests", "readme", "heldout"} <= set(result["sets"])


def test_the_audit_sees_a_prompt_in_a_training_form(overlap, monkeypatch):
    form = overlap._training_module().FORMS[0]
    planted = form.format(t="a topic nobody trained on")
    real = overlap.project_prompts
    monkeypatch.setattr(overlap, "project_prompts", lambda: dict(real(), planted=[planted]))
    assert not overlap.disjoint(overlap.audit())


def test_the_shipped_heads_record_it():
    for head in ("demo_eagle3", "demo_medusa"):
        info = json.loads((REPO / "trtspec" / "assets" / head / "provenance.json").read_text())
        assert "eagle3_prompt_overlap" in json.dumps(info), head
    e3 = json.loads((REPO / "trtspec" / "assets" / "demo_eagle3" / "provenance.json").read_text())
    assert e3["prompt_overlap"]["disjoint_from_project_prompts"] is True
    assert e3["prompt_overlap"]["training_prompts"] == e3["data"]["sequences"]
