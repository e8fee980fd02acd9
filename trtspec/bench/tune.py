"""`trtspec tune`: the best fixed draft length per concurrency band, measured, written into a build config as a
draft-length schedule.

The sweep is `trtspec bench` with fixed-k cells (the baseline is k=0). Where the deployment takes a draft length
per request (engine: reference, tensorrt_llm) one deployment serves every k; with engine: llmapi TensorRT-LLM
decides k from its own config, so each k > 0 gets a deployment of its own (its most draft tokens = k, the target-only
`baseline` endpoint beside it). Each k is judged by its speedup over the baseline measured in the same run.

Bands: the measured concurrency levels, ascending; the lowest one's k applies from 1 request in flight, each
other one's from its own level upward (trtspec's draft_len_schedule: each key is a batch size from which its
draft length applies upward). Keys whose k equals the band below are dropped.
"""

from __future__ import annotations

import copy
import datetime as _dt
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from trtspec.bench.report import is_fixed_candidate
from trtspec.config import MAX_DRAFT_LEN, SpeculativeConfig
from trtspec.contract import NUM_DRAFT_TOKENS


class TuneError(Exception):
    """Tuning cannot go on; the message is meant for the user."""


@dataclass(frozen=True)
class BandChoice:
    concurrency: int
    k: int
    speedup: float  # over the baseline at that concurrency (1.0 for k=0)
    speedups: dict[int, float]  # every k measured there -> its speedup


def best_k_per_band(results: Iterable[Mapping[str, Any]]) -> list[BandChoice]:
    """Per concurrency, over one or more bench results: the fixed k (0 = the baseline) with the highest speedup
    over the baseline of its own run; a tie goes to the smaller k."""
    speedups: dict[int, dict[int, float]] = {}
    for res in results:
        for c in res["cells"]:
            if not is_fixed_candidate(c):
                continue
            s = 1.0 if not c["speculative"] else (c.get("speedup") or {}).get("output_tokens_per_s")
            if s is not None:
                speedups.setdefault(c["concurrency"], {})[c[NUM_DRAFT_TOKENS]] = s
    out = []
    for conc in sorted(speedups):
        ks = speedups[conc]
        if not any(k > 0 for k in ks):
            continue
        best = max(ks, key=lambda k: (ks[k], -k))
        out.append(BandChoice(conc, best, ks[best], dict(sorted(ks.items()))))
    return out


def schedule_from_bands(bands: list[BandChoice]) -> dict[int, int]:
    """{first batch size of the band: k}, the lowest band from 1, repeated k dropped (module docstring)."""
    if not bands:
        raise TuneError("no concurrency level had both the baseline and a fixed k > 0 measured: nothing to tune")
    out: dict[int, int] = {}
    previous = None
    for i, b in enumerate(sorted(bands, key=lambda b: b.concurrency)):
        if b.k != previous:
            out[1 if i == 0 else b.concurrency] = b.k
            previous = b.k
    return out


@dataclass
class Tuned:
    doc: dict[str, Any]  # the new config mapping
    schedule: dict[int, int]  # as written (canonical: trtspec's draft_len_schedule)
    section: str  # "speculative" or "llmapi"
    notes: list[str] = field(default_factory=list)


def apply_schedule(doc: Mapping[str, Any], schedule: Mapping[int, int]) -> Tuned:
    """The config mapping with the schedule written where its flavour reads it (a new mapping; `doc` is kept).

    reference / tensorrt_llm: speculative.draft_len_schedule caps each request's k, so the default k becomes
    the schedule's largest k (a cap cannot raise k) and max_concurrency goes (the schedule's k=0 bands decide).
    llmapi: llmapi.draft_len_schedule, where TensorRT-LLM requires schedule[1] == the most draft tokens (max_k),
    which becomes the k of the first band (larger k of later bands are lowered to it); when that k is 0 no schedule
    can say it, and llmapi.max_concurrency 0 turns speculation off instead.
    """
    new = copy.deepcopy(dict(doc))
    schedule = {int(b): int(k) for b, k in sorted(schedule.items())}
    notes: list[str] = []
    spec = new.setdefault("speculative", {}) or {}
    new["speculative"] = spec
    if new.get("engine") != "llmapi":
        spec["draft_len_schedule"] = schedule
        top = max(schedule.values())
        before = spec.get(NUM_DRAFT_TOKENS, _default("default_k"))
        if before != top:
            notes.append(f"speculative.{NUM_DRAFT_TOKENS}: {before} -> {top} (the schedule only caps a request's k)")
        spec[NUM_DRAFT_TOKENS] = top
        if spec.pop("max_concurrency", None) is not None:
            notes.append("speculative.max_concurrency removed: the schedule's bands decide where drafting stops")
        if spec.get("draft_length_policy", _default("draft_length_policy")) == "adaptive":
            notes.append("speculative.draft_length_policy is adaptive: the schedule caps the k it chooses")
        return Tuned(new, schedule, "speculative", notes)

    lim = new.setdefault("llmapi", {}) or {}
    new["llmapi"] = lim
    first = schedule[1]
    if first == 0:
        lim.pop("draft_len_schedule", None)
        lim["max_concurrency"] = 0
        notes.append("k=0 was best from 1 request in flight: llmapi.max_concurrency 0 (speculation off); "
                     f"TensorRT-LLM's schedule must map batch size 1 to {MAX_DRAFT_LEN} >= 1")
        if any(schedule.values()):
            notes.append(f"bands where k > 0 paid ({ {b: k for b, k in schedule.items() if k} }) cannot be "
                         "expressed without drafting at batch size 1")
        return Tuned(new, {}, "llmapi", notes)
    clipped = {b: min(k, first) for b, k in schedule.items()}
    if clipped != schedule:
        notes.append(f"draft lengths above the first band's ({first}) lowered to it: TensorRT-LLM requires "
                     f"schedule[1] == {MAX_DRAFT_LEN}")
    floored = _floor_one_engine(new, clipped, first)
    if floored.schedule != clipped:
        clipped = floored.schedule
        notes += floored.notes
    old_max = spec.get(MAX_DRAFT_LEN, _default("max_k"))
    if old_max != first:
        notes.append(f"speculative.{MAX_DRAFT_LEN}: {old_max} -> {first} (schedule[1] == {MAX_DRAFT_LEN})")
    spec[MAX_DRAFT_LEN] = first
    lim["draft_len_schedule"] = clipped
    if lim.pop("max_concurrency", None) is not None:
        notes.append("llmapi.max_concurrency removed: the schedule's bands decide where drafting stops")
    return Tuned(new, clipped, "llmapi", notes)


