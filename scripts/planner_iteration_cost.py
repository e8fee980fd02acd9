"""What the loop's per-iteration decision (trtspec.spec.planner) costs in Python, where nothing drafts.

    python scripts/planner_iteration_cost.py [--load 8] [--iterations 3000] [--profile]

`load` requests in flight take turns, as the loop processes of a served deployment do: each iteration is one
`plan` and one `outcome` of a streamed hybrid request under the controller (priced as on a CPU, or with --batched
as on a GPU), with
a plain step's time recorded every iteration, so every decision re-prices from the shared estimates as a served one
does (each sample changes them). Prompt lookup finds no match (chat). It prints microseconds per iteration; a served
iteration's engine step at 8 in flight on the demo is ~100 ms (CPU) or a few ms (GPU). To compare revisions, run it
from outside the checkout with PYTHONPATH pointing at each.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

from trtspec.config import SpeculativeConfig
from trtspec.spec.drafters import Proposal
from trtspec.spec.estimates import Estimates
from trtspec.spec.planner import Planner, RequestPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", type=int, default=8, help="requests in flight")
    ap.add_argument("--iterations", type=int, default=3000)
    ap.add_argument("--batched", action="store_true", help="priced as on a GPU (batched steps), not as on a CPU")
    ap.add_argument("--profile", action="store_true", help="also print cProfile's top 25 by cumulative time")
    args = ap.parse_args()

    spec = SpeculativeConfig.of(8, 4, draft_length_policy="adaptive", adaptive={"batched_steps": args.batched})
    estimates = Estimates()
    rng = np.random.default_rng(0)
    planners = [Planner(spec, estimates, RequestPolicy(10**6, 4, True, "hybrid", stream=True), ("ngram", "model"))
                for _ in range(args.load)]
    seqs = [[int(t) for t in rng.integers(0, 1000, 200)] for _ in range(args.load)]

    def no_match(source, seq, k):
        return Proposal([])

    def run(n: int) -> float:
        start = time.perf_counter()
        for it in range(n):
            i = it % args.load
            plan = planners[i].plan(args.load, seqs[i], no_match)
            seqs[i].append(int(rng.integers(0, 1000)))
            planners[i].outcome(plan, args.load, [], seqs[i][-1:], 0.100 + 0.002 * rng.random(), None, seqs[i], 1,
                                no_match, step_tokens=args.load)
        return (time.perf_counter() - start) / n

    run(200)  # the estimates warm: plain steps measured
    print(f"{run(args.iterations) * 1e6:.0f} us per iteration at {args.load} in flight"
          f" ({'batched' if args.batched else 'unbatched'})")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        run(args.iterations)
        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
