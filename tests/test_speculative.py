"""The pure algorithm: acceptance arithmetic, distribution preservation, draft-length policy, counters."""

import numpy as np
import pytest
from scipy.stats import chisquare

from trtspec.spec.metrics import SpecStats
from trtspec.spec.drafters import ESTIMATE_KEYS, estimate_key, ngram_match
from trtspec.spec.controller import MAX_PROBE_BACKOFF, Choice, GoodputController
from trtspec.spec.estimates import Estimates
from trtspec.spec.speculative import (
    SamplingParams,
    draft_len_at_load,
    find_stop,
    fixed_draft_len,
    probabilities,
    scheduled_draft_len,
    speedup_bound,
    verify_by_target_sample,
    verify_greedy,
    verify_rejection,
)


def propose(tokens, k, n_max=3, n_min=1):
    return ngram_match(tokens, k, n_max, n_min)[0]


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
    assert fixed_draft_len(4, remaining=10) == 4
    assert fixed_draft_len(4, remaining=3) == 2  # never past remaining - 1: the target adds a token
    assert fixed_draft_len(4, remaining=1) == 0
    assert fixed_draft_len(0, 10) == 0


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


class Deployment:
    """Synthetic costs and acceptance: a plain step costs step(load); verifying k drafts costs step * (1 + 0.1 k);
    the draft model costs draft_per_token * k, prompt lookup nothing; position i is accepted with acceptance[i]
    (given the ones before were), drawn from a seeded generator."""

    def __init__(self, acceptance, draft_per_token=0.004, step=lambda load: 0.040, seed=0):
        self.acceptance, self.draft_per_token, self.step = acceptance, draft_per_token, step
        self.step_cost = lambda k: None  # the verify cost by k when not step * (1 + 0.1 k)
        self.rng = np.random.default_rng(seed)

    def iterate(self, ctl, load, sources=("model",), cap=6):
        choice = ctl.choose(load, {s: cap for s in sources})
        k = choice.k
        accepted = 0
        while accepted < k and self.rng.random() < self.acceptance[min(accepted, len(self.acceptance) - 1)]:
            accepted += 1
        verify = self.step_cost(k) or self.step(load) * (1 + 0.1 * k)
        draft = self.draft_per_token * k if choice.source == "model" else None
        # the step holds the other requests' plain rows and this one's k + 1, as the loop counts them
        ctl.record(load, choice.source, k, accepted, verify, draft, step_tokens=load + k)
        return choice


NGRAM = estimate_key("ngram", 3)  # prompt lookup's acceptance estimate for a 3-token match


def _controller(**settings):
    from trtspec.config import AdaptivePolicy

    return GoodputController(Estimates(), AdaptivePolicy(**settings))


def _ks(dep, ctl, n, **kw):
    return [dep.iterate(ctl, **kw).k for _ in range(n)]


def test_controller_starts_at_zero_and_stays_there_when_drafting_costs_more_than_it_gains():
    dep, ctl = Deployment([0.05], draft_per_token=0.010), _controller(probe_every=8)
    ks = _ks(dep, ctl, 200, load=1)
    assert ks[:8] == [0] * 8  # pessimistic: a fresh deployment starts at k = 0
    assert sum(k > 0 for k in ks) <= 200 // 8 // 2  # only probes, fewer as they keep failing
    assert sum(k > 1 for k in ks) <= 3  # a probe is one token when acceptance is poor


def test_controller_drafts_longer_as_acceptance_rises():
    means = []
    for a in (0.3, 0.6, 0.9):
        dep, ctl = Deployment([a]), _controller()
        means.append(np.mean(_ks(dep, ctl, 300, load=1)[100:]))
    assert means[0] < means[1] < means[2]
    assert means[2] >= 3


def test_a_longer_draft_is_explored_at_its_last_position_not_by_a_bonus_on_every_position():
    # this project's CPU with the EAGLE-3 head at one in flight: a head step and a row cost a sixth of a step, and
    # acceptance 0.4 at every position, so k = 1 pays most (k = 2 3% less, k = 3 11% less). Deep positions are
    # reached by few drafts and their estimates stay uncertain: their bonuses, compounded, drew the controller to
    # k = 2-6 in up to 43% of its iterations
    for seed in range(4):
        dep, ctl = Deployment([0.4], draft_per_token=0.0, seed=seed), _controller()
        dep.step_cost = lambda k: 0.036 if k == 0 else 0.034 + 0.006 * k
        ks = _ks(dep, ctl, 400, load=1)[100:]
        assert ks.count(1) >= 0.9 * len(ks), (seed, np.bincount(ks).tolist())


def test_a_stale_mean_of_a_shorter_draft_does_not_price_it_above_a_longer_one():
    # each k's mean moves only while it is chosen: k = 2 measured twice while the machine was slow, k = 3 since
    ctl = _controller()
    est = ctl.est
    for k, (seconds, calls) in enumerate([(0.036, 20), (0.041, 50), (0.056, 2), (0.050, 50)]):
        est.verify_s[k, 1], est.verify_n[k, 1] = seconds, calls
    costs = ctl.verify_costs(3, 1)
    assert costs == sorted(costs)
    # pooled with the longer draft's, each by its samples (the smoothing's window at most)
    assert costs[2] == costs[3] == pytest.approx((0.056 * 2 + 0.050 * 10) / 12)
    assert costs[1] == pytest.approx(0.041)


