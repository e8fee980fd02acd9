"""Guided decoding (trtspec.guided) in-process on the demo pair: the reference engine's masks are xgrammar's own
matcher's on the same tokens, every guided output follows its guide, and speculation under a guide (draft model,
prompt lookup) gives exactly the target-only tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import engine_call, loop_settings

from trtspec.contract import RequestError

xgr = pytest.importorskip("xgrammar")

from trtspec import guided  # noqa: E402
from trtspec.spec.loop import LoopRequest, LoopSettings, SpeculativeLoop  # noqa: E402
from trtspec.reference_engine import ReferenceEngine, request_from_tensors  # noqa: E402

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"},
                                           "capital": {"type": "boolean"}},
          "required": ["city", "population", "capital"]}
GUIDES = [
    ("json_schema", json.dumps(SCHEMA)),
    ("json", None),
    ("regex", r"(yes|no), because [a-z ]{5,30}\."),
    ("ebnf_grammar", 'root ::= "[" num ("," num)? "]"\nnum ::= [0-9] [0-9]? [0-9]?'),
]
PROMPT = ("<|im_start|>user\nDescribe Paris as JSON with the fields city, population and capital, then say yes. "
          "The JSON is {\"city\": \"Paris\", \"population\": 2100000, \"capital\": true}<|im_end|>\n"
          "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def pair(demo_pair, tmp_path_factory):
    from transformers import AutoTokenizer

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    info = guided.write_tokenizer_info(demo_pair.target, tmp_path_factory.mktemp("guided"))
    tok = AutoTokenizer.from_pretrained(str(demo_pair.target))
    engines = {
        "tensorrt_llm": ReferenceEngine(demo_pair.target, device="cpu", dtype="float32", salt=1,
                                        xgrammar_tokenizer_info=info),
        "tensorrt_llm_draft": ReferenceEngine(demo_pair.draft, device="cpu", dtype="float32", salt=2,
                                              xgrammar_tokenizer_info=info),
    }
    yield tok, engines, str(info)
    torch.set_num_threads(threads)


def _settings(info: str, vocab: int, **kw) -> LoopSettings:
    s = loop_settings(max_draft_len=8, **kw)
    return s.model_copy(update={"guided": guided.GuidedSettings(tokenizer_info=info, vocab_size=vocab)})


def _run(loop, **kw):
    chunks = list(loop.run(LoopRequest(**kw)))
    return [t for c in chunks for t in c.new_tokens], chunks[-1].stats


def _xgrammar_matcher(tok, guide_type, guide):
    """xgrammar's own matcher, built from the Hugging Face tokenizer directly (not from trtspec's tokenizer info)."""
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=49152)
    comp = xgr.GrammarCompiler(info)
    compiled = {"json": lambda: comp.compile_builtin_json_grammar(),
                "json_schema": lambda: comp.compile_json_schema(guide),
                "regex": lambda: comp.compile_regex(guide),
                "ebnf_grammar": lambda: comp.compile_grammar(guide)}[guide_type]()
    return xgr.GrammarMatcher(compiled)


@pytest.mark.parametrize("guide_type,guide", GUIDES[:3])
def test_engine_masks_are_xgrammars_on_the_same_tokens(pair, guide_type, guide):
    """The reference engine's greedy guided output: at every position its token is the argmax of the raw logits
    over exactly the tokens xgrammar's own matcher allows there, and the output ends where the grammar does."""
    tok, engines, _ = pair
    eng = engines["tensorrt_llm"]
    prompt = tok.encode(PROMPT)
    res = eng.run(request_from_tensors(_tensors(prompt, 40, guide_type, guide, tok.eos_token_id).get))
    new = res.new_tokens
    assert new, "no output"
    m = _xgrammar_matcher(tok, guide_type, guide)
    bits = xgr.allocate_token_bitmask(1, 49152)
    seq = list(prompt)
    for t in new:
        raw = eng.run(request_from_tensors(_tensors(seq, 1, None, None, tok.eos_token_id, logits=True).get))
        logits = raw.generation_logits[0].copy()
        m.fill_next_token_bitmask(bits)
        allowed = np.unpackbits(bits.numpy().reshape(-1).view(np.uint8), bitorder="little")[:49152].astype(bool)
        logits[~allowed] = -np.inf
        assert int(logits.argmax()) == t
        assert m.accept_token(t)
        seq.append(t)
    if len(new) < 40:  # it ended: the grammar could end there
        assert m.accept_token(tok.eos_token_id) and m.is_terminated()


