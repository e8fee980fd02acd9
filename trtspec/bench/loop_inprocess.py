"""The loop benchmark's in-process phase, after the server has stopped (so the two never share the CPU): Hugging
Face ``generate``, target only and assisted; the draft/target cost ratio c; the verify cost against the context;
the prompts' prefill; and postprocessing's detokenization per streamed chunk."""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from trtspec.bench.loop_settings import DEFAULT_KINDS, BenchPrompt, LoopBenchArgs, select_prompts

# The draft's generation_config fields that steer HF's assisted generation (generate() kwargs are ignored for these)
ASSISTANT_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


# ================================================================================ Hugging Face generate


@contextmanager
def counting_assisted_calls() -> Iterator[dict[str, Any]]:
    """Counts HF's assisted verify calls, their matches and proposals while inside, and records the settings HF
    actually ran with, by wrapping ``AssistedCandidateGenerator.update_candidate_strategy``."""
    counters: dict[str, Any] = {"calls": 0, "matches": 0, "proposed": 0, "observed": None}
    try:
        from transformers.generation.candidate_generator import AssistedCandidateGenerator

        original = AssistedCandidateGenerator.update_candidate_strategy

        def counting(self, input_ids, scores, num_matches):  # noqa: ANN001
            if counters["observed"] is None:  # what HF actually used (generate() kwargs would be ignored)
                agc = getattr(self, "assistant_generation_config", None)
                counters["observed"] = {
                    "num_assistant_tokens": getattr(self, "num_assistant_tokens", None),
                    "num_assistant_tokens_schedule": getattr(agc, "num_assistant_tokens_schedule", None),
                    "assistant_confidence_threshold": getattr(self, "assistant_confidence_threshold", None),
                }
            counters["calls"] += 1
            counters["matches"] += int(num_matches)
            counters["proposed"] += int(scores.shape[1]) - 1
            return original(self, input_ids, scores, num_matches)

        AssistedCandidateGenerator.update_candidate_strategy = counting
    except Exception:  # noqa: BLE001 - counts are a bonus
        AssistedCandidateGenerator, original = None, None
    try:
        yield counters
    finally:
        if original is not None:
            AssistedCandidateGenerator.update_candidate_strategy = original


def assistant_defaults(gc: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The draft's assistant settings as its generation config holds them, and as HF applies them."""
    hf_default = {name: getattr(gc, name, None) for name in ASSISTANT_SETTINGS}
    try:  # transformers 5: None in the config means "the library default", applied at generate() time
        from transformers import GenerationConfig

        lib_defaults = GenerationConfig._get_default_generation_params()
    except Exception:  # noqa: BLE001
        lib_defaults = {}
    effective = {n: hf_default[n] if hf_default[n] is not None else lib_defaults.get(n) for n in ASSISTANT_SETTINGS}
    return hf_default, effective


def _set_assistant(gc: Any, num: Any, schedule: Any, threshold: Any) -> None:
    gc.num_assistant_tokens = num
    gc.num_assistant_tokens_schedule = schedule
    gc.assistant_confidence_threshold = threshold


def hf_generate(target: Any, ids: list[int], n: int, assistant: Any, eos: int | None) -> tuple[list[int], float]:
    """Greedy ``target.generate`` of `n` new tokens, assisted by `assistant` if given: (the tokens before EOS,
    seconds)."""
    import torch

    x = torch.tensor([ids], dtype=torch.long)
    kw = {"assistant_model": assistant} if assistant is not None else {}
    t0 = time.perf_counter()
    with torch.inference_mode():
        y = target.generate(
            input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, pad_token_id=eos, **kw
        )
    dt = time.perf_counter() - t0
    new = [int(t) for t in y[0, len(ids):]]
    if eos is not None and eos in new:
        new = new[: new.index(eos)]
    return new, dt


def hf_generate_runs(
    target: Any, draft: Any, prompt_ids: Sequence[list[int]], max_tokens: int, k: int, eos: int | None,
    defaults: bool, log: Any,
) -> dict[str, Any]:
    """HF generate, target only and assisted (k constant, threshold 0; and HF defaults), per prompt."""
    gc = draft.generation_config
    hf_default, effective_default = assistant_defaults(gc)
    modes = [("target", None, None), ("assisted", draft, (k, "constant", 0.0))]
    if defaults:
        modes.append(("assisted_hf_defaults", draft, tuple(hf_default.values())))
    results: dict[str, Any] = {
        "hf_default_assistant_settings": effective_default,
        "draft_generation_config_values": hf_default,
        "modes": {},
    }
    with counting_assisted_calls() as counters:
        try:
            for name, assistant, settings in modes:
                if settings is not None:
                    _set_assistant(gc, *settings)
                generate = partial(hf_generate, target, assistant=assistant, eos=eos)
                generate(prompt_ids[0], 8)  # warm-up
                counters.update(calls=0, matches=0, proposed=0, observed=None)
                mode: dict[str, Any] = {"per_prompt": _time_prompts(generate, name, prompt_ids, max_tokens, log)}
                if assistant is not None:
                    mode |= _assisted_figures(settings, counters)
                results["modes"][name] = mode
        finally:
            _set_assistant(gc, *hf_default.values())
    return results


def _time_prompts(
    generate: Callable[[list[int], int], tuple[list[int], float]], name: str, prompt_ids: Sequence[list[int]],
    max_tokens: int, log: Any,
) -> list[dict[str, Any]]:
    per_prompt = []
    for ids in prompt_ids:
        new, dt = generate(ids, max_tokens)
        per_prompt.append({"tokens": new, "seconds": dt})
        log(f"  HF {name:22s} {len(new):4d} tok {dt:6.2f} s {len(new) / dt:6.1f} tok/s")
    return per_prompt


def _assisted_figures(settings: Sequence[Any], counters: dict[str, Any]) -> dict[str, Any]:
    """The settings asked for and those HF ran with, and what its verify calls counted."""
    out = {"settings": dict(zip(ASSISTANT_SETTINGS, settings)), "observed_settings": counters["observed"]}
    if counters["calls"]:
        out["target_forwards"] = counters["calls"]
        out["tokens_per_target_forward"] = (counters["matches"] + counters["calls"]) / counters["calls"]
        out["acceptance_rate"] = counters["matches"] / counters["proposed"] if counters["proposed"] else None
    return out


# ================================================================================ costs


def decode_cost(engine: Any, prompt: list[int], n: int, reps: int) -> tuple[float, float]:
    """Seconds per generated token of a ReferenceEngine (incremental decode, prefix cache warmed): median, best."""
    from trtspec.reference_engine import EngineRequest

    engine.run(EngineRequest(list(prompt), output_len=1))  # the prompt is in the prefix cache now
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        engine.run(EngineRequest(list(prompt), output_len=n))
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times), min(times)