def test_controller_drafts_shorter_as_load_raises_the_step_cost():
    # one deployment, two loads: at 8 in flight the batched step is compute-bound, so verifying k drafts costs
    # nearly k + 1 plain steps and every draft token costs more
    light = Deployment([0.7], draft_per_token=0.004, step=lambda load: 0.040)
    heavy = Deployment([0.7], draft_per_token=0.030, step=lambda load: 0.120)
    heavy.step_cost = lambda k: 0.120 * (1 + 0.9 * k)
    ctl = _controller()
    ks = {1: [], 8: []}
    for _ in range(300):
        ks[1].append(light.iterate(ctl, load=1).k)
        ks[8].append(heavy.iterate(ctl, load=8).k)
    assert np.mean(ks[8][100:]) < np.mean(ks[1][100:])
    assert ks[1][100:].count(0) < 20  # drafting pays at 1 in flight
    assert ks[8][100:].count(0) > 150  # not at 8: plain steps, probes aside


def test_controller_comes_back_after_a_k0_stretch_when_acceptance_returns():
    dep, ctl = Deployment([0.02]), _controller(probe_every=8)
    assert np.mean(_ks(dep, ctl, 150, load=1)[100:]) < 0.2  # probes, and a try of a longer draft never measured
    dep.acceptance = [0.95]
    ks = _ks(dep, ctl, 150, load=1)
    assert np.mean(ks[-50:]) >= 3


def test_controller_prefers_free_prompt_lookup_and_blends_the_request_history():
    dep, ctl = Deployment([0.6], draft_per_token=0.010), _controller()
    _ks(dep, ctl, 200, load=1, sources=(NGRAM, "model"))
    choice = ctl.choose(1, {NGRAM: 4, "model": 6})
    choice = ctl.choose(1, {NGRAM: 4, "model": 6}) if choice.probe else choice  # the deployment's probe is due
    assert choice.source == NGRAM and not choice.probe
    # a new request of the same deployment starts from what the deployment learnt
    fresh = GoodputController(ctl.est, ctl.settings)
    assert fresh.choose(1, {NGRAM: 4}).k >= 1
    assert fresh.expected_accepted(NGRAM, 3) == pytest.approx(ctl.expected_accepted(NGRAM, 3), rel=0.3)


def test_controller_charges_the_draft_models_catch_up():
    dep, ctl = Deployment([0.8], draft_per_token=0.004), _controller()
    _ks(dep, ctl, 100, load=1)
    for _ in range(5):  # catch-up prefills measured at 2 ms per missed token
        ctl.record(1, "model", 2, 2, 0.048, ctl.draft_cost("model", 2, 1) + 0.002 * 40, missed=42)
    assert ctl.draft_cost("model", 2, 1, missed=42) == pytest.approx(ctl.draft_cost("model", 2, 1) + 0.080, rel=0.05)
    assert ctl.choose(1, {"model": 6}, missed=1000).k == 0  # catching up on 1,000 tokens does not pay


def test_controller_does_not_draft_at_load_where_the_draft_model_does_not_pay_the_deployment():
    # the demo at 8 in flight: a plain batched step 150 ms, each draft row adds 12 ms to it, the draft model 8 ms a
    # token, acceptance 0.28 / 0.08 / 0.02. For the request alone a 1-token draft looks like a win (1.28 tokens for
    # 170 ms against 1 for 150 ms), but its rows and its draft call are not shared with the other 7: per engine
    # second the deployment makes 53 tokens plainly and 33 drafting
    dep = Deployment([0.28, 0.08, 0.02], draft_per_token=0.008, step=lambda load: 0.150)
    dep.step_cost = lambda k: 0.150 + 0.012 * k
    ctl = _controller(probe_every=8)
    choices = [dep.iterate(ctl, load=8, cap=3) for _ in range(400)]
    assert sum(c.k > 0 and not c.probe for c in choices[50:]) == 0
    assert sum(c.probe for c in choices[50:]) <= 350 // 8 // 2  # probes get rarer as they keep failing
    # the same costs at one in flight, where nobody else waits for the step: 1.28 tokens per 170 ms beats 1 per 150
    # (whether 1 or 2 tokens: position 2's acceptance is still being learnt, optimistically, from few drafts)
    assert sum(c.k > 0 for c in [dep.iterate(ctl, load=1, cap=3) for _ in range(100)][50:]) >= 40


def test_controller_drafts_at_load_when_the_draft_rows_and_draft_model_are_cheap():
    # a device with headroom at 8 in flight (a draft row adds 1 ms to a 150 ms step): drafting pays the deployment
    dep = Deployment([0.9], draft_per_token=0.001, step=lambda load: 0.150)
    dep.step_cost = lambda k: 0.150 + 0.001 * k
    ctl = _controller()
    assert np.mean(_ks(dep, ctl, 300, load=8)[100:]) >= 3


def test_controller_never_takes_draft_rows_at_a_load_where_they_were_not_measured_for_free():
    for alone_row in (0.020, 0.004):
        ctl = _controller()
        for _ in range(20):  # at 1 in flight: a plain step 40 ms, alone_row per draft row
            for k in (0, 3):
                ctl.record(1, NGRAM if k else None, k, 0, 0.040 + alone_row * k)
            ctl.record(8, None, 0, 0, 0.150)  # at 8 only plain steps were measured: 110 ms more for 7 more rows
        assert ctl.verify_cost(3, 1) == pytest.approx(0.040 + 3 * alone_row)
        # at 8 a row costs at least what one more request adds to the plain step (~16 ms), more if alone says so
        assert ctl.verify_cost(3, 8) == pytest.approx(0.150 + 3 * max(alone_row, 0.110 / 7))
    fresh = _controller()
    fresh.record(1, None, 0, 0, 0.040)
    fresh.record(8, None, 0, 0, 0.110)  # draft rows measured nowhere: what a request's row adds to a plain step
    assert fresh.verify_cost(2, 8) == pytest.approx(0.110 + 2 * 0.010)


