"""`trtspec doctor`: is this pair servable, and can this machine build it?"""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from trtspec.pipeline.plan import make_plan
from trtspec.pipeline.memory import describe_estimates
from trtspec.checkpoint import CheckpointError, CheckpointInfo, format_bytes, format_params
from trtspec.commands._common import UserError, console, friendly_errors
from trtspec.config import ConfigError, EngineKind, checkpoint_path, load_config
from trtspec.contract.nvidia import ENGINE_FLOW_RANGE
from trtspec.demo_pair import DemoPairError
from trtspec.machine import GpuSpecError, Machine, machine_inventory


def say(*objects: object) -> None:
    """Print without re-wrapping long lines (commands and paths stay copyable)."""
    console.print(*objects, soft_wrap=True)

HELP = """Check CONFIG's model pair and this machine, without building anything.

\b
Reports
  the pair     per model: architecture, parameters, dtype, vocab size (config and
               tokenizer), tokenizer fingerprint; draft and target must share one
               vocabulary and tokenizer, and the draft should be < 1/3 of the target;
               an EAGLE-3 head (speculative.method: eagle3) is checked against the
               target instead: architecture, vocab and draft_vocab_size, hidden size,
               d2t range, capture layers inside the target's depth; for method: mtp,
               the target's MTP layers and architecture; with engine: llmapi, what a
               draft length of 0 does for the method on the release (EAGLE-3 one-model
               and MTP on 1.2.x: schedule bands of 0 and max_concurrency are written
               as 1, since the release has no floor and acceptance would collapse)
  the machine  GPUs via NVML (name, compute capability, memory; "no NVIDIA driver" is a
               normal answer), tritonserver, trtllm-build, TensorRT-LLM and TensorRT
  preflight    everything `trtspec build` would refuse, each with its fix: vocab or
               tokenizer mismatch, too few GPUs, FP8 on SM < 8.9, GPU memory, versions,
               disk; plus the GPU placement and KV-cache fractions a build would use

Exits 1 when there is an error, 0 otherwise (warnings included).

\b
Examples
  trtspec doctor build_configs/demo.yaml
  trtspec doctor build_configs/llama-3.1-8b_llama-3.2-1b_h100.yaml --gpus h100x1
"""


@click.command("doctor", help=HELP, short_help="Check the draft/target pair and this machine.")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--gpus", default=None, metavar="SPEC",
    help="Check against these GPUs instead of the ones NVML reports, e.g. h200x8 (software is still this machine's).",
)  # fmt: skip
@click.option(
    "--output", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Where a build would write (for the disk check). Default: ./trtspec-out/<config name>.",
)  # fmt: skip
@friendly_errors(ConfigError, DemoPairError, GpuSpecError, CheckpointError)
def command(config: Path, gpus: str | None, output: Path | None) -> None:
    cfg = load_config(config)
    out = output if output is not None else Path("trtspec-out") / cfg.name
    machine = machine_inventory(gpus=gpus, disk_paths=[out])
    plan = make_plan(cfg, out, machine, config_path=config)
    pf = plan.preflight

    say(f"[bold]trtspec doctor[/] {escape(str(config))}: {escape(cfg.name)} (engine: {cfg.engine.value})")
    say(pair_table(plan.infos))
    print_machine(machine, out)
    if cfg.engine is EngineKind.reference:
        from trtspec.reference_engine.device import describe_linear_kernels, describe_precision

        for role in ("target", "draft"):
            if getattr(cfg, role) is not None:
                say(f"  {role} precision: {escape(describe_precision(getattr(cfg, role).dtype, cfg.device))}")
                kernels = describe_linear_kernels(getattr(cfg, role).linear_kernels, checkpoint_path(cfg, role),
                                                  out / "kernels", cfg.device)
                say(f"  {role} weight products: {escape(kernels)}")

    if cfg.engine is EngineKind.llmapi:
        for line in draft_length_floor(cfg, machine.tensorrt_llm_version):
            say(f"  draft length 0: {escape(line)}")

    if cfg.engine is EngineKind.tensorrt_llm and pf.placement:
        say("[bold]Build plan[/]")
        say("  placement: " + "; ".join(f"{r} GPU {','.join(map(str, g))}" for r, g in pf.placement.items()))
        if pf.kv_fractions:
            say(
                "  kv_cache_free_gpu_mem_fraction: "
                + "; ".join(f"{r} {f}{' (derived)' if pf.kv_derived.get(r) else ''}"
                            for r, f in pf.kv_fractions.items())
            )
        for line in describe_estimates(pf):
            say(f"  memory: {escape(line)}")
    for note in pf.notes:
        say(f"  note: {escape(note)}")

    say("[bold]Preflight[/]")
    if not pf.findings:
        say("  [green]no problems found[/]")
    for f in pf.findings:
        color = "red" if f.level == "error" else "yellow"
        say(f"  [{color}]{f.level}[/] {escape(f'[{f.code}]')} {escape(f.message)}")
    if pf.errors:
        codes = ", ".join(dict.fromkeys(f.code for f in pf.errors))
        raise UserError(f"doctor found {len(pf.errors)} error(s): {codes} (details above)")
    say(f"[green]ok[/] ({len(pf.warnings)} warning(s))")