def _tensors(ids, n, guide_type, guide, end_id, logits=False):
    t = {"input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
         "request_output_len": np.array([[n]], dtype=np.int32), "end_id": np.array([[end_id]], dtype=np.int32)}
    if guide_type:
        t["guided_decoding_guide_type"] = np.array([[guide_type.encode()]], dtype=object)
    if guide:
        t["guided_decoding_guide"] = np.array([[guide.encode()]], dtype=object)
    if logits:
        t["return_generation_logits"] = np.array([[True]])
    return t


def _valid(guide_type, guide, text):
    if guide_type == "json_schema":
        import jsonschema

        jsonschema.validate(json.loads(text), json.loads(guide))
    elif guide_type == "json":
        json.loads(text)
    elif guide_type == "regex":
        import re

        assert re.fullmatch(guide, text), text
    else:
        assert json.loads(text) is not None


@pytest.mark.parametrize("guide_type,guide", GUIDES)
def test_greedy_guided_speculation_equals_target_only(pair, guide_type, guide):
    """Draft model, prompt lookup and hybrid drafting under the guide: the same tokens as target-only, valid."""
    tok, engines, info = pair
    prompt = tok.encode(PROMPT)
    base = SpeculativeLoop(_settings(info, 49152, draft_disabled=True), engine_call(engines))
    spec = SpeculativeLoop(_settings(info, 49152), engine_call(engines))
    kw = dict(prompt=prompt, max_tokens=60, end_id=tok.eos_token_id, guided_decoding_guide_type=guide_type,
              guided_decoding_guide=guide)
    want, _ = _run(base, **kw)
    assert len(want) < 60, "the guided answer did not end"
    _valid(guide_type, guide, tok.decode(want))
    for source in ("model", "ngram", "hybrid"):
        got, stats = _run(spec, num_draft_tokens=4, draft_source=source, draft_length_policy="fixed", **kw)
        assert got == want, source
        # the draft model always drafts; prompt lookup where the prompt holds the answer (the JSON)
        if source == "model" or guide_type == "json_schema":
            assert stats.total_draft_tokens > 0, source


def test_sampled_guided_output_follows_the_guide(pair):
    """With sampling (rejection sampling against the draft's masked distribution) every output is valid."""
    tok, engines, info = pair
    spec = SpeculativeLoop(_settings(info, 49152), engine_call(engines))
    guide = json.dumps(SCHEMA)
    for seed in range(3):
        got, stats = _run(spec, prompt=tok.encode(PROMPT), max_tokens=80, end_id=tok.eos_token_id, temperature=0.8,
                          seed=seed, use_draft_logits=True, num_draft_tokens=4, draft_source="model",
                          draft_length_policy="fixed", guided_decoding_guide_type="json_schema", guided_decoding_guide=guide)
        if len(got) < 80:
            _valid("json_schema", guide, tok.decode(got))
        assert stats.total_draft_tokens > 0


def test_proposals_are_cut_at_the_first_refused_token(pair):
    tok, _, info = pair
    req = LoopRequest(prompt=[1, 2, 3], max_tokens=10, guided_decoding_guide_type="regex", guided_decoding_guide="ab+c")
    g = guided.GuidedRequest.start(req, _settings(info, 49152, draft_disabled=True))
    from trtspec.spec.drafters import Proposal

    a, b, c, x = (tok.convert_tokens_to_ids(s) for s in ("a", "b", "c", "x"))
    assert g.cut(Proposal([a, b, b, x, c])).tokens == [a, b, b]
    g.accept([a, b])
    assert g.cut(Proposal([x])).tokens == []
    assert g.cut(Proposal([b, c])).tokens == [b, c]