def test_controller_prices_draft_rows_at_load_by_what_they_add_to_the_step_not_by_the_requests_own_wait():
    # the demo's reference engine on 2 CPU cores: alone, a plain step 70 ms and each draft row +35 ms; at 8 in flight
    # every call waits for the same ~250 ms steps whatever its own k (the others' rows lengthen them as much), so a
    # request's k = 4 call and its k = 0 call take the same time there. Prompt lookup accepted 0.9 per position pays
    # alone (4.1 tokens for 210 ms against 1 for 70) and not at 8 (4 rows, 140 ms of everyone's step, for 3.1 more
    # tokens where a plain step's 1/8 share makes one in 31 ms)
    rng = np.random.default_rng(0)
    ctl = _controller(probe_every=8)

    def iterate(load):
        choice = ctl.choose(load, {NGRAM: 4})
        accepted = 0
        while accepted < choice.k and rng.random() < 0.9:
            accepted += 1
        verify = 0.070 + 0.035 * choice.k if load == 1 else 0.250 + rng.normal(0, 0.01)
        ctl.record(load, choice.source, choice.k, accepted, verify)
        return choice

    alone = [iterate(1) for _ in range(100)]
    assert np.mean([c.k for c in alone[50:]]) >= 2
    crowded = [iterate(8) for _ in range(300)]
    assert sum(c.k > 0 and not c.probe for c in crowded[50:]) == 0
    assert ctl.verify_cost(4, 8) == pytest.approx(0.250 + 4 * 0.035, rel=0.05)
    # nobody alone yet: one more request in flight adds a row to the plain step (here 25 ms from 4 to 8 in flight)
    fresh = _controller()
    for _ in range(10):
        fresh.record(4, None, 0, 0, 0.150)
        fresh.record(8, None, 0, 0, 0.250)
        fresh.record(8, NGRAM, 4, 1, 0.250)
    assert fresh.verify_cost(4, 8) == pytest.approx(0.250 + 4 * 0.025)


def test_controller_tries_a_longer_draft_when_a_verify_call_costs_a_fixed_amount_more_than_a_plain_step():
    # the reference engine on CPU: a plain step 64 ms, any call with drafts 64 + 60 + 5 k ms (a multi-token segment
    # costs a fixed amount more). Measured at k = 1 only, k = 4 is not four times k = 1's extra: with prompt lookup
    # accepting 0.9 per position, k = 4 (4.1 tokens for 184 ms) beats k = 1 (1.9 for 129) and a plain step
    rng = np.random.default_rng(0)
    ctl = _controller(probe_every=8)
    ks = []
    for _ in range(200):
        choice = ctl.choose(1, {NGRAM: 4})
        accepted = 0
        while accepted < choice.k and rng.random() < 0.9:
            accepted += 1
        ctl.record(1, choice.source, choice.k, accepted, 0.064 + (0.060 + 0.005 * choice.k if choice.k else 0.0))
        ks.append(choice.k)
    assert np.mean(ks[100:]) >= 3.5
    assert ctl.verify_cost(4, 1) == pytest.approx(0.064 + 0.080, rel=0.02)
    fresh = _controller()
    for _ in range(10):  # only k = 1 measured alone: k = 4 is priced as it, to be tried, not at 0.064 + 4 * 0.065
        fresh.record(1, None, 0, 0, 0.064)
        fresh.record(1, NGRAM, 1, 1, 0.129)
    assert fresh.verify_cost(4, 1) == pytest.approx(0.129)


def test_controller_scales_a_draft_cost_measured_at_lighter_load():
    ctl = _controller()
    for _ in range(20):
        ctl.record(1, None, 0, 0, 0.040)
        ctl.record(8, None, 0, 0, 0.120)  # the device is three times as busy at 8 in flight
        ctl.record(1, "model", 2, 1, 0.048, draft_s=0.010)
    assert ctl.draft_cost("model", 2, 1) == pytest.approx(0.010)
    assert ctl.draft_cost("model", 2, 8) == pytest.approx(0.030 / 8)  # a share of the batch's call


def test_controller_does_not_probe_on_a_requests_first_call():
    # a probe of the draft model on the first call would prefill the whole prompt on the draft model before the
    # request's first token; the probe waits for the next iteration instead
    ctl = _controller(probe_every=8)
    for _ in range(20):
        ctl.record(1, None, 0, 0, 0.040)
        ctl.record(1, "model", 1, 0, 0.048, draft_s=0.010)
    for _ in range(8):
        assert ctl.choose(1, {"model": 4}).k == 0  # acceptance 0: plain steps until the probe is due
        ctl.record(1, None, 0, 0, 0.040)
    for _ in range(2):  # the probe's draft call and its verify row: 18 ms at a 5% share, 0.36 s of steps
        ctl.record(1, None, 0, 0, 0.040)
    assert ctl.choose(1, {"model": 4}, missed=300, may_probe=False) == Choice(None, 0)
    assert ctl.choose(1, {"model": 4}, missed=2).probe