def draft_length_floor(cfg, installed: str | None) -> list[str]:
    """What a draft length of 0 does for this config's method on its TensorRT-LLM release (trtspec.llmapi.draft_floor;
    what trtspec writes because of it comes with the preflight notes)."""
    from trtspec.llmapi.draft_floor import explain
    from trtspec.llmapi.fields import pinned_version, version_fields

    version = cfg.tensorrt_llm_version or installed
    try:
        fields = version_fields(version)
    except KeyError as e:
        return [str(e.args[0])]
    two_model = bool(cfg.llmapi and cfg.llmapi.eagle3_two_model)
    return [explain(cfg.speculative.method or "draft_model", fields, version or f"{pinned_version()} (pinned)",
                    two_model)]


def runnable_flavours(trtllm_version: str | None) -> list[str]:
    """Which `engine:` values the installed TensorRT-LLM can serve (reference always; llmapi on CPU as a stand-in)."""
    from trtspec.llmapi.fields import version_fields

    out = ["reference"]
    if trtllm_version is None:
        return out + ["llmapi (CPU stand-in only: no tensorrt_llm installed)"]
    if ENGINE_FLOW_RANGE.contains(trtllm_version):
        out.append(f"tensorrt_llm (TensorRT-LLM {trtllm_version} has trtllm-build and the C++ backend)")
    else:
        out.append(f"not tensorrt_llm (TensorRT-LLM {trtllm_version} has no engine flow: PyTorch backend only)")
    try:
        version_fields(trtllm_version)
        out.append("llmapi")
    except KeyError:
        out.append(f"not llmapi (no validated field lists for TensorRT-LLM {trtllm_version})")
    return out


def pair_table(infos: dict[str, CheckpointInfo | None]) -> Table:
    t = Table(title="Model pair", title_justify="left", show_lines=False)
    t.add_column("")
    roles = list(infos)
    for role in roles:
        t.add_column(role, overflow="fold")

    def row(label: str, fn) -> None:  # noqa: ANN001
        t.add_row(label, *[escape(str(fn(infos[r]))) if infos[r] is not None else "-" for r in roles])

    row("path", lambda i: i.path)
    row("architecture", lambda i: i.architecture or "?")
    row("model_type", lambda i: i.model_type or "?")
    row("parameters", lambda i: f"{format_params(i.num_params)} (from {i.params_source or '?'})")
    row("torch_dtype", lambda i: i.torch_dtype or "?")
    row("vocab_size (config)", lambda i: i.vocab_size or "?")
    row("tokenizer tokens", lambda i: i.tokenizer_vocab_size or "?")
    row("layers / hidden", lambda i: f"{i.num_layers} / {i.hidden_size}")
    row("heads / kv heads", lambda i: f"{i.num_attention_heads} / {i.num_kv_heads}")
    row("tokenizer fingerprint", lambda i: (i.tokenizer_fingerprint or "none")[:16])
    row("weights on disk", lambda i: format_bytes(i.weights_bytes_on_disk))
    return t


def print_machine(m: Machine, out: Path) -> None:
    say("[bold]Machine[/]")
    if m.gpus:
        t = Table(show_header=True, box=None, padding=(0, 2))
        for col in ("GPU", "name", "compute capability", "memory total", "memory free"):
            t.add_column(col)
        for g in m.gpus:
            t.add_row(str(g.index), escape(g.name), g.cc, format_bytes(g.memory_total), format_bytes(g.memory_free))
        say(t)
        if m.synthetic:
            say(f"  (synthetic GPUs from --gpus {escape(m.gpu_spec or '')})")
        if m.driver_version:
            say(f"  NVIDIA driver {m.driver_version}")
    else:
        say(f"  GPUs: {escape(m.nvml_error or 'none')}")

    def tool(label: str, path: str | None, version: str | None, note: str | None) -> None:
        if path:
            v = f" {version}" if version else ""
            n = f" ({note})" if note else ""
            say(f"  {label}: [green]yes[/]{escape(v)} {escape(path)}{escape(n)}")
        else:
            say(f"  {label}: [yellow]no[/] {escape(note or '')}")

    tool("tritonserver", m.tritonserver.path, m.tritonserver.version, m.tritonserver.note)
    tool("trtllm-build", m.trtllm_build.path, m.trtllm_build.version, m.trtllm_build.note)
    tool("tensorrt_llm", "importable" if m.tensorrt_llm_version else None, m.tensorrt_llm_version,
         None if m.tensorrt_llm_version else "not installed")
    tool("TensorRT", "installed" if m.tensorrt_version else None, m.tensorrt_version,
         None if m.tensorrt_version else "not installed")
    say(f"  engine flow supported: {escape(ENGINE_FLOW_RANGE.label)}")
    say(f"  flavours this machine runs: {escape(', '.join(runnable_flavours(m.tensorrt_llm_version)))}")
    if m.triton_container:
        say(f"  Triton container: {escape(m.triton_container)}")
    for p, free in m.disk_free.items():
        say(f"  disk free at {escape(p)}: {format_bytes(free)}")