def model_decode_cost(model: Any, prompt: list[int], n: int, reps: int) -> tuple[float, float]:
    """Seconds per token of bare HF incremental decoding (DynamicCache, batch 1, argmax), prompt prefilled."""
    import torch
    from transformers import DynamicCache

    times = []
    with torch.inference_mode():
        for _ in range(reps + 1):
            cache = DynamicCache(config=model.config)
            out = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            t0 = time.perf_counter()
            for _ in range(n):
                out = model(input_ids=tok, past_key_values=out.past_key_values, use_cache=True)
                tok = out.logits[:, -1:].argmax(-1)
            times.append((time.perf_counter() - t0) / n)
    return statistics.median(times[1:]), min(times[1:])


def cost_ratio(target: Any, draft: Any, prompt: list[int], n: int, reps: int) -> dict[str, Any]:
    """The draft/target cost ratio c per token, on the reference engine and on the bare HF models."""
    t_target, t_target_min = decode_cost(target, prompt, n, reps)
    t_draft, t_draft_min = decode_cost(draft, prompt, n, reps)
    m_target, m_target_min = model_decode_cost(target.model, prompt, n, reps)
    m_draft, m_draft_min = model_decode_cost(draft.model, prompt, n, reps)
    return {
        "tokens": n,
        "reps": reps,
        "context": len(prompt),
        "engine_target_s_per_token": t_target,
        "engine_draft_s_per_token": t_draft,
        "c_engine": t_draft / t_target,
        "model_target_s_per_token": m_target,
        "model_draft_s_per_token": m_draft,
        "c_model": m_draft / m_target,
        "c_engine_of_fastest": t_draft_min / t_target_min,
        "c_model_of_fastest": m_draft_min / m_target_min,
    }


def verify_cost(engine: Any, context: list[int], draft: list[int], reps: int) -> dict[str, Any]:
    """Median seconds of one verify call (k draft tokens) after the context is in the prefix cache."""
    from trtspec.reference_engine import EngineRequest, PrefixCache

    engine.cache = PrefixCache(engine.cache.max_entries, engine.cache.max_bytes)
    engine.run(EngineRequest(list(context), output_len=1))  # warms the cache with the context
    times, computed, reused = [], 0, 0
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        r = engine.run(EngineRequest(list(context), output_len=len(draft) + 1, draft_ids=list(draft)))
        times.append(time.perf_counter() - t0)
        computed, reused = r.computed_tokens, r.reused_tokens
    return {
        "context": len(context),
        "median_s": statistics.median(times[1:]),
        "min_s": min(times[1:]),
        "all_s": times[1:],
        "computed_tokens": computed,
        "reused_tokens": reused,
    }