def _floor_one_engine(doc: Mapping[str, Any], schedule: dict[int, int], max_k: int):
    """The schedule as trtspec will write it for the config's method on its pinned TensorRT-LLM release: a one-engine
    drafter's bands of 0 become 1 where the release has no floor for them (trtspec.llmapi.draft_floor)."""
    from trtspec.llmapi.draft_floor import resolve
    from trtspec.llmapi.fields import pinned_version, version_fields

    version = doc.get("tensorrt_llm_version")  # None: the pinned release
    method = (doc.get("speculative") or {}).get("method") or ("draft_model" if doc.get("draft") else "ngram")
    two_model = bool((doc.get("llmapi") or {}).get("eagle3_two_model"))
    return resolve(method, version_fields(version), max_k, schedule, None, two_model,
                   version or f"{pinned_version()} (pinned)")


def _default(name: str) -> Any:
    return SpeculativeConfig.model_fields[name].default


def sweep_variant(doc: Mapping[str, Any], k: int | None = None) -> dict[str, Any]:
    """The config to measure with: the load caps off (they would cap the k being measured); for llmapi, k as
    the most draft tokens and the target-only baseline endpoint on."""
    new = copy.deepcopy(dict(doc))
    spec = dict(new.get("speculative") or {})
    for key in ("max_concurrency", "draft_len_schedule"):
        spec.pop(key, None)
    if new.get("engine") == "llmapi":
        lim = dict(new.get("llmapi") or {})
        for key in ("max_concurrency", "draft_len_schedule", "acceptance_window", "acceptance_length_threshold"):
            lim.pop(key, None)
        lim["baseline_endpoint"] = True
        new["llmapi"] = lim
        if k is not None:
            spec[MAX_DRAFT_LEN] = k
    new["speculative"] = spec
    return new


# ------------------------------------------------------------------------------------------------ the file


def output_paths(config: Path, output: Path | None, in_place: bool) -> tuple[Path, Path | None]:
    """(where the tuned config goes, where the original is backed up or None)."""
    if in_place and output is not None:
        raise TuneError("give either --output FILE or --in-place, not both")
    if in_place:
        return config, config.with_name(config.name + ".bak")
    return output or config.with_name(f"{config.stem}.tuned{config.suffix or '.yaml'}"), None


def check_writable(dest: Path, backup: Path | None, force: bool) -> None:
    """Before any measuring: refuse to overwrite without --force, and a folder that does not exist."""
    if backup is not None:
        if backup.exists() and not force:
            raise TuneError(f"{backup} exists (a backup of an earlier tune?): move it away or pass --force")
    elif dest.exists() and not force:
        raise TuneError(f"{dest} exists: choose another --output, or pass --force to replace it")
    if not dest.parent.is_dir():
        raise TuneError(f"{dest.parent}: no such folder for the tuned config")
    if not os.access(dest.parent, os.W_OK):
        raise TuneError(f"{dest.parent}: not writable")


def header(config: Path, bands: list[BandChoice], notes: list[str]) -> str:
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Tuned by `trtspec tune {config.name}` on {date}: the best fixed draft length per concurrency band",
             "# (output tokens/s over the target-only baseline, per k measured):"]
    for b in bands:
        measured = ", ".join(f"k={k} {s:.2f}x" for k, s in b.speedups.items())
        lines.append(f"#   c={b.concurrency}: k={b.k}  ({measured})")
    lines += [f"# {n}" for n in notes]
    return "\n".join(lines) + "\n"


def write_config(dest: Path, doc: Mapping[str, Any], head: str, backup: Path | None = None,
                 validate: Any = None) -> None:
    """Write atomically: a temp file beside `dest` is written, validated (`validate(path)` raises on a config
    the next build would refuse) and renamed over `dest`; on any failure `dest` is untouched and the temp file
    removed. With `backup`, `dest`'s previous content is copied there first."""
    text = head + yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=False)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if validate is not None:
            validate(tmp)
        if backup is not None and dest.exists():
            backup.write_bytes(dest.read_bytes())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
