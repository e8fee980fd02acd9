"""Extract the declared I/O of NVIDIA's Triton TensorRT-LLM models into trtspec's contract data format.

Reads `config.pbtxt` templates from a git checkout (tensorrtllm_backend <= 0.19 / early 0.20 main:
`all_models/inflight_batcher_llm/`; TensorRT-LLM >= 0.20: `triton_backend/all_models/inflight_batcher_llm/`)
and prints one JSON object per model: the facts (name, data_type, dims, optional, reshape, ragged), not the
file. `${...}` data types become the value trtspec deploys with, and the placeholder is kept as `type_param`.

  python scripts/nvidia_contract.py GIT_DIR REF [--prefix all_models/inflight_batcher_llm] > models.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trtspec.contract.nvidia import MODELS, TYPE_PARAMS, tensor_entry  # noqa: E402


def parse(text: str) -> tuple[mc.ModelConfig, dict[str, str]]:
    typed = dict(re.findall(r'name:\s*"(\w+)"[^}]*?data_type:\s*\$\{(\w+)\}', text, re.S))
    text = re.sub(r"data_type:\s*\$\{(\w+)\}", lambda m: f"data_type: {TYPE_PARAMS[m.group(1)]}", text)
    text = re.sub(r'(?<!")\$\{\w+\}(?!")', "1", text)  # unquoted numbers/bools; quoted strings parse as they are
    text = text.replace("kind :", "kind:")
    return text_format.Parse(text, mc.ModelConfig()), typed


def model_io(git_dir: str, ref: str, prefix: str, model: str) -> dict:
    path = f"{prefix}/{model}/config.pbtxt"
    text = subprocess.run(["git", "-C", git_dir, "show", f"{ref}:{path}"], check=True, capture_output=True, text=True).stdout
    cfg, typed = parse(text)
    seen: set[tuple[str, str]] = set()
    out: dict = {"source": f"{path}@{ref}", "inputs": [], "outputs": []}
    for kind, tensors in (("inputs", cfg.input), ("outputs", cfg.output)):
        for t in tensors:
            if (kind, t.name) in seen:  # NVIDIA's ensemble lists kv_cache_alloc_total_blocks twice
                continue
            seen.add((kind, t.name))
            out[kind].append(tensor_entry(t, typed.get(t.name)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("git_dir")
    ap.add_argument("ref")
    ap.add_argument("--prefix", default="all_models/inflight_batcher_llm")
    a = ap.parse_args()
    print(json.dumps({m: model_io(a.git_dir, a.ref, a.prefix, m) for m in MODELS}, indent=1))


if __name__ == "__main__":
    main()
