"""`trtspec build`: from two HF checkpoints to TensorRT-LLM engines and a Triton model repository."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.markup import escape

from trtspec.pipeline.argv import ENV_DOC
from trtspec.pipeline.plan import Plan, Step
from trtspec.pipeline.memory import describe_estimates
from trtspec.pipeline.runner import BuildError, Runner
from trtspec.checkpoint import CheckpointError, format_params
from trtspec.commands._common import UserError, console, friendly_errors
from trtspec.config import MAX_DRAFT_LEN, ConfigError, EngineKind, load_config
from trtspec.demo_pair import DemoPairError
from trtspec.machine import GpuSpecError, machine_inventory, synthetic_machine


def say(*objects: object) -> None:
    """Print without re-wrapping long lines (commands and paths stay copyable)."""
    console.print(*objects, soft_wrap=True)

STEP_NAMES = (
    "preflight",
    "convert-target",
    "quantize-target",
    "convert-draft",
    "quantize-draft",
    "build-target",
    "build-draft",
    "repository",
)

_ENV_HELP = "\n".join(f"  {k:<24} {v}" for k, v in ENV_DOC.items())

HELP = f"""Build everything CONFIG describes: engines and a Triton model repository.

\b
Steps (engine: tensorrt_llm):
  preflight        pair check (vocab, tokenizer), GPUs, FP8 support, memory, versions, disk
  convert-target   HF -> TensorRT-LLM checkpoint (convert_checkpoint.py; tp/pp mapping)
  convert-draft    same for the draft, or quantize-draft for draft.quantization: fp8
                   (quantize.py --qformat fp8 --kv_cache_dtype fp8; needs SM >= 8.9)
  build-target     trtllm-build --speculative_decoding_mode draft_tokens_external
                   --max_draft_len K --use_paged_context_fmha enable ...
  build-draft      trtllm-build --use_paged_context_fmha enable ...
  repository       the Triton model repository (engine paths, GPUs, KV fractions)
With engine: reference there are no engines: preflight -> repository.

\b
Steps are cached: a re-run skips finished steps and resumes where a failed or
interrupted one stopped (outputs are written to <output>.partial-<pid> and renamed
on success). Results go to --output (default ./trtspec-out/<name>): checkpoints/,
engines/, model_repository/, logs/<step>.log and manifest.json.

\b
Plan first, on any machine (no GPU or TensorRT-LLM needed):
  trtspec build CONFIG --dry-run                 the steps with their exact commands
  trtspec build CONFIG --dry-run --gpus h200x8   ... for another machine
  trtspec build CONFIG --json                    the plan as JSON (stable format)
Then, in NVIDIA's tritonserver *-trtllm-python-py3 container:
  trtspec build CONFIG
  trtspec serve trtspec-out/<name>/model_repository

