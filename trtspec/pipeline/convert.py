"""HF -> TensorRT-LLM checkpoint through TensorRT-LLM's Python API (``python -m trtspec.pipeline.convert``).

Used for architectures without a mapped ``convert_checkpoint.py`` (see plan.py). It does what the example
scripts do internally: for every rank of the tp x pp mapping, ``AutoModelForCausalLM.from_hugging_face``
(dispatching on ``config.json``'s architecture through TensorRT-LLM's MODEL_MAP) and ``save_checkpoint``
(rank 0 also writes ``config.json``). It runs as a child process so the converted weights' host and GPU
memory is returned before the engine build starts.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trtspec.pipeline.convert", description=__doc__)
    p.add_argument("--model_dir", required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--output_dir", required=True, help="TensorRT-LLM checkpoint directory to write")
    p.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16", "float32"])
    p.add_argument("--tp_size", type=int, default=1)
    p.add_argument("--pp_size", type=int, default=1)
    return p.parse_args(argv)


def convert(model_dir: str, output_dir: str, dtype: str, tp_size: int, pp_size: int) -> None:
    from tensorrt_llm.mapping import Mapping
    from tensorrt_llm.models import AutoModelForCausalLM

    world = tp_size * pp_size
    for rank in range(world):
        t0 = time.monotonic()
        mapping = Mapping(world_size=world, rank=rank, tp_size=tp_size, pp_size=pp_size)
        model = AutoModelForCausalLM.from_hugging_face(model_dir, dtype, mapping=mapping)
        model.save_checkpoint(output_dir, save_config=(rank == 0))
        del model
        gc.collect()
        print(f"[trtspec] rank {rank + 1}/{world} converted in {time.monotonic() - t0:.1f}s", flush=True)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    convert(a.model_dir, a.output_dir, a.dtype, a.tp_size, a.pp_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
