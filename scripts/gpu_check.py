"""The parts of scripts/gpu_check.sh (one subcommand each, so that one failing leaves the others running).

    make-pair ROOT [--small]      a random-weight target with the demo target's shapes (SmolLM2-135M-Instruct) and a
                                  draft of its first 4 layers (demo_pair.build_first_layers_draft), in ROOT/target,
                                  ROOT/draft; --small: a tiny pair of the same vocabulary (the CPU plumbing check)
    bench ROOT --device D         `trtspec bench-engine` on ROOT/target under the NVML sampler (or /proc without a
                                  driver), then what the sampler read: utilisation, memory, power, clocks
    logits ROOT --device D        one position's logits in a decode, in a verify of 4 drafts and in a batch of 16:
                                  how far apart (greedy exactness is asserted by tests/test_engine_exactness.py)
    machine ROOT --device D       machine.py's GPU detection (NVML) against its table of known GPUs, the precision
                                  the engine picks there, one NVML sample, and `trtspec doctor` on the pair

Greedy exactness and costs do not depend on the weights, so random weights stand in for the demo target, whose GGUF
does not travel to the GPU machine. Where a flip of a greedy token shows, the logits part gives the margin it had.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# SmolLM2-135M-Instruct's config.json (the demo target, ~/.cache/trtspec/demo/target/config.json), as converted
# from the demo GGUF: the shapes that matter are hidden 576, intermediate 1536, 30 layers, 9 heads, 3 KV heads,
# vocabulary 49152, tied embeddings.
TARGET_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "unk_token_id": 0,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.02,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pretraining_tp": 1,
    "rms_norm_eps": 9.999999747378752e-06,
    "rope_theta": 100000.0,  # written rope_parameters by transformers 5; this older key is read by 4.x and 5.x
    "tie_word_embeddings": True,
    "use_cache": True,
    "vocab_size": 49152,
}
# --small: the same vocabulary (the exactness tests' and bench-engine's token ids reach ~20,000), tiny layers
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16}


def say(msg: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_pair(root: Path, small: bool) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trtspec.demo_pair import build_first_layers_draft

    cfg = {**TARGET_CONFIG, **(SMALL if small else {})}
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg)).to(torch.float32)
    n = sum(p.numel() for p in model.parameters())
    target = root / "target"
    model.save_pretrained(target)
    layers = model.config.num_hidden_layers
    say(f"random target: {n / 1e6:.1f} M parameters, {layers} layers, hidden {model.config.hidden_size}, vocab "
        f"{model.config.vocab_size}, tied {model.config.tie_word_embeddings} -> {target} ({time.perf_counter() - t0:.1f} s)")
    del model
    build_first_layers_draft(root / "draft", target, say, {"kind": "gpu-check draft", "target": "random"})
    say(f"draft: {root / 'draft'}")


def _print_nvml(samples) -> None:
    """What the sampler read, per source: the figures that say the GPU was busy, how much memory, power, clocks."""
    from trtspec.profiling import summarize

    summary = summarize(samples)
    say(f"sampler: {summary['sampler']}, {summary['ticks']} ticks over {summary['duration_s']:.1f} s "
        f"(interval {summary['interval_s'] or 0:.3f} s)")
    for source, info in summary["sources"].items():
        figures = []
        for metric, st in info["metrics"].items():
            if st["n"] == 0:
                figures.append(f"{metric} -")
                continue
            unit = st["unit"]
            if "delta" in st:
                figures.append(f"{metric} +{st['delta']:.0f} {unit}")
            else:
                figures.append(f"{metric} p50 {st['p50']:.0f} max {st['max']:.0f} {unit}".rstrip())
        print(f"  {source} ({info['name']}): " + "; ".join(figures), flush=True)


def bench(root: Path, device: str, dtypes: str, out: Path, reps: int) -> int:
    from trtspec.profiling import create_sampler, plot_timeline, write_timeline

    sampler = create_sampler(interval_s=0.1)
    say(f"sampler: {sampler.kind}" + (f" ({sampler.reason})" if sampler.reason else ""))
    cmd = [sys.executable, "-c", "from trtspec.commands.bench_engine import command; command(prog_name='trtspec bench-engine')",
           "--checkpoint", str(root / "target"), "--device", device, "--dtypes", dtypes, "--reps", str(reps),
           "--json", str(out / "bench_engine.json")]
    say("$ trtspec bench-engine " + " ".join(cmd[3:]))
    with sampler:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        sampler.add_pids([proc.pid])
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.startswith("trtspec reference engine: ") and " on " in line:  # a dtype's engine loads
                sampler.mark(line.split(": ")[2].split(" (")[0])  # "float32 on cuda": a line in the plot
        rc = proc.wait()
    samples = sampler.stop()
    for w in sampler.warnings:
        say(f"sampler warning: {w}")
    _print_nvml(samples)
    files = write_timeline(samples, root / "timeline")
    (out / "nvml_summary.json").write_text(files[2].read_text())
    try:
        plot_timeline(samples, out / "timeline.png")
    except Exception as e:  # noqa: BLE001 - the plot is a convenience; the figures are printed and in the JSON
        say(f"timeline plot not drawn: {e!r}")
    say(f"bench-engine exited {rc}; {out / 'bench_engine.json'}, {out / 'nvml_summary.json'}, {out / 'timeline.png'}")
    return rc


def logits(root: Path, device: str, dtypes: str, out: Path) -> int:
    """Per dtype: one position's logits from a 1-token decode, from row i of a verify of k+1 tokens, and from a
    batch of 16 one-token rows: the largest difference, whether the argmax agrees, and the decode's margin
    between its best two tokens (a difference above that margin flips a greedy token)."""
    import torch

    from trtspec.reference_engine.ragged import Segment
    from trtspec.reference_engine import ReferenceEngine
    from trtspec.reference_engine.kv_cache import new_cache

    prompt, k, rows = [1, 9690, 314, 253, 7018, 11173, 28, 3781, 2], 4, 16
    results, failed = {}, 0
    for dtype in dtypes.split(","):
        engine = ReferenceEngine(root / "target", device=device, dtype=dtype)

        def prefilled(tokens: list[int]) -> Segment:
            seg = Segment(new_cache(engine.model.config), list(tokens), 0, 1)
            engine.forward([seg])
            return seg

        # decode: the prompt's last token and k greedy continuations, one token per step
        seg, cont, decode = prefilled(prompt[:-1]), [], []
        token = prompt[-1]
        for i in range(k + 1):
            step = Segment(seg.cache, [token], len(prompt) - 1 + i, 1)
            engine.forward([step])
            decode.append(step.logits[0].float())
            token = int(step.logits[0].argmax())
            cont.append(token)
        decode = torch.stack(decode)
        # verify: the same k + 1 positions in one step
        verify = Segment(prefilled(prompt[:-1]).cache, [prompt[-1], *cont[:k]], len(prompt) - 1, k + 1)
        engine.forward([verify])
        # batch: the first position as one of 16 one-token rows, each continuing its own prompt
        others = [prefilled([400 + 37 * j, 1200 + j, *prompt[: 3 + j % 6]]) for j in range(rows - 1)]
        mine = prefilled(prompt[:-1])
        batch = [Segment(mine.cache, [prompt[-1]], len(prompt) - 1, 1)]
        batch += [Segment(o.cache, [500 + j], len(o.tokens), 1) for j, o in enumerate(others)]
        engine.forward(batch)
        top2 = decode.topk(2, dim=-1).values
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        vrows, brow = verify.logits.float(), batch[0].logits[0].float()
        r = {
            "decode_vs_verify_max_abs": (decode - vrows).abs().max().item(),
            "decode_vs_verify_bitwise_rows": int((decode == vrows).all(dim=-1).sum()),
            "decode_vs_verify_argmax_same": bool((decode.argmax(-1) == vrows.argmax(-1)).all()),
            "decode_vs_batch16_max_abs": (decode[0] - brow).abs().max().item(),
            "decode_vs_batch16_bitwise": bool((decode[0] == brow).all()),
            "decode_vs_batch16_argmax_same": bool(decode[0].argmax() == brow.argmax()),
            "decode_logit_scale": decode.abs().max().item(),
            "decode_min_top2_margin": margin,
        }
        results[engine.precision.dtype] = r
        failed += not (r["decode_vs_verify_argmax_same"] and r["decode_vs_batch16_argmax_same"])
        say(f"{engine.precision.dtype} on {device}: decode vs verify of {k + 1} rows max |d| "
            f"{r['decode_vs_verify_max_abs']:.3g} ({r['decode_vs_verify_bitwise_rows']}/{k + 1} rows bitwise, argmax "
            f"{'same' if r['decode_vs_verify_argmax_same'] else 'DIFFERS'}); decode vs batch of {rows} max |d| "
            f"{r['decode_vs_batch16_max_abs']:.3g} ({'bitwise' if r['decode_vs_batch16_bitwise'] else 'not bitwise'}, argmax "
            f"{'same' if r['decode_vs_batch16_argmax_same'] else 'DIFFERS'}); logits up to {r['decode_logit_scale']:.3g}, "
            f"smallest top-2 margin {margin:.3g}")
        del engine
        if device == "cuda":
            torch.cuda.empty_cache()
    (out / "logits.json").write_text(json.dumps({"device": device, "k": k, "batch_rows": rows, "results": results}, indent=1) + "\n")
    return 1 if failed else 0


def machine(root: Path, device: str, out: Path) -> int:
    import torch

    from trtspec.machine import KNOWN_GPUS, machine_inventory
    from trtspec.profiling import create_sampler
    from trtspec.reference_engine.device import describe_precision, pick_device

    rc = 0
    m = machine_inventory()
    say(f"machine.py: {m.describe_gpus()}; driver {m.driver_version}; NVML error {m.nvml_error}")
    for g in m.gpus:
        print(f"  GPU {g.index}: {g.name}, compute capability {g.cc}, {g.memory_total / 2**20:.0f} MiB total, "
              f"{g.memory_free / 2**20:.0f} MiB free", flush=True)
        known = [(sku, spec) for sku, spec in KNOWN_GPUS.items() if spec[0] == g.name]
        if known:
            sku, (_, mib, cc) = known[0]
            same = mib == round(g.memory_total / 2**20) and cc == g.compute_capability
            print(f"  machine.KNOWN_GPUS[{sku!r}]: {mib} MiB, cc {cc[0]}.{cc[1]}: {'matches' if same else 'DIFFERS from NVML'}", flush=True)
            rc |= not same
        else:
            print(f"  machine.KNOWN_GPUS has no entry named {g.name!r} (--gpus cannot describe this GPU)", flush=True)
    if device == "cuda" and not m.gpus:
        rc = 1
    say(f"torch: {torch.__version__}, cuda available {torch.cuda.is_available()}"
        + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
    say(f"device auto -> {pick_device('auto')}; dtype auto there: {describe_precision('auto', 'auto')}")
    sampler = create_sampler(interval_s=0.2)
    with sampler:
        time.sleep(0.5)
    say(f"one NVML read ({sampler.kind}):")
    _print_nvml(sampler.samples)

    config = root / "gpu-check.yaml"
    config.write_text(
        f"name: gpu-check\nengine: reference\ndevice: {device}\n"
        f"target:\n  checkpoint: {root / 'target'}\n  dtype: auto\n"
        f"draft:\n  checkpoint: {root / 'draft'}\n  dtype: auto\n"
        "speculative:\n  num_draft_tokens: 4\n"
    )
    cmd = [sys.executable, "-c", "from trtspec.commands.doctor import command; command(prog_name='trtspec doctor')",
           str(config), "-o", str(root / "doctor-out")]
    say(f"$ trtspec doctor {config}")
    env = {**os.environ, "COLUMNS": "140"}
    doctor = subprocess.run(cmd, env=env)
    say(f"doctor exited {doctor.returncode} (1: it found an error, listed above)")
    return rc or doctor.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["make-pair", "bench", "logits", "machine"])
    ap.add_argument("root", type=Path)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or a.root / "out"
    out.mkdir(parents=True, exist_ok=True)
    if a.part == "make-pair":
        make_pair(a.root, a.small)
        return 0
    if a.part == "bench":
        return bench(a.root, a.device, a.dtypes, out, a.reps)
    if a.part == "logits":
        return logits(a.root, a.device, a.dtypes, out)
    return machine(a.root, a.device, out)


if __name__ == "__main__":
    sys.exit(main())
