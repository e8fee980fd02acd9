"""The loop benchmark's derived figures: from the measured results, the acceptance alpha and the bound S per prompt
kind, the efficiency against S, the comparison with Hugging Face's assisted generation, the loop's overhead in BLS
round trips, and the checks against the targets."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from trtspec.bench.loop_stats import ratio
from trtspec.spec.speculative import speedup_bound

# Targets
TARGET_EFFICIENCY = 0.9  # speculative/baseline >= 0.9 S
# Loop overhead per speculative iteration, in BLS round trips: drafting with the draft model needs two
# engine calls per iteration, an in-process drafter (n-gram) only the verify call.
TARGET_OVERHEAD_ROUND_TRIPS = {"model": 3.0, "hybrid": 3.0, "ngram": 1.5}
TARGET_VERIFY_RATIO = 1.3  # verify at 1,024 tokens of context <= 1.3 x at 64

HF_FIELDS = (
    "hf_target_tokens_per_s", "hf_assisted_tokens_per_s", "hf_assisted_defaults_tokens_per_s", "hf_assisted_vs_target"
)


def derive(results: dict[str, Any], kinds: Sequence[str], k: int) -> None:
    """Adds alpha/S/efficiency per kind, the HF comparison, overhead vs BLS round trips, and the target checks."""
    server = results.get("server", {})
    per_kind = server.get("summary", {}).get("per_kind", {})
    inproc = results.get("inprocess", {})
    cost = inproc.get("cost", {})
    hf = inproc.get("hf", {}).get("modes", {})
    checks: list[dict[str, Any]] = []

    # c measured inside the server: draft seconds per draft token / target seconds per (baseline) target call
    all_entry = per_kind.get("all")
    if all_entry:
        d = all_entry["speculative"].get("draft_s_per_token")
        t = all_entry["baseline"].get("target_s_per_call")
        cost["c_server"] = ratio(d, t)

    hf_kind: dict[str, dict[str, Any]] = {}
    if hf:
        hf_kind = inproc["hf"]["per_kind"] = hf_per_kind(hf, results["prompt_ids"], results["prompt_kinds"], kinds)

    for kind in list(kinds) + ["all"]:
        e = per_kind.get(kind)
        if e is None:
            continue
        add_bounds(e, k, cost.get("c_engine"), cost.get("c_server"), hf_kind.get(kind))
        if kind != "all":
            checks += kind_checks(kind, e, k)

    if hf and server.get("records"):
        mark_hf_identity(hf, server["records"], results["prompt_ids"])

    bls = server.get("bls_exec")
    if all_entry and bls:
        ov = server["overhead"] = loop_overhead(all_entry, bls, results["settings"].get("draft_source", "model"))
        trips, limit, value = ov["limit_round_trips"], ov["limit_s"], ov["speculative_per_iteration_s"]
        checks.append(_check(f"loop overhead per iteration <= {trips:g} BLS round trips", value, limit,
                             None if value is None else value <= limit))
    v = inproc.get("verify")
    if v:
        checks.append(_check("verify cost at 1,024 tokens <= 1.3 x at 64", v["ratio"], TARGET_VERIFY_RATIO,
                             v["ratio"] <= TARGET_VERIFY_RATIO))
    results["checks"] = checks


def _check(check: str, value: Any, target: Any, passed: bool | None) -> dict[str, Any]:
    return {"check": check, "value": value, "target": target, "pass": passed}


def hf_per_kind(
    hf: Mapping[str, Any], prompt_ids: Sequence[str], kind_of: Mapping[str, str], kinds: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """HF's tokens/s per prompt kind and overall: target only, assisted (k), assisted (HF defaults)."""

    def tokens_per_s(mode: str, kind: str) -> float | None:
        m = hf.get(mode)
        if not m:
            return None
        sel = [pp for pid, pp in zip(prompt_ids, m["per_prompt"]) if kind == "all" or kind_of[pid] == kind]
        t = sum(len(pp["tokens"]) for pp in sel)
        s = sum(pp["seconds"] for pp in sel)
        return t / s if s else None

    out: dict[str, dict[str, Any]] = {}
    for kind in list(kinds) + ["all"]:
        h = {
            "hf_target_tokens_per_s": tokens_per_s("target", kind),
            "hf_assisted_tokens_per_s": tokens_per_s("assisted", kind),
            "hf_assisted_defaults_tokens_per_s": tokens_per_s("assisted_hf_defaults", kind),
        }
        h["hf_assisted_vs_target"] = ratio(h["hf_assisted_tokens_per_s"], h["hf_target_tokens_per_s"])
        out[kind] = h
    return out