def verify_against_context(target: Any, passage: list[int], k: int, reps: int) -> dict[str, Any]:
    """The verify cost of k draft tokens at 1,024 tokens of context against 64 (`passage`: over 1,040 tokens)."""
    draft_ids = passage[1024 : 1024 + k]
    short = verify_cost(target, passage[:64], draft_ids, reps)
    long = verify_cost(target, passage[:1024], draft_ids, reps)
    return {
        "k": k,
        "ctx64": short,
        "ctx1024": long,
        "ratio": long["median_s"] / short["median_s"],
        "ratio_min": long["min_s"] / short["min_s"],
    }


def detokenize_cost(
    tokenizer: Any, lengths: Sequence[int] = (64, 1024), chunk: int = 2, reps: int = 3
) -> dict[str, Any]:
    """Postprocessing's work per streamed chunk at the end of a stream of each length: decoding the chunk against
    the whole prefix (what postprocessing was sent before) and against the loop's window of the last tokens
    (trtspec.triton.loop_model.PREFIX_WINDOW). Real text, greedy-output-like chunks of `chunk` tokens."""
    from trtspec.detokenize import chunk_text
    from trtspec.triton.loop_model import PREFIX_WINDOW

    text = " ".join(p.text for p in select_prompts(DEFAULT_KINDS, 2))
    ids = tokenizer.encode(text, add_special_tokens=False)
    while len(ids) < max(lengths) + chunk:
        ids = ids + ids
    out: dict[str, Any] = {"chunk_tokens": chunk, "window": PREFIX_WINDOW}
    for n in lengths:
        prefix, new = ids[:n], ids[n : n + chunk]
        for name, ctx in (("whole_prefix", prefix), ("window", prefix[-PREFIX_WINDOW:])):
            times = []
            for _ in range(reps * 50):
                t0 = time.perf_counter()
                chunk_text(tokenizer, ctx, new)
                times.append(time.perf_counter() - t0)
            out[f"{name}_{n}_s"] = statistics.median(times)
    return out


def prefill_times(model: Any, prompt_ids: Sequence[list[int]]) -> dict[str, Any]:
    """Each prompt's prefill on the bare model (HF generate pays it in every call; the server's measured requests
    start with the prompt cached)."""
    import torch

    pre = []
    with torch.inference_mode():
        for ids in prompt_ids:
            t0 = time.perf_counter()
            model(input_ids=torch.tensor([ids]))
            pre.append(time.perf_counter() - t0)
    return {"mean_s": sum(pre) / len(pre), "per_prompt_s": pre}


# ================================================================================ the phase


def run_inprocess_phase(
    target_dir: Path, draft_dir: Path, prompts: Sequence[BenchPrompt], args: LoopBenchArgs, log: Any
) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    from trtspec.reference_engine import ReferenceEngine

    out: dict[str, Any] = {"torch_threads": torch.get_num_threads()}
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    # as the preprocessing model does it
    prompt_ids = [tok.encode(p.text, add_special_tokens=False) for p in prompts]
    eos = tok.eos_token_id
    log("loading target and draft in-process (reference engine)")
    target = ReferenceEngine(target_dir, device="cpu", dtype="float32")
    draft = ReferenceEngine(draft_dir, device="cpu", dtype="float32", use_draft_vocab=True)

    if not args.skip_hf:
        log("HF generate: target only, assisted (k constant, threshold 0)"
            + (", assisted (HF defaults)" if args.hf_defaults else ""))
        out["hf"] = hf_generate_runs(
            target.model, draft.model, prompt_ids, args.max_tokens, args.k, eos, args.hf_defaults, log
        )

    out["prefill"] = prefill_times(target.model, prompt_ids)

    log("cost ratio c: incremental decode, batch 1")
    cost = out["cost"] = cost_ratio(target, draft, prompt_ids[0], args.cost_tokens, args.cost_reps)
    t_draft, t_target = cost["engine_draft_s_per_token"], cost["engine_target_s_per_token"]
    log(f"  c (reference engine) = {t_draft * 1e3:.1f} / {t_target * 1e3:.1f} ms = {t_draft / t_target:.3f};"
        f" c (bare HF) = {cost['c_model']:.3f}")

    log("verify cost at 1,024 vs 64 tokens of context")
    passage = tok.encode(" ".join(p.text for p in prompts), add_special_tokens=False)
    while len(passage) < 1024 + 16:
        passage = passage + passage
    v = out["verify"] = verify_against_context(target, passage, args.k, args.verify_reps)
    log(f"  verify k={args.k}: {v['ctx64']['median_s'] * 1e3:.1f} ms at 64, "
        f"{v['ctx1024']['median_s'] * 1e3:.1f} ms at 1024 -> x{v['ratio']:.2f}")
    out["prompt_lengths"] = {p.id: len(ids) for p, ids in zip(prompts, prompt_ids)}
    log("detokenization cost per streamed chunk at 64 vs 1,024 output tokens")
    out["detokenize"] = detokenize_cost(tok)
    return out