\b
Environment (tool locations; defaults fit NVIDIA's container):
{_ENV_HELP}
"""


@click.command("build", help=HELP, short_help="Build engines (TensorRT-LLM) and a Triton model repository.")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--output", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Output directory. Default: ./trtspec-out/<config name>.",
)  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Print the plan and what preflight would refuse; run nothing.")
@click.option(
    "--json", "as_json", is_flag=True,
    help="Print the plan as JSON (a list of steps with name, argv, env, outputs, up_to_date) and exit.",
)  # fmt: skip
@click.option("--force", is_flag=True, help="Rerun every step, even those that are up to date.")
@click.option(
    "--only", type=click.Choice(STEP_NAMES), default=None, metavar="STEP",
    help=f"Run just this step (even if up to date); its upstream steps must be done. One of: {', '.join(STEP_NAMES)}.",
)  # fmt: skip
@click.option(
    "--gpus", default=None, metavar="SPEC",
    help="Plan for these GPUs instead of the ones NVML reports, e.g. h200x8, h100x2, l40s (SKUs: h100 h200 a100 "
    "l40s a10g b200 rtx4090). With --dry-run/--json, software and disk checks are skipped (another machine).",
)  # fmt: skip
@click.option(
    "--ignore-preflight", multiple=True, metavar="CODE",
    help="Proceed despite this preflight error code (e.g. gpu-memory when you know the estimate is pessimistic). "
         "Repeatable.",
)  # fmt: skip
@friendly_errors(ConfigError, DemoPairError, GpuSpecError, BuildError, CheckpointError)
def command(
    config: Path,
    output: Path | None,
    dry_run: bool,
    as_json: bool,
    force: bool,
    only: str | None,
    gpus: str | None,
    ignore_preflight: tuple[str, ...],
) -> None:
    from trtspec.pipeline.plan import make_plan

    planning = dry_run or as_json
    # A plan can be made for checkpoints that live on another machine; a build needs them here.
    cfg = load_config(config, check_paths=not planning)
    out = output if output is not None else Path("trtspec-out") / cfg.name
    if gpus and planning:
        machine = synthetic_machine(gpus, tensorrt_llm_version=cfg.tensorrt_llm_version)
    else:
        machine = machine_inventory(gpus=gpus, disk_paths=[out])
    plan = make_plan(cfg, out, machine, config_path=config, ignore=ignore_preflight)

    if as_json:
        click.echo(json.dumps(plan.to_json(), indent=2))
        return
    print_plan(plan, verbose=dry_run)
    if dry_run:
        if not plan.preflight.ok:
            say(
                f"[red]preflight would refuse this build[/] ({len(plan.preflight.errors)} error(s) above); "
                "fix them or plan with --gpus for the machine you will build on."
            )
        return
    try:
        result = Runner(plan, console=console, force=force, only=only).run()
    except KeyError as e:
        raise UserError(str(e.args[0])) from None
    say(f"[green]build finished[/]; manifest: {result.manifest}")
    if result.repository:
        say(f"next: [bold]trtspec serve {result.repository}[/]")


def _argv_lines(argv: list[str]) -> list[str]:
    """Group an argv as 'prog args' then one '--flag value' per line, for reading."""
    import shlex

    lines: list[str] = []
    i = 0
    head: list[str] = []
    while i < len(argv) and not argv[i].startswith("--"):
        head.append(argv[i])
        i += 1
    lines.append(shlex.join(head))
    while i < len(argv):
        group = [argv[i]]
        i += 1
        while i < len(argv) and not argv[i].startswith("--"):
            group.append(argv[i])
            i += 1
        lines.append(shlex.join(group))
    return lines


def _step_block(plan: Plan, step: Step, i: int, n: int) -> None:
    state = "always runs" if step.always_run else ("up to date" if step.up_to_date else "to run")
    color = "dim" if step.up_to_date else ("cyan" if step.always_run else "yellow")
    say(f"[bold][{i}/{n}] {step.name}[/]  [{color}]{state}[/]")
    say(f"    {escape(step.description)}")
    if step.argv:
        lines = _argv_lines(step.argv)
        say("    $ " + escape(lines[0]) + (" \\" if len(lines) > 1 else ""))
        for j, ln in enumerate(lines[1:], 1):
            say("        " + escape(ln) + (" \\" if j < len(lines) - 1 else ""))
    if step.env:
        say("    env: " + escape(" ".join(f"{k}={v}" for k, v in step.env.items())))
    if step.inputs:
        say("    inputs: " + escape(", ".join(step.inputs)))
    say("    outputs: " + escape(", ".join(str(p) for p in step.outputs)))


def print_plan(plan: Plan, *, verbose: bool = True) -> None:
    cfg, m, pf = plan.cfg, plan.machine, plan.preflight
    say(f"[bold]trtspec build[/] {escape(cfg.name)} (engine: {cfg.engine.value})")
    if plan.config_path:
        say(f"  config:  {escape(str(plan.config_path))}")
    say(f"  output:  {escape(str(plan.output_dir))}")
    machine = m.describe_gpus()
    if cfg.engine is EngineKind.tensorrt_llm:
        version = plan.trtllm_version or "unknown"
        src = "config" if cfg.tensorrt_llm_version else ("installed" if m.tensorrt_llm_version else "")
        machine += f"; TensorRT-LLM {version}{f' ({src})' if src else ''}"
    say(f"  machine: {escape(machine)}")
    for role, info in plan.infos.items():
        if info is None:
            say(f"  {role}:  {escape(str(plan.checkpoints[role]))} (not readable here)")
        else:
            say(
                f"  {role}:  {escape(info.architecture or '?')} {format_params(info.num_params)} params, "
                f"vocab {info.vocab_size}, {escape(str(info.path))}"
            )
    if cfg.engine is EngineKind.tensorrt_llm and pf.placement:
        place = "; ".join(f"{r} GPU {','.join(map(str, g))}" for r, g in pf.placement.items())
        say(f"  placement: {place}")
        if pf.kv_fractions:
            kv = "; ".join(
                f"{r} {f} ({'derived from the memory estimate' if pf.kv_derived.get(r) else 'from the config'})"
                for r, f in pf.kv_fractions.items()
            )
            say(f"  kv_cache_free_gpu_mem_fraction: {kv}")
        for line in describe_estimates(pf):
            say(f"  memory: {escape(line)}")
    if cfg.draft is not None:
        L, K = cfg.limits, cfg.speculative.max_k
        say(
            f"  note: speculative requests need prompt + max_tokens <= max_input_len ({L.max_input_len}): the loop "
            f"resends the running sequence each step; K = {MAX_DRAFT_LEN} = {K}"
        )
    for note in pf.notes:
        say(f"  note: {escape(note)}")
    if pf.findings:
        say("[bold]Preflight[/]")
        for f in pf.findings:
            color = "red" if f.level == "error" else "yellow"
            say(f"  [{color}]{f.level}[/] {escape(f'[{f.code}]')} {escape(f.message)}")
    elif verbose:
        say("[bold]Preflight[/]: [green]no problems found[/]")
    if verbose:
        say("[bold]Steps[/]")
        for i, s in enumerate(plan.steps, 1):
            _step_block(plan, s, i, len(plan.steps))