def test_controller_probes_prompt_lookup_only_alone_where_a_probe_measures_its_rows():
    # prompt lookup's acceptance comes from its proposals scored for free (observe), and its rows' cost from calls
    # alone: at 16 in flight a probe (up to 4 rows in everyone's step) would learn nothing (measured on the demo
    # at 16 in flight: 60 such probes in 978 iterations, 0.95x target-only)
    ctl = _controller(probe_every=8)
    for _ in range(20):
        ctl.record(1, None, 0, 0, 0.040)
        ctl.record(1, NGRAM, 4, 0, 0.060)
        ctl.record(16, None, 0, 0, 0.200)
    ctl.observe([(NGRAM, 4, 0)] * 20)  # lookups that did not match what the target produced
    crowded = []
    for _ in range(64):
        crowded.append(ctl.choose(16, {NGRAM: 4}))
        ctl.record(16, None, 0, 0, 0.200)
    assert all(c.k == 0 for c in crowded)
    alone = []
    for _ in range(16):
        alone.append(ctl.choose(1, {NGRAM: 4}))
        ctl.record(1, None, 0, 0, 0.040)
    assert any(c.probe for c in alone)


def test_controller_asks_an_in_engine_drafter_for_a_draft_only_when_the_next_iteration_may_use_it():
    # EAGLE-3 in the target drafts for the next call when asked: asked on every call, a k = 0 stretch would pay
    # the head's drafting on each plain step; asked only when drafting pays or its probe is due, it does not
    ctl = _controller(probe_every=8)
    assert ctl.next_draft_len("model", 4, load=1) == 0  # a fresh deployment: nothing measured, no probe due yet
    for _ in range(20):
        ctl.record(1, None, 0, 0, 0.040)
        ctl.record(1, "model", 3, 0, 0.060, draft_s=0.0)
    asked = []
    # acceptance 0: plain steps, one probe per interval (its verify rows, 4 calls of 20 ms, at most 5% of the time:
    # 1.6 s), announced one iteration before it
    verified = 0  # the head's draft that came with the last answer, verified by this call (Planner.plan)
    for _ in range(80):
        k = ctl.next_draft_len("model", 4, load=1)
        asked.append(k > 0)
        ctl.record(1, "model" if verified else None, verified, 0, 0.060 if verified else 0.040, 0.0)
        verified = k
    assert 1 <= sum(asked) <= 80 // 8
    assert ctl.next_draft_len("model", 0, load=1) == 0
    for _ in range(30):  # once its drafts are accepted, it drafts: asked every iteration, for what it will draft
        ctl.record(1, "model", 3, 3, 0.060, draft_s=0.0)
    assert ctl.next_draft_len("model", 4, load=1) == ctl.choose(1, {"model": 4}).k >= 3


def test_an_iterations_own_overhead_is_priced_a_drafting_iteration_pays_it_a_plain_run_spreads_it():
    # One request, prompt lookup accepted 12% of the time: a verify of 1 costs 42 ms against a 40 ms step, so
    # drafting pays on the engine's costs alone. Each iteration also spends 6 ms outside its calls (the loop, the
    # answer's way to the client): a drafting iteration pays it for its 1.12 tokens, a plain run once for 16, and
    # drafting stops paying; where a plain call is a token, the plain step pays it too, and drafting pays again.
    ctl = _controller(probe_every=1000)
    for i in range(100):
        ctl.record(1, None, 0, 0, 0.040)
        ctl.record(1, NGRAM, 1, int(i % 25 < 3), 0.042)
    assert ctl.choose(1, {NGRAM: 1}, plain_run=16).k == 1  # nothing outside the calls measured yet
    for _ in range(10):
        ctl.record(1, None, 0, 0, 0.040, overhead_s=0.006)
    assert ctl.iteration_overhead(1) == pytest.approx(0.006)
    assert ctl.choose(1, {NGRAM: 1}, plain_run=16).k == 0
    assert ctl.choose(1, {NGRAM: 1}, plain_run=1).k == 1


def test_controller_asks_an_in_engine_drafter_for_the_k_it_will_draft_not_for_its_cap():
    # the head's first draft is accepted, its later ones not: drafting 1 pays, 3 does not; each call pays for the
    # head's drafting of what it asks, so asking for 3 where 1 will be drafted would cost two head steps for nothing
    ctl = _controller(probe_every=8)
    for _ in range(30):
        ctl.record(1, None, 0, 0, 0.040)
        ctl.record(1, "model", 1, 1, 0.045, draft_s=0.0)
        ctl.record(1, "model", 3, 1, 0.062, draft_s=0.0)
    assert ctl.choose(1, {"model": 3}).k == 1
    assert ctl.next_draft_len("model", 3, load=1) == 1


def test_controller_learns_a_requests_prompt_lookup_rate_from_proposals_it_did_not_draft():
    # the deployment's prompt lookups are mostly accepted (grounded requests); this request's are not (chat that
    # happens to repeat a few words): scored for free against what the target produced, it stops drafting them
    est = Estimates()
    from trtspec.config import AdaptivePolicy

    grounded = GoodputController(est, AdaptivePolicy())
    for _ in range(20):
        grounded.record(1, None, 0, 0, 0.040)
        grounded.record(1, NGRAM, 4, 4, 0.080)  # a verify call costs 2 plain steps, as on the CPU engine
    chat = GoodputController(est, AdaptivePolicy())
    assert chat.choose(1, {NGRAM: 4}).k >= 1  # new request: the deployment's rate, which pays
    for _ in range(20):
        chat.observe([(NGRAM, 4, 0)])
    assert chat.choose(1, {NGRAM: 4}).k == 0
    assert GoodputController(est, AdaptivePolicy()).choose(1, {NGRAM: 4}).k >= 1  # the next request starts over
    chat.observe([(NGRAM, 0, 0)])  # no proposal: no sample
    assert chat.reached[ESTIMATE_KEYS.index(NGRAM), 0] == 20


