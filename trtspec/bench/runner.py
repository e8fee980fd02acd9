"""Runs the benchmark: every cell (concurrency x draft length k), warm-ups first (with every prompt once through
each endpoint, so that no cell meets a prompt first), then N streamed requests
(or, with ``stream`` false, requests answered whole) sent by a fixed number of client threads (a closed loop: each thread sends its next request as soon as the
previous one has finished). With ``rounds`` > 1 the cells of a concurrency take turns: each runs its requests in
that many rounds, in A-B-B-A order, and its throughput is its tokens over the sum of its rounds' time.

Per request it records when each streamed response arrived and how many token ids it carried (tokens are
counted from the ids, never from text chunks), the final acceptance statistics the server reported, and the
client's own overhead: the time between a response arriving and the client asking for the next one (the
client library's decoding plus this module's bookkeeping; see ``one_request``).

With ``api="openai"`` the requests go through the OpenAI-compatible API of `trtspec serve` (streamed completions
to ``<name>`` and ``<name>-baseline``, the token ids of each chunk returned with ``return_token_ids`` and checked
against ``usage``), so what is measured includes that server.

k = 0 is the target-only ``baseline`` endpoint; k > 0 is the speculative ``ensemble``
endpoint with that many draft tokens. With ``k0_on_ensemble`` a third kind of cell runs ``ensemble`` with
k = 0 (drafting off): the speculative loop's own overhead against the baseline.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from trtspec.bench.metrics import CrossCheck, check_result, default_metrics_url
from trtspec.bench.prompts import Prompt
from trtspec.client import Chunk, Client, ClientError
from trtspec.contract import NUM_DRAFT_TOKENS
from trtspec.spec.metrics import SpecStats
from trtspec.spec.loop import SETTINGS_PARAMETER

from trtspec.contract.models import BASELINE, ENSEMBLE, LOOP_OF  # noqa: F401  (the bench's endpoints)


class BenchError(Exception):
    """The benchmark cannot run or go on; the message is meant for the user."""


@dataclass
class BenchSettings:
    url: str = "localhost:8000"
    protocol: str = "http"
    api: str = "triton"  # triton (KServe v2 over --protocol) | openai (the OpenAI API of `trtspec serve`)
    max_tokens: int = 64
    concurrency: Sequence[int] = (1, 4)
    draft_tokens: Sequence[int] = (0, 2, 4)
    requests_per_cell: int = 16
    warmup: int = 2  # per cell
    rounds: int = 1  # the cells of a concurrency run interleaved in this many rounds (see run_bench)
    k0_on_ensemble: bool = False
    # False: one response per request (throughput and end-to-end latency; no TTFT or ITL)
    stream: bool = True
    fixed_k: Sequence[int] = ()  # also run these k with draft_length_policy fixed: the "best fixed k" candidates
    draft_source: str | None = None  # model | ngram | hybrid for the speculative cells; None: the deployment's
    draft_length_policy: str | None = None  # fixed | adaptive for the speculative cells; None: the deployment's
    metrics_url: str | None = None  # None: Triton's default (port 8002 of the --url host); "" or "none": no check
    profile: bool = False
    profile_pids: Sequence[int] | None = None
    timeout: float = 600.0
    openai_models: dict[str, str] = field(default_factory=dict)  # endpoint -> OpenAI model name (found by the check)
    # the deployment's own draft_length_policy, read by the check from the speculative endpoint's config (None: not
    # known, e.g. through the OpenAI API): what the cells that send none run under
    deployment_policy: str | None = None

    def validate(self) -> None:
        if self.api not in ("triton", "openai"):
            raise BenchError(f"api must be triton or openai, got {self.api!r}")
        if self.protocol not in ("http", "grpc"):
            raise BenchError(f"protocol must be http or grpc, got {self.protocol!r}")
        if self.max_tokens < 1:
            raise BenchError(f"max tokens must be >= 1, got {self.max_tokens}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise BenchError(f"concurrency levels must be >= 1, got {list(self.concurrency)}")
        if not self.draft_tokens or min(self.draft_tokens) < 0:
            raise BenchError(f"{NUM_DRAFT_TOKENS} values must be >= 0, got {list(self.draft_tokens)}")
        if self.fixed_k and min(self.fixed_k) < 0:
            raise BenchError(f"fixed k values must be >= 0, got {list(self.fixed_k)}")
        if self.requests_per_cell < 1:
            raise BenchError(f"requests per cell must be >= 1, got {self.requests_per_cell}")
        if self.warmup < 0:
            raise BenchError(f"warm-up requests must be >= 0, got {self.warmup}")
        if not 1 <= self.rounds <= self.requests_per_cell:
            raise BenchError(f"rounds must be between 1 and the requests per cell ({self.requests_per_cell}), "
                             f"got {self.rounds}")

    def rounds_at(self, concurrency: int) -> int:
        """Rounds at one concurrency: never so many that a round has fewer requests than clients in flight
        (a round's tail, where clients have nothing left to send, would then be most of it)."""
        return max(1, min(self.rounds, self.requests_per_cell // concurrency))

    @property
    def resolved_metrics_url(self) -> str | None:
        if self.metrics_url is None:
            return default_metrics_url(self.url)
        if self.metrics_url.strip().lower() in ("", "none", "off"):
            return None
        url = self.metrics_url.strip()
        if "://" not in url:
            url = "http://" + url
        return url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"


@dataclass(frozen=True)
class Cell:
    concurrency: int
    k: int  # the draft length its requests ask for (0 on the baseline)
    endpoint: str  # ensemble | baseline
    policy: str | None = None  # "fixed" for a best-fixed-k candidate; None: the run's draft_length_policy

    @property
    def speculative(self) -> bool:
        """Drafting on (the cells that speedup / best k / crossover are about)."""
        return self.endpoint == ENSEMBLE and self.k > 0

    @property
    def label(self) -> str:
        if self.endpoint == BASELINE:
            return f"c={self.concurrency} baseline"
        return (f"c={self.concurrency} k={self.k}" + ("" if self.k else " (ensemble)")
                + (f" {self.policy}" if self.policy else ""))


def cell_policy(settings: BenchSettings, cell: Cell) -> str | None:
    """The draft_length_policy a cell's requests carry (None: the deployment's own)."""
    if cell.endpoint != ENSEMBLE:
        return None
    return cell.policy or settings.draft_length_policy


def plan_cells(settings: BenchSettings) -> list[Cell]:
    """Cells in run order: by concurrency, the baseline first, then k ascending, then the fixed-k candidates
    (--fixed-k) that the k cells do not already cover. The baseline runs at every concurrency even when 0 is
    not among the draft-token values: every speedup needs it, and it is the k=0 candidate of "best fixed k"."""
    ks = sorted({k for k in settings.draft_tokens if k > 0})
    covered = set(ks) if settings.draft_length_policy == "fixed" else set()
    fixed = sorted({k for k in settings.fixed_k if k > 0} - covered)
    cells = []
    for c in sorted(set(settings.concurrency)):
        cells.append(Cell(c, 0, BASELINE))
        if settings.k0_on_ensemble:
            cells.append(Cell(c, 0, ENSEMBLE))
        cells.extend(Cell(c, k, ENSEMBLE) for k in ks)
        cells.extend(Cell(c, k, ENSEMBLE, "fixed") for k in fixed)
    return cells


@dataclass
class RequestRecord:
    cell: Cell
    index: int  # within the cell; warm-ups are numbered separately
    warmup: bool
    prompt: Prompt
    start: float  # perf_counter when the request was sent
    chunk_times: list[float] = field(default_factory=list)  # perf_counter when each response arrived
    chunk_tokens: list[int] = field(default_factory=list)  # token ids each response carried
    stats: SpecStats = field(default_factory=SpecStats)  # the last response's running stats (= the final ones)
    client_overhead_s: float = 0.0
    error: str | None = None
    left_early: bool = False  # the client went away after `leave_after` responses (soak)
    streamed: bool = True  # False: one response carries every token (no time to first token is measured)

    @property
    def endpoint(self) -> str:
        return self.cell.endpoint

    @property
    def output_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def end(self) -> float:
        return self.chunk_times[-1] if self.chunk_times else self.start

    @property
    def e2e_s(self) -> float:
        return self.end - self.start

    @property
    def first_token_time(self) -> float | None:
        return next((t for t, n in zip(self.chunk_times, self.chunk_tokens) if n > 0), None)

    @property
    def ttft_s(self) -> float | None:
        t = self.first_token_time if self.streamed else None
        return None if t is None else t - self.start


@dataclass
class CellRun:
    cell: Cell
    records: list[RequestRecord]  # measured requests only
    warmups: list[RequestRecord]
    rounds: list[tuple[float, float]]  # (start, end) of each round of its measured requests

    @property
    def wall_s(self) -> float:
        """The time its measured requests ran: the sum of its rounds, not the span of the interleaved run."""
        return sum(end - start for start, end in self.rounds)


@dataclass
class BenchRun:
    settings: BenchSettings
    prompts: list[Prompt]
    cells: list[CellRun]
    t0: float  # perf_counter at the start of the run: every time in results.json is relative to it
    started_at: str  # ISO 8601, UTC
    duration_s: float
    metrics_check: dict[str, Any]
    sampler: Any = None  # trtspec.profiling sampler when profiling

    @property
    def all_records(self) -> list[RequestRecord]:
        return [r for c in self.cells for r in (*c.warmups, *c.records)]


class ProgressSink:
    """What run_bench reports while it runs. The default does nothing."""

    def begin(self, total: int) -> None: ...
    def cell(self, cell: Cell, warmup: bool) -> None: ...
    def advance(self, record: RequestRecord) -> None: ...
    def end(self) -> None: ...


class RichProgress(ProgressSink):
    """A rich progress bar: requests done / total, the cell running, failures."""

    def __init__(self, console: Any = None) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("requests"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[errors]}"),
            console=console,
            transient=False,
        )
        self.task: Any = None
        self.errors = 0

    def begin(self, total: int) -> None:
        self.progress.start()
        self.task = self.progress.add_task("bench", total=total, errors="")

    def cell(self, cell: Cell, warmup: bool) -> None:
        self.progress.update(self.task, description=f"{cell.label}{' warm-up' if warmup else ''}")

    def advance(self, record: RequestRecord) -> None:
        if record.error:
            self.errors += 1
        self.progress.update(self.task, advance=1, errors=f"[red]{self.errors} failed[/]" if self.errors else "")

    def end(self) -> None:
        self.progress.update(self.task, description="done")
        self.progress.stop()


# ------------------------------------------------------------------------------------------------ checks


def _get(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def deployment_policy(model_config: dict[str, Any]) -> str | None:
    """The draft_length_policy in a loop model's config (Triton's JSON form); None where it has none."""
    try:
        loop = json.loads(model_config["parameters"][SETTINGS_PARAMETER]["string_value"])
        return loop["speculative"]["draft_length_policy"]
    except (KeyError, TypeError, ValueError):
        return None


def check_deployment(settings: BenchSettings, endpoints: Sequence[str]) -> None:
    """Fail early, with a message that says what to do, when the server or an endpoint is not there."""
    url = settings.url.removeprefix("http://").removeprefix("https://").rstrip("/")
    hint = ("start one with `trtspec serve REPO` (or let the bench start its own with --config CONFIG), "
            "or point --url at it")
    if settings.api == "openai":
        try:
            with urllib.request.urlopen(f"http://{url}/v1/models", timeout=5) as resp:
                models = json.loads(resp.read())["data"]
        except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
            raise BenchError(f"cannot list the models of an OpenAI API at {url} ({getattr(e, 'reason', e)}): "
                             f"{hint} (its OpenAI port, 9000 by default)") from None
        settings.openai_models = {m.get("triton_model"): m["id"] for m in models if m.get("triton_model")}
        missing = [m for m in endpoints if m not in settings.openai_models]
        if missing:
            raise BenchError(f"the OpenAI API at {url} serves no model for {', '.join(missing)}: is it "
                             "`trtspec serve`?")
        return
    if settings.protocol == "http":
        try:
            status = _get(f"http://{url}/v2/health/ready")
        except (urllib.error.URLError, OSError) as e:
            raise BenchError(f"cannot reach Triton over HTTP at {url} ({getattr(e, 'reason', e)}): {hint}") from None
        if status != 200:
            raise BenchError(f"Triton at {url} is up but not ready (HTTP {status}); wait for its models to load")
        for m in endpoints:
            try:
                ready = _get(f"http://{url}/v2/models/{m}/ready") == 200
            except (urllib.error.URLError, OSError):
                ready = False
            if not ready:
                raise BenchError(f"the server at {url} has no ready model {m!r}: is it a trtspec deployment "
                                 f"(its repository has `ensemble` and `baseline`)?")
        if ENSEMBLE in endpoints:
            try:
                with urllib.request.urlopen(f"http://{url}/v2/models/{ENSEMBLE}/config", timeout=5) as resp:
                    settings.deployment_policy = deployment_policy(json.loads(resp.read()))
            except (urllib.error.URLError, OSError, ValueError):
                pass  # only names the cells' policy in the report
        return
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        client = grpcclient.InferenceServerClient(url)
    except Exception as e:  # noqa: BLE001 - bad address formats raise assorted errors
        raise BenchError(f"bad gRPC address {url!r}: {e}") from None
    try:
        try:
            ready = client.is_server_ready(client_timeout=5)
        except InferenceServerException as e:
            raise BenchError(f"cannot reach Triton over gRPC at {url} ({e.message()}): {hint}") from None
        if not ready:
            raise BenchError(f"Triton at {url} is up but not ready; wait for its models to load")
        for m in endpoints:
            try:
                ok = client.is_model_ready(m, client_timeout=5)
            except InferenceServerException:
                ok = False
            if not ok:
                raise BenchError(f"the server at {url} has no ready model {m!r}: is it a trtspec deployment?")
        if ENSEMBLE in endpoints:
            try:
                config = client.get_model_config(ENSEMBLE, as_json=True, client_timeout=5)
                settings.deployment_policy = deployment_policy(config.get("config", {}))
            except InferenceServerException:
                pass  # only names the cells' policy in the report
    finally:
        client.close()


# ------------------------------------------------------------------------------------------------ running


def one_request(
    settings: BenchSettings,
    cell: Cell,
    index: int,
    prompt: Prompt,
    warmup: bool,
    extra: dict[str, Any] | None = None,
    leave_after: int | None = None,
) -> RequestRecord:
    """One request (streamed unless settings.stream is false); `extra` request fields override the cell's, and with `leave_after` the client goes
    away (closes the HTTP connection, cancels the gRPC stream) after that many responses.

    Client overhead: for each response, the time from its arrival (the client stamps ``Chunk.time`` when the
    bytes / the gRPC callback arrive) to the moment this loop asks for the next one, i.e. decoding by the
    client library plus the bookkeeping here. When a response arrived while the previous one was still being
    handled, only the time after that handling counts, so nothing is counted twice.
    """
    params = {NUM_DRAFT_TOKENS: cell.k} if cell.endpoint == ENSEMBLE else {}
    if cell.endpoint == ENSEMBLE and settings.draft_source:
        params["draft_source"] = settings.draft_source
    policy = cell_policy(settings, cell)
    if policy:
        params["draft_length_policy"] = policy
    params.update(extra or {})
    rec = RequestRecord(cell, index, warmup, prompt, start=time.perf_counter(), streamed=settings.stream)
    times, tokens = rec.chunk_times, rec.chunk_tokens
    overhead = 0.0
    last_ask = rec.start
    chunks = _stream(settings, cell, prompt.text, params)
    try:
        for chunk in chunks:
            times.append(chunk.time)
            tokens.append(len(chunk.token_ids))
            if chunk.stats is not None:
                rec.stats = chunk.stats
            now = time.perf_counter()
            overhead += now - max(chunk.time, last_ask)
            last_ask = now
            if leave_after is not None and len(times) >= leave_after:
                rec.left_early = True
                break
    except ClientError as e:
        rec.error = str(e) or type(e).__name__
    except Exception as e:  # noqa: BLE001 - a broken connection must not kill the whole run
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        chunks.close()  # closes the connection / cancels the stream now, not when garbage-collected
    if rec.error is None and not times:
        rec.error = "the server sent no response"
    rec.client_overhead_s = overhead
    return rec


def _stream(settings: BenchSettings, cell: Cell, prompt: str, params: dict[str, Any]) -> Iterator[Chunk]:
    if settings.api == "triton":
        client = Client(settings.url, settings.protocol, model=cell.endpoint, timeout=settings.timeout)
        yield from client.stream(prompt, settings.max_tokens, stream=settings.stream, **params)
        return
    import openai

    openai_client = _openai_client(settings.url, settings.timeout)
    create = dict(model=settings.openai_models[cell.endpoint], prompt=prompt, max_tokens=settings.max_tokens,
                  extra_body={**params, "return_token_ids": True})
    if not settings.stream:
        try:
            whole = openai_client.completions.create(**create)
        except openai.APIError as e:
            raise ClientError(str(e)) from None
        wire = (whole.model_extra or {}).get("speculative")
        ids = (whole.choices[0].model_extra or {}).get("token_ids") or []
        yield Chunk(whole.choices[0].text, ids, time.perf_counter(), SpecStats.from_wire(wire) if wire else None)
        return
    stream = openai_client.completions.create(**create, stream=True, stream_options={"include_usage": True})
    counted = 0
    try:
        for c in stream:
            t = time.perf_counter()
            if c.choices:
                ids = (c.choices[0].model_extra or {}).get("token_ids") or []
                counted += len(ids)
                wire = (c.model_extra or {}).get("speculative")
                yield Chunk(c.choices[0].text, ids, t, SpecStats.from_wire(wire) if wire else None)
            elif c.usage is not None and c.usage.completion_tokens != counted:
                raise ClientError(f"usage says {c.usage.completion_tokens} completion tokens, the chunks carried "
                                  f"{counted} token ids")
    except openai.APIError as e:
        raise ClientError(str(e)) from None
    finally:
        stream.close()


@functools.lru_cache(maxsize=4)
def _openai_client(url: str, timeout: float) -> Any:
    """One client (one connection pool) for every bench thread: the openai client is thread-safe."""
    import openai

    base = url if "://" in url else f"http://{url}"
    return openai.OpenAI(base_url=f"{base.rstrip('/')}/v1", api_key="unused", max_retries=0, timeout=timeout)


def _run_phase(
    settings: BenchSettings,
    cell: Cell,
    items: list[tuple[int, Prompt]],
    warmup: bool,
    on_done: Callable[[RequestRecord], None],
) -> list[RequestRecord]:
    """Send ``items`` with ``cell.concurrency`` client threads; returns the records in request order."""
    it = iter(items)
    lock = threading.Lock()
    stop = threading.Event()
    out: list[RequestRecord] = []

    def worker() -> None:
        while not stop.is_set():
            with lock:
                item = next(it, None)
            if item is None:
                return
            rec = one_request(settings, cell, item[0], item[1], warmup)
            with lock:
                out.append(rec)
            on_done(rec)

    threads = [threading.Thread(target=worker, daemon=True, name=f"bench-{i}")
               for i in range(min(cell.concurrency, len(items)))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except KeyboardInterrupt:
        stop.set()
        raise
    return sorted(out, key=lambda r: r.index)


def priming_cells(group: Sequence[Cell]) -> list[Cell]:
    """The cells that send every prompt once before a concurrency's measured requests: one per endpoint, the
    speculative one drafting the most (its draft engine sees the prompts too)."""
    by_endpoint: dict[str, Cell] = {}
    for cell in group:
        if cell.endpoint not in by_endpoint or cell.k > by_endpoint[cell.endpoint].k:
            by_endpoint[cell.endpoint] = cell
    return list(by_endpoint.values())


def measured_schedule(settings: BenchSettings, group: Sequence[Cell]) -> list[tuple[Cell, range]]:
    """The measured phases of one concurrency's cells, in run order: each cell's request indices split into
    ``rounds_at`` rounds, the cells taking turns A-B-B-A so that every cell's mean position in the sequence is
    the same and a drift of the machine's speed over the run (other jobs, heat) weighs on every cell alike."""
    rounds = settings.rounds_at(group[0].concurrency) if group else 1
    bounds = [settings.requests_per_cell * r // rounds for r in range(rounds + 1)]
    return [(cell, range(bounds[r], bounds[r + 1]))
            for r in range(rounds) for cell in (group if r % 2 == 0 else group[::-1])]


def _all_failed(records: list[RequestRecord], cell: Cell, phase: str) -> None:
    if records and all(r.error for r in records):
        raise BenchError(f"every {phase} request of {cell.label} failed; the first error: {records[0].error}")


def run_bench(settings: BenchSettings, prompts: Sequence[Prompt], progress: ProgressSink | None = None) -> BenchRun:
    """Run every cell and return the raw records (see trtspec.bench.report for the figures)."""
    settings.validate()
    if not prompts:
        raise BenchError("no prompt to send")
    prompts = list(prompts)
    cells = plan_cells(settings)
    check_deployment(settings, sorted({c.endpoint for c in cells}))
    progress = progress or ProgressSink()

    metrics_url = settings.resolved_metrics_url
    # the OpenAI API sends token ids to the loop models, which count its requests; a text endpoint counts its own
    labels = LOOP_OF if settings.api == "openai" else {}
    check = CrossCheck(metrics_url, labels) if metrics_url else None
    sampler = None
    if settings.profile:
        try:
            from trtspec.profiling import create_sampler
        except ImportError as e:
            raise BenchError(f"--profile needs trtspec.profiling, which cannot be imported here ({e})") from None
        sampler = create_sampler(interval_s=0.1, pids=list(settings.profile_pids) if settings.profile_pids else None)

    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if check:
        check.start()
    t0 = time.perf_counter()
    if sampler is not None:
        sampler.start()
    runs: dict[Cell, CellRun] = {}
    measured_prompts = list({p.text: p for p in (prompts[i % len(prompts)]
                                                 for i in range(settings.requests_per_cell))}.values())
    groups = [[c for c in cells if c.concurrency == n] for n in sorted({c.concurrency for c in cells})]
    priming = sum(len(priming_cells(g)) for g in groups) * len(measured_prompts) if settings.warmup else 0
    progress.begin(len(cells) * (settings.warmup + settings.requests_per_cell) + priming)
    try:
        for group in groups:
            for cell in group:
                warm: list[RequestRecord] = []
                if settings.warmup:
                    progress.cell(cell, True)
                    if sampler is not None:
                        sampler.mark(f"{cell.label} warm-up")
                    items = [(i, prompts[i % len(prompts)]) for i in range(settings.warmup)]
                    warm = _run_phase(settings, cell, items, True, progress.advance)
                    _all_failed(warm, cell, "warm-up")
                runs[cell] = CellRun(cell, [], warm, [])
            # The prompts the cells will send, once each through every endpoint first: otherwise the cell that sends
            # a prompt first meets it cold, and every later cell finds it in the engine's prefix cache (TensorRT-LLM's
            # KV cache reuse; the target engine is shared by both endpoints). With A-B-B-A rounds those are the
            # first and the last cell of a concurrency, the baseline among them.
            for cell in priming_cells(group) if settings.warmup else ():
                progress.cell(cell, True)
                if sampler is not None:
                    sampler.mark(f"{cell.label} warm-up: every prompt once")
                items = [(settings.warmup + i, p) for i, p in enumerate(measured_prompts)]
                warm = _run_phase(settings, cell, items, True, progress.advance)
                _all_failed(warm, cell, "warm-up")
                runs[cell].warmups.extend(warm)
            for cell, indices in measured_schedule(settings, group):
                progress.cell(cell, False)
                if sampler is not None:
                    sampler.mark(cell.label if indices.start == 0 else f"{cell.label} from request {indices.start}")
                items = [(i, prompts[i % len(prompts)]) for i in indices]
                start = time.perf_counter()
                records = _run_phase(settings, cell, items, False, progress.advance)
                end = max((r.end for r in records), default=time.perf_counter())
                _all_failed(records, cell, "measured")
                runs[cell].records.extend(records)
                runs[cell].rounds.append((start, end))
    finally:
        progress.end()
        if sampler is not None:
            sampler.stop()
    duration = time.perf_counter() - t0
    all_records = [r for c in runs.values() for r in (*c.warmups, *c.records)]
    if check is not None:
        metrics_check = check.finish(all_records)
    else:
        metrics_check = check_result("skipped", None, "disabled (--metrics-url none)")
    return BenchRun(settings, prompts, list(runs.values()), t0, started_at, duration, metrics_check, sampler)
