"""The adaptive loop skips a draft source that makes tokens slower, and keeps one that pays.

Engines here are test doubles on a virtual clock (the loop's only view of cost is wall time): a
deterministic "target" whose next token is a function of the sequence, and drafts that are either
right or wrong at a chosen cost. Real engines are covered in test_loop_reference_engine / test_serving.
"""

import numpy as np
import pytest

from trtspec import loop as loop_mod
from conftest import loop_settings

from trtspec.loop import LoopRequest, SpeculativeLoop


def next_token(seq):
    return (seq[-1] * 7 + len(seq)) % 50 + 1


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Engines:
    """Target: 40 ms a call + 2 ms per draft token verified. Draft: `draft_ms` per token, right or wrong."""

    def __init__(self, clock, draft_ms, draft_right):
        self.clock, self.draft_ms, self.draft_right = clock, draft_ms, draft_right
        self.calls = {"target": 0, "draft": 0}

    def __call__(self, model, t, wanted):
        seq = t["input_ids"].reshape(-1).tolist()
        n = int(t["request_output_len"].reshape(-1)[0])
        if model == "tensorrt_llm_draft":
            self.calls["draft"] += 1
            self.clock.now += self.draft_ms * n / 1e3
            out = list(seq)
            for _ in range(n):
                out.append(next_token(out) if self.draft_right else 0)
        else:
            self.calls["target"] += 1
            draft = t["draft_input_ids"].reshape(-1).tolist() if "draft_input_ids" in t else []
            self.clock.now += (40 + 2 * len(draft)) / 1e3
            out = list(seq)
            for d in draft:
                want = next_token(out)
                out.append(want)
                if d != want:
                    break
            else:
                out.append(next_token(out))
        return {"output_ids": np.array([[out]], dtype=np.int32), "sequence_length": np.array([[len(out)]])}


def _generate(engines, adaptive, k=4, tokens=120):
    loop = SpeculativeLoop(loop_settings(draft_length_policy="adaptive" if adaptive else "fixed", max_draft_len=8), engines)
    chunks = list(loop.run(LoopRequest(prompt=[1, 2, 3], max_tokens=tokens, num_draft_tokens=k)))
    return [t for c in chunks for t in c.new_tokens], chunks[-1].stats


def _expected(tokens):
    seq = [1, 2, 3]
    for _ in range(tokens):
        seq.append(next_token(seq))
    return seq[3:]


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(loop_mod.time, "perf_counter", c)
    return c


def test_a_draft_that_does_not_pay_is_skipped(clock):
    fixed = Engines(clock, draft_ms=10, draft_right=False)
    out, _ = _generate(fixed, adaptive=False)
    t_fixed = clock.now
    assert out == _expected(120) and fixed.calls["draft"] == fixed.calls["target"] - 1  # the last step has k = 0

    clock.now = 0.0
    adaptive = Engines(clock, draft_ms=10, draft_right=False)
    out, stats = _generate(adaptive, adaptive=True)
    assert out == _expected(120)
    # a few measured drafts, then only probes (every 8 iterations)
    assert adaptive.calls["draft"] < adaptive.calls["target"] / 4
    plain_time = 120 * 0.040
    assert clock.now < 1.15 * plain_time < t_fixed


def test_a_draft_that_pays_keeps_drafting(clock):
    eng = Engines(clock, draft_ms=2, draft_right=True)
    out, stats = _generate(eng, adaptive=True)
    assert out == _expected(120)
    # every iteration drafts except the plain steps the gate takes to measure the plain rate
    assert eng.calls["target"] - eng.calls["draft"] <= 3
    assert stats.mean_acceptance_length > 3
    assert clock.now < 0.5 * 120 * 0.040
