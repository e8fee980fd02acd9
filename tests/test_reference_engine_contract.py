"""The reference engine gives each tensorrt_llm input the TensorRT-LLM executor's meaning (tiny models, no Triton).

Formulas are the executor's (penaltyKernels.cu, externalDraftTokensKernels.cu), restated here independently
of the engine's code: each test computes what TensorRT-LLM would return and compares.
"""

import numpy as np
import pytest
import torch

from trtspec.reference_engine import TOKENS_PER_BLOCK, EngineRequest, ReferenceEngine
from trtspec.spec.speculative import SamplingParams

PROMPT = [0, 3, 4, 3]


@pytest.fixture(scope="module")
def eng(tiny_target):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield ReferenceEngine(tiny_target, device="cpu")
    torch.set_num_threads(threads)


def raw_logits(eng, tokens):
    with torch.inference_mode():
        return eng.model(input_ids=torch.tensor([tokens])).logits[0, -1].float().numpy()


def greedy(eng, n, **kw):
    return eng.run(EngineRequest(list(PROMPT), output_len=n, **kw))


def test_end_token_is_not_output_and_not_counted(eng):
    free = greedy(eng, 6).new_tokens
    first = greedy(eng, 6, end_id=free[0])
    assert first.tokens == PROMPT and first.new_tokens == []  # end first: output_ids == input
    later = free[3]
    cut = greedy(eng, 6, end_id=later)
    assert cut.new_tokens == free[: free.index(later)]
    assert later not in cut.new_tokens


def test_verify_stops_before_the_end_token(eng):
    free = greedy(eng, 6).new_tokens
    # draft = the target's own tokens: all accepted; the end token is the 3rd target token
    r = eng.run(EngineRequest(list(PROMPT), output_len=5, draft_ids=free[:4], end_id=free[2]))
    assert r.tokens == PROMPT + free[:2] and r.num_drafted == 4
    # the target's next token after the accepted prefix is the end token: input + accepted prefix only
    r = eng.run(EngineRequest(list(PROMPT), output_len=3, draft_ids=free[:2], end_id=free[2]))
    assert r.tokens == PROMPT + free[:2] and r.num_accepted == 2
    # the end token first: the input unchanged
    r = eng.run(EngineRequest(list(PROMPT), output_len=3, draft_ids=free[:2], end_id=free[0]))
    assert r.tokens == PROMPT


def test_min_tokens_suppresses_the_end_token(eng):
    free = greedy(eng, 6).new_tokens
    r = greedy(eng, 6, end_id=free[0], min_tokens=3)
    assert len(r.new_tokens) >= 3 and free[0] not in r.new_tokens[:3]
    raw = raw_logits(eng, PROMPT)
    masked = raw.copy()
    masked[free[0]] = -np.inf
    assert r.new_tokens[0] == int(masked.argmax())


def _penalized(raw, context, rep=None, pres=None, freq=None, temperature=None, bias=None):
    """penaltyKernels.cu: bias, temperature, then over tokens of prompt + output: repetition, presence, frequency."""
    x = raw.astype(np.float32).copy()
    if bias is not None:
        x = x + bias
    if temperature:
        x = x / temperature
    for tok in set(context):
        c = context.count(tok)
        if rep is not None:
            x[tok] = x[tok] * rep if x[tok] < 0 else x[tok] / rep
        if pres is not None:
            x[tok] -= pres
        if freq is not None:
            x[tok] -= freq * c
    return x


@pytest.mark.parametrize(
    "kw", [{"repetition_penalty": 3.0}, {"presence_penalty": 2.5}, {"frequency_penalty": 1.5},
           {"repetition_penalty": 1.7, "presence_penalty": 0.5, "frequency_penalty": 0.8}],
)
def test_penalties_follow_the_kernel_over_prompt_and_output(eng, kw):
    names = {"repetition_penalty": "rep", "presence_penalty": "pres", "frequency_penalty": "freq"}
    r = greedy(eng, 4, return_log_probs=True, **kw)
    seq = list(PROMPT)
    for i, tok in enumerate(r.new_tokens):
        x = _penalized(raw_logits(eng, seq), seq, **{names[k]: v for k, v in kw.items()})
        assert tok == int(x.argmax())
        lse = np.log(np.exp(x.astype(np.float64) - x.max()).sum()) + x.max()
        assert r.log_probs[i] == pytest.approx(float(x[tok] - lse), abs=1e-4)
        seq.append(tok)
    plain = greedy(eng, 4, return_log_probs=True)
    assert r.log_probs != pytest.approx(plain.log_probs, abs=1e-3)  # the inputs take effect


