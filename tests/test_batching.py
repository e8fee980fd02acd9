"""The in-flight batcher without Triton: batched rows equal solo runs (generate, verify, chunked prefill),
limits queue instead of failing, and a full queue is a clear error."""

import threading
import time

import pytest

from trtspec.reference_engine import batching
from trtspec.reference_engine.batching import BatchScheduler, QueueFull
from trtspec.reference_engine import EngineRequest, ReferenceEngine

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2][: 3 + i] for i in range(8)]


@pytest.fixture(scope="module")
def engine(tiny_target):
    return ReferenceEngine(tiny_target, device="cpu")


def _requests():
    reqs = [EngineRequest(list(p), output_len=6) for p in PROMPTS]
    reqs += [EngineRequest(list(p), output_len=3, draft_ids=[4, 5]) for p in PROMPTS[:3]]  # verify rows
    return reqs


def test_batched_equals_solo_with_chunked_prefill(engine, tiny_target):
    solo = [engine.run(r).tokens for r in _requests()]
    fresh = ReferenceEngine(tiny_target, device="cpu")  # nothing cached: every prompt is prefilled in the batch
    seen = []  # (active, queued, tokens, kv bytes) after each step: what the Prometheus gauges show
    scheduler = BatchScheduler(fresh, max_batch_size=4, max_num_tokens=5,  # prompts of up to 10 tokens: chunked
                               on_step=lambda s: seen.append((s.active, s.queued, s.last_step_tokens, s.kv_bytes)))
    try:
        futures = [scheduler.submit(r) for r in _requests()]
        assert [f.result(60).tokens for f in futures] == solo
        assert scheduler.stats.max_active == 4 and len(seen) >= scheduler.stats.steps  # + the drained report
        assert max(a for a, *_ in seen) == 4 and max(t for _, _, t, _ in seen) == 5  # batch and step bounds held
        assert max(q for _, q, *_ in seen) > 0 and min(kv for *_, kv in seen[:-1]) > 0
        assert seen[-1][:2] == (0, 0) and seen[-1][3] == 0  # drained
    finally:
        scheduler.close()


def test_full_queue_is_refused_and_the_rest_drains(engine):
    scheduler = BatchScheduler(engine, max_batch_size=1, max_num_tokens=64, max_queue_size=2)
    gate = threading.Event()
    original = engine.forward
    engine.forward = lambda segments: (gate.wait(30), original(segments))  # hold the first step
    try:
        futures = [scheduler.submit(EngineRequest([1, 2, 3], output_len=2))]
        deadline = time.monotonic() + 60
        while scheduler.stats.active == 0:
            assert time.monotonic() < deadline, "the first request never started"
            threading.Event().wait(0.01)
        futures += [scheduler.submit(EngineRequest([1, 2, 3 + i], output_len=2)) for i in range(2)]
        with pytest.raises(QueueFull, match="queue is full.*max_batch_size"):
            scheduler.submit(EngineRequest([1, 2], output_len=2))
        gate.set()
        assert all(len(f.result(60).new_tokens) == 2 for f in futures)
    finally:
        gate.set()
        engine.forward = original
        scheduler.close()


def test_a_refused_request_fails_alone(engine):
    scheduler = BatchScheduler(engine, max_batch_size=2)
    try:
        bad, good = scheduler.submit(EngineRequest([], output_len=2)), scheduler.submit(EngineRequest([1, 2], output_len=2))
        with pytest.raises(ValueError, match="input_ids is empty"):
            bad.result(60)
        assert len(good.result(60).new_tokens) == 2
    finally:
        scheduler.close()


