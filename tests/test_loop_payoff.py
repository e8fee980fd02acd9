"""The goodput controller (draft_length_policy adaptive) on real engines: the reference engine in-process, the
loop's own wall-clock costs. It steps aside from a draft that cannot pay and drafts where drafting is free and
accepted; whatever it picks, greedy output is the target's. No timing assertions: what is checked is what the
controller chose (draft_len_counts) and which engine calls it made."""

import pytest

from conftest import loop_settings

from trtspec.spec.loop import LoopRequest, SpeculativeLoop
from trtspec.reference_engine import ReferenceEngine, run_tensors
from trtspec.spec.estimates import Estimates


class Counted:
    """Tensor-level calls as the BLS makes them, counted per model."""

    def __init__(self, engines):
        self.engines, self.calls = engines, {name: 0 for name in engines}

    def __call__(self, model, t, wanted):
        self.calls[model] += 1
        return run_tensors(self.engines[model], t)


def _run(loop, **kw):
    chunks = list(loop.run(LoopRequest(**kw)))
    return [t for c in chunks for t in c.new_tokens], chunks[-1].stats


@pytest.fixture(scope="module")
def demo_untrained(demo_pair):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield {
        "tensorrt_llm": ReferenceEngine(demo_pair.target, device="cpu", dtype="float32"),
        "tensorrt_llm_draft": ReferenceEngine(demo_pair.draft_untrained, device="cpu", dtype="float32"),
    }
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tiny_target):
    return {"tensorrt_llm": ReferenceEngine(tiny_target, device="cpu", salt=1)}


def test_controller_steps_aside_from_the_untrained_draft(demo_pair, demo_untrained):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_pair.target))
    prompt = tok("Explain in two sentences why the sky is blue.")["input_ids"]
    base = SpeculativeLoop(loop_settings(draft_disabled=True), Counted(demo_untrained))
    want, _ = _run(base, prompt=prompt, max_tokens=40)

    estimates = Estimates()  # one deployment: the second request starts from what the first learnt
    calls = Counted(demo_untrained)
    spec = SpeculativeLoop(loop_settings(draft_length_policy="adaptive", num_draft_tokens=3), calls, estimates=estimates)
    for _ in range(2):
        calls.calls = dict.fromkeys(calls.calls, 0)
        got, stats = _run(spec, prompt=prompt, max_tokens=40, draft_source="model")
        assert got == want
        counts = stats.draft_len_counts
        assert sum(counts) == stats.num_iterations == calls.calls["tensorrt_llm"]
        # k = 0 unless probing (one in probe_every + 1 iterations at most), and a probe is one token
        assert counts[0] >= stats.num_iterations * 0.75 and sum(counts[2:]) == 0
        # an iteration at k = 0 makes no draft-engine call
        assert calls.calls["tensorrt_llm_draft"] == sum(counts[1:]) == stats.num_drafts
    assert estimates.reached[0, 0] > 0 and estimates.accepted[0, 0] / estimates.reached[0, 0] < 0.3


def test_controller_drafts_where_prompt_lookup_is_accepted(tiny):
    # the tiny random model soon repeats itself, so prompt lookup finds what it generates next, at no engine step.
    # Streamed: the alternative to a draft is a one-token call (not streamed it is a run of up to 16 tokens in one
    # call, which on a model this small costs less per token than any verify: the controller rightly takes runs)
    base = SpeculativeLoop(loop_settings(draft_disabled=True), Counted(tiny))
    settings = loop_settings(draft_length_policy="adaptive", draft_source="ngram", num_draft_tokens=4)
    spec = SpeculativeLoop(settings.model_copy(update={"draft_model": None}), Counted(tiny), estimates=Estimates())
    prompt = [0, 3, 4, 5, 3, 4]
    want, _ = _run(base, prompt=prompt, max_tokens=150)
    got, stats = _run(spec, prompt=prompt, max_tokens=150, stream=True)
    assert got == want
    assert stats.acceptance_rate > 0.8
    assert sum(stats.draft_len_counts[2:]) > stats.num_iterations / 2  # it drafts, and more than one token


def test_zero_draft_tokens_is_a_plain_loop(demo_untrained):
    calls = Counted(demo_untrained)
    spec = SpeculativeLoop(loop_settings(draft_length_policy="adaptive"), calls)
    _, stats = _run(spec, prompt=[1, 2, 3, 4], max_tokens=12, num_draft_tokens=0, draft_source="hybrid")
    assert calls.calls["tensorrt_llm_draft"] == 0 and stats.draft_len_counts == [stats.num_iterations]


