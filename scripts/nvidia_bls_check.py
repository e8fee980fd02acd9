"""Run NVIDIA's own `tensorrt_llm_bls`, unmodified, against the reference engine and compare it with `baseline`.

    python scripts/nvidia_bls_check.py BLS_DIR --tensorrt-llm-version 0.19.0 [--config build_configs/demo.yaml]
                                       [--max-tokens 48] [--draft-tokens 3,5]

BLS_DIR is NVIDIA's `tensorrt_llm_bls` folder of that TensorRT-LLM version (`config.pbtxt` plus `1/model.py` and
`1/lib/`), taken from tensorrtllm_backend `all_models/inflight_batcher_llm/` (<= 0.19) or TensorRT-LLM
`triton_backend/all_models/inflight_batcher_llm/` (>= 0.20). trtspec does not ship NVIDIA's files.

The script generates the config's repository pinned to that version's contract, copies BLS_DIR in, fills its
`config.pbtxt` parameters the way NVIDIA's `fill_template.py` would for this deployment (non-decoupled, one
instance, `tensorrt_llm` + `tensorrt_llm_draft`), starts Triton, and for each prompt sends greedy requests to
`baseline` (with `exclude_input_in_output: false`, as the BLS returns the prompt too) and to the BLS without a
draft and with each `num_draft_tokens`. It prints one line per prompt and exits 1 unless every BLS answer equals
`baseline`'s. Several prompts end at the end token before `--max-tokens`, which is where the executor's
end-of-sequence rule (the end token is never returned) matters.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

from trtspec.bench.local import local_deployment
from trtspec.config import load_config


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little robot who",
    "def fibonacci(n):",
    "Water boils at",
    "1, 2, 3, 4, 5,",
    "import numpy as np\n\n",
    chat("Say hello."),
    chat("Name a colour."),
    chat("What is 2+2? Answer with one word."),  # ends at the end token
    chat("Is the sky blue? Answer yes or no."),  # ends at the end token
]


def bls_parameters(cfg) -> dict[str, str]:
    """Values for the `${...}` parameters of NVIDIA's BLS config.pbtxt, for this deployment."""
    return {
        "triton_max_batch_size": str(cfg.limits.max_batch_size),
        "decoupled_mode": "false",
        "logits_datatype": "TYPE_FP32",
        "accumulate_tokens": "false",
        "tensorrt_llm_model_name": "tensorrt_llm",
        "tensorrt_llm_draft_model_name": "tensorrt_llm_draft",
        "multimodal_encoders_name": "",
        "bls_instance_count": "1",
    }


def install_bls(bls_dir: Path, repo: Path, params: dict[str, str]) -> None:
    dest = repo / "tensorrt_llm_bls"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(bls_dir, dest, ignore=shutil.ignore_patterns("__pycache__"))
    text = (dest / "config.pbtxt").read_text()
    unknown = sorted(set(re.findall(r"\$\{(\w+)\}", text)) - params.keys())
    if unknown:
        sys.exit(f"{bls_dir}/config.pbtxt has parameters this script does not know how to fill: {', '.join(unknown)}")
    (dest / "config.pbtxt").write_text(re.sub(r"\$\{(\w+)\}", lambda m: params[m.group(1)], text))


def generate(http: str, model: str, body: dict) -> str:
    """`body` sent as is: trtspec.client adds return_perf_metrics, which 0.17's tensorrt_llm_bls does not declare."""
    req = urllib.request.Request(
        f"{http}/v2/models/{model}/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())["text_output"]
    except urllib.error.HTTPError as e:
        return f"<HTTP {e.code}: {e.read().decode()[-400:]}>"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bls_dir", type=Path, help="NVIDIA's tensorrt_llm_bls folder of that version")
    ap.add_argument("--tensorrt-llm-version", required=True, help="the version BLS_DIR comes from, e.g. 0.19.0")
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "build_configs/demo.yaml"))
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--draft-tokens", default="3,5", help="num_draft_tokens values to send to the BLS")
    args = ap.parse_args()
    if not (args.bls_dir / "config.pbtxt").is_file() or not (args.bls_dir / "1" / "model.py").is_file():
        sys.exit(f"{args.bls_dir}: expected NVIDIA's tensorrt_llm_bls folder (config.pbtxt and 1/model.py)")

    cfg = load_config(args.config).model_copy(update={"tensorrt_llm_version": args.tensorrt_llm_version})
    if cfg.draft is None:
        sys.exit(f"{args.config}: NVIDIA's BLS needs a draft model (a draft: section)")
    ks = [int(k) for k in args.draft_tokens.split(",") if k]
    same = total = 0
    with local_deployment(
        cfg,
        prepare=lambda repo: install_bls(args.bls_dir, repo, bls_parameters(cfg)),
        on_step=lambda m: print(f"... {m}", file=sys.stderr, flush=True),
    ) as server:
        http = server.endpoints.http
        for prompt in PROMPTS:
            base = generate(
                http, "baseline", {"text_input": prompt, "max_tokens": args.max_tokens, "exclude_input_in_output": False}
            )
            row: dict = {"prompt": prompt, "baseline": base}
            for k in [0, *ks]:
                body = {"text_input": prompt, "max_tokens": args.max_tokens, "stream": False}
                if k:
                    body["num_draft_tokens"] = k
                out = generate(http, "tensorrt_llm_bls", body)
                row[f"bls_k{k}_equal"] = out == base
                if out != base:
                    row[f"bls_k{k}"] = out
                same += out == base
                total += 1
            print(json.dumps(row), flush=True)
    print(f"NVIDIA tensorrt_llm_bls {args.tensorrt_llm_version} equal to baseline: {same}/{total} answers")
    return 0 if same == total else 1


if __name__ == "__main__":
    sys.exit(main())