def test_controller_probes_are_the_deployments_not_each_requests():
    # short requests at k = 0 (the draft model does not pay): a new request must not probe afresh, nor undo the
    # doubling of the interval that earlier failed probes earned
    dep = Deployment([0.02], draft_per_token=0.010)
    est = Estimates()
    from trtspec.config import AdaptivePolicy

    probes = 0
    for _ in range(60):  # 60 requests of 12 iterations: per request, each would probe at its 9th
        ctl = GoodputController(est, AdaptivePolicy(probe_every=8))
        probes += sum(dep.iterate(ctl, load=1).probe for _ in range(12))
    # after the first few, one per MAX_PROBE_BACKOFF x probe_every plain steps of the deployment
    assert probes <= 720 // int(8 * MAX_PROBE_BACKOFF) + 4


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


def test_ngram_continues_a_loop_past_the_sequences_end():
    assert propose([5, 1, 2, 1, 2], 5, n_max=2) == [1, 2, 1, 2, 1]  # period 2
    assert propose([4, 7, 7, 7], 3, n_max=2) == [7, 7, 7]


def test_ngram_respects_min_n():
    seq = [1, 2, 3, 9, 3]
    assert propose(seq, 2, n_max=3, n_min=1) == [9, 3]
    assert propose(seq, 2, n_max=3, n_min=2) == []


def test_prompt_lookup_is_estimated_by_the_length_of_its_match():
    # "a b c ... a b c" matches 3 tokens, "x ... x" only 1: their acceptance differs (1-token matches are mostly
    # wrong), so the controller keeps one estimate per match level and a request's poor 1-token lookups do not
    # hold back its 3-token ones
    assert ngram_match([1, 2, 3, 9, 1, 2, 3], 2) == ([9, 1], 3)
    assert ngram_match([5, 9, 7, 5], 2) == ([9, 7], 1)
    assert ngram_match([5, 9, 7], 2) == ([], 0)
    assert [estimate_key("ngram", n) for n in (1, 2, 3, 7)] == ["ngram@1", "ngram@2", "ngram@3", "ngram@3"]
    assert estimate_key("model") == "model" and set(ESTIMATE_KEYS) == {"model", "ngram@1", "ngram@2", "ngram@3"}
    ctl = _controller()
    for _ in range(30):
        ctl.record(1, None, 0, 0, 0.040)
        ctl.record(1, NGRAM, 4, 4, 0.060)
        ctl.observe([("ngram@1", 4, 0)])
    assert ctl.choose(1, {NGRAM: 4}).k == 4 and ctl.choose(1, {"ngram@1": 4}).k == 0


def test_at_load_on_a_cpus_steps_a_draft_row_costs_what_one_more_request_does():
    """The demo's reference engine on 2 CPU cores, through Triton: a plain call takes 50 / 52 / 70 / 125 ms at
    1 / 2 / 4 / 8 in flight (one more request adds ~14 ms near 8), and the calls' times by the tokens in flight
    fall on a line with a large intercept (waits, round trips), whose slope reads a row at a few ms. At 8 in flight
    prompt lookup accepted 0.6 a position does not pay there (measured: 20% more rows ran 0.8x); at 2, where one
    more request adds little, it does. Priced as a GPU's batched steps (by the line), the same drafts would be taken
    at 8, as they are where 8 in flight cost what 1 does."""
    def trained(plain: dict[int, float], per_token: float, batched: bool) -> GoodputController:
        ctl = _controller(batched_steps=batched)
        for _ in range(30):
            for load, s in plain.items():
                ctl.record(load, None, 0, 0, s, step_tokens=load)
                ctl.record(load, NGRAM, 2, 2, s + per_token * 2 * load, step_tokens=3 * load)
        for _ in range(50):
            ctl.observe([(NGRAM, 4, 4), (NGRAM, 4, 2), (NGRAM, 4, 1)])
        return ctl

    cpu_steps = {1: 0.050, 2: 0.052, 4: 0.070, 8: 0.125}
    cpu = trained(cpu_steps, per_token=0.002, batched=False)
    assert cpu.request_cost(8) == pytest.approx(0.0139, rel=0.05)
    assert cpu.choose(8, {NGRAM: 4}, may_probe=False).k == 0
    assert cpu.choose(2, {NGRAM: 4}, may_probe=False).k > 0
    assert trained(cpu_steps, per_token=0.002, batched=True).choose(8, {NGRAM: 4}, may_probe=False).k > 0
    gpu = trained({1: 0.0070, 2: 0.0070, 4: 0.0071, 8: 0.0072}, per_token=0.00002, batched=True)
    assert gpu.choose(8, {NGRAM: 4}, may_probe=False).k > 0


