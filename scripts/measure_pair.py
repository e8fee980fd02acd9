#!/usr/bin/env python
"""Measure a draft/target pair on held-out prompts: acceptance α and per-token cost ratio c.

* α (teacher-forced greedy acceptance): the target continues each prompt greedily for ``--new-tokens``
  tokens; α is the share of those positions where the draft's argmax, given the target's prefix, equals
  the target's token. Under greedy verification this is exactly the per-token acceptance of a draft
  that has matched so far, so the fixed-length speculative loop can be simulated from it:
  ``tok/step@k`` is the mean number of tokens produced per target forward with k draft tokens.
* c: draft decode-step time / target decode-step time (incremental decode with a KV cache, batch 1,
  same thread count), medians over interleaved repeats.

Two prompt kinds, none on a training topic of scripts/train_draft.py (checked at start-up):
``chat`` (open questions) and ``grounded`` (a passage plus summarise / rewrite / extract).

    HF_HUB_OFFLINE=1 python scripts/measure_pair.py --out pair.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trtspec.demo_pair import resolve_checkpoint  # noqa: E402
from trtspec.reference_engine import draft_head, load_draft_vocab, tune_for_cpu  # noqa: E402

# (keyword that must not occur in any training topic, prompt)
CHAT = [
    ("volcano", "Explain how a volcano erupts."),
    ("autumn", "Write a short poem about autumn leaves."),
    ("second language", "What are the benefits of learning a second language?"),
    ("refrigerator", "How does a refrigerator keep food cold?"),
    ("job interview", "Give me some advice for preparing for a job interview."),
    ("butterfl", "Describe the life cycle of a butterfly."),
    ("sky", "Why is the sky blue during the day and red at sunset?"),
    ("lost dog", "Write a short story about a lost dog finding its way home."),
]

PASSAGES = [
    ("honeybee", "Honeybees live in colonies of up to 60,000 insects. A single queen lays all the eggs, while "
     "worker bees collect nectar and pollen, build wax combs and care for the young. Drones exist only to mate "
     "with a queen. Bees communicate the location of flowers through a 'waggle dance', whose angle and length "
     "tell other workers the direction and distance of the food."),
    ("printing press", "Around 1440, Johannes Gutenberg developed a printing press with movable metal type in "
     "Mainz, Germany. His method made it possible to produce books far faster and more cheaply than copying "
     "them by hand. The Gutenberg Bible, printed around 1455, is the most famous early example. Within fifty "
     "years, printing presses had spread to more than two hundred cities across Europe."),
    ("great wall", "The Great Wall of China is a series of fortifications built over many centuries to protect "
     "Chinese states from raids by nomadic groups. The best-known sections were built during the Ming dynasty, "
     "between 1368 and 1644. The walls were made of stone, brick and rammed earth, and watchtowers along them "
     "allowed soldiers to send signals with smoke and fire."),
    ("lighthouse", "A lighthouse is a tower with a bright lamp at the top that guides ships at night and warns "
     "them of rocks and dangerous coastlines. Early lighthouses burned wood or coal. In 1822 Augustin Fresnel "
     "invented a lens that focused the light into a strong beam visible for many kilometres. Today most "
     "lighthouses are automated and no longer need a keeper."),
    ("coffee", "Coffee plants are thought to have been first used in Ethiopia, and by the fifteenth century "
     "coffee was being grown in Yemen. Coffee houses soon became popular meeting places in cities such as Cairo "
     "and Istanbul. Today Brazil is the largest producer in the world, and the two main species grown are "
     "arabica and robusta, which differ in taste and caffeine content."),
    ("curie", "Marie Curie was a physicist and chemist born in Warsaw in 1867. She moved to Paris to study and "
     "worked there with her husband Pierre on radioactivity. She discovered the elements polonium and radium. "
     "Curie was the first woman to win a Nobel Prize, and she remains the only person to have won Nobel Prizes "
     "in two different sciences, physics in 1903 and chemistry in 1911."),
    ("tide", "Tides are the regular rise and fall of the sea level. They are caused mainly by the gravitational "
     "pull of the Moon and, to a lesser extent, the Sun. Most coasts have two high tides and two low tides "
     "every day. When the Sun, Moon and Earth are aligned, the tides are especially strong; these are called "
     "spring tides."),
    ("silk road", "The Silk Road was a network of trade routes that connected China with the Mediterranean for "
     "more than 1,500 years. Merchants carried silk, spices, paper and porcelain westward, and brought back "
     "gold, glass and horses. Along with goods, the routes spread religions, languages and inventions, and "
     "cities such as Samarkand grew rich from the trade."),
]
TASKS = [
    "Summarize the following text in one sentence:\n\n{p}",
    "Rewrite this passage in simpler words:\n\n{p}",
    "Extract the key facts from the text below as a bulleted list.\n\n{p}",
    "{p}\n\nWhat is the main point of this passage?",
]
GROUNDED = [(kw, TASKS[i % len(TASKS)].format(p=p)) for i, (kw, p) in enumerate(PASSAGES)]


def check_held_out() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        from train_draft import TOPICS
    except Exception:  # the training script needs nothing extra, but do not fail a measurement over it
        return
    clash = [kw for kw, _ in CHAT + GROUNDED if any(kw in t.lower() for t in TOPICS)]
    if clash:
        raise SystemExit(f"held-out prompts overlap training topics: {clash}")


def encode_chat(tok, user: str) -> torch.Tensor:
    enc = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True, tokenize=True)
    if hasattr(enc, "keys"):
        enc = enc["input_ids"]
    return torch.tensor([list(enc)], dtype=torch.long)


def simulate_tokens_per_step(agree: list[bool], k: int) -> float:
    """Greedy speculative decoding with k draft tokens over one continuation: tokens per target forward."""
    pos, steps, n = 0, 0, len(agree)
    while pos < n:
        run = 0
        while run < k and pos + run < n and agree[pos + run]:
            run += 1
        pos += run + 1  # accepted tokens + the target's own token
        steps += 1
    return n / steps


@torch.no_grad()
def step_time(model, prompt: torch.Tensor, steps: int, clock=time.perf_counter, vocab: list[int] | None = None) -> float:
    """Median decode step, as the reference engine runs it (with a draft vocabulary: only its head rows)."""
    from transformers import DynamicCache

    if vocab is not None:
        ids = torch.tensor(vocab)
        head_t = draft_head(model, vocab)

        def step(x, cache):
            h = model.base_model(input_ids=x, past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
            return ids[(h @ head_t).argmax(-1)][:, None]
    else:
        def step(x, cache):
            return model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1:].argmax(-1)

    cache = DynamicCache(config=model.config)
    nxt = step(prompt, cache)
    times = []
    for _ in range(steps):
        t = clock()
        nxt = step(nxt, cache)
        times.append(clock() - t)
    return statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo:target")
    ap.add_argument("--drafts", nargs="+", default=["demo:draft", "demo:draft-untrained"])
    ap.add_argument("--self-draft", action="store_true", help="also measure the target as its own draft")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timing-steps", type=int, default=24)
    ap.add_argument("--timing-repeats", type=int, default=3)
    ap.add_argument("--k", type=int, nargs="+", default=[3, 5], help="draft lengths for the tok/step simulation")
    ap.add_argument("--clock", choices=["wall", "thread"], default="wall",
                    help="wall: perf_counter; thread: CPU time of the calling thread (needs --threads 1). On a "
                         "machine busy with other work, wall times are dominated by waiting; thread CPU time is not")
    ap.add_argument("--no-alpha", action="store_true", help="only the cost ratio c")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.clock == "thread" and args.threads != 1:
        ap.error("--clock thread measures one thread's CPU time: use it with --threads 1")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    check_held_out()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    tdir = resolve_checkpoint(args.target)
    tok = AutoTokenizer.from_pretrained(tdir)
    target = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
    tune_for_cpu(target)  # the reference engine's CPU layout: measure what serving runs
    names = list(args.drafts) + (["target-as-draft"] if args.self_draft else [])
    drafts, vocabs = {}, {}
    for ref in args.drafts:
        ddir = resolve_checkpoint(ref)
        dtok = AutoTokenizer.from_pretrained(ddir)
        if dtok.get_vocab() != tok.get_vocab():
            raise SystemExit(f"{ref}: tokenizer differs from the target's")
        drafts[ref] = AutoModelForCausalLM.from_pretrained(ddir, dtype=torch.float32).eval()
        tune_for_cpu(drafts[ref])
        vocabs[ref] = load_draft_vocab(ddir, drafts[ref].config.vocab_size)
    if args.self_draft:
        drafts["target-as-draft"] = target

    # Target greedy continuations: one left-padded batch (far fewer forward passes than one prompt at a
    # time, which matters on a busy machine); each case is then stored unpadded.
    eos = tok.eos_token_id
    cases = [] if args.no_alpha else [{"kind": kind, "key": kw, "prompt": encode_chat(tok, text)[0]}
             for kind, prompts in (("chat", CHAT), ("grounded", GROUNDED)) for kw, text in prompts]
    width = max((len(c["prompt"]) for c in cases), default=0)
    batch = torch.full((len(cases), width), eos, dtype=torch.long)
    mask = torch.zeros_like(batch)
    for i, c in enumerate(cases):
        batch[i, width - len(c["prompt"]):] = c["prompt"]
        mask[i, width - len(c["prompt"]):] = 1
    with torch.no_grad():
        out = None if not cases else target.generate(input_ids=batch, attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False,
                              eos_token_id=eos, pad_token_id=eos)
    for i, c in enumerate(cases):
        gen = out[i, width:].tolist()
        if eos in gen:  # keep the EOS itself (a draft is scored on proposing it too), drop the padding after it
            gen = gen[: gen.index(eos) + 1]
        c["ids"] = torch.cat([c["prompt"], torch.tensor(gen, dtype=torch.long)])[None]
        c["plen"] = len(c["prompt"])
    print(f"target continuations: {time.monotonic() - t0:.0f} s", file=sys.stderr)

    results = {n: {"per_prompt": []} for n in names}
    for name in names:
        model = drafts[name]
        for c in cases:
            with torch.no_grad():
                logits = model(input_ids=c["ids"]).logits[0]
            if vocabs.get(name) is not None:  # the draft may only propose ids of its vocabulary
                allowed = torch.zeros(logits.shape[-1], dtype=torch.bool)
                allowed[vocabs[name]] = True
                logits = logits.masked_fill(~allowed, float("-inf"))
            pred = logits[c["plen"] - 1 : -1].argmax(-1)
            gold = c["ids"][0, c["plen"]:]
            agree = (pred == gold).tolist()
            results[name]["per_prompt"].append({"kind": c["kind"], "key": c["key"], "n": len(agree),
                                                "alpha": sum(agree) / len(agree), "agree": agree})

    # Cost ratio: interleaved repeats, medians.
    prompt = encode_chat(tok, CHAT[0][1])
    ttimes = {n: [] for n in ["target"] + names}
    for _ in range(args.timing_repeats):
        ttimes["target"].append(step_time(target, prompt, args.timing_steps, clock))
        for name in names:
            ttimes[name].append(step_time(drafts[name], prompt, args.timing_steps, clock, vocabs.get(name)))
    t_target = statistics.median(ttimes["target"])

    summary = {"target": args.target, "threads": args.threads, "clock": args.clock, "new_tokens": args.new_tokens,
               "target_step_ms": round(t_target * 1e3, 2), "drafts": {}}
    for name in names:
        pp = results[name]["per_prompt"]
        row = {}
        for kind in ("chat", "grounded", "all"):
            sel = [p for p in pp if kind == "all" or p["kind"] == kind]
            agree = sum(sum(p["agree"]) for p in sel)
            total = sum(p["n"] for p in sel)
            row[f"alpha_{kind}"] = round(agree / total, 4) if total else None
        t_d = statistics.median(ttimes[name])
        row["draft_step_ms"] = round(t_d * 1e3, 2)
        row["draft_vocab"] = None if vocabs.get(name) is None else len(vocabs[name])
        row["c"] = round(t_d / t_target, 4)
        for k in args.k:
            tps = statistics.mean(simulate_tokens_per_step(p["agree"], k) for p in pp) if pp else None
            row[f"tok_per_step_k{k}"] = None if tps is None else round(tps, 3)
            # Simple cost model: one target step (verifying k+1 tokens costs about one decode step on this
            # tiny model at batch 1) plus k draft steps.
            row[f"est_speedup_k{k}"] = None if tps is None else round(tps / (1 + k * row["c"]), 3)
        row["per_prompt_alpha"] = {f'{p["kind"]}:{p["key"]}': round(p["alpha"], 3) for p in pp}
        summary["drafts"][name] = row

    ks = args.k
    head = "| draft | α chat | α grounded | α all | c (draft/target step) | " + " | ".join(
        f"tok/step k={k} | est. speed-up k={k}" for k in ks) + " |"
    print(f"\nTarget {args.target}: {len(CHAT)} chat + {len(GROUNDED)} grounded held-out prompts, "
          f"{args.new_tokens} greedy tokens each; target step {summary['target_step_ms']} ms "
          f"(batch 1, {args.threads} threads, {args.clock} clock)\n")
    print(head)
    print("|" + "---|" * (5 + 2 * len(ks)))
    def fmt(v, spec: str, suffix: str = "") -> str:
        return "–" if v is None else f"{v:{spec}}{suffix}"

    for name, r in summary["drafts"].items():
        cells = [name] + [fmt(r[f"alpha_{kind}"], ".3f") for kind in ("chat", "grounded", "all")] + [fmt(r["c"], ".3f")]
        for k in ks:
            cells += [fmt(r[f"tok_per_step_k{k}"], ".2f"), fmt(r[f"est_speedup_k{k}"], ".2f", "x")]
        print("| " + " | ".join(cells) + " |")
    summary["seconds"] = round(time.monotonic() - t0, 1)
    print(f"\n({summary['seconds']} s)")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
