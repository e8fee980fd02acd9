"""What the simulators run: synthetic requests whose drafts are accepted by a profile, the policies they run
under, the load's schedule, and what a cell measured (trtspec.bench.simulate, trtspec.bench.overlapped)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from trtspec.spec.drafters import Proposal
from trtspec.spec.planner import Planner

VOCAB = 32000


@dataclass(frozen=True)
class Acceptance:
    """Conditional acceptance by position: first * decay^i, or `positions` (measured: position i's, the last one
    decaying on); `drop`: (from, to) fractions of the run's steps where the first position's acceptance is `low`
    instead (the text turns hard to draft, then easy again)."""

    name: str
    first: float
    decay: float = 0.92
    drop: tuple[float, float] | None = None
    low: float = 0.1
    positions: tuple[float, ...] = ()

    @classmethod
    def measured(cls, text: str) -> "Acceptance":
        """From "a0,a1,...": the conditional acceptance of each draft position (e.g. a bench run's)."""
        values = tuple(float(v) for v in text.split(","))
        if not values or not all(0.0 <= v <= 1.0 for v in values):
            raise ValueError(f"acceptance by position must be numbers in 0..1, comma-separated: {text!r}")
        return cls(f"measured ({text})", values[0], positions=values)

    def at(self, position: int, progress: float) -> float:
        if self.positions:
            last = len(self.positions) - 1
            return self.positions[min(position, last)] * self.decay ** max(position - last, 0)
        first = self.low if self.drop and self.drop[0] <= progress < self.drop[1] else self.first
        return first * self.decay ** position


PROFILES = {
    "strong": Acceptance("strong (0.75)", 0.75),
    "medium": Acceptance("medium (0.5)", 0.5),
    "weak": Acceptance("weak (0.25)", 0.25),
    "drop": Acceptance("drop (0.75 -> 0.1 -> 0.75)", 0.75, drop=(1 / 3, 2 / 3)),
}


@dataclass(frozen=True)
class Policy:
    """target-only (k = 0, no drafter), fixed k, or the controller (adaptive, at most k)."""

    name: str
    k: int
    adaptive: bool

    @classmethod
    def parse(cls, text: str) -> "Policy":
        if text in ("target-only", "0"):
            return cls("target-only", 0, False)
        if text.startswith("controller"):
            k = int(text.split(":", 1)[1]) if ":" in text else 4
            return cls(f"controller, k <= {k}", k, True)
        return cls(f"k={int(text)}", int(text), False)


@dataclass
class CellResult:
    policy: str
    concurrency: str
    profile: str
    tokens: int = 0
    seconds: float = 0.0
    iterations: int = 0
    drafted: int = 0  # iterations that verified a draft
    draft_tokens: int = 0
    accepted: int = 0
    k_counts: list[int] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def count(self, draft: Sequence[int], accepted: int, added: int) -> None:
        """One iteration that verified `draft` (empty: a plain call), `accepted` of it, and kept `added` tokens."""
        self.iterations += 1
        if draft:
            self.drafted += 1
            self.draft_tokens += len(draft)
            self.accepted += accepted
        self.k_counts += [0] * (len(draft) + 1 - len(self.k_counts))
        self.k_counts[len(draft)] += 1
        self.tokens += added

    def add(self, other: "CellResult") -> None:
        """Pools another run of the same cell (another seed) into this one: one longer run."""
        for name in ("tokens", "seconds", "iterations", "drafted", "draft_tokens", "accepted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.k_counts = [a + b for a, b in itertools.zip_longest(self.k_counts, other.k_counts, fillvalue=0)]

    def to_dict(self) -> dict:
        return {
            "policy": self.policy, "concurrency": self.concurrency, "profile": self.profile, "tokens": self.tokens,
            "seconds": self.seconds, "tokens_per_s": self.tokens_per_s, "iterations": self.iterations,
            "drafted": self.drafted, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
            "k_counts": self.k_counts,
        }


class SyntheticRequest:
    def __init__(self, planner: Planner, rng: np.random.Generator, prompt: int, max_tokens: int):
        self.planner, self.rng = planner, rng
        self.truth = rng.integers(0, VOCAB, prompt + max_tokens + 64).tolist()  # the target's greedy text
        self.seq = self.truth[:prompt]
        self.prompt, self.max_tokens = prompt, max_tokens
        self.call = None  # the lock-step simulator's call in progress
        self.next: list[int] = []  # the target's own drafter's draft that came with the last answer
        self.done = False

    def draft(self, k: int, acceptance: Acceptance, progress: float) -> list[int]:
        """k proposed tokens after the sequence: the target's own while each position passes, then a wrong one."""
        pos, out = len(self.seq), []
        for i in range(k):
            if self.rng.random() < acceptance.at(i, progress):
                out.append(self.truth[pos + i])
            else:
                out.append((self.truth[pos + i] + 1) % VOCAB)
                out += self.rng.integers(0, VOCAB, k - i - 1).tolist()
                break
        return out

    def answer(self, draft: Sequence[int], plain: int) -> tuple[list[int], int]:
        """The target's answer to a call verifying `draft` (empty: a plain call of `plain` tokens) after the running
        sequence, and how many of the draft it accepted."""
        pos = len(self.seq)
        if not draft:
            return self.truth[pos: pos + plain], 0
        accepted = next((i for i, t in enumerate(draft) if t != self.truth[pos + i]), len(draft))
        return self.truth[pos: pos + accepted + 1], accepted

    def propose(self, source: str, seq: Sequence[int], k: int) -> Proposal:
        return Proposal(list(self.next)) if source == "model" else Proposal([])


Schedule = Callable[[float], int]  # progress (0..1 of the run's requests) -> requests in flight


def constant(n: int) -> Schedule:
    return lambda progress: n


def ramp(peak: int) -> Schedule:
    """1 -> peak -> 1, in equal thirds of the run (the load doubles and halves in steps)."""
    levels = [2 ** i for i in range(int(np.log2(peak)) + 1)]
    path = levels + levels[::-1]
    return lambda progress: path[min(int(progress * len(path)), len(path) - 1)]
