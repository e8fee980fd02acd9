"""Benchmarks that go with the issues' "Benchmark" sections; each one is `python -m trtspec.benchmarks.<name>`.

* ``loop``: the speculative loop on the demo pair through a real Triton server, against the target-only
  baseline endpoint and Hugging Face assisted generation, with the acceptance, the cost ratio, the bound S,
  the loop's per-iteration overhead and the verify cost at long context.
"""