def test_controller_prices_the_in_engine_drafters_catch_up_as_measured():
    # EAGLE-3 asked after a plain stretch catches the head up on every position it missed inside the call (measured
    # on this CPU: ~6.3 ms a position, 0.13 of a step). Unpriced, a request asked for a draft after 40 plain tokens
    # paid ~5 steps for one token's worth of acceptance, and every request in its step waited (held-out prompts
    # through Triton: 0.83x / 0.88x target-only at 4 / 8 in flight)
    ctl = _controller(probe_every=8, batched_steps=False)  # a CPU's: each call its own
    for _ in range(30):
        ctl.record(4, None, 0, 0, 0.040)
        ctl.record(4, "model", 1, 1, 0.048, draft_s=0.0)
        ctl.record(4, "model", 1, 0, 0.048, draft_s=0.0)  # acceptance 0.5 at the first position: k = 1 pays
    assert ctl.head_catchup_cost(40, 4) == 0.0  # nothing measured: a probe measures it
    assert ctl.next_draft_len("model", 3, load=4, missed=40, remaining=40) >= 1
    ctl.record_head_catchup(4, 20, 20 * 0.0063)
    assert abs(ctl.head_catchup_cost(40, 4) - 40 * 0.0063) < 1e-9
    assert abs(ctl.head_catchup_cost(40, 8) - 40 * 0.0063) < 1e-9  # the nearest load measured
    assert ctl.next_draft_len("model", 3, load=4, missed=40, remaining=40, may_probe=False) == 0
    assert ctl.next_draft_len("model", 3, load=4, missed=0, remaining=40) >= 1  # caught up: drafting pays again
    assert ctl.next_draft_len("model", 3, load=4, missed=40, remaining=4000) >= 1  # spread over a long answer


def test_a_cpus_draft_rows_are_priced_by_what_a_drafting_call_measured_at_the_load():
    # This CPU's kernels: a step of 2-4 rows costs what one does, a 5th adds ~29%. The steps by their tokens (flat
    # at 2-4, a few at 5-6) put a line through that cliff, which priced a draft row at 4 in flight at a fifth of a
    # share: prompt lookup at 0.6 drafted, and the held-out chat cells read 0.90x target-only through Triton. A
    # drafting call's own time at the load prices it; where that call measured the rows as cheap, drafting pays.
    key = estimate_key("ngram", 2)

    def controller(drafting_call_s: float) -> GoodputController:
        ctl = _controller(probe_every=8, batched_steps=False)
        for i in range(40):
            for tokens in (2, 3, 4):
                ctl.record(4, None, 0, 0, 0.040, step_tokens=tokens)
            ctl.record(4, key, 1, int(i % 5 < 3), drafting_call_s, step_tokens=5 + i % 2)
        for tokens, seconds in ((5, 0.052), (6, 0.058)):
            ctl.est.step_s[tokens] = seconds  # the cliff, as the steps measured it
        return ctl

    assert controller(0.052).choose(4, {key: 1}, may_probe=False).k == 0
    assert controller(0.041).choose(4, {key: 1}, may_probe=False).k == 1


def test_a_draft_model_probe_is_spaced_by_its_whole_call_the_catch_up_included():
    # A probe's draft call catches the draft model up on what it missed first (a request that has not drafted: its
    # whole sequence). Priced by its drafted tokens alone, probes of the demo's draft at 4 in flight cost the
    # deployment ~29 ms each on this CPU, far past the share PROBE_SHARE allows.
    dep, ctl = Deployment([0.8], draft_per_token=0.004), _controller()
    _ks(dep, ctl, 100, load=1)
    for _ in range(5):  # catch-up prefills measured at 2 ms per missed token
        ctl.record(1, "model", 2, 2, 0.048, ctl.draft_cost("model", 2, 1) + 0.002 * 40, missed=42)
    si = ESTIMATE_KEYS.index("model")
    ctl.est.probe_backoff[si] = 1.0
    ctl.est.last_drafted[si] = ctl.est.clock[0] - 12.0  # 12 s of the deployment's time without drafting
    # no catch-up: a probe drafting up to 64 tokens (0.26 s) and verifying them (0.26 s more) is due after ~10 s
    assert ctl.probe_due("model", 1, missed=2)
    assert not ctl.probe_due("model", 1, missed=1000)  # ~2 s more of catch-up: due after ~50 s


def test_a_request_answered_in_one_run_still_drafts_where_lookup_or_a_probe_would():
    # Once the deployment has stopped drafting, a request that is not streamed takes its plain calls as whole runs
    # (target-only's calls). A run of 16 tokens answers a short request in one call: it never looks up a match its
    # answer makes, nor takes the deployment's probe, which only a later call does; a quiet deployment that gets
    # short answers never drafted again (grounded prompts alone, where prompt lookup pays 1.4x: nothing drafted, in
    # CI). A whole run is taken only where nothing would draft within it.
    from trtspec.config import SpeculativeConfig
    from trtspec.spec.drafters import Proposal
    from trtspec.spec.planner import Planner, RequestPolicy
    from trtspec.spec.speculative import PLAIN_RUN_MAX

    def first_call_asks(selection, lookup_acceptance=0.9, model_probed_now=False):
        spec = SpeculativeConfig.of(3, 3, draft_length_policy="adaptive", adaptive={"batched_steps": False})
        est = Estimates()
        ctl = GoodputController(est, spec.adaptive)
        for _ in range(200):  # plain steps at 1 in flight, long past the last choice to draft
            ctl.record(1, None, 0, 0, 0.040)
        est.verify_s[3, 1], est.verify_n[3, 1] = 0.060, 10  # 3 rows alone: half a step more
        si = ESTIMATE_KEYS.index(estimate_key("ngram", 3))
        est.reached[si, :3], est.accepted[si, :3] = 50.0, 50.0 * lookup_acceptance
        if model_probed_now:
            est.last_drafted[ESTIMATE_KEYS.index("model")] = est.clock[0]
        assert not ctl.drafting_lately(1)
        planner = Planner(spec, est, RequestPolicy(16, 3, True, selection), ("ngram", "model")
                          if selection == "hybrid" else (selection,))
        return planner.plan(1, [0, 5, 6, 7], lambda s, seq, k: Proposal([])).plain

    assert first_call_asks("hybrid") == 1  # lookup drafts a match here: the answer may make one
    assert first_call_asks("ngram") == 1
    assert first_call_asks("ngram", lookup_acceptance=0.1) == PLAIN_RUN_MAX  # it would not: target-only's calls
    # the deployment's probe is due: the next call takes it, so this one leaves one (a call more, not a token a call)
    assert first_call_asks("model") == 8
    assert first_call_asks("model", model_probed_now=True) == PLAIN_RUN_MAX


