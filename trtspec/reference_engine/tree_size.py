"""How much of the Medusa tree a step verifies: a prefix of its nodes (in medusa_choices' order, so every prefix
is a tree), from 0 (the root alone: a plain step) to all of them, the one that maximises the step's expected
tokens per second for its whole batch.

* Acceptance, measured online per node: how often the target's token after a node's parent was the node's token,
  among steps whose walk reached that parent. Every node whose head ran is scored, verified or not (its parent's
  row says what the target chose there), so a head's nodes learn from every step that runs it.
* Cost: a forward's seconds by the rows in it, measured by the engine on its own steps whose every row has logits
  (the tree steps), kept and read as the controller keeps and reads a target step by its tokens
  (trtspec.spec.estimates.Estimates.step_s, trtspec.spec.engine_costs.step_slope); and the heads'
  seconds per LM-head product by the requests they ran for together. Heads sharing the target's LM head put
  their rows through it in products of as many rows as a step takes at about one row's cost (product_rows: the
  demo target's first 4 on this CPU's compiled kernels), so two or three heads for one request cost one head.
* Exploration: every EXPLORE_EVERY-th step runs one head deeper than the choice and verifies the choice alone: the
  deeper head's nodes are scored all the same (a node's parent row is verified, or the root's), for a head's cost
  (an eighth of a plain step on the demo target), not a larger step's (5+ rows of the demo target cost 1.3-2x
  4 rows on this CPU's GEMM kernels: docs/benchmarks/medusa.md).
* Prices from the start: the engine times a step of every row count one request's tree can make before its first
  request (ReferenceEngine.time_tree_steps); a step of more rows (a batch's trees) is priced along the slope of
  the row counts timed until it runs. Without those timings (a TreeSize of its own), while fewer than two row
  counts are timed it verifies the prefix whose row count is farthest from those timed (the whole tree first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtspec.medusa import Tree
from trtspec.spec.engine_costs import step_slope
from trtspec.spec.estimates import MAX_STEP_TOKENS, Estimates, mean_update

EXPLORE_EVERY = 16  # steps: 1 in 16 runs one head deeper than chosen (its nodes scored, not verified)
ACCEPTANCE_WINDOW = 256  # a node's acceptance is a mean over about its last this-many scores
PRIOR = 0.5  # a node's acceptance before it is scored, worth one score
COST_SMOOTHING = 0.1  # as the controller's cost_smoothing default: a new step's weight once 10 are timed
# A tree is verified for a gain beyond the cost readings' noise, as the controller drafts (SHARED_MARGIN): a row
# count timed on a few steps reads 10-30% off on this CPU, and a tree that gains nothing still costs its walk
TREE_MARGIN = 0.03
# A step of this many more seconds than a one-row step still reads the weights once: its rows fit the GEMM's row
# blocking (the demo target on this CPU's compiled kernels: 1-4 rows within 5%, 5 rows 1.3x)
PRODUCT_TOLERANCE = 0.1


@dataclass(frozen=True)
class Sizing:
    """A step's tree: its first `nodes` verified, and `heads` heads run (the nodes' own, and one deeper where the
    step explores: that head's nodes are scored, not verified)."""

    nodes: int
    heads: int


@dataclass
class Proposal:
    """A Medusa request's tree for its next step: the hidden row the heads read; the engine fills in the rest
    before the forward (TreeSize.choose, ReferenceEngine.size_trees)."""

    hidden: Any  # torch.Tensor [H]
    tokens: list[int | None] | None = field(default=None, repr=False)  # every node's token (None: its head not run)
    size: int = 0  # the nodes verified: the tree's first `size`


class NodeAcceptance:
    """Per node, the share of scores that accepted it given its parent was (decayed: recent steps weigh more)."""

    def __init__(self, tree: Tree):
        self.tree = tree
        self.hits = np.zeros(len(tree))
        self.seen = np.zeros(len(tree))

    def score(self, tokens: list[int | None], picks: list[int], path: list[int]) -> None:
        """A step's walk: picks[d] is the target's token after the root (d = 0) or path[d - 1]; every known child
        of those is scored against it."""
        keep = 1.0 - 1.0 / ACCEPTANCE_WINDOW
        parent = -1
        for d, t in enumerate(picks):
            for c in self.tree.children(parent):
                if tokens[c] is not None:
                    self.hits[c] = self.hits[c] * keep + (tokens[c] == t)
                    self.seen[c] = self.seen[c] * keep + 1.0
            if d >= len(path):
                break
            parent = path[d]

    def expected(self) -> list[float]:
        """Per node, the chance the walk accepts it (its and its ancestors' conditional acceptance)."""
        cond = (self.hits + PRIOR) / (self.seen + 1.0)
        out: list[float] = []
        for i, p in enumerate(self.tree.parent):
            out.append(float(cond[i]) * (out[p] if p >= 0 else 1.0))
        return out


