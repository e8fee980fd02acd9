"""In-flight batching for the reference engine: one scheduler thread owns the model and steps every request
in flight together, as TensorRT-LLM's executor does.

Each step is one forward pass over a ragged batch (trtspec.reference_engine.ragged): prefill rows of new requests (a long prompt
in chunks, so it does not stall everyone), one-token decode rows and k+1-token verify rows. A request submitted
while a step runs joins at the next one; a finished request is answered at once, not when the batch drains.
`max_batch_size` bounds the requests in the running batch and `max_num_tokens` the tokens per step; requests
beyond them wait in FIFO order, and beyond `max_queue_size` waiting ones are refused with QueueFull.

A loop model sends one engine request per iteration, so the requests answered after a step come back as new
ones a moment later. Starting the next step at once would run it with whoever came back first and leave the
rest for the step after: through Triton the batch splits in two, and halves its throughput. So when requests
were answered, the next step waits for as many arrivals (Triton's dynamic batcher has the same knob,
max_queue_delay_microseconds), but only as long as they typically take to come back, and only when that is
short beside a step. How long they take is measured (a loop's next request starts with its previous
input_ids): a baseline loop is back within milliseconds, a speculative one drafts first, and the draft engine's
clients go to the target before they return, which is too long to wait for.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

import torch

from trtspec.contract.errors import Overloaded
from trtspec.reference_engine.ragged import Segment
from trtspec.reference_engine import EngineRequest, EngineResult, ReferenceEngine, Steps, cache_nbytes
from trtspec.regather import REGATHER_SHARE, WINDOW, regather_wait, typical_delay


# Observers (Triton metrics) cost a round trip to the server per value sent, as much as a request's own: the forward
# time is sent once per step that answers (or after this long without one), and a drained engine's stats once it has
# stayed drained a little longer than that (so a rate limit of REPORT_EVERY_S lets it through), not after every
# request of a loop that comes straight back.
REPORT_EVERY_S = 0.25
DRAINED_REPORT_S = 1.2 * REPORT_EVERY_S


class Returns:
    """How soon answered requests come back: a loop's next request starts with the input_ids of its last one
    (the tokens it accepted follow), so an arrival that extends a recently answered request is its return."""

    TAIL = 8  # tokens of the answered input_ids that identify it, with its length
    KEEP = 256  # answered requests remembered

    def __init__(self, window: int = WINDOW):
        self._answered: collections.OrderedDict[tuple, float] = collections.OrderedDict()
        self.delays: collections.deque[float] = collections.deque(maxlen=window)

    @classmethod
    def _key(cls, ids: list[int], n: int) -> tuple:
        return n, tuple(ids[max(0, n - cls.TAIL) : n])

    def answered(self, input_ids: list[int], now: float) -> None:
        self._answered[self._key(input_ids, len(input_ids))] = now
        while len(self._answered) > self.KEEP:
            self._answered.popitem(last=False)

    def arrived(self, input_ids: list[int], now: float) -> None:
        for n in {n for n, _ in self._answered}:
            if n <= len(input_ids):
                answered_at = self._answered.pop(self._key(input_ids, n), None)
                if answered_at is not None:
                    self.delays.append(now - answered_at)
                    return

    def typical_delay(self) -> float:
        return typical_delay(self.delays)


class QueueFull(Overloaded):
    """The engine's queue is full; the message is for the client."""


@dataclass
class _Job:
    input_ids: list[int]
    steps: Steps
    future: Future
    segment: Segment | None = None
    done_tokens: int = 0  # tokens of the current segment computed by earlier chunks


@dataclass
class SchedulerStats:
    active: int = 0
    queued: int = 0
    last_step_tokens: int = 0
    steps: int = 0
    max_active: int = 0  # the largest running batch seen
    kv_bytes: int = 0  # KV cache held by the running requests after the last step
    regather_wait_s: float = 0.0  # time the engine waited for answered requests to come back