def test_others_drafting_does_not_cut_a_requests_runs_where_steps_are_not_batched():
    # On a CPU (steps not batched) each request's choice is its own: two requests of eight drafting (their own
    # acceptance) cut every other request's runs into calls of a token or two, each a step's wait (EAGLE-3 at 4 and
    # 8 in flight: 0.93-0.96x target-only, drafting in 1% of iterations). Batched, or alone, the deployment's choices
    # still count: the steps mix drafting and plain requests, and a lone request's predecessor is the best guess.
    from trtspec.config import SpeculativeConfig
    from trtspec.spec.drafters import Proposal
    from trtspec.spec.planner import Planner, RequestPolicy
    from trtspec.spec.speculative import PLAIN_RUN_MAX

    def asks(load, batched, own_drafted=False):
        spec = SpeculativeConfig.of(3, 3, draft_length_policy="adaptive", adaptive={"batched_steps": batched})
        est = Estimates()
        ctl = GoodputController(est, spec.adaptive)
        for _ in range(50):
            ctl.record(load, None, 0, 0, 0.040)
        est.last_chosen[ESTIMATE_KEYS.index("model")] = est.clock[0]  # another request chose to draft just now
        est.last_drafted[ESTIMATE_KEYS.index("model")] = est.clock[0]  # (so no probe is due)
        assert ctl.drafting_lately(load)
        planner = Planner(spec, est, RequestPolicy(48, 3, True, "model"), ("model",))
        planner.drafted = own_drafted
        return planner.plan(load, [0, 5, 6, 7], lambda s, seq, k: Proposal([])).plain

    assert asks(8, batched=False) == PLAIN_RUN_MAX
    assert asks(8, batched=False, own_drafted=True) == 1
    assert asks(1, batched=False) == 1
    assert asks(8, batched=True) == 1


def test_a_probe_of_the_in_engine_drafter_is_one_requests_not_every_asking_ones():
    # 8 requests in flight each ask the controller before the one probing has drafted: asked-for probes were all
    # taken (each paying its head's catch-up: 8 catch-ups where 1 was due, 0.66x target-only at 8 in flight)
    ctl = _controller(probe_every=8, batched_steps=False)
    for _ in range(30):
        ctl.record(8, None, 0, 0, 0.100)
    ctl.record_head_catchup(8, 10, 10 * 0.006)
    for _ in range(600):  # long enough for a probe to be due, even with its catch-up (3.5 s of the deployment)
        ctl.record(8, None, 0, 0, 0.100)
    asked = [ctl.next_draft("model", 3, load=8, missed=30, remaining=40) for _ in range(8)]
    assert sum(a.probe for a in asked) == 1 and all(a.k == 0 for a in asked if not a.probe)


def _probe_run_calls(accept: bool, load: int = 4) -> int:
    """Calls in a row that a request verifies a probe of the target's own drafter in, its drafts all accepted or all
    rejected: the planner driven as the loop drives it, the head's draft coming with each answer."""
    from trtspec.config import SpeculativeConfig
    from trtspec.spec.drafters import Proposal
    from trtspec.spec.planner import Planner, RequestPolicy

    spec = SpeculativeConfig.of(3, 3, draft_length_policy="adaptive", adaptive={"batched_steps": False,
                                                                                "probe_every": 8})
    est = Estimates()
    ctl = GoodputController(est, spec.adaptive)
    for _ in range(400):  # plain steps long past any drafting: a probe is due, and drafting does not pay
        ctl.record(load, None, 0, 0, 0.040)
    est.verify_s[1, load], est.verify_n[1, load] = 0.052, 10
    planner = Planner(spec, est, RequestPolicy(64, 3, True, "model"), ("model",), in_target=True)
    seq, head, verified = list(range(40)), [], []
    for _ in range(12):
        plan = planner.plan(load, seq, lambda s, q, k: Proposal(list(head)))
        draft = plan.tokens or []
        new = (list(draft) if accept else [t + 1 for t in draft[:1]]) + [7]
        seq += new
        planner.outcome(plan, load, draft, new, 0.052 if draft else 0.040, None, seq, len(new),
                        lambda s, q, k: Proposal([]))
        head = [7] * plan.next_k  # what the head drafted for the next call
        verified.append(bool(draft))
    return sum(verified)


def test_a_probe_of_the_in_engine_drafter_goes_on_only_while_its_drafts_are_accepted():
    # Once the head is caught up, its probe goes on for up to PROBE_RUN calls (one sample per catch-up left the
    # estimate at its prior for long). Each call more costs the head's steps and the verify's rows (a third of a
    # step on this project's CPU): where the drafts are rejected it stopped, so a weak head's probes cost a call's
    # rows, not four (EAGLE-3 at 8 in flight, weak acceptance, in the simulator: 0.976x -> 0.982x target-only).
    from trtspec.spec.controller import PROBE_RUN
    assert _probe_run_calls(accept=True) >= PROBE_RUN  # (and then it drafts: accepted, drafting pays)
    assert _probe_run_calls(accept=False) == 2  # the call that verified the rejected draft had asked for the next


