#!/usr/bin/env python
"""Train the shipped demo Medusa head set (trtspec/assets/demo_medusa): Medusa-1 heads on the frozen demo target's
last hidden state, on text the target generates itself.

Training prompts: the first ``--prompts`` jobs of scripts/train_eagle3.py's make_jobs (seed 0), a subset of the
demo EAGLE-3 head's training prompts, so scripts/eagle3_prompt_overlap.py's audit (disjoint from every prompt the
bench, demo and tests send and from trtspec/assets/eval/heldout_chat.jsonl) covers them too.

Stages:

1. ``gen``    the target continues the prompts (train_eagle3.generate_batch: batched, greedy or sampled as the job
              says); per position its final normed hidden state (fp16) is kept.
2. ``train``  each head h: x + SiLU(W x + b) on the hidden state at t, then the target's own LM head (shared, frozen),
              cross-entropy against the token at t + 2 + h; W starts at zero (the head starts as the target's head).
3. writes ``<out>/medusa_lm_head.safetensors`` (fp16, no LM heads: "lm_head": "target" in config.json),
              ``config.json`` and ``provenance.json``.

Run (respect /tmp/QUIET)::

    nice -n 15 python scripts/train_medusa.py --threads 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from argparse import Namespace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from trtspec import demo_pair, medusa  # noqa: E402

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{(time.monotonic() - T0) / 60:6.2f} min] {msg}", flush=True)


def eagle3_training():
    spec = importlib.util.spec_from_file_location("train_eagle3", REPO / "scripts" / "train_eagle3.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def jobs(tok, n: int) -> list[dict]:
    """The EAGLE-3 head's training jobs (seed 0, its default counts), the first n."""
    mod = eagle3_training()
    return mod.make_jobs(tok, Namespace(**mod.JOB_DEFAULTS))[:n]


def stage_gen(args, model, tok) -> list[dict]:
    mod = eagle3_training()
    if args.eagle3_work:  # the EAGLE-3 head's generation run: its shards keep each position's last hidden state
        seqs = [{"ids": s["ids"], "plen": s["plen"], "last": s["last"]}
                for s in mod.load_shards(Namespace(work=args.eagle3_work, seed=0))]
        args.prompts = len(seqs)
        return seqs
    path = args.work / f"gen_{args.prompts}_{args.max_new}.pt"
    if path.exists():
        return torch.load(path)
    cap = mod.Capture(model, [0])  # generate_batch's capture hooks; only the last hidden state is kept here
    eos = tok.convert_tokens_to_ids(demo_pair.EOS_TOKEN)
    todo = jobs(tok, args.prompts)
    seqs = []
    gen = torch.Generator(device=args.device)
    for i in range(0, len(todo), args.gen_batch):
        shard = args.work / f"shard_{i}_{args.gen_batch}_{args.max_new}.pt"  # a resumed run keeps finished batches
        if shard.exists():
            seqs += torch.load(shard)
            continue
        chunk = todo[i : i + args.gen_batch]
        gen.manual_seed(1000 + i)
        got = [{"ids": s["ids"], "plen": s["plen"], "last": s["last"]}
               for s in mod.generate_batch(model, cap, [j["prompt"] for j in chunk], max_new=args.max_new,
                                           temps=[j["temp"] for j in chunk], top_p=0.95, eos=eos, gen=gen)]
        torch.save(got, shard)
        seqs += got
        log(f"gen {len(seqs)}/{len(todo)} sequences, {sum(len(q['ids']) for q in seqs)} tokens")
    torch.save(seqs, path)
    return seqs