def test_requests_answered_after_a_step_are_regathered_into_the_next(engine):
    """Loop clients send one request per iteration and come back a moment after their answer (through Triton,
    an IPC round trip): the next step waits for them instead of starting with whoever came back first."""
    original = engine.forward

    def slow_forward(segments):  # a step long enough that a 2 ms turnaround is small beside it
        threading.Event().wait(0.1)
        original(segments)

    rows = []
    scheduler = BatchScheduler(engine, max_batch_size=4, on_step=lambda s: rows.append(s.last_step_tokens))
    engine.forward = slow_forward

    def client(prompt, out):
        seq = list(prompt)
        for _ in range(4):
            seq = scheduler.run(EngineRequest(seq, output_len=1)).tokens
            threading.Event().wait(0.002)
        out.append(seq)

    try:
        out: list = []
        threads = [threading.Thread(target=client, args=(p, out)) for p in PROMPTS[4:8]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(out) == 4
        assert len(rows) <= 5, f"the batch split: rows per step {rows}"  # 4 iterations, plus one staggered start
        # 3 returns each; these prompts are prefixes of one another, so a return can pass for another's
        assert len(scheduler.returns.delays) >= 8
    finally:
        engine.forward = original
        scheduler.close()


def test_clients_that_come_back_late_are_not_waited_for(engine):
    """A draft engine's clients verify on the target before they draft again: waiting for them would idle the
    engine for nothing. Once their return delay is measured, the scheduler starts the next step at once."""
    original = engine.forward
    engine.forward = lambda segments: (threading.Event().wait(0.02), original(segments))
    scheduler = BatchScheduler(engine, max_batch_size=4)
    try:
        # a long request keeps the engine stepping, so every step after a client's answer could wait for it
        busy = scheduler.submit(EngineRequest(list(PROMPTS[7]), output_len=200))
        seq = list(PROMPTS[3])
        for i in range(6):
            seq = scheduler.run(EngineRequest(seq, output_len=1)).tokens
            if i == 1:  # one return measured: the last wait is behind us
                waited = scheduler.stats.regather_wait_s
            threading.Event().wait(0.08)  # the round trip elsewhere
        assert not busy.done(), "the long request ended early: the steps had no reason to wait"
        assert len(scheduler.returns.delays) == 5 and scheduler.returns.typical_delay() >= 0.08
        # it waited for the first return, whose delay it did not know yet, and for none after
        assert waited > 0 and scheduler.stats.regather_wait_s == waited
    finally:
        engine.forward = original
        scheduler.close()


def test_a_failing_observer_does_not_stop_the_engine(engine):
    def broken(_):
        raise RuntimeError("metrics are down")

    scheduler = BatchScheduler(engine, max_batch_size=2, on_step=broken, on_forward=broken)
    try:
        assert len(scheduler.run(EngineRequest([1, 2, 3], output_len=3)).new_tokens) == 3
        assert len(scheduler.run(EngineRequest([3, 2, 1], output_len=2)).new_tokens) == 2
    finally:
        scheduler.close()


def test_observers_are_sent_once_per_answer_and_once_when_drained(engine, monkeypatch):
    # each value sent to Triton's metrics is a round trip to the server: not one per step of a request
    monkeypatch.setattr(batching, "REPORT_EVERY_S", 60.0)
    monkeypatch.setattr(batching, "DRAINED_REPORT_S", 0.05)
    forward, steps = [], []
    scheduler = BatchScheduler(engine, max_batch_size=2, on_forward=forward.append,
                               on_step=lambda s: steps.append((s.active, s.queued)))
    try:
        assert len(scheduler.run(EngineRequest([1, 2, 3], output_len=5)).new_tokens) == 5
        assert len(forward) == 1 and forward[0] > 0  # the request's 5 steps, in one value, before its answer
        assert len(scheduler.run(EngineRequest([3, 2, 1], output_len=2)).new_tokens) == 2
        assert len(forward) == 2
        deadline = time.monotonic() + 30
        while len(steps) == scheduler.stats.steps:  # the drained engine reports once more
            assert time.monotonic() < deadline, "the drained engine never reported"
            time.sleep(0.01)
        assert steps[-1] == (0, 0)
    finally:
        scheduler.close()