def add_bounds(
    e: dict[str, Any], k: int, c: float | None, c_server: float | None, hf_figures: Mapping[str, Any] | None
) -> None:
    """Adds to one kind's entry the bound S (with c in-process and c from the server), the efficiency against S,
    HF's figures and the speculative endpoint against HF assisted."""
    spec = e["speculative"]
    alpha = spec.get("alpha")
    e["S"] = speedup_bound(alpha, k, c) if alpha is not None and c is not None else None
    e["efficiency"] = ratio(e["speedup"], e["S"])
    e["S_c_server"] = speedup_bound(alpha, k, c_server) if alpha is not None and c_server is not None else None
    e.update(hf_figures or dict.fromkeys(HF_FIELDS))
    e["spec_vs_hf_assisted"] = ratio(spec["tokens_per_s"], e["hf_assisted_tokens_per_s"])
    best_assisted = [x for x in (e["hf_assisted_tokens_per_s"], e["hf_assisted_defaults_tokens_per_s"]) if x]
    e["spec_vs_hf_best_assisted"] = ratio(spec["tokens_per_s"], max(best_assisted or [0]) or None)


def kind_checks(kind: str, e: Mapping[str, Any], k: int) -> list[dict[str, Any]]:
    """One prompt kind's checks: efficiency against S, faster than HF assisted, token identity."""
    efficiency, vs_hf = e.get("efficiency"), e["spec_vs_hf_assisted"]
    return [
        _check(f"{kind}: speculative/baseline >= {TARGET_EFFICIENCY} S", efficiency, TARGET_EFFICIENCY,
               None if efficiency is None else efficiency >= TARGET_EFFICIENCY),
        _check(f"{kind}: Triton speculative faster than HF assisted (k={k})", vs_hf, 1.0,
               None if vs_hf is None else vs_hf > 1.0),
        _check(f"{kind}: speculative token-identical to baseline", f"{e['identical']}/{e['compared']}", "all",
               e["identical"] == e["compared"]),
    ]


def mark_hf_identity(hf: Mapping[str, Any], records: Sequence[Mapping[str, Any]], prompt_ids: Sequence[str]) -> None:
    """HF's outputs identical to the server's baseline (greedy): a cross-check of both, per HF mode."""
    base = {r["prompt_id"]: r["token_ids"] for r in records if r["endpoint"] == "baseline"}
    for m in hf.values():
        m["identical_to_server_baseline"] = sum(
            1 for pid, pp in zip(prompt_ids, m["per_prompt"]) if base.get(pid) == pp["tokens"]
        )


def loop_overhead(all_entry: Mapping[str, Any], bls: Mapping[str, Any], draft_source: str) -> dict[str, Any]:
    """The loop's overhead per iteration against one BLS round trip, and the draft source's limit."""
    ov = all_entry["speculative"].get("overhead_per_iteration_s")
    trips = TARGET_OVERHEAD_ROUND_TRIPS[draft_source]
    return {
        "speculative_per_iteration_s": ov,
        "baseline_per_iteration_s": all_entry["baseline"].get("overhead_per_iteration_s"),
        "bls_exec_s": bls["median_s"],
        "limit_s": trips * bls["median_s"],
        "limit_round_trips": trips,
        "in_bls_execs": ratio(ov, bls["median_s"]),
    }