def examples(seqs: list[dict], heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden [N, H], labels [N, heads]): per position t from the last prompt token on, the tokens at t + 2 + h
    (-100 past the end)."""
    xs, ys = [], []
    for s in seqs:
        ids, last, start = s["ids"].long(), s["last"], max(0, s["plen"] - 1)
        n = last.shape[0]
        lab = torch.full((n, heads), -100, dtype=torch.long)
        for h in range(heads):
            off = 2 + h
            if n > 0 and len(ids) > off:
                m = min(n, len(ids) - off)
                lab[:m, h] = ids[off : off + m]
        xs.append(last[start:])
        ys.append(lab[start:])
    return torch.cat(xs).float(), torch.cat(ys)


def stage_train(args, model, seqs) -> tuple[list[torch.Tensor], list[torch.Tensor], dict]:
    H, dev = model.config.hidden_size, args.device
    lm = model.lm_head.weight.detach()  # tied to the embedding in SmolLM2: shared, frozen
    x, y = (t.to(dev) for t in examples(seqs, args.heads))
    n_eval = max(1, int(0.05 * len(x)))
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g).to(dev)
    ev, tr = order[:n_eval], order[n_eval:]
    W = [torch.zeros(H, H, device=dev, requires_grad=True) for _ in range(args.heads)]
    B = [torch.zeros(H, device=dev, requires_grad=True) for _ in range(args.heads)]
    opt = torch.optim.AdamW(W + B, lr=args.lr, weight_decay=0.0)
    steps = args.epochs * (len(tr) // args.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=max(1, steps), pct_start=0.05)

    def head_logits(h: int, xb: torch.Tensor) -> torch.Tensor:
        return (xb + torch.nn.functional.silu(xb @ W[h].T + B[h])) @ lm.T

    def evaluate() -> list[float]:
        with torch.no_grad():
            accs = []
            for h in range(args.heads):
                lab = y[ev, h]
                keep = lab >= 0
                pred = torch.cat([head_logits(h, x[ev[i : i + 512]]).argmax(-1) for i in range(0, len(ev), 512)])
                accs.append(float((pred[keep] == lab[keep]).float().mean()))
            return accs

    history = {"top1_before": evaluate()}
    log(f"train: {len(tr)} positions, {steps} steps; top-1 per head before: {history['top1_before']}")
    step = 0
    for epoch in range(args.epochs):
        perm = tr[torch.randperm(len(tr), generator=g).to(dev)]
        for i in range(0, len(perm) - args.batch + 1, args.batch):
            idx = perm[i : i + args.batch]
            xb, yb = x[idx], y[idx]
            loss = sum(torch.nn.functional.cross_entropy(head_logits(h, xb), yb[:, h], ignore_index=-100) * 0.8**h
                       for h in range(args.heads))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % 50 == 0:
                log(f"step {step}/{steps} loss {float(loss):.3f}")
        history[f"top1_epoch{epoch + 1}"] = evaluate()
        log(f"epoch {epoch + 1}: top-1 per head {history[f'top1_epoch{epoch + 1}']}")
    history.update(positions=len(tr), eval_positions=len(ev), steps=step)
    return [w.detach() for w in W], [b.detach() for b in B], history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "trtspec" / "assets" / "demo_medusa")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "trtspec_train_medusa")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="torch device for generation and training, e.g. cuda")
    ap.add_argument("--eagle3-work", type=Path, help="train on this scripts/train_eagle3.py --work directory's "
                    "generation shards (the same prompts, already generated) instead of generating")
    ap.add_argument("--prompts", type=int, default=384)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    args.work.mkdir(parents=True, exist_ok=True)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = demo_pair.ensure_target(progress=log)
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval().to(args.device)
    for p in model.parameters():
        p.requires_grad_(False)
    t0 = time.monotonic()
    seqs = stage_gen(args, model, tok)
    gen_min = (time.monotonic() - t0) / 60
    t0 = time.monotonic()
    W, B, history = stage_train(args, model, seqs)
    train_min = (time.monotonic() - t0) / 60

    from safetensors.torch import save_file

    args.out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for h in range(args.heads):
        tensors[f"{h}.0.linear.weight"] = W[h].half().cpu().contiguous()
        tensors[f"{h}.0.linear.bias"] = B[h].half().cpu().contiguous()
    save_file(tensors, str(args.out / medusa.TENSORS_FILE))
    cfg = {"medusa_num_heads": args.heads, "medusa_num_layers": 1, "hidden_size": model.config.hidden_size,
           "vocab_size": model.config.vocab_size, "lm_head": medusa.SHARED_LM_HEAD,
           "base_model_name_or_path": "demo:target (SmolLM2-135M-Instruct)"}
    (args.out / medusa.CONFIG_FILE).write_text(json.dumps(cfg, indent=1) + "\n")
    prov = {
        "model": "Medusa-1 heads for SmolLM2-135M-Instruct (the demo target), trained on text the target generated",
        "shared_with_target": ["lm_head.weight (tied to model.embed_tokens.weight): each head's LM head"],
        "data": {"prompts": f"the first {args.prompts} jobs of scripts/train_eagle3.py make_jobs (seed 0): a subset of "
                 "the demo EAGLE-3 head's training prompts (audit: scripts/eagle3_prompt_overlap.py)",
                 "sequences": len(seqs), "tokens": sum(len(s["ids"]) for s in seqs), "max_new": args.max_new},
        "training": {"loss": "cross-entropy against the token at t + 2 + h, head h weighted 0.8^h", "epochs": args.epochs,
                     "batch": args.batch, "lr": args.lr, **history},
        "minutes": {"generation": round(gen_min, 1), "training": round(train_min, 1)},
        "threads": args.threads,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "command": "python scripts/train_medusa.py " + " ".join(sys.argv[1:]),
    }
    (args.out / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