def test_alone_a_probe_of_the_in_engine_drafter_goes_on_for_its_whole_run():
    # Alone, the rows are the request's own and the catch-up is paid: each call more buys a sample for a head step
    # and a row. Stopped at the first rejection, a cold deployment's probes learnt one or two samples each, and the
    # pessimistic prior held (served at 1 in flight: 4 draft tokens in 24 requests, 0.94x target-only)
    from trtspec.spec.controller import PROBE_RUN
    assert _probe_run_calls(accept=False, load=1) == PROBE_RUN


def test_a_first_call_prices_the_heads_extension_over_the_prompt_not_a_catch_up_mid_request():
    # The target computes a prompt's states in the first call anyway: asking the head for a draft there adds its
    # extension alone (this project's CPU: 7.0 against 6.4 ms a prompt token), where a catch-up mid-request
    # recomputes the target's states too (5.7 ms a position). Priced as the latter, a request whose head would pay
    # started in plain runs and never drafted (served, the bench's chat at 1 in flight: 1.00x target-only)
    ctl = _controller(batched_steps=False)
    est = ctl.est
    est.verify_s[:2, 1], est.verify_n[:2, 1] = (0.0316, 0.0385), (20, 20)
    est.head_catchup_s[1], est.head_catchup_n[1] = 0.0057, 10
    est.draft_fit[1], est.draft_fit_n[1] = (1, 0, 0, 0, 0), 1  # the head's drafts come with the answer: no call
    si = ESTIMATE_KEYS.index("model")
    est.reached[si, 0], est.accepted[si, 0] = 1000, 300
    first = dict(missed=25, remaining=48, may_probe=False, first_call=True)
    assert ctl.head_catchup_cost(25, 1, first_call=True) == ctl.head_catchup_cost(25, 1)  # until both are measured
    assert ctl.next_draft("model", 1, 1, **first).k == 0
    for _ in range(5):
        ctl.record_first_call(False, 25, 25 * 0.0064)
        ctl.record_first_call(True, 25, 25 * 0.0070)
    assert ctl.head_catchup_cost(25, 1, first_call=True) == pytest.approx(25 * 0.0006)
    assert ctl.next_draft("model", 1, 1, **first).k == 1
    assert ctl.next_draft("model", 1, 1, **dict(first, first_call=False)).k == 0  # mid-request it does not pay


def test_a_probe_is_spaced_by_its_verify_rows_too():
    # A probe's rows lengthen the step every request in it waits for: on this project's CPU a row is a quarter of a
    # step at 4 in flight (44.6 -> 56.0 ms), and the head's probe verifies rows in up to PROBE_RUN calls. Spaced by its
    # catch-up alone, EAGLE-3's probes cost the deployment 3-4.5% at 4 and 8 in flight (simulator, this CPU's costs).
    ctl = _controller(probe_every=8, batched_steps=False)
    for _ in range(30):
        ctl.record(1, None, 0, 0, 0.040)
        ctl.record(4, None, 0, 0, 0.045)
    si = ESTIMATE_KEYS.index("model")
    ctl.est.last_drafted[si] = ctl.est.clock[0] - 0.5  # 0.5 s without drafting: 8 plain steps are 0.36 s
    assert ctl.probe_due("model", 4, head_missed=1, in_target=True)  # no row measured: priced at nothing yet
    ctl.est.verify_s[1, 1], ctl.est.verify_n[1, 1] = 0.051, 10  # a row measured alone, where a call shows it
    ctl.est.costs_version[0] += 1
    # 4 calls of an 11 ms row at a 5% share: 0.9 s
    assert not ctl.probe_due("model", 4, head_missed=1, in_target=True)
    ctl.est.last_drafted[si] = ctl.est.clock[0] - 1.0
    assert ctl.probe_due("model", 4, head_missed=1, in_target=True)


def test_a_plain_run_is_priced_by_its_steps_and_one_call_not_by_the_mean_of_calls_of_every_length():
    # A plain call costs its steps and, once, the engine request's round trip. Where a request steps aside in
    # stretches that double from one token (1, 2, 4, 8, 16), the mean per step over those calls carries ~40% of a
    # round trip, and a drafting iteration that saves less than that looked cheaper than a plain run, which carries
    # 1/16 of one (this CPU's deployment at 1 in flight: 5 times the target calls of target-only, 0.97x).
    ctl = _controller(probe_every=1000, batched_steps=False)
    for _ in range(40):
        for steps in (1, 2, 4, 8, 16):  # 16 ms a call beyond its 40 ms steps: 46 ms a step, the mean over them
            ctl.record(1, None, 0, 0, (0.016 + 0.040 * steps) / steps, steps=steps)
    a, b = ctl.plain_call(1)
    assert a == pytest.approx(0.016) and b == pytest.approx(0.040)
    for i in range(100):  # prompt lookup: a verify of 1 is a call of 60 ms, accepted a third of the time: 45 ms a token
        ctl.record(1, NGRAM, 1, int(i % 3 == 0), 0.060)
    assert ctl.choose(1, {NGRAM: 1}, plain_run=1).k == 1  # against plain calls of a token: 56 ms a token
    assert ctl.choose(1, {NGRAM: 1}, plain_run=16).k == 0  # against runs: 41 ms a token


def test_plain_calls_of_one_length_do_not_tell_a_call_from_its_steps():
    ctl = _controller()
    for _ in range(20):
        ctl.record(1, None, 0, 0, 0.040, steps=16)
    assert ctl.plain_call(1) is None
