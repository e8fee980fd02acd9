"""Sampling under a guide, in-process on tiny models (milliseconds a forward pass, a 12-token vocabulary that
xgrammar reads as raw text): the rejection rule holds on the masked distributions (the output is the target's masked
distribution, and a draft is accepted as often as sum_x min(p(x), q(x)) of the masked p and q says), and a row the
guide leaves nothing in never reaches a softmax (no NaN)."""

from __future__ import annotations

import json
import warnings
from collections import Counter

import numpy as np
import pytest
from scipy.stats import chisquare

from conftest import engine_call, loop_settings

xgr = pytest.importorskip("xgrammar")

from trtspec import guided  # noqa: E402
from trtspec.spec.loop import LoopRequest, SpeculativeLoop  # noqa: E402
from trtspec.reference_engine import EngineRequest, ReferenceEngine  # noqa: E402
from trtspec.spec.speculative import SamplingParams, probabilities  # noqa: E402

# token i is this text (raw vocabulary); 1 is the tiny models' eos, the tokenizer info's stop token
VOCAB = ["<s>", "</s>", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
EOS = 1
REGEX = "[a-c][a-f]"  # position 1: a, b, c (ids 2-4); position 2: a-f (ids 2-7); then only the end
PROMPT = [0, 3, 4]


@pytest.fixture(scope="module")
def tiny(tiny_target, tiny_draft, tmp_path_factory):
    import torch

    path = tmp_path_factory.mktemp("tiny-guided") / guided.TOKENIZER_INFO_FILE
    path.write_text(json.dumps({"encoded_vocab": VOCAB, "stop_token_ids": [EOS],
                                "tokenizer_str": json.dumps({"model": {"type": "WordLevel"}, "decoder": None})}))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engines = {"tensorrt_llm": ReferenceEngine(tiny_target, device="cpu", salt=1, xgrammar_tokenizer_info=path),
               "tensorrt_llm_draft": ReferenceEngine(tiny_draft, device="cpu", salt=2, xgrammar_tokenizer_info=path)}
    yield engines, str(path)
    torch.set_num_threads(threads)


def _loop(engines, info):
    s = loop_settings(max_draft_len=4)
    return SpeculativeLoop(s.model_copy(update={"guided": guided.GuidedSettings(tokenizer_info=info, vocab_size=len(VOCAB))}),
                           engine_call(engines))


def _masked(logits, allowed):
    x = np.array(logits, dtype=np.float64)
    x[~allowed] = -np.inf
    return probabilities(x, SamplingParams(temperature=1.0))


def _allowed(ids):
    a = np.zeros(len(VOCAB), dtype=bool)
    a[list(ids)] = True
    return a


def _logits(engine, seq):
    import torch

    with torch.no_grad():
        return engine.model(torch.tensor([seq])).logits[0, -1].numpy()


POS1, POS2 = _allowed(range(2, 5)), _allowed(range(2, 8))


@pytest.mark.parametrize("k", [1, 2])
def test_sampling_under_a_guide_follows_the_rejection_rule_on_the_masked_distributions(tiny, k):
    """Chi-square over every two-token answer: speculative sampling gives the target's masked distribution; with
    one draft token, acceptances match sum_x min(p(x), q(x)) of the masked p and q (a binomial, within 4 sigma), far
    from what unmasked q would give."""
    engines, info = tiny
    target, draft = engines["tensorrt_llm"], engines["tensorrt_llm_draft"]
    p1 = _masked(_logits(target, PROMPT), POS1)
    expected = np.zeros((len(VOCAB), len(VOCAB)))
    for t1 in np.flatnonzero(POS1):
        expected[t1] = p1[t1] * _masked(_logits(target, PROMPT + [int(t1)]), POS2)
    loop = _loop(engines, info)
    n, counts, accepted, drafted = 1000, Counter(), 0, 0
    for i in range(n):  # a seed per request: independent draws, the same outcome every run
        chunks = list(loop.run(LoopRequest(
            prompt=PROMPT, max_tokens=2, end_id=EOS, temperature=1.0, seed=5_000 + i, use_draft_logits=True,
            num_draft_tokens=k, draft_source="model", draft_length_policy="fixed",
            guided_decoding_guide_type="regex", guided_decoding_guide=REGEX)))
        tokens = [t for c in chunks for t in c.new_tokens]
        assert len(tokens) == 2 and POS1[tokens[0]] and POS2[tokens[1]], tokens
        counts[tokens[0] * len(VOCAB) + tokens[1]] += 1
        accepted += chunks[-1].stats.total_accepted_draft_tokens
        drafted += chunks[-1].stats.total_draft_tokens
    flat = expected.reshape(-1)
    keep = flat * n >= 5  # pool the cells too rare for chi-square
    obs = np.array([counts[j] for j in range(flat.size)], dtype=float)
    o, e = np.append(obs[keep], obs[~keep].sum()), np.append(flat[keep] * n, flat[~keep].sum() * n)
    if e[-1] == 0:
        o, e = o[:-1], e[:-1]
    assert obs[~(flat > 0)].sum() == 0  # nothing the guide refuses
    assert chisquare(o, e).pvalue > 1e-3
    if k == 1:
        assert drafted == n
        q1 = _masked(_logits(draft, PROMPT), POS1)
        rate = np.minimum(p1, q1).sum()
        assert abs(accepted - n * rate) < 4 * np.sqrt(n * rate * (1 - rate)), (accepted, n * rate)
        q_raw = probabilities(_logits(draft, PROMPT).astype(np.float64), SamplingParams(temperature=1.0))
        assert abs(np.minimum(p1, q_raw).sum() - rate) > 8 * np.sqrt(rate * (1 - rate) / n)  # the test tells them apart


def _allowed_by(regex, done):
    """What xgrammar's own matcher allows after `done`."""
    info = xgr.TokenizerInfo(VOCAB, vocab_size=len(VOCAB), stop_token_ids=[EOS])
    m = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_regex(regex))
    for t in done:
        assert m.accept_token(t)
    bits = xgr.allocate_token_bitmask(1, len(VOCAB))
    m.fill_next_token_bitmask(bits)
    return np.unpackbits(bits.numpy().reshape(-1).view(np.uint8), bitorder="little")[: len(VOCAB)].astype(bool)