class BatchScheduler:
    def __init__(
        self,
        engine: ReferenceEngine,
        max_batch_size: int = 8,
        max_num_tokens: int = 2048,
        max_queue_size: int = 0,
        on_step: Callable[[SchedulerStats], None] | None = None,
        on_forward: Callable[[int], None] | None = None,
        regather: float = REGATHER_SHARE,
    ):
        if max_batch_size < 1 or max_num_tokens < 1:
            raise ValueError(f"max_batch_size ({max_batch_size}) and max_num_tokens ({max_num_tokens}) must be >= 1")
        self.engine = engine
        self.max_batch_size, self.max_num_tokens = max_batch_size, max_num_tokens
        self.max_queue_size = max_queue_size or 64 * max_batch_size
        self.stats = SchedulerStats()
        # called on the scheduler thread after every step (e.g. Prometheus gauges), and once more when the engine has
        # stayed drained for DRAINED_REPORT_S
        self.on_step = on_step
        # forward-pass time in ns not reported yet, before a step's requests are answered (or every REPORT_EVERY_S)
        self.on_forward = on_forward
        self._unreported_ns, self._reported_at = 0, time.monotonic()
        self._drained_report = False  # the drained stats are due once the engine stays drained
        self.regather = regather
        self._returning = 0  # requests answered after the last step that have not come back yet
        self.returns = Returns()
        self._last_step_s = 0.0
        self._queue: collections.deque[tuple[EngineRequest, Future]] = collections.deque()
        self._active: list[_Job] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="reference-engine-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callers

    def submit(self, req: EngineRequest) -> Future:
        """A future of the request's EngineResult (or its exception). Raises QueueFull when the queue is full."""
        future: Future = Future()
        with self._wake:
            if self._stopping:
                raise RuntimeError("the reference engine is shutting down")
            if len(self._queue) >= self.max_queue_size:
                raise QueueFull(
                    f"the reference engine's queue is full ({len(self._queue)} requests waiting behind "
                    f"{self.max_batch_size} running; max_batch_size {self.max_batch_size}): retry later, or raise "
                    "limits.max_batch_size in the build config"
                )
            self._queue.append((req, future))
            self.returns.arrived(req.input_ids, time.monotonic())
            self._returning = max(0, self._returning - 1)
            self.stats.queued = len(self._queue)
            self._wake.notify()
        return future

    def run(self, req: EngineRequest) -> EngineResult:
        return self.submit(req).result()

    def close(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join()

    # ------------------------------------------------------------------ the scheduler thread

    def _admit(self) -> None:
        """Move queued requests into the running batch (under the lock), up to max_batch_size."""
        while self._queue and len(self._active) < self.max_batch_size:
            req, future = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                steps = self.engine.steps(req)
                job = _Job(req.input_ids, steps, future, next(steps))
            except Exception as e:  # a request the engine refuses fails alone
                future.set_exception(e)
                continue
            self._active.append(job)

    def _run(self) -> None:
        while True:
            with self._wake:
                self._admit()
                while not self._active and not self._stopping:
                    if not self._wake.wait(DRAINED_REPORT_S if self._drained_report else None) and self._drained_report:
                        self._drained_report = False
                        self._notify(self.on_step, self.stats)
                    self._admit()
                self._drained_report = False
                self._regather()
                if self._stopping:
                    self._fail_all(RuntimeError("the reference engine is shutting down"))
                    return
                self.stats.active, self.stats.queued = len(self._active), len(self._queue)
                self.stats.max_active = max(self.stats.max_active, len(self._active))
            self._step()

    def _regather(self) -> None:
        """Under the lock: wait for the requests answered after the last step to come back, when they
        typically do so within `regather` of a step; at most twice their typical delay."""
        wait = regather_wait(self.returns.delays, self._last_step_s, self.regather) if self._returning else None
        if wait is not None:
            start = time.monotonic()
            deadline = start + wait
            while self._returning and len(self._active) < self.max_batch_size and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wake.wait(left)
                self._admit()
            self.stats.regather_wait_s += time.monotonic() - start
        self._returning = 0

    def _plan(self) -> list[tuple[_Job, Segment]]:
        """This step's work, in arrival order, within max_num_tokens: a segment too long for what is left is
        chunked (never its logits rows, which come with its last chunk); the first job always gets a chunk."""
        budget, plan = self.max_num_tokens, []
        for job in self._active:
            seg = job.segment
            left = len(seg.tokens) - job.done_tokens
            n = min(left, budget)
            if n < left and left - n < seg.logit_rows:
                n = left - seg.logit_rows  # the logits rows stay together, in the last chunk
            if n <= 0:
                if plan:
                    continue
                n = left  # more logits rows than a step holds: run them anyway rather than never
            d = job.done_tokens
            piece = seg if n == left and d == 0 else Segment(
                seg.cache,
                seg.tokens[d : d + n],
                seg.start + d,
                seg.logit_rows if n == left else 0,
                capture=seg.capture,
                # a Medusa tree's rows come in the last chunk; a parent in an earlier chunk is in the cache by then
                parents=None if seg.parents is None else [max(-1, p - d) for p in seg.parents[d : d + n]],
                positions=None if seg.positions is None else seg.positions[d : d + n],
                want_hidden=seg.want_hidden and n == left,
            )
            plan.append((job, piece))
            budget -= n
            if budget <= 0:
                break
        return plan

    def _step(self) -> None:
        # Medusa trees are sized for the whole running batch (the rows this step will hold) before it is chunked
        self.engine.size_trees([job.segment for job in self._active])
        plan = self._plan()
        started = time.monotonic_ns()
        try:
            self.engine.forward([piece for _, piece in plan])
        except Exception as e:  # the model failed: every request of the step fails, the engine stays up
            self._report_forward()
            for job, _ in plan:
                self._finish(job, error=e)
            return
        took = time.monotonic_ns() - started
        self._last_step_s = took / 1e9
        self._unreported_ns += took
        self.stats.last_step_tokens = sum(len(p.tokens) for _, p in plan)
        self.stats.steps += 1
        finished: list[tuple[_Job, EngineResult | None, BaseException | None]] = []
        for job, piece in plan:
            if piece is not job.segment:
                if piece.features is not None:  # a chunk's EAGLE-3 features: the segment's rows, in order
                    have = job.segment.features if job.done_tokens else None
                    job.segment.features = piece.features if have is None else torch.cat([have, piece.features])
                job.done_tokens += len(piece.tokens)
                if job.done_tokens < len(job.segment.tokens):
                    continue
                job.segment.logits, job.segment.hidden = piece.logits, piece.hidden
            job.done_tokens = 0
            try:
                job.segment = job.steps.send(None)
            except StopIteration as done:
                finished.append((job, done.value, None))
            except Exception as e:
                finished.append((job, None, e))
        if finished or time.monotonic() - self._reported_at >= REPORT_EVERY_S:
            self._report_forward()
        for job, result, error in finished:
            self._finish(job, result, error)
        self.stats.kv_bytes = sum(cache_nbytes(job.segment.cache) for job in self._active)
        self.stats.queued = len(self._queue)
        self._notify(self.on_step, self.stats)
        self._drained_report = not self._active and not self._queue

    def _report_forward(self) -> None:
        if self._unreported_ns:
            self._notify(self.on_forward, self._unreported_ns)
        self._unreported_ns, self._reported_at = 0, time.monotonic()

    @staticmethod
    def _notify(callback: Callable | None, value: object) -> None:
        """A failing observer (metrics) must not take the scheduler thread, and every request with it, down."""
        if callback is None:
            return
        try:
            callback(value)
        except Exception as e:  # noqa: BLE001
            print(f"trtspec.reference_engine.batching: {getattr(callback, '__qualname__', callback)} failed: {e!r}", file=sys.stderr)

    def _finish(self, job: _Job, result: EngineResult | None = None, error: BaseException | None = None) -> None:
        with self._wake:
            self._active.remove(job)
            self._returning += 1
            self.returns.answered(job.input_ids, time.monotonic())
            self.stats.active = len(self._active)
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    def _fail_all(self, error: BaseException) -> None:
        for job in self._active:
            job.future.set_exception(error)
        for _, future in self._queue:
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
        self._active.clear()
        self._queue.clear()