class StepCosts:
    """A forward's seconds by its rows, timed by the engine on steps whose every row has logits. A row count's first
    step is not kept: it runs cold (its shapes' first kernels and allocations), measured on the demo target at 45 ms
    for one row whose later steps take 32, and at 104 ms for three rows against 32; a step size not chosen is not
    timed again, so one cold timing kept the engine at one tree size (or none) for a whole run, 0.97x to 1.39x
    target-only from run to run."""

    def __init__(self) -> None:
        self.est = Estimates()
        self.warm: set[int] = set()  # row counts whose first (cold) step has run
        # the row counts timed, ascending: kept here, as a step prices every prefix of its tree from them (read off
        # the 8,193 counts of est.step_n at each, they took most of the engine's 0.3 ms a step of sizing)
        self._timed = np.zeros(0, dtype=np.int64)

    def record(self, rows: int, seconds: float) -> None:
        if rows not in self.warm:
            self.warm.add(rows)
            return
        if 0 < rows <= MAX_STEP_TOKENS:
            if not self.est.step_n[rows]:
                self._timed = np.sort(np.append(self._timed, rows))
            mean_update(self.est.step_s, self.est.step_n, (rows,), seconds, COST_SMOOTHING)
            self.est.costs_version[0] += 1

    def timed(self) -> np.ndarray:
        return self._timed

    def seconds(self, rows: int) -> float | None:
        """A step of `rows`: as timed, else from the nearest timed row count along the slope of the steps timed
        around the two (or of all those timed where too few are near); None: fewer than two timed."""
        timed = self._timed
        if timed.size == 0:
            return None
        near = int(timed[np.argmin(np.abs(timed - rows))])
        if near == rows:
            return float(self.est.step_s[rows])
        slope = step_slope(timed, self.est.step_s, min(near, rows), max(near, rows))
        if slope is None and timed.size >= 2:
            slope = step_slope(timed, self.est.step_s, int(timed[0]), int(timed[-1]))
        return None if slope is None else float(self.est.step_s[near]) + slope * (rows - near)


class TreeSize:
    """The engine's choice of how many of the tree's nodes each step verifies (`fixed`: always that many)."""

    def __init__(self, tree: Tree, fixed: int | None = None):
        self.tree, self.fixed = tree, fixed
        self.acceptance = NodeAcceptance(tree)
        self.costs = StepCosts()
        self.head_s: dict[int, float] = {}  # requests run together -> seconds of one LM-head product for them
        self.steps = 0

    def product_rows(self) -> int:
        """Rows one LM-head product of the heads takes: as many as a step of that many rows costs within
        PRODUCT_TOLERANCE of a one-row step, timed (1 before two are); read once per change of the costs (a step
        prices every prefix's heads by it)."""
        return self.costs.est.memo(("product_rows",), self._product_rows)

    def _product_rows(self) -> int:
        est, rows = self.costs.est, 1
        if not est.step_n[1]:
            return rows
        bound = (1.0 + PRODUCT_TOLERANCE) * float(est.step_s[1])
        while rows < MAX_STEP_TOKENS and est.step_n[rows + 1] and est.step_s[rows + 1] <= bound:
            rows += 1
        return rows

    def products(self, batch: int, heads: int) -> int:
        """LM-head products of `heads` heads run for `batch` requests (MedusaHeads.top)."""
        return -(-batch * heads // max(batch, self.product_rows()))

    def record_heads(self, batch: int, heads: int, seconds: float) -> None:
        if heads:
            per_product = seconds / self.products(batch, heads)
            old = self.head_s.get(batch)
            self.head_s[batch] = per_product if old is None else old + COST_SMOOTHING * (per_product - old)

    def heads_seconds(self, batch: int, heads: int) -> float:
        """`heads` heads' seconds for `batch` requests: products, each as timed at the nearest batch (0 before
        any is timed)."""
        if not self.head_s or not heads:
            return 0.0
        return self.products(batch, heads) * self.head_s[min(self.head_s, key=lambda b: (abs(b - batch), b))]

    def rates(self, own_rows: list[int], other_rows: int = 0, other_tokens: int = 0) -> list[float] | None:
        """Expected tokens per second of the step for each prefix size 0..len(tree): `own_rows` the committed rows
        of each Medusa request in it (1: the root), `other_rows` / `other_tokens` the rows of the step's other
        requests and the tokens they take (one per request with logits); None: the costs cannot say yet."""
        b, base = len(own_rows), other_rows + sum(own_rows)
        gain = np.concatenate([[0.0], np.cumsum(self.acceptance.expected())])
        out = []
        for m in range(len(self.tree) + 1):
            step = self.costs.seconds(base + b * m)
            if step is None:
                return None
            heads = self.heads_seconds(b, self.tree.prefix_depth(m))
            out.append((other_tokens + b * (1.0 + gain[m])) / max(step + heads, 1e-9))
        return out

    def choose(self, own_rows: list[int], other_rows: int = 0, other_tokens: int = 0) -> Sizing:
        tree = self.tree
        if self.fixed is not None:
            return self._sizing(min(self.fixed, len(tree)))
        self.steps += 1
        n, b, base = len(tree), len(own_rows), other_rows + sum(own_rows)
        rates = self.rates(own_rows, other_rows, other_tokens)
        if rates is None:  # time the row count farthest from those timed: two are needed for a slope
            timed = self.costs.timed()
            if timed.size == 0:
                return self._sizing(n)
            return self._sizing(max(range(n + 1), key=lambda m: (int(np.min(np.abs(timed - (base + b * m)))), m)))
        best = int(np.argmax(rates))  # the first of equals: the smaller tree
        if rates[best] < (1.0 + TREE_MARGIN) * rates[0]:
            best = 0
        heads = tree.prefix_depth(best)
        if self.steps % EXPLORE_EVERY == 0:
            heads = min(heads + 1, max(tree.depth))
        return Sizing(best, heads)

    def _sizing(self, nodes: int) -> Sizing:
        return Sizing(nodes, self.tree.prefix_depth(nodes))