def test_a_request_learns_its_prompt_lookups_pay_without_drafting_them(demo_pair, demo_untrained, monkeypatch):
    # The deployment's prompt lookups were rejected (chat requests, primed below); this request copies a passage,
    # so its lookups are right. The loop scores each lookup it did not draft against what the target then
    # produced, so the request starts drafting them within a few tokens instead of waiting for probes.
    from transformers import AutoTokenizer

    from trtspec.config import AdaptivePolicy
    from trtspec.spec.drafters import ESTIMATE_KEYS, estimate_key
    from trtspec.spec.controller import GoodputController

    tok = AutoTokenizer.from_pretrained(str(demo_pair.target))
    passage = "The quick brown fox jumps over the lazy dog near the river bank at dawn."
    text = tok.apply_chat_template([{"role": "user", "content": f"Repeat this sentence three times: {passage}"}],
                                   add_generation_prompt=True, tokenize=False)
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    want, _ = _run(SpeculativeLoop(loop_settings(draft_disabled=True), Counted(demo_untrained)), prompt=prompt,
                   max_tokens=48)

    def accepted(score: bool) -> tuple[int, float]:
        estimates = Estimates()
        primer = GoodputController(estimates, AdaptivePolicy())
        for _ in range(30):
            primer.record(1, None, 0, 0, 0.070)
            for level in range(1, 4):
                primer.record(1, estimate_key("ngram", level), 4, 0, 0.140)
        if not score:
            monkeypatch.setattr(GoodputController, "observe", lambda *a, **kw: None)
        # the loop's own timings are not recorded, so the primed costs stay: what the controller chooses depends on
        # the tokens, not on how busy the machine is (or how warm: run alone, the first calls are slower)
        record = GoodputController.record
        monkeypatch.setattr(GoodputController, "record",
                            lambda self, load, key, proposed, accepted, *timings, **kw: record(self, load, key, proposed,
                                                                                         accepted, None, None))
        settings = loop_settings(draft_length_policy="adaptive", num_draft_tokens=4)
        spec = SpeculativeLoop(settings, Counted(demo_untrained), estimates=estimates)
        got, stats = _run(spec, prompt=prompt, max_tokens=48, draft_source="ngram")
        monkeypatch.undo()
        assert got == want
        i = ESTIMATE_KEYS.index(estimate_key("ngram", 3))
        return stats.total_accepted_draft_tokens, estimates.accepted[i, 0] / estimates.reached[i, 0]

    (scored, learnt), (unscored, stuck) = accepted(True), accepted(False)
    # what the deployment now believes of 3-token lookups, and what the request gained from believing it early
    assert learnt > 2 * stuck and scored > 2 * unscored, (learnt, stuck, scored, unscored)


def test_the_controller_asks_eagle3_in_the_target_for_full_drafts_only_when_it_may_use_them(demo_pair):
    # EAGLE-3 drafting inside the target: each call drafts for the next one as asked. Where the demo head does not
    # pay, the controller takes plain steps, and those must not pay for the head at all: through a k = 0 stretch
    # the target is asked for no draft (the engine then does no head work; it catches up when asked again).
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from trtspec.demo_pair import EAGLE3_ASSET_DIR

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = ReferenceEngine(demo_pair.target, device="cpu", dtype="float32", eagle3_head=EAGLE3_ASSET_DIR)
        asked: list[int] = []

        def call(model, t, wanted):
            n = t.get("next_draft_len")
            asked.append(0 if n is None else int(np.asarray(n).reshape(-1)[0]))
            return run_tensors(engine, t)

        tok = AutoTokenizer.from_pretrained(str(demo_pair.target))
        prompt = tok("Explain in two sentences why the sky is blue.")["input_ids"]
        base = SpeculativeLoop(loop_settings(draft_disabled=True).model_copy(update={"draft_model": None}), call)
        want, _ = _run(base, prompt=prompt, max_tokens=40)
        settings = loop_settings(method="eagle3", draft_length_policy="adaptive", num_draft_tokens=3)
        spec = SpeculativeLoop(settings.model_copy(update={"draft_model": None}), call, estimates=Estimates())
        asked.clear()
        got, stats = _run(spec, prompt=prompt, max_tokens=40, draft_source="model")
    finally:
        torch.set_num_threads(threads)
    assert got == want
    full = sum(n == 3 for n in asked)
    # full drafts: where the head drafted, and one call before each probe; a plain step asks for one token
    assert full <= stats.num_drafts + stats.num_iterations // 8 + 2, (asked, stats.draft_len_counts)
    plain = stats.draft_len_counts[0]
    assert asked.count(0) >= plain - stats.num_iterations // 8 - 2, (asked, stats.draft_len_counts)  # stretches ask none


def test_a_first_call_counts_its_prompt_among_the_tokens_in_the_step(tiny):
    # what a batching engine's steps are measured by: the tokens it computes at once. A request's first call has it
    # prefill the prompt, so a call in the same step runs in a step of that many more tokens (counted as 1, the steps
    # a prompt's catch-up is priced by read as costing far more than their tokens)
    counted = []

    class Spy(Estimates):
        def target_call(self, tokens):
            counted.append(tokens)
            return super().target_call(tokens)

    from trtspec.config import AdaptivePolicy

    for batched, first in ((None, 8), (False, 1)):  # a GPU's batching engine: the prompt; a CPU's: priced by load
        counted.clear()
        settings = loop_settings(draft_length_policy="adaptive", draft_source="ngram", num_draft_tokens=4,
                                 adaptive=AdaptivePolicy(batched_steps=batched))
        spec = SpeculativeLoop(settings.model_copy(update={"draft_model": None}), Counted(tiny), estimates=Spy())
        _, stats = _run(spec, prompt=[0, 3, 4, 5, 3, 4, 7, 8], max_tokens=24, stream=True)
        assert len(counted) == stats.num_iterations and counted[0] == first  # no draft on a first call
        assert all(1 <= c <= 5 for c in counted[1:])  # a token and its draft of at most 4
