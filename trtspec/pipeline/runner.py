"""Executes a build plan: cached, resumable, atomic steps, with progress and a manifest.

* A step is *done* when ``<out>/.steps/<step>.done.json`` holds its current cache key and its outputs exist.
  The record is written last, after the outputs were renamed into place.
* A step writes to ``<output>.partial-<pid>`` and renames it to ``<output>`` on success, so an interrupted or
  failed step never leaves something that looks finished; leftovers of earlier attempts are removed first.
* A re-run skips steps that are done and resumes at the first one that is not. ``force`` reruns everything,
  ``only`` runs one step (its upstream steps must be done).
* Each tool's output is streamed to the console and to ``<out>/logs/<step>.log``; a failed step prints the
  last lines of its log and the log's path.
* ``<out>/manifest.json``: versions, GPUs, every step's argv, duration and outputs, engine sizes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.markup import escape

from trtspec import __version__
from trtspec.pipeline.plan import Plan, Step
from trtspec.checkpoint import format_bytes
from trtspec.config import EngineKind

TAIL_LINES = 30


class BuildError(Exception):
    """A build that cannot go on; the message is meant for the user."""


class StepFailed(BuildError):
    def __init__(self, step: str, message: str, log: Path | None = None):
        super().__init__(message)
        self.step = step
        self.log = log


@dataclass
class StepResult:
    name: str
    status: str  # "done" | "skipped" | "failed" | "pending"
    duration_s: float | None = None
    log: Path | None = None


@dataclass
class RunResult:
    results: list[StepResult] = field(default_factory=list)
    manifest: Path | None = None
    repository: Path | None = None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _fmt_elapsed(s: float) -> str:
    m, s = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def dir_size(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists() or p.is_symlink():
        p.unlink()


@contextlib.contextmanager
def _lock(output_dir: Path) -> Iterator[None]:
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / ".trtspec.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise BuildError(f"another `trtspec build` is running on {output_dir}; wait for it or use another --output") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Runner:
    def __init__(
        self,
        plan: Plan,
        *,
        console: Console | None = None,
        force: bool = False,
        only: str | None = None,
        stream_output: bool = True,
    ):
        self.plan = plan
        self.console = console or Console(highlight=False)
        self.force = force
        self.only = only
        self.stream_output = stream_output
        self.results: dict[str, StepResult] = {}
        if only is not None:
            plan.step(only)  # KeyError names the steps

    def _say(self, *objects: object) -> None:
        self.console.print(*objects, soft_wrap=True)

    # ----------------------------------------------------------------------------------------- driver

    def run(self) -> RunResult:
        plan = self.plan
        plan.output_dir.mkdir(parents=True, exist_ok=True)
        plan.state_dir.mkdir(exist_ok=True)
        plan.log_dir.mkdir(exist_ok=True)
        with _lock(plan.output_dir), _sigterm_as_interrupt():
            try:
                self._run_steps()
            finally:
                manifest = self.write_manifest()
        return RunResult(
            results=[self.results.get(s.name, StepResult(s.name, "pending")) for s in plan.steps],
            manifest=manifest,
            repository=plan.repository_dir if plan.repository_dir.exists() else None,
        )

    def _run_steps(self) -> None:
        plan = self.plan
        plan.refresh()
        if self.only is not None and self.only != "preflight":
            target = plan.step(self.only)
            missing = [d for d in target.depends_on if d != "preflight" and not plan.step(d).up_to_date]
            if missing:
                raise BuildError(
                    f"--only {self.only}: {', '.join(missing)} is not done yet; run `trtspec build` without --only "
                    f"(or --only {missing[0]}) first"
                )
        n = len(plan.steps)
        for i, step in enumerate(plan.steps, 1):
            plan.refresh()
            selected = self.only is None or step.name == self.only or step.name == "preflight"
            if not selected:
                continue
            forced = self.force or (self.only == step.name and step.name != "preflight")
            if step.up_to_date and not forced:
                rec = plan.done_record(step.name) or {}
                self.results[step.name] = StepResult(step.name, "skipped", rec.get("duration_s"))
                self._say(f"[dim][{i}/{n}] {step.name}: up to date, skipped[/]")
                continue
            self._say(f"[bold][{i}/{n}] {step.name}[/]: {escape(step.description)}")
            start = time.monotonic()
            try:
                if step.kind == "process":
                    self._run_process(step, i, n)
                elif step.name == "preflight":
                    self._run_preflight(step)
                elif step.name == "repository":
                    self._run_repository(step)
                else:  # pragma: no cover - plans only hold the steps above
                    raise BuildError(f"no in-process handler for step {step.name}")
            except StepFailed as e:
                self.results[step.name] = StepResult(step.name, "failed", time.monotonic() - start, e.log)
                raise
            duration = time.monotonic() - start
            self._mark_done(step, duration)
            self.results[step.name] = StepResult(step.name, "done", duration, plan.log_dir / f"{step.name}.log")
            self._say(f"[green]  done[/] {step.name} in {_fmt_elapsed(duration)}")

    # ------------------------------------------------------------------------------------------ steps

    def _run_preflight(self, step: Step) -> None:
        pf = self.plan.preflight
        out = step.outputs[0]
        out.write_text(json.dumps(pf.to_dict(), indent=2) + "\n")
        for f in pf.findings:
            color = "red" if f.level == "error" else "yellow"
            self._say(f"  [{color}]{f.level}[/] {escape(f'[{f.code}]')} {escape(f.message)}")
        if not pf.ok:
            raise StepFailed(
                "preflight",
                f"preflight found {len(pf.errors)} error(s): "
                + "; ".join(f"[{f.code}] {f.message}" for f in pf.errors)
                + " (use --ignore-preflight CODE to proceed anyway)",
            )

    def _partial(self, out: Path) -> Path:
        return out.with_name(f"{out.name}.partial-{os.getpid()}")

    def _clear(self, step: Step) -> None:
        """Remove the done record, the outputs and any leftover partial outputs of earlier attempts."""
        done = self.plan.done_file(step.name)
        if done.exists():
            done.unlink()
        for out in step.outputs:
            for leftover in out.parent.glob(f"{out.name}.partial-*"):
                _remove(leftover)
            _remove(out)

    def _run_process(self, step: Step, i: int, n: int) -> None:
        plan = self.plan
        self._clear(step)
        tmp = {out: self._partial(out) for out in step.outputs}
        for out in step.outputs:
            out.parent.mkdir(parents=True, exist_ok=True)
        mapping = {str(o): str(t) for o, t in tmp.items()}
        argv = [mapping.get(a, a) for a in step.argv]
        log_path = plan.log_dir / f"{step.name}.log"
        env = {**os.environ, **step.env, "PYTHONUNBUFFERED": "1"}
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        start = time.monotonic()
        self._say(f"  [dim]$ {escape(step.command_line())}[/]")
        with open(log_path, "w", encoding="utf-8") as log:
            log.write(f"# {_now()} {step.name}\n# argv: {json.dumps(argv)}\n# env: {json.dumps(step.env)}\n")
            log.flush()
            try:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    errors="replace",
                    bufsize=1,
                    start_new_session=True,
                )
            except OSError as e:
                for t in tmp.values():
                    _remove(t)
                raise StepFailed(step.name, f"{step.name}: cannot start {argv[0]!r}: {e}", log_path) from None
            try:
                status = self.console.status(f"[{i}/{n}] {step.name}  00:00")
                with status:
                    assert proc.stdout is not None
                    for line in proc.stdout:
                        line = line.rstrip("\n")
                        log.write(line + "\n")
                        tail.append(line)
                        elapsed = _fmt_elapsed(time.monotonic() - start)
                        if self.stream_output:
                            self._say(f"  [dim]{escape(line)}[/]")
                        status.update(f"[{i}/{n}] {step.name}  {elapsed}  {escape(line[-80:])}")
                    rc = proc.wait()
            except BaseException:
                _terminate(proc)
                for t in tmp.values():
                    _remove(t)
                log.write(f"# interrupted after {time.monotonic() - start:.1f}s\n")
                raise
            log.write(f"# exit code {rc} after {time.monotonic() - start:.1f}s\n")

        problem = None
        if rc != 0:
            problem = f"exited with code {rc}"
        else:
            first = tmp[step.outputs[0]] if step.outputs else None
            missing = [e for e in step.expect if first is not None and not (first / e).exists()]
            missing_outs = [str(o) for o, t in tmp.items() if not t.exists()]
            if missing_outs:
                problem = f"exited 0 but wrote no {', '.join(missing_outs)}"
            elif missing:
                problem = f"exited 0 but its output lacks {', '.join(missing)}"
        if problem:
            for t in tmp.values():
                _remove(t)
            self._print_tail(step, tail, log_path, problem)
            raise StepFailed(step.name, f"step {step.name} failed: {problem}; full log: {log_path}", log_path)
        for out, t in tmp.items():
            os.replace(t, out)

    def _print_tail(self, step: Step, tail: deque[str], log_path: Path, problem: str) -> None:
        self._say(f"[red]  {step.name} {problem}[/]. Last {len(tail)} lines of its log:")
        for line in tail:
            self._say(f"  [red]|[/] {escape(line)}")
        self._say(f"  full log: {log_path}")

    def _run_repository(self, step: Step) -> None:
        from trtspec.repository import generate_repository  # the generator lives with the serving code

        plan = self.plan
        self._clear(step)
        final = step.outputs[0]
        stage = self._partial(final)
        trt = plan.cfg.engine is EngineKind.tensorrt_llm
        cfg = _cfg_with_placement(plan)
        try:
            returned = generate_repository(
                cfg,
                stage,
                final_dir=final,  # the staging dir is renamed to it: files inside are named by their final path
                target_engine_dir=plan.engine_dir("target") if trt else None,
                # llmapi: the draft checkpoint model.yaml names (the FP8 export when quantized)
                draft_engine_dir=plan.engine_dir("draft") if trt and plan.cfg.draft is not None else plan.llmapi_draft_dir,
                trtllm_version=plan.trtllm_version if trt or plan.cfg.engine is EngineKind.llmapi else None,
                kv_cache_fractions=dict(plan.preflight.kv_fractions) if trt else None,
                # compile-kernels' output, the deployment's own copy of its compiled GEMM kernels
                **({"kernel_dir": plan.output_dir / "kernels"} if any(x.name == "compile-kernels" for x in plan.steps) else {}),
            )
        except BaseException as e:
            _remove(stage)
            if isinstance(e, Exception):
                raise StepFailed(step.name, f"step repository failed: {type(e).__name__}: {e}") from e
            raise
        returned = Path(returned) if returned is not None else stage
        if returned.resolve() == stage.resolve():
            os.replace(stage, final)
        elif stage.resolve() in returned.resolve().parents:
            os.replace(returned, final)
            _remove(stage)
        else:
            _remove(stage)
            raise StepFailed(step.name, f"generate_repository wrote {returned}, outside {stage}; expected it under the staging dir")

    # -------------------------------------------------------------------------------------- bookkeeping

    def _mark_done(self, step: Step, duration: float) -> None:
        plan = self.plan
        record = {
            "name": step.name,
            "cache_key": step.cache_key,
            "run_id": uuid.uuid4().hex,
            "finished_at": _now(),
            "duration_s": round(duration, 3),
            "argv": step.argv,
            "env": step.env,
            "outputs": {str(p): dir_size(p) if p.exists() else None for p in step.outputs},
            "trtspec": __version__,
        }
        tmp = plan.done_file(step.name).with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, plan.done_file(step.name))

    def write_manifest(self) -> Path:
        plan = self.plan
        m = plan.machine
        steps = []
        for s in plan.steps:
            rec = plan.done_record(s.name) or {}
            res = self.results.get(s.name)
            steps.append(
                {
                    "name": s.name,
                    "kind": s.kind,
                    "status": res.status if res else ("done" if s.up_to_date else "pending"),
                    "argv": s.argv,
                    "env": s.env,
                    "inputs": s.inputs,
                    "outputs": {str(p): (dir_size(p) if p.exists() else None) for p in s.outputs},
                    "duration_s": round(res.duration_s, 3) if res and res.duration_s is not None and res.status == "done" else rec.get("duration_s"),
                    "finished_at": rec.get("finished_at"),
                    "cache_key": s.cache_key,
                    "log": str(plan.log_dir / f"{s.name}.log") if s.kind == "process" else None,
                }
            )
        engines = {}
        for role in ("target", "draft"):
            d = plan.engine_dir(role)
            if d.is_dir():
                files = {f.name: f.stat().st_size for f in sorted(d.iterdir()) if f.is_file()}
                engines[role] = {"dir": str(d), "size_bytes": sum(files.values()), "size": format_bytes(sum(files.values())), "files": files}
        manifest = {
            "trtspec_manifest": 1,
            "written_at": _now(),
            "config": str(plan.config_path) if plan.config_path else None,
            "name": plan.cfg.name,
            "engine": plan.cfg.engine.value,
            "versions": {
                "trtspec": __version__,
                "tensorrt_llm": plan.trtllm_version,
                "tensorrt_llm_installed": m.tensorrt_llm_version,
                "tensorrt": m.tensorrt_version,
                "triton_container": os.environ.get("NVIDIA_TRITON_SERVER_VERSION") or m.triton_container,
                "triton_server": os.environ.get("TRITON_SERVER_VERSION") or m.tritonserver.version,
            },
            "gpus": [
                {"index": g.index, "name": g.name, "compute_capability": g.cc, "memory_total_bytes": g.memory_total}
                for g in m.gpus
            ],
            "gpus_synthetic": m.synthetic,
            "driver_version": m.driver_version,
            "placement": plan.preflight.placement,
            "kv_cache_free_gpu_mem_fraction": plan.preflight.kv_fractions,
            "checkpoints": {k: str(v) for k, v in plan.checkpoints.items()},
            "steps": steps,
            "engines": engines,
            "model_repository": str(plan.repository_dir) if plan.repository_dir.exists() else None,
        }
        path = plan.output_dir / "manifest.json"
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(tmp, path)
        return path


class Terminated(KeyboardInterrupt):
    """SIGTERM (e.g. `docker stop`) during a build: unwinds like Ctrl-C, so the running tool is stopped
    and its partial output removed."""


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:  # noqa: ARG001
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(proc: subprocess.Popen) -> None:
    """Stop a child and everything it started (it runs in its own session)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, PermissionError):
        pass
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _cfg_with_placement(plan: Plan) -> Any:
    """The config the repository is generated from: gpu_device_ids filled in from the placement."""
    cfg = plan.cfg
    if cfg.engine is not EngineKind.tensorrt_llm or not plan.preflight.placement:
        return cfg
    updates = {}
    for role in ("target", "draft"):
        m = getattr(cfg, role)
        if m is not None and m.gpu_device_ids is None and role in plan.preflight.placement:
            updates[role] = m.model_copy(update={"gpu_device_ids": plan.preflight.placement[role]})
    if not updates:
        return cfg
    new = cfg.model_copy(update=updates)
    object.__setattr__(new, "_source_dir", cfg.source_dir)
    return new


def run_plan(plan: Plan, **kwargs: Any) -> RunResult:
    return Runner(plan, **kwargs).run()