def test_penalties_change_the_logits_they_should(eng):
    """A token seen twice in the context: frequency subtracts 2 x penalty, presence once, repetition divides."""
    seq = [0, 5, 5, 7]
    raw = raw_logits(eng, seq)
    x = _penalized(raw, seq, freq=1.0)
    assert x[5] == pytest.approx(raw[5] - 2.0) and x[7] == pytest.approx(raw[7] - 1.0) and x[1] == raw[1]
    x = _penalized(raw, seq, pres=1.0)
    assert x[5] == pytest.approx(raw[5] - 1.0)


def test_embedding_bias_is_added_to_the_logits(eng):
    raw = raw_logits(eng, PROMPT)
    target = int(raw.argmin())
    bias = np.zeros(eng.vocab_size, dtype=np.float32)
    bias[target] = 1000.0
    r = greedy(eng, 1, embedding_bias=bias)
    assert r.new_tokens == [target]
    with pytest.raises(ValueError, match="embedding_bias"):
        greedy(eng, 1, embedding_bias=np.zeros(3, dtype=np.float32))


def test_temperature_is_applied_before_the_penalties(eng):
    """Presence after temperature: with T=0.5 the same presence penalty weighs half as much."""
    raw = raw_logits(eng, PROMPT)
    r = eng.run(EngineRequest(list(PROMPT), 1, sampling=SamplingParams(0.5, top_k=1), presence_penalty=0.3,
                              return_log_probs=True))
    x = _penalized(raw, PROMPT, pres=0.3, temperature=0.5)
    assert r.new_tokens == [int(x.argmax())]


def test_log_probs_without_processing_are_the_model_log_softmax(eng):
    r = greedy(eng, 3, return_log_probs=True)
    seq = list(PROMPT)
    for tok, lp in zip(r.new_tokens, r.log_probs):
        raw = torch.tensor(raw_logits(eng, seq), dtype=torch.float64)
        assert lp == pytest.approx(float(torch.log_softmax(raw, -1)[tok]), abs=1e-4)
        seq.append(tok)


def test_generation_and_context_logits_are_raw(eng):
    bias = np.full(eng.vocab_size, 5.0, dtype=np.float32)
    r = greedy(eng, 2, return_generation_logits=True, return_context_logits=True, embedding_bias=bias)
    assert r.context_logits.shape == (len(PROMPT), eng.vocab_size)
    assert np.allclose(r.context_logits[-1], raw_logits(eng, PROMPT), atol=1e-4)
    assert np.allclose(r.generation_logits[0], raw_logits(eng, PROMPT), atol=1e-4)
    v = eng.run(EngineRequest(list(PROMPT), 2, draft_ids=[5], return_context_logits=True))
    assert v.context_logits.shape == (len(PROMPT), eng.vocab_size)
    assert np.allclose(v.context_logits[1], raw_logits(eng, PROMPT[:2]), atol=1e-4)


def test_bad_words_and_stop_words(eng):
    free = greedy(eng, 4).new_tokens
    r = greedy(eng, 4, bad_words=[[free[0]]])
    assert r.new_tokens[0] != free[0]
    r = greedy(eng, 4, stop_words=[[free[1]]])
    assert r.new_tokens == free[:2]  # the stop word stays in the output, the end token would not


def test_kv_cache_blocks_and_timings(eng):
    r = eng.run(EngineRequest([1] * (TOKENS_PER_BLOCK * 2 + 3), output_len=1))
    new, reused, total = r.kv_blocks()
    assert total == 3 and new + reused == total
    again = eng.run(EngineRequest(r.tokens, output_len=1))
    assert again.kv_blocks()[1] == 2  # the first two blocks came from the prefix cache
    assert 0 < again.first_token_ns <= again.last_token_ns
