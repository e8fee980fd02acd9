"""What a target call per token costs, and where the k = 0 endpoint stands: greedy, one request at a time, on a
local deployment of a build config (default: the demo's), each prompt prefilled first so every measured request
finds it cached, the ways alternating per prompt so the machine's drift weighs on each alike.

  python scripts/bench_plain_calls.py engine      # the target engine: one request of N tokens vs N one-token requests
  python scripts/bench_plain_calls.py endpoints   # baseline vs ensemble k=0 vs ensemble (the controller)
  python scripts/bench_plain_calls.py endpoints --stream --kinds chat,code --rounds 3
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from trtspec.bench.local import local_deployment
from trtspec.bench.loop import select_prompts
from trtspec.client import Client
from trtspec.config import load_config

ENDPOINTS = {"baseline": ("baseline", {}), "k=0": ("ensemble", {"num_draft_tokens": 0}), "controller": ("ensemble", {})}


def engine_tokens(client, ids: list[int], n: int) -> list[int]:
    import tritonclient.http as th

    inputs = []
    for name, value in (("input_ids", [ids]), ("input_lengths", [[len(ids)]]), ("request_output_len", [[n]]),
                        ("end_id", [[-1]])):
        a = np.array(value, dtype=np.int32)
        inputs.append(th.InferInput(name, a.shape, "INT32"))
        inputs[-1].set_data_from_numpy(a)
    r = client.infer("tensorrt_llm", inputs, outputs=[th.InferRequestedOutput(o) for o in ("output_ids", "sequence_length")])
    out = r.as_numpy("output_ids").reshape(-1)
    return [int(x) for x in out[len(ids) : int(r.as_numpy("sequence_length").reshape(-1)[0])]]


def bench_engine(server, prompts, args) -> None:
    import tritonclient.http as th
    from transformers import AutoTokenizer

    from trtspec.config import checkpoint_path

    tok = AutoTokenizer.from_pretrained(str(checkpoint_path(load_config(args.config), "target")))
    client = th.InferenceServerClient(server.endpoints.http_address)
    seconds = {"one request": 0.0, "a request per token": 0.0}
    tokens = 0
    for r in range(args.rounds):
        for i, p in enumerate(prompts):
            ids = tok(p.text)["input_ids"]
            engine_tokens(client, ids, 1)  # prefix cached for both
            ways = list(seconds) if (i + r) % 2 == 0 else list(seconds)[::-1]
            got = {}
            for way in ways:
                t = time.perf_counter()
                if way == "one request":
                    got[way] = engine_tokens(client, ids, args.max_tokens)
                else:
                    seq, got[way] = list(ids), []
                    for _ in range(args.max_tokens):
                        new = engine_tokens(client, seq, 1)
                        got[way] += new
                        seq += new
                seconds[way] += time.perf_counter() - t
            if got["one request"] != got["a request per token"]:
                raise SystemExit(f"{p.id}: the two ways gave different tokens")
            tokens += args.max_tokens
    one, each = seconds["one request"], seconds["a request per token"]
    print(f"one request of {args.max_tokens}: {one / tokens * 1e3:.1f} ms/token; a request per token: "
          f"{each / tokens * 1e3:.1f} ms/token ({each / one:.3f}x); {tokens} tokens each, identical")


def bench_endpoints(server, prompts, args) -> None:
    addr = server.endpoints.http_address
    names = args.endpoints.split(",")
    clients = {n: Client(addr, "http", ENDPOINTS[n][0]) for n in names}

    def gen(name, text, n):
        return clients[name].generate(text, max_tokens=n, stream=args.stream, **ENDPOINTS[name][1])

    for p in prompts[:2]:  # warm-up
        for n in names:
            gen(n, p.text, 8)
    done = {n: {} for n in names}  # kind -> [tokens, seconds]
    for r in range(args.rounds):
        for i, p in enumerate(prompts):
            order = names if (i + r) % 2 == 0 else names[::-1]
            for n in order:
                gen(n, p.text, 1)
            for n in order:
                t = time.perf_counter()
                g = gen(n, p.text, args.max_tokens)
                cell = done[n].setdefault(p.kind, [0, 0.0])
                cell[0] += len(g.token_ids)
                cell[1] += time.perf_counter() - t
    for kind in sorted(done[names[0]]):
        base = done[names[0]][kind][0] / done[names[0]][kind][1]
        print(f"{kind:9s} " + "  ".join(f"{n} {done[n][kind][0] / done[n][kind][1]:.2f} tok/s "
                                          f"({done[n][kind][0] / done[n][kind][1] / base:.3f}x)" for n in names))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("engine", "endpoints"))
    ap.add_argument("--config", type=Path, default=Path(__file__).resolve().parents[1] / "build_configs" / "demo.yaml")
    ap.add_argument("--kinds", default="chat,code,grounded")
    ap.add_argument("--per-kind", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--stream", action="store_true", help="endpoints: streamed requests")
    ap.add_argument("--endpoints", default="baseline,k=0,controller", help=f"of {', '.join(ENDPOINTS)}; the first is the 1.00x")
    args = ap.parse_args()
    prompts = select_prompts(args.kinds.split(","), args.per_kind)
    with local_deployment(load_config(args.config), ready_timeout=600, on_step=print) as server:
        (bench_engine if args.what == "engine" else bench_endpoints)(server, prompts, args)


if __name__ == "__main__":
    main()
