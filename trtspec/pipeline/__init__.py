"""`trtspec build`: preflight, checkpoint conversion (FP8 for the draft), engines, Triton repository.

    plan.py       pure functions: build config + machine + checkpoints -> steps with exact argv
    preflight.py  checks with fixes; placement; KV-cache fractions from the memory estimate
    runner.py     executes a plan: cached, resumable, atomic steps; progress; manifest.json
    convert.py    HF -> TensorRT-LLM checkpoint via the Python API (child process)
"""

from trtspec.pipeline.plan import Plan, Step, Tools, make_plan
from trtspec.pipeline.preflight import Finding, PreflightResult, run_preflight
from trtspec.pipeline.runner import BuildError, RunResult, Runner, StepFailed, run_plan

__all__ = [
    "BuildError",
    "Finding",
    "Plan",
    "PreflightResult",
    "RunResult",
    "Runner",
    "Step",
    "StepFailed",
    "Tools",
    "make_plan",
    "run_plan",
    "run_preflight",
]