def test_bad_guides_are_request_errors(pair):
    tok, engines, info = pair
    loop = SpeculativeLoop(_settings(info, 49152), engine_call(engines))
    for guide_type, guide, words in (
        ("json_schema", '{"type": "object", "properties": ', "json_schema guide does not compile"),
        ("json_schema", None, "needs guided_decoding_guide"),
        ("regex", "(unclosed", "regex guide does not compile"),
        ("xml", "x", "must be one of"),
    ):
        with pytest.raises(RequestError, match=words):
            _run(loop, prompt=[1, 2], max_tokens=4, guided_decoding_guide_type=guide_type, guided_decoding_guide=guide)
    no_guided = SpeculativeLoop(loop_settings(max_draft_len=8), engine_call(engines))
    with pytest.raises(RequestError, match="does not serve guided decoding"):
        _run(no_guided, prompt=[1, 2], max_tokens=4, guided_decoding_guide_type="json")


def test_on_tensorrt_llms_engine_a_guided_request_is_one_call_without_drafting(pair):
    """TensorRT-LLM's engine masks one position per step and starts the guide at each request's first new token:
    the loop sends the guide, no draft and no guided_decoding_start, and asks for the whole output at once."""
    tok, engines, info = pair
    calls = []

    def call(model, t, wanted):
        calls.append((model, dict(t)))
        return engine_call(engines)(model, t, wanted)

    settings = loop_settings(max_draft_len=8).model_copy(update={"guided": guided.GuidedSettings(
        tokenizer_info=info, vocab_size=49152, mode="one_call")})
    loop = SpeculativeLoop(settings, call)
    got, stats = _run(loop, prompt=tok.encode(PROMPT), max_tokens=40, end_id=tok.eos_token_id, num_draft_tokens=4,
                      stream=True, guided_decoding_guide_type="json_schema", guided_decoding_guide=json.dumps(SCHEMA))
    assert [m for m, _ in calls] == ["tensorrt_llm"]
    t = calls[0][1]
    assert "draft_input_ids" not in t and guided.GUIDE_START not in t
    assert int(t["request_output_len"].reshape(-1)[0]) == 40
    assert t["guided_decoding_guide_type"].reshape(-1)[0] == b"json_schema"
    assert stats.guided_without_drafting == 1 and stats.total_draft_tokens == 0
    json.loads(tok.decode(got))


def test_eagle3_proposals_under_a_guide_give_the_target_only_tokens(pair, demo_pair):
    """The in-engine EAGLE-3 head drafts without the guide; the loop cuts its proposals at the first refused token."""
    from trtspec.demo_pair import EAGLE3_ASSET_DIR

    tok, engines, info = pair
    target = ReferenceEngine(demo_pair.target, device="cpu", dtype="float32", eagle3_head=EAGLE3_ASSET_DIR,
                             xgrammar_tokenizer_info=info)
    settings = _settings(info, 49152, method="eagle3").model_copy(update={"draft_model": None})
    loop = SpeculativeLoop(settings, engine_call({"tensorrt_llm": target}))
    base = SpeculativeLoop(_settings(info, 49152, draft_disabled=True), engine_call(engines))
    kw = dict(prompt=tok.encode(PROMPT), max_tokens=60, end_id=tok.eos_token_id, guided_decoding_guide_type="json_schema",
              guided_decoding_guide=json.dumps(SCHEMA))
    want, _ = _run(base, **kw)
    got, stats = _run(loop, num_draft_tokens=3, draft_source="model", draft_length_policy="fixed", **kw)
    assert got == want
    assert stats.total_draft_tokens > 0


