"""No draft length of 0 for a one-engine drafter on a TensorRT-LLM release that has no floor for it.

In TensorRT-LLM's PyTorch backend, one-engine drafters (EAGLE-3 one-model, the `Eagle` default, and MTP) keep
drafter state across iterations (the draft layers' KV cache, MTP's hidden states). A `draft_len_schedule` band of
0, or `max_concurrency` (speculation off above that batch size), skips drafting, and that state is not written;
when drafting resumes the drafter reads positions it never wrote, and acceptance silently collapses for the rest of
each affected request (NVIDIA/TensorRT-LLM pull request #16888, open July 2026: it floors the runtime draft length at
`min_runtime_draft_len`, 1 for one-engine modes). Releases 1.0-1.2.1 have no such floor (api_surface.json,
`one_engine_k0`), so for them trtspec never writes a schedule or `max_concurrency` under which a one-engine drafter
would stop and resume:

* a schedule band of 0 becomes 1, and `max_concurrency` N becomes the band {N + 1: 1} (where the release has
  `draft_len_schedule`; without one, max_concurrency N >= 1 is refused, naming the fix);
* `max_concurrency: 0` stays: speculation is off at every batch size, so it never resumes;
* with `llmapi.eagle3_two_model: true` (method eagle3, a release with `eagle3_one_model`) the head runs as a
  separate draft model (`eagle3_one_model: false`), which re-reads the sequence when it drafts again, and the
  schedule and max_concurrency stay as written: drafting really stops under load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

# speculation methods whose TensorRT-LLM drafter runs inside the target engine (EAGLE-3 unless two-model)
ONE_ENGINE_METHODS = ("eagle3", "mtp")
TWO_MODEL_FIELD = "eagle3_one_model"


class DraftFloorError(ValueError):
    """A load control that the release cannot honour for a one-engine drafter without the collapse; names the fix."""


@dataclass
class Floored:
    """What trtspec writes: the schedule (trtspec's keys: each a batch size from which its length applies),
    max_concurrency, whether EAGLE-3 runs as two models, and why (for build, doctor and tune to print)."""

    schedule: dict[int, int] | None
    max_concurrency: int | None
    two_model: bool = False
    notes: list[str] = field(default_factory=list)


def release_floor(fields: Mapping[str, Any]) -> int | None:
    """The release's own runtime floor for one-engine drafters (min_runtime_draft_len), None where it has none."""
    return (fields.get("one_engine_k0") or {}).get("floor")


def is_one_engine(method: str, two_model: bool = False) -> bool:
    return method in ONE_ENGINE_METHODS and not (method == "eagle3" and two_model)


def draft_len_at(schedule: Mapping[int, int] | None, max_concurrency: int | None, max_k: int, batch: int) -> int:
    """The draft length a batch of `batch` requests gets (trtspec's schedule keys; max_concurrency: 0 above it)."""
    k = max_k
    for b, v in sorted((schedule or {}).items()):
        if batch >= b:
            k = v
    if max_concurrency is not None and batch > max_concurrency:
        k = 0
    return k


def resolve(
    method: str,
    fields: Mapping[str, Any],
    max_k: int,
    schedule: Mapping[int, int] | None,
    max_concurrency: int | None,
    two_model: bool = False,
    release: str = "the pinned release",
) -> Floored:
    """The schedule and max_concurrency to write for `method` on the release whose field lists are `fields`."""
    schedule = None if schedule is None else {int(b): int(k) for b, k in sorted(schedule.items())}
    if two_model:
        if method != "eagle3":
            raise DraftFloorError(f"llmapi.eagle3_two_model: only speculative.method eagle3 has a two-model path (got {method})")
        eagle_fields = fields["decoding_types"]["eagle3"]["fields"]
        if TWO_MODEL_FIELD not in eagle_fields:
            raise DraftFloorError(f"llmapi.eagle3_two_model: TensorRT-LLM {release} has no {TWO_MODEL_FIELD}; remove it")
        return Floored(schedule, max_concurrency, True, [
            f"EAGLE-3 runs as two models ({TWO_MODEL_FIELD}: false): drafting stops where the schedule or "
            "max_concurrency says, and the draft model re-reads the sequence when it drafts again"])
    if method not in ONE_ENGINE_METHODS or release_floor(fields) is not None:
        return Floored(schedule, max_concurrency)
    if max_concurrency == 0:
        return Floored(schedule, 0, notes=[
            "max_concurrency 0: speculation off at every batch size (it never resumes, so nothing collapses)"])
    zeros = sorted(b for b, k in (schedule or {}).items() if k == 0)
    if not zeros and max_concurrency is None:
        return Floored(schedule, None)
    why = (f"{method} drafts inside the target engine, and TensorRT-LLM {release} has no floor for it "
           "(min_runtime_draft_len, NVIDIA/TensorRT-LLM PR #16888): after a band of 0 acceptance collapses silently "
           "when drafting resumes")
    fix = " (set llmapi.eagle3_two_model: true to stop drafting there instead)" if method == "eagle3" and \
        TWO_MODEL_FIELD in fields["decoding_types"]["eagle3"]["fields"] else ""
    notes: list[str] = []
    out = {b: max(1, k) for b, k in (schedule or {1: max_k}).items()}
    if zeros:
        notes.append(f"draft_len_schedule: the bands of 0 from batch sizes {zeros} draft 1 token instead: {why}{fix}")
    if max_concurrency is not None:
        if fields.get("draft_len_schedule") is None:
            alt = ", or set llmapi.eagle3_two_model: true" if fix else ""
            raise DraftFloorError(
                f"llmapi.max_concurrency {max_concurrency}: {why}, and {release} has no draft_len_schedule to draft "
                f"1 token above it instead; remove max_concurrency{alt}")
        above = max_concurrency + 1
        out = {b: k for b, k in out.items() if b < above}
        out[above] = 1
        notes.append(f"max_concurrency {max_concurrency}: written as draft_len_schedule band {{{above}: 1}} "
                     f"(1 token above it, not 0): {why}{fix}")
    return Floored(out, None, notes=notes)


def explain(method: str, fields: Mapping[str, Any], release: str, two_model: bool = False) -> str:
    """One line for `trtspec doctor`: what a draft length of 0 does for this method on this release."""
    if method not in ONE_ENGINE_METHODS:
        return f"{method}: a draft length of 0 is safe on TensorRT-LLM {release} (the drafter re-reads the sequence)"
    if method == "eagle3" and two_model:
        return (f"eagle3 as two models ({TWO_MODEL_FIELD}: false): schedule bands of 0 and max_concurrency stop "
                "drafting, and the draft model catches up when it drafts again")
    if release_floor(fields) is not None:
        return f"{method}: TensorRT-LLM {release} floors one-engine draft lengths at {release_floor(fields)} itself"
    return (f"{method} drafts inside the target engine and TensorRT-LLM {release} has no floor for it (PR #16888): "
            "trtspec writes schedule bands of 0 as 1 and max_concurrency N as the band {N+1: 1} (max_concurrency 0, "
            "off for good, stays)" + ("; llmapi.eagle3_two_model: true stops drafting there instead"
                                      if method == "eagle3" else ""))
