"""The pure algorithm: acceptance arithmetic, distribution preservation, draft-length policy, counters."""

import numpy as np
import pytest
from scipy.stats import chisquare

from trtspec.metrics import SpecStats
from trtspec.drafters import propose_ngram as propose
from trtspec.speculative import (
    DraftLengthPolicy,
    PayoffGate,
    SamplingParams,
    draft_len_at_load,
    find_stop,
    probabilities,
    scheduled_draft_len,
    speedup_bound,
    verify_by_target_sample,
    verify_greedy,
    verify_rejection,
)


def test_greedy_accepts_matching_prefix_then_takes_target_token():
    v = verify_greedy([5, 6, 7], [5, 6, 9, 1])
    assert v.num_accepted == 2 and v.tokens == [5, 6, 9]


def test_greedy_all_accepted_gets_bonus_token():
    v = verify_greedy([5, 6], [5, 6, 8])
    assert v.num_accepted == 2 and v.tokens == [5, 6, 8]


def test_greedy_first_rejected():
    v = verify_greedy([4, 6], [5, 6, 8])
    assert v.num_accepted == 0 and v.tokens == [5]


def test_greedy_needs_k_plus_one_target_tokens():
    with pytest.raises(ValueError):
        verify_greedy([1, 2], [1, 2])


def test_probabilities_greedy_top_k_top_p():
    logits = np.array([1.0, 3.0, 2.0, 0.0])
    assert probabilities(logits, SamplingParams(0.0)).tolist() == [0, 1, 0, 0]
    p = probabilities(logits, SamplingParams(1.0, top_k=2))
    assert p[0] == 0 and p[3] == 0 and p.sum() == pytest.approx(1)
    full = probabilities(logits, SamplingParams(1.0))
    nucleus = probabilities(logits, SamplingParams(1.0, top_p=full[1] + 0.01))
    assert np.count_nonzero(nucleus) == 2  # the top token alone does not reach top_p


def _random_dist(rng, v, concentration=0.7):
    return rng.dirichlet(np.full(v, concentration))


@pytest.mark.parametrize("k", [1, 3])
def test_rejection_sampling_preserves_target_distribution(k):
    """Chi-square: with context-independent rows, token i of the output must follow target row i."""
    rng = np.random.default_rng(0)
    V, n = 6, 20000
    p = np.stack([_random_dist(rng, V) for _ in range(k + 1)])
    q = np.stack([_random_dist(rng, V) for _ in range(k)])
    first = np.zeros(V)
    second = np.zeros(V)
    accepted = 0
    for _ in range(n):
        draft = [int(rng.choice(V, p=q[i])) for i in range(k)]
        v = verify_rejection(draft, q, p, rng)
        accepted += v.num_accepted
        first[v.tokens[0]] += 1
        if k > 1 and len(v.tokens) > 1:
            second[v.tokens[1]] += 1
    assert chisquare(first, p[0] * n).pvalue > 1e-3
    if k > 1:
        assert chisquare(second, p[1] * second.sum()).pvalue > 1e-3
    # the acceptance rate of position 0 is sum min(p, q): check the arithmetic, not just the output
    if k == 1:
        assert accepted / n == pytest.approx(np.minimum(p[0], q[0]).sum(), abs=0.015)


def test_rejection_sampling_detects_a_wrong_rule():
    """The test above can fail: accepting every draft token gives the draft's distribution, not the target's."""
    rng = np.random.default_rng(1)
    V, n = 6, 20000
    p, q = _random_dist(rng, V)[None], _random_dist(rng, V)[None]
    counts = np.zeros(V)
    for _ in range(n):
        counts[int(rng.choice(V, p=q[0]))] += 1  # a broken "always accept" rule
    assert chisquare(counts, p[0] * n).pvalue < 1e-6


def test_token_comparison_sampling_preserves_target_distribution():
    rng = np.random.default_rng(2)
    V, n = 5, 20000
    p = np.stack([_random_dist(rng, V) for _ in range(3)])
    counts = np.zeros(V)
    for _ in range(n):
        v = verify_by_target_sample([1, 2], p, rng)
        counts[v.tokens[0]] += 1
        assert v.num_accepted == len(v.tokens) - 1
    assert chisquare(counts, p[0] * n).pvalue > 1e-3


def test_fixed_policy_respects_budget():
    pol = DraftLengthPolicy(4)
    assert pol.next_k(remaining=10) == 4
    assert pol.next_k(remaining=3) == 2  # never past remaining - 1: the target adds a token
    assert pol.next_k(remaining=1) == 0
    assert DraftLengthPolicy(0).next_k(10) == 0


def test_draft_len_schedule_caps_k_from_each_batch_size_upward():
    schedule = {1: 4, 4: 2, 8: 0}
    assert [scheduled_draft_len(schedule, n, 4) for n in (1, 3, 4, 7, 8, 30)] == [4, 4, 2, 2, 0, 0]
    assert scheduled_draft_len(schedule, 5, 1) == 1  # a cap, never more than the request's k
    assert scheduled_draft_len({6: 1}, 2, 3) == 3  # below the smallest entry: k as asked
    assert scheduled_draft_len(None, 50, 3) == 3


def test_draft_len_at_load_stops_drafting_above_max_concurrency_or_keeps_only_lookup():
    assert draft_len_at_load(4, 4, 4, None) == (4, False)  # at the limit: drafting goes on
    assert draft_len_at_load(4, 5, 4, None) == (0, False)  # above it: off (TensorRT-LLM, vLLM)
    assert draft_len_at_load(4, 5, 4, None, ngram_above_max_concurrency=True) == (4, True)
    assert draft_len_at_load(4, 5, 4, {5: 2}, ngram_above_max_concurrency=True) == (2, True)
    assert draft_len_at_load(4, 100, None, {1: 3, 8: 0}) == (0, False)  # the schedule alone
    assert draft_len_at_load(4, 2, None, {1: 3, 8: 0}) == (3, False)


