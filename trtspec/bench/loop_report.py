"""The loop benchmark's markdown report: the command, machine and settings, then one section per measurement
(through Triton, Hugging Face generate, the cost ratio c, the loop's overhead, detokenization, the verify cost) and
the targets. Each section is left out when its results are missing."""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def _f(x: Any, fmt: str = "{:.2f}", none: str = "–") -> str:
    if x is None:
        return none
    if isinstance(x, str):
        return x
    return fmt.format(x)


def _ms(x: Any) -> str:
    return _f(None if x is None else x * 1e3, "{:.2f} ms")


def render_report(results: dict[str, Any], kinds: Sequence[str]) -> str:
    server = results.get("server", {})
    per_kind = server.get("summary", {}).get("per_kind", {})
    inproc = results.get("inprocess", {})
    cost = inproc.get("cost", {})
    lines = _header(results)
    if per_kind:
        lines += _triton_section(per_kind, cost, kinds)
    if inproc.get("hf", {}).get("per_kind", {}):
        lines += _hf_section(results, per_kind, kinds)
    if cost:
        lines += _cost_section(cost, per_kind)
    if server.get("overhead"):
        lines += _overhead_section(server, per_kind["all"], results["settings"].get("draft_source", "model"))
    if inproc.get("detokenize"):
        lines += _detokenize_section(inproc["detokenize"])
    if inproc.get("verify"):
        lines += _verify_section(inproc["verify"])
    if results.get("checks", []):
        lines += _targets_section(results["checks"])
    return "\n".join(lines)


def _header(results: Mapping[str, Any]) -> list[str]:
    m = results["machine"]
    s = results["settings"]
    startup = results.get("server", {}).get("startup_s")
    return [
        "# trtspec loop benchmark",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Machine: {m.get('cpu_model', '?')}, {m.get('cpu_count')} CPUs (affinity {m.get('affinity_cpus', '?')}), "
        f"torch {m.get('torch', '?')} with {m.get('torch_threads', '?')} threads in-process (server stubs: torch "
        f"default, OMP_NUM_THREADS={m.get('omp_num_threads') or 'unset'}), transformers {m.get('transformers', '?')}, "
        f"Python {m.get('python')}. "
        f"Load average (1/5/15 min) at start {results.get('loadavg_start')}, after the server phase "
        f"{results.get('loadavg_after_server')}, end {results.get('loadavg_end')}: Triton and in-process numbers are "
        "comparable only if the load stayed alike.",
        "",
        f"Settings: target `{s['target']}`, draft `{s['draft']}`, k = {s['k']}, greedy, "
        f"max_tokens = {s['max_tokens']}, "
        f"{s['prompts_per_kind']} prompts per kind, 1 request at a time, {s['protocol'].upper()}"
        f"{' streaming' if s['stream'] else ' non-streaming'}; run took {_f(results.get('elapsed_s'), '{:.0f}', '?')} s"
        + (f" (server start {startup:.0f} s)." if startup else "."),
        "",
    ]


