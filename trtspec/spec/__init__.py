"""The speculative core: what every engine flavour's deployment runs between a request and its engines.

- `loop`: the speculative loop (engine calls, tensors, streaming) around the planner's decisions
- `planner`: one request's per-iteration decision (source, k, probes, catch-up, plain runs) and its outcome
- `controller`: the goodput controller the planner asks (draft_length_policy: adaptive); `estimates`: what it knows,
  shared by the deployment's loop processes (`load`: the shared memory and the load in flight)
- `speculative`: verification arithmetic (greedy and rejection sampling), stopping and bounds
- `drafters`: the draft sources behind one interface; `methods`: the speculation methods a build config names
- `metrics`: the statistics a request and a deployment report; `logprobs`: their log-probabilities
"""