def test_adaptive_policy_grows_shrinks_pauses_and_recovers():
    pol = DraftLengthPolicy(6, adaptive=True, min_k=1, pause_below=0.3, window=3, probe_every=4)
    pol.current_k = 3
    pol.update(3, 3)
    assert pol.next_k(100) == 4  # fully accepted: grow
    pol.update(4, 1)
    assert pol.next_k(100) == 2  # rejection: shrink to accepted + 1
    pol.update(2, 0)
    pol.update(1, 0)
    pol.update(1, 0)  # window rate 0/4 < 0.3
    assert pol.paused
    ks = [pol.next_k(100) for _ in range(4)]
    assert ks == [0, 0, 0, 1]  # plain target steps, then a probe of min_k
    pol.update(1, 1)  # the probe is accepted: drafting resumes
    assert not pol.paused and pol.next_k(100) >= 1


def test_adaptive_policy_never_exceeds_requested():
    pol = DraftLengthPolicy(3, adaptive=True)
    for _ in range(10):
        pol.update(pol.next_k(100), pol.next_k(100))
    assert pol.next_k(100) == 3


def test_payoff_gate_skips_a_source_slower_than_plain_steps_and_probes_it():
    gate = PayoffGate(window=4, probe_every=3)
    gate.record("model", 2, 1.0)  # first use: carries the prefill, not measured
    for _ in range(4):
        assert gate.allows("model")  # unmeasured: ask
        gate.record("model", 2, 0.100)  # 20 tokens/s
    assert gate.pays("model") is None and gate.wants_plain_step()  # nothing to compare with yet
    gate.record(None, 1, 0.040)  # plain steps: 25 tokens/s
    assert not gate.wants_plain_step()
    assert gate.pays("model") is False
    assert [gate.allows("model") for _ in range(6)] == [False, False, True, False, False, True]  # probes


def test_payoff_gate_keeps_a_source_that_pays_and_refreshes_the_plain_rate():
    gate = PayoffGate(window=4, probe_every=3, refresh_every=10)
    gate.record(None, 1, 0.040)
    for _ in range(9):
        gate.record("ngram", 3, 0.050)  # 60 tokens/s against 25
        assert gate.allows("ngram")
    assert gate.pays("ngram") is True and not gate.wants_plain_step()
    gate.record("ngram", 3, 0.050)
    assert gate.wants_plain_step()  # 10 drafted iterations since the last plain step


def test_payoff_gate_sources_are_independent():
    gate = PayoffGate(window=2, probe_every=100)
    gate.record(None, 1, 0.040)
    for src, tokens in (("model", 1), ("ngram", 4)):
        for _ in range(3):
            gate.record(src, tokens, 0.050)
    assert gate.pays("model") is False and gate.pays("ngram") is True
    assert not gate.allows("model") and gate.allows("ngram")


def test_spec_stats_rates_and_positions():
    s = SpecStats()
    s.record(3, 2)
    s.record(2, 0)
    s.record(0, 0)  # a plain target step
    assert (s.num_drafts, s.total_draft_tokens, s.total_accepted_draft_tokens, s.num_iterations) == (2, 5, 2, 3)
    assert s.acceptance_rate == pytest.approx(0.4)
    assert s.mean_acceptance_length == pytest.approx(2.0)
    assert s.proposed_per_position == [2, 2, 1] and s.accepted_per_position == [1, 1, 0]
    t = SpecStats()
    t.record(4, 4)
    s.merge(t)
    assert s.proposed_per_position == [3, 3, 2, 1] and s.accepted_per_position == [2, 2, 1, 1]


def test_find_stop():
    assert find_stop([1, 2, 3, 4], [[3, 4]]) == 4
    assert find_stop([1, 2, 3, 4, 5], [[2, 3], [5]]) == 3
    assert find_stop([1, 2, 3], [[9]]) is None
    assert find_stop([1, 2, 3, 4], [[1, 2]], start=2) is None  # ended before the new tokens


def test_speedup_bound():
    assert speedup_bound(0.0, 4, 0.1) == pytest.approx(1 / 1.4)
    assert speedup_bound(1.0, 3, 0.0) == pytest.approx(4.0)
    assert speedup_bound(0.6, 3, 0.05) == pytest.approx((1 - 0.6**4) / (0.4 * 1.15))


# --------------------------------------------------------------- n-gram drafter


def test_ngram_longest_match_wins():
    seq = [1, 2, 3, 9, 8, 2, 3, 7, 6, 5, 1, 2, 3]
    # suffix [1,2,3] occurs at 0 (followed by 9, 8); [2,3] alone would match later at 5 (followed by 7)
    assert propose(seq, 2, n_max=3) == [9, 8]


def test_ngram_most_recent_occurrence():
    seq = [4, 5, 1, 4, 5, 2, 4, 5]
    assert propose(seq, 1, n_max=2) == [2]


def test_ngram_no_match_proposes_nothing():
    assert propose([1, 2, 3, 4], 3) == []
    assert propose([7], 3) == []


def test_ngram_never_beyond_k():
    seq = [1, 2, 3, 4, 5, 6, 1, 2]
    assert propose(seq, 3, n_max=2) == [3, 4, 5]
    assert len(propose(seq, 1, n_max=2)) == 1
    assert propose(seq, 0) == []


def test_ngram_respects_min_n():
    seq = [1, 2, 3, 9, 3]
    assert propose(seq, 2, n_max=3, n_min=1) == [9, 3]
    assert propose(seq, 2, n_max=3, n_min=2) == []