def _guided(ids, n, guide, **kw):
    return EngineRequest(list(ids), output_len=n, end_id=EOS, guide=guided.Guide("regex", guide),
                         guide_start=len(PROMPT), **kw)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_row_the_guide_leaves_nothing_in_never_reaches_a_softmax(tiny, temperature):
    """Where the grammar may only end but min_tokens bans the end token (a draft call asks for k tokens this way),
    every masked logit is -inf: the end token is certain there (the guide wins; nothing may follow), with no NaN
    and no RuntimeWarning. Where it may not end, the request fails naming why, instead of emitting a token the
    grammar refuses."""
    engines, _ = tiny
    eng = engines["tensorrt_llm"]
    sampling = SamplingParams(temperature=temperature)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a NaN softmax warns "invalid value encountered"
        for seed in range(20):
            r = eng.run(_guided(PROMPT, 6, "[a-c]", sampling=sampling, seed=seed, min_tokens=6))
            new = r.tokens[len(PROMPT):]
            assert len(new) == 1 and 2 <= new[0] <= 4, new  # one letter, then the end
        # verify: a draft past the grammar's end, min_tokens banning the end: the sequence ends after the letter
        r = eng.run(_guided(PROMPT, 3, "[a-c]", sampling=sampling, seed=1, min_tokens=6, draft_ids=[2, 5]))
        assert r.tokens[len(PROMPT):] in ([2], [3], [4]) and r.tokens[len(PROMPT):][0] in (2, 3, 4)
        # the grammar needs a letter that bad_words removes: a clear error, not a refused token
        with pytest.raises(ValueError, match="the guide allows only tokens that the request itself excludes"):
            eng.run(_guided(PROMPT, 3, "[c]", sampling=sampling, seed=1, bad_words=[[4]]))


def test_draft_logits_the_guide_leaves_nothing_in_reject_the_draft(tiny):
    """Rejection sampling with draft logits that give the grammar's tokens no probability (a draft that was not
    masked proposed a token the grammar refuses): that row is q = 0, the draft token is rejected and the target
    samples its own masked distribution there. A NaN q would have accepted it."""
    engines, _ = tiny
    eng = engines["tensorrt_llm"]
    bad = np.full((1, len(VOCAB)), -np.inf, dtype=np.float32)
    bad[0, 9] = 5.0  # only 'h', which [a-c] refuses
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in range(30):
            r = eng.run(_guided(PROMPT, 2, "[a-c][a-f]", sampling=SamplingParams(temperature=1.0), seed=seed,
                                draft_ids=[9], draft_logits=bad))
            new = r.tokens[len(PROMPT):]
            assert r.num_accepted == 0 and len(new) == 1 and _allowed_by("[a-c][a-f]", [])[new[0]], new


def test_a_draft_vocabulary_without_the_grammars_tokens_ends_the_proposal(tiny, tiny_draft, tmp_path):
    """A draft engine whose vocabulary holds nothing the grammar allows next proposes nothing more from there (it
    cannot draft a token the target would accept), instead of sampling from a row of -inf."""
    import shutil

    from trtspec.reference_engine import DRAFT_VOCAB_FILE

    _, info = tiny
    d = tmp_path / "draft"
    shutil.copytree(tiny_draft, d)
    (d / DRAFT_VOCAB_FILE).write_text(json.dumps({"ids": [0, 1, 2, 3, 4]}))  # <s>, </s>, a, b, c
    eng = ReferenceEngine(d, device="cpu", use_draft_vocab=True, xgrammar_tokenizer_info=info)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for temperature in (0.0, 1.0):
            r = eng.run(_guided(PROMPT, 4, "[a-c][d-f][a-c]", sampling=SamplingParams(temperature=temperature), seed=3,
                                min_tokens=4))
            new = r.tokens[len(PROMPT):]
            assert len(new) == 1 and 2 <= new[0] <= 4, new  # a letter it has, then nothing it has