def test_what_the_grammar_forces_is_drafted_and_always_accepted(pair):
    """A plain iteration drafts the text the grammar forces: the output is the target-only one; the baseline drafts
    nothing."""
    tok, engines, info = pair
    regex = r"The answer is (yes|no), because of [a-z]{3,10}\."
    req = LoopRequest(prompt=[1, 2], max_tokens=10, guided_decoding_guide_type="regex", guided_decoding_guide=regex)
    g = guided.GuidedRequest.start(req, _settings(info, 49152))
    from trtspec.spec.drafters import Proposal

    forced = g.cut(Proposal([]))
    assert tok.decode(forced.tokens) == "The answer is "
    assert g.cut(Proposal([]), plain=16).tokens == []  # a plain run steps them anyway
    assert guided.GuidedRequest.start(req, _settings(info, 49152, draft_disabled=True)).cut(Proposal([])).tokens == []
    kw = dict(prompt=tok.encode(PROMPT), max_tokens=40, end_id=tok.eos_token_id, stream=True,
              guided_decoding_guide_type="regex", guided_decoding_guide=regex)
    want, _ = _run(SpeculativeLoop(_settings(info, 49152, draft_disabled=True), engine_call(engines)), **kw)
    got, stats = _run(SpeculativeLoop(_settings(info, 49152), engine_call({"tensorrt_llm": engines["tensorrt_llm"]})),
                      draft_source="ngram", **kw)
    assert got == want and stats.total_draft_tokens >= 4 and stats.total_accepted_draft_tokens >= 3


def _log_softmax(x):
    m = x[np.isfinite(x)].max()
    return x - m - np.log(np.exp(x[np.isfinite(x)] - m).sum())


def test_log_probs_under_a_guide_are_of_the_masked_distribution(pair):
    """As TensorRT-LLM returns them: its guided decoder writes -inf into the logits before the sampler computes log
    probs (guidedDecoder.cpp, logitsBitmask kernel; the PyTorch executor's GuidedDecoder.execute likewise), so a
    token's log prob and its top alternatives are of the distribution over what the grammar allows there. Checked
    against xgrammar's own matcher on the raw logits, with speculation (draft model) and without."""
    tok, engines, info = pair
    eng = engines["tensorrt_llm"]
    prompt = tok.encode(PROMPT)
    guide = json.dumps(SCHEMA)
    kw = dict(prompt=prompt, max_tokens=14, end_id=tok.eos_token_id, guided_decoding_guide_type="json_schema",
              guided_decoding_guide=guide, return_log_probs=True, top_log_probs=4)
    for loop, extra in ((SpeculativeLoop(_settings(info, 49152, draft_disabled=True), engine_call(engines)), {}),
                        (SpeculativeLoop(_settings(info, 49152), engine_call(engines)),
                         dict(num_draft_tokens=4, draft_source="model", draft_length_policy="fixed"))):
        chunks = list(loop.run(LoopRequest(**kw, **extra)))
        new = [t for c in chunks for t in c.new_tokens]
        lps = [x for c in chunks for x in c.log_probs]
        top_ids = np.concatenate([c.top.ids for c in chunks])
        top_lps = np.concatenate([c.top.log_probs for c in chunks])
        m = _xgrammar_matcher(tok, "json_schema", guide)
        bits = xgr.allocate_token_bitmask(1, 49152)
        seq = list(prompt)
        for i, t in enumerate(new):
            raw = eng.run(request_from_tensors(_tensors(seq, 1, None, None, tok.eos_token_id, logits=True).get))
            m.fill_next_token_bitmask(bits)
            allowed = np.unpackbits(bits.numpy().reshape(-1).view(np.uint8), bitorder="little")[:49152].astype(bool)
            masked = raw.generation_logits[0].astype(np.float64)
            masked[~allowed] = -np.inf
            want = _log_softmax(masked)
            assert lps[i] == pytest.approx(want[t], abs=1e-4), i
            # the alternatives are the most likely tokens the grammar allows; past them, what it refuses has -inf
            possible = np.isfinite(top_lps[i])
            assert possible.sum() == min(4, allowed.sum()) and all(allowed[top_ids[i][possible]]), (i, top_ids[i])
            assert top_ids[i][0] == t and np.allclose(top_lps[i][possible], want[top_ids[i][possible]], atol=1e-4), i
            assert m.accept_token(t)
            seq.append(t)
