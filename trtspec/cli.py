"""The `trtspec` command line. Thin on purpose: each verb lives in trtspec/commands/<verb>.py."""

from __future__ import annotations

import click

from trtspec import __version__
from trtspec.commands import (
    bench, bench_engine, bench_loop, build, demo, doctor, infer, k8s, profile, serve, simulate, tune,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "-V", "--version", prog_name="trtspec")
def cli() -> None:
    """Speculative decoding (draft + target) on Triton Inference Server.

    \b
    The usual path:
      trtspec doctor CONFIG          check the pair and the machine
      trtspec build CONFIG           engines (TensorRT-LLM) + a Triton model repository
      trtspec serve OUTPUT/model_repository
      trtspec infer "prompt" --stream
      trtspec bench --concurrency 1,4 --draft-tokens 0,2,4
      trtspec tune CONFIG            the best k per load, written as its schedule
      trtspec simulate               the controller against GPU cost structures, no server
      trtspec k8s CONFIG -o k8s/     Kubernetes manifests, autoscaled

    `trtspec demo` runs all of it on the shipped demo pair on CPU.
    Example configs: build_configs/ (demo.yaml, Llama on H100 / H200 FP8).
    """


for _module in (build, doctor, serve, infer, bench, bench_loop, bench_engine, tune, simulate, profile, demo, k8s):
    cli.add_command(_module.command)


def main() -> None:
    cli(prog_name="trtspec")


if __name__ == "__main__":
    main()