def _triton_section(per_kind: Mapping[str, Any], cost: Mapping[str, Any], kinds: Sequence[str]) -> list[str]:
    lines = [
        f"## Through Triton (c = {_f(cost.get('c_engine'), '{:.3f}')})",
        "",
        "| kind | baseline tok/s | speculative tok/s | speculative/baseline | identical | tokens/target call | α "
        "| accepted/proposed | S | efficiency (÷S) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in list(kinds) + ["all"]:
        e = per_kind.get(kind)
        if not e:
            continue
        sp, b = e["speculative"], e["baseline"]
        lines.append(
            f"| {kind} | {_f(b['tokens_per_s'], '{:.1f}')} | {_f(sp['tokens_per_s'], '{:.1f}')} | "
            f"{_f(e['speedup'], '{:.3f}')} | {e['identical']}/{e['compared']} | "
            f"{_f(sp.get('tokens_per_call'), '{:.3f}')} | {_f(sp.get('alpha'), '{:.3f}')} | "
            f"{_f(sp.get('acceptance_rate'), '{:.3f}')} | {_f(e.get('S'), '{:.3f}')} | "
            f"{_f(e.get('efficiency'), '{:.3f}')} |"
        )
    pos = per_kind.get("all", {}).get("speculative", {}).get("acceptance_per_position")
    if pos:
        lines += ["", "Acceptance by draft position (all prompts): " + ", ".join(_f(x, "{:.2f}") for x in pos) + "."]
    lines.append("")
    return lines


def _hf_section(results: Mapping[str, Any], per_kind: Mapping[str, Any], kinds: Sequence[str]) -> list[str]:
    k = results["settings"]["k"]
    hf = results["inprocess"]["hf"]
    hf_kind = hf["per_kind"]
    dflt = hf.get("hf_default_assistant_settings", {})
    lines = [
        "## Hugging Face generate, in-process (server stopped)",
        "",
        f"| kind | HF target tok/s | HF assisted tok/s (k={k}, constant, threshold 0) | assisted/target | "
        f"HF assisted tok/s (HF defaults: {dflt.get('num_assistant_tokens')}, "
        f"{dflt.get('num_assistant_tokens_schedule')}, threshold {dflt.get('assistant_confidence_threshold')}) | "
        f"Triton speculative / HF assisted (k={k}) |",
        "|---|---|---|---|---|---|",
    ]
    for kind in list(kinds) + ["all"]:
        e = hf_kind.get(kind)
        if not e:
            continue
        vs = per_kind.get(kind, {}).get("spec_vs_hf_assisted")
        lines.append(
            f"| {kind} | {_f(e['hf_target_tokens_per_s'], '{:.1f}')} | {_f(e['hf_assisted_tokens_per_s'], '{:.1f}')} | "
            f"{_f(e['hf_assisted_vs_target'], '{:.3f}')} | {_f(e['hf_assisted_defaults_tokens_per_s'], '{:.1f}')} | "
            f"{_f(vs, '{:.3f}')} |"
        )
    lines += ["", "HF " + "; ".join(_hf_mode_notes(hf, len(results["prompt_ids"]))) + "."]
    pre = results["inprocess"].get("prefill")
    tgt = hf.get("modes", {}).get("target")
    if pre and tgt:
        share = pre["mean_s"] * len(tgt["per_prompt"]) / sum(pp["seconds"] for pp in tgt["per_prompt"])
        lines.append(
            f"HF timings include the prompt prefill (mean {pre['mean_s'] * 1e3:.0f} ms per prompt, {share:.1%} of the "
            "target-only time); the server's measured requests start with the prompt in the prefix cache (both "
            "endpoints alike)."
        )
    lines.append("")
    return lines


def _hf_mode_notes(hf: Mapping[str, Any], n: int) -> list[str]:
    """Per HF mode: identity with the server's baseline, tokens per target forward, the settings HF ran with."""
    notes = []
    for mode, mm in hf.get("modes", {}).items():
        extra = ""
        if mm.get("tokens_per_target_forward"):
            extra = (f", {mm['tokens_per_target_forward']:.2f} tokens per target forward, "
                     f"acceptance {_f(mm.get('acceptance_rate'), '{:.2f}')}")
        obs = mm.get("observed_settings")
        if obs:
            extra += (f" (HF ran with {obs.get('num_assistant_tokens')} draft tokens, "
                      f"{obs.get('num_assistant_tokens_schedule')} schedule, "
                      f"threshold {obs.get('assistant_confidence_threshold')})")
        notes.append(
            f"{mode}: identical to the server's baseline on {mm.get('identical_to_server_baseline', '?')}/{n} "
            f"prompts{extra}"
        )
    return notes


def _cost_section(cost: Mapping[str, Any], per_kind: Mapping[str, Any]) -> list[str]:
    lines = [
        "## Cost ratio c (draft / target per token, incremental decode with KV cache, batch 1)",
        "",
        "| measured on | draft per token | target per token | c |",
        "|---|---|---|---|",
        f"| reference engine in-process (used for S) | {_ms(cost['engine_draft_s_per_token'])} | "
        f"{_ms(cost['engine_target_s_per_token'])} | {cost['c_engine']:.3f} |",
        f"| bare HF forward in-process | {_ms(cost['model_draft_s_per_token'])} | "
        f"{_ms(cost['model_target_s_per_token'])} | {cost['c_model']:.3f} |",
    ]
    fastest = (f"Medians of {cost.get('reps', '?')} runs of {cost.get('tokens', '?')} tokens; from the fastest runs "
               f"c = {_f(cost.get('c_engine_of_fastest'), '{:.3f}')} (engine), "
               f"{_f(cost.get('c_model_of_fastest'), '{:.3f}')} (bare HF).")
    all_e = per_kind.get("all")
    if all_e and cost.get("c_server") is not None:
        lines.append(
            "| inside the server (draft engine time / draft token; target engine time / baseline call) | "
            f"{_ms(all_e['speculative'].get('draft_s_per_token'))} | "
            f"{_ms(all_e['baseline'].get('target_s_per_call'))} | {cost['c_server']:.3f} |"
        )
    lines += ["", fastest]
    if all_e and all_e.get("S_c_server") is not None:
        lines.append(f"With c from the server, S (all prompts) = {all_e['S_c_server']:.3f}.")
    lines.append("")
    return lines


def _overhead_section(server: Mapping[str, Any], all_e: Mapping[str, Any], draft_source: str) -> list[str]:
    ov = server["overhead"]
    sp, b = all_e["speculative"], all_e["baseline"]
    bls = server["bls_exec"]
    return [
        "## Loop overhead per iteration (Triton per-model statistics)",
        "",
        "| endpoint | client wall | engine time (target + draft) | pre/post-processing | iterations "
        "| overhead / iteration | without pre/post |",
        "|---|---|---|---|---|---|---|",
        f"| speculative | {sp['wall_s']:.2f} s | {sp['engine_s']:.2f} s ({sp['target_calls']} target + "
        f"{sp['draft_calls']} draft calls) | {sp['pre_post_s']:.3f} s | "
        f"{sp['iterations']} | {_ms(sp['overhead_per_iteration_s'])} | "
        f"{_ms(sp['overhead_per_iteration_excl_pre_post_s'])} |",
        f"| baseline | {b['wall_s']:.2f} s | {b['engine_s']:.2f} s ({b['target_calls']} target calls) | "
        f"{b['pre_post_s']:.3f} s | "
        f"{b['iterations']} | {_ms(b['overhead_per_iteration_s'])} | "
        f"{_ms(b['overhead_per_iteration_excl_pre_post_s'])} |",
        "",
        f"One BLS round trip ({bls['how']}): median {_ms(bls['median_s'])}, mean {_ms(bls['mean_s'])}, "
        f"p10 {_ms(bls['p10_s'])} "
        f"(Triton's compute time of the echo model, mean: {_ms(bls['echo_compute_s'])}; for Python models it includes "
        "the backend-to-stub hand-off, so part of every exec is counted as engine time above). Speculative overhead "
        f"per iteration = {_f(ov['in_bls_execs'], '{:.2f}')} BLS round trips; target for draft source {draft_source}: "
        f"≤ {ov['limit_round_trips']:g} round trips = {_ms(ov['limit_s'])}.",
        "",
    ]


def _detokenize_section(d: Mapping[str, Any]) -> list[str]:
    return [
        "## Streamed-chunk detokenization (postprocessing's work per chunk, median)",
        "",
        "| output so far | against the whole prefix | against the loop's window |",
        "|---|---|---|",
        *(f"| {n} tokens | {_ms(d[f'whole_prefix_{n}_s'])} | {_ms(d[f'window_{n}_s'])} |" for n in (64, 1024)),
        "",
        f"Chunks of {d['chunk_tokens']} tokens; the loop sends postprocessing the last {d['window']} generated tokens "
        "as context, so a chunk's cost does not grow with the length of the stream.",
        "",
    ]


def _verify_section(v: Mapping[str, Any]) -> list[str]:
    return [
        "## Verify cost vs context (reference engine in-process, prefix cache warmed with the context)",
        "",
        "| context | verify k tokens (median) | tokens computed / reused |",
        "|---|---|---|",
        f"| 64 | {_ms(v['ctx64']['median_s'])} | {v['ctx64']['computed_tokens']} / {v['ctx64']['reused_tokens']} |",
        f"| 1,024 | {_ms(v['ctx1024']['median_s'])} | {v['ctx1024']['computed_tokens']} / "
        f"{v['ctx1024']['reused_tokens']} |",
        "",
        f"Ratio 1,024 / 64 = {v['ratio']:.2f} (k = {v['k']}, median of {len(v['ctx64']['all_s'])}; "
        f"of the fastest runs: {_ms(v['ctx1024'].get('min_s'))} / {_ms(v['ctx64'].get('min_s'))} = "
        f"{_f(v.get('ratio_min'))}).",
        "",
    ]


def _targets_section(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["## Targets", "", "| check | value | target | pass |", "|---|---|---|---|"]
    for ch in checks:
        val, tgt = ch["value"], ch["target"]
        if isinstance(val, float) and "overhead" in ch["check"]:
            val, tgt = _ms(val), _ms(tgt)
        passed = "–" if ch["pass"] is None else ("yes" if ch["pass"] else "NO")
        lines.append(f"| {ch['check']} | {_f(val, '{:.3f}')} | {_f(tgt, '{:.3g}')} | {passed} |")
    lines.append("")
    return lines
