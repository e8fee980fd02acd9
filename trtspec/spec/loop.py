"""The speculative loop, one implementation for every engine flavour.

Each iteration asks a drafter (trtspec.spec.drafters) for k tokens, sends the running sequence plus
`draft_input_ids` (and `draft_logits` when asked) to the target in ONE call, and takes the target's answer:
the accepted prefix plus one target token. The loop talks to its engines only through
`call(model, tensors, wanted)`, so it runs unchanged against TensorRT-LLM engines, the reference engine, or
a test double.

End of sequence is read the way TensorRT-LLM reports it: the executor never returns the end token (it is not
counted in `sequence_length`), so a verify call whose next target token is the end token returns only the
accepted prefix, and none at all when the end token comes first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from trtspec.config import SpeculativeConfig
from trtspec.contract import REQUEST_FIELDS, STAT, EngineCallError, RequestError
from trtspec.contract.limits import RequestLimits
from trtspec.spec.drafters import SELECTIONS, SOURCES, Drafter, Proposal, TargetDrafter, drafts_in_target
from trtspec.guided import GuidedRequest, GuidedSettings
from trtspec.spec.logprobs import TopLogProbs
from trtspec.spec.methods import in_engine
from trtspec.spec.metrics import SpecStats
from trtspec.spec.planner import Planner, RequestPolicy
from trtspec.spec.estimates import Estimates
from trtspec.spec.speculative import PLAIN_RUN_MAX, find_stop
from trtspec.triton_io import to_words_list

# (model name, input tensors, requested outputs) -> output tensors; raises EngineCallError on failure
EngineCall = Callable[[str, Mapping[str, np.ndarray], list[str]], Mapping[str, np.ndarray]]
# the same, response by response: a request with streaming=true is answered a step's new tokens at a time
EngineStream = Callable[[str, Mapping[str, np.ndarray], list[str]], Iterator[Mapping[str, np.ndarray]]]


LoopRequestError = RequestError


class LoopSettings(BaseModel):
    """What a loop model is deployed with: built once from the build config, shipped as one JSON parameter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    speculative: SpeculativeConfig
    max_input_len: int  # engines' limit: the running sequence (prompt + generated) is resent as input
    target_model: str = "tensorrt_llm"
    draft_model: str | None = "tensorrt_llm_draft"  # None: the deployment has no draft model
    draft_disabled: bool = False  # the target-only baseline endpoint
    engine_reports_drafts: bool = False  # in-engine speculation (Medusa): the engine's own draft counts are the stats
    engine_input_names: dict[str, str] = {}  # TensorRT-LLM version aliases, e.g. {"min_tokens": "min_length"}
    max_concurrent_requests: int = 64
    guided: GuidedSettings | None = None  # None: guided requests are refused (trtspec.guided)

    @property
    def limits(self) -> RequestLimits:
        return RequestLimits(self.speculative.max_k, self.max_input_len)

    def requested_k(self, req: "LoopRequest") -> int:
        """The draft length the request asks for, or the deployment's default when it asks for none."""
        return self.speculative.default_k if req.num_draft_tokens is None else req.num_draft_tokens

    def engine_name(self, name: str) -> str:
        return self.engine_input_names.get(name, name)


SETTINGS_PARAMETER = "loop_settings"  # the loop model's one parameter: LoopSettings as JSON


def settings_parameter(settings: LoopSettings) -> dict[str, str]:
    return {SETTINGS_PARAMETER: settings.model_dump_json()}


@dataclass
class LoopRequest:
    """A request as the loop sees it; field names are the request fields' (trtspec.contract)."""

    prompt: list[int]
    max_tokens: int
    num_draft_tokens: int | None = None
    use_draft_logits: bool = False
    draft_source: str | None = None
    draft_length_policy: str | None = None  # fixed | adaptive; None: the deployment's
    stream: bool = False
    end_id: int | None = None
    pad_id: int | None = None
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    return_perf_metrics: bool | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    exclude_input_in_output: bool | None = None  # None: the generated tokens only
    embedding_bias: Sequence[float] | None = None  # one value per vocabulary entry, added to every engine's logits
    return_num_input_tokens: bool | None = None
    return_num_output_tokens: bool | None = None
    return_log_probs: bool | None = None  # the target's log-probability of each token it emits
    top_log_probs: int | None = None  # N: the target's N most likely tokens at each emitted position
    guided_decoding_guide_type: str | None = None  # trtspec.guided
    guided_decoding_guide: str | None = None


@dataclass
class Step:
    """One iteration of a request, or a streamed run's response before the run ends: the tokens it accepted (what a
    streamed response carries)."""

    new_tokens: list[int]
    generated_before: list[int]
    stats: SpecStats
    final: bool = False
    log_probs: list[float] | None = None  # of new_tokens, from the target (with return_log_probs)
    top: TopLogProbs | None = None  # at new_tokens' positions, from the target (with top_log_probs)


def validate(req: LoopRequest, settings: LoopSettings) -> None:
    for f in REQUEST_FIELDS:
        if hasattr(req, f.name):
            f.validate(getattr(req, f.name))
    if not req.prompt:
        raise RequestError("the prompt is empty (text_input must not be empty)")
    settings.limits.check(len(req.prompt), req.max_tokens, req.num_draft_tokens)
    source = req.draft_source or settings.speculative.draft_source
    if not settings.draft_disabled and settings.draft_model is None and not drafts_in_target(settings) and \
            not in_engine(settings.speculative.method) and any(
        SOURCES[s].needs_draft_model for s in SELECTIONS[source]
    ):
        raise RequestError(
            f"draft_source {source!r} needs a draft model and this deployment has none "
            "(it was built with speculative.draft_source: ngram); use draft_source ngram"
        )


def _i32(*v: int) -> np.ndarray:
    return np.array([list(v)], dtype=np.int32)


# the engine's own speculation (Medusa), as its perf metrics count it: asked with return_perf_metrics
ENGINE_DRAFTS = (STAT.total_draft_tokens, STAT.total_accepted_draft_tokens)


def _engine_drafts(out: Mapping[str, np.ndarray]) -> list[int]:
    return [int(np.asarray(out.get(n, [[0]])).reshape(-1)[0]) for n in ENGINE_DRAFTS]


class SpeculativeLoop:
    def __init__(
        self,
        settings: LoopSettings,
        call: EngineCall,
        in_flight: Callable[[], int] = lambda: 0,
        estimates: Estimates | None = None,
        stream: EngineStream | None = None,
    ):
        """`in_flight`: requests in flight in the deployment now (the controller's load; speculative.max_concurrency
        compares with it). `estimates`: what the goodput controller learns, shared by the deployment's loop
        processes (trtspec.spec.load.SharedEstimates); default: this loop's own. `stream`: the engines' streamed
        answers (TensorRT-LLM's streaming=true: each response a step's new tokens, the input never among them,
        sequence_length their count): a streamed request's plain runs come from the engine as each step makes
        them, as target-only decoding streams, instead of a target call per token; None: a call per token."""
        self.settings = settings
        self.call = call
        self.stream = stream
        self.in_flight = in_flight
        self.estimates = estimates if estimates is not None else Estimates()

    # -------------------------------------------------------------- engine requests

    def _sampling_tensors(self, req: LoopRequest) -> dict[str, np.ndarray]:
        t: dict[str, np.ndarray] = {"streaming": np.array([[False]])}
        if req.end_id is not None:
            t["end_id"] = _i32(req.end_id)
        if req.pad_id is not None:
            t["pad_id"] = _i32(req.pad_id)
        for f in REQUEST_FIELDS:  # sampling inputs and penalties, as the engines name them (version aliases)
            value = getattr(req, f.name, None) if f.engine_input else None
            if value is not None:
                t[self.settings.engine_name(f.engine_input)] = np.array([[value]], dtype=f.numpy)
        if req.embedding_bias is not None:
            t["embedding_bias"] = np.asarray(req.embedding_bias, dtype=np.float32).reshape(1, -1)
        if req.bad_words:
            t["bad_words_list"] = to_words_list(req.bad_words)
        return t

    @staticmethod
    def _new_tokens(out: Mapping[str, np.ndarray], seq_len: int) -> list[int]:
        ids = np.asarray(out["output_ids"]).reshape(-1)
        n = int(np.asarray(out["sequence_length"]).reshape(-1)[0])
        return [int(x) for x in ids[seq_len:n]]

    def _ask(self, common: Mapping[str, np.ndarray], seq: Sequence[int], output_len: int,
             min_tokens: int = 0) -> dict[str, np.ndarray]:
        """An engine request's tensors: the request's own (`common`), the running sequence, the tokens to ask for and
        how many must come before the end token may (under the version's name)."""
        tensors = dict(common, input_ids=np.array([seq], dtype=np.int32), input_lengths=_i32(len(seq)),
                       request_output_len=_i32(output_len))
        if min_tokens > 0:
            tensors[self.settings.engine_name("min_tokens")] = _i32(min_tokens)
        return tensors

    def _draft_call(self, common: Mapping[str, np.ndarray]) -> Callable[[Sequence[int], int, bool], Proposal]:
        """The draft model as a drafter; `common`: the request's sampling tensors, built once per request."""
        model = self.settings.draft_model

        def draft(seq: Sequence[int], k: int, want_logits: bool) -> Proposal:
            tensors = self._ask(common, seq, k, min_tokens=k)  # the draft must not stop early
            tensors["return_generation_logits"] = np.array([[want_logits]])
            wanted = ["output_ids", "sequence_length"] + (["generation_logits"] if want_logits else [])
            out = self.call(model, tensors, wanted)
            tokens = self._new_tokens(out, len(seq))[:k]
            logits = None
            if want_logits and tokens and "generation_logits" in out:
                g = np.asarray(out["generation_logits"], dtype=np.float32)
                logits = g.reshape(-1, g.shape[-1])[-len(tokens) :][None]
            return Proposal(tokens, logits)

        return draft

    def _verify(
        self, seq: list[int], proposal: Proposal, common: Mapping[str, np.ndarray], min_tokens: int,
        log_probs: bool = False,
        in_target: TargetDrafter | None = None, next_k: int = 0, top: int = 0, temperature: float | None = None,
        plain: int = 1, guided: GuidedRequest | None = None, engine_drafts: list[int] | None = None,
    ) -> tuple[list[int], list[float] | None, TopLogProbs | None]:
        """The target's new tokens, and with `log_probs` its log-probability of each (TensorRT-LLM's output_log_probs),
        with `top` its `top` most likely tokens at each new token's position (from its generation_logits).
        `common`: the request's sampling and stop-word tensors, built once per request; `min_tokens`: how many
        more tokens the request must generate before the end token may come (each call is a new engine request);
        `in_target`: the drafter that takes the target's draft for the next call (next_k tokens) from this answer;
        `plain`: without a draft, the tokens to ask for (the engine steps them); `guided`: the request's grammar
        state, which masks the rows `top` is taken from as the engine masked the distributions it sampled from."""
        tensors = self._ask(common, seq, len(proposal.tokens) + 1 if proposal.tokens else plain, min_tokens)
        if proposal.tokens:
            tensors["draft_input_ids"] = np.array([proposal.tokens], dtype=np.int32)
            if proposal.logits is not None:
                tensors["draft_logits"] = proposal.logits
        wanted = ["output_ids", "sequence_length"]
        if log_probs:
            tensors["return_log_probs"] = np.array([[True]])
            wanted.append("output_log_probs")
        if top:
            # TensorRT-LLM fills generation_logits' first rows with the verify logits of positions len(seq) ..
            # len(seq) + k in order (copyLastContextLogits), so row i is the distribution new[i] was chosen from
            tensors["return_generation_logits"] = np.array([[True]])
            wanted.append("generation_logits")
        if in_target is not None and next_k:
            tensors["next_draft_len"] = _i32(next_k)
            wanted.append("next_draft_ids")
        if engine_drafts is not None:
            tensors["return_perf_metrics"] = np.array([[True]])
            wanted += ENGINE_DRAFTS
        out = self.call(self.settings.target_model, tensors, wanted)
        if engine_drafts is not None:
            engine_drafts[:] = _engine_drafts(out)
        if in_target is not None:
            in_target.next = [int(x) for x in np.asarray(out.get("next_draft_ids", [])).reshape(-1)]
        new = self._new_tokens(out, len(seq))
        alternatives = None
        if top and not new:  # the end token came first: no emitted position (engines may return no logits)
            alternatives = TopLogProbs.empty(top)
        elif top:
            g = out.get("generation_logits")
            rows = None if g is None else np.asarray(g).reshape(-1, np.shape(g)[-1])
            if rows is None or len(rows) < len(new):
                raise EngineCallError(
                    f"{self.settings.target_model} returned {0 if rows is None else len(rows)} rows of "
                    f"generation_logits for {len(new)} new tokens (top_log_probs needs one per token)")
            rows = rows[: len(new)] if guided is None else guided.mask_rows(rows[: len(new)], new)
            alternatives = TopLogProbs.from_logits(rows, top, temperature)
        if not log_probs:
            return new, None, alternatives
        if "output_log_probs" not in out:
            raise EngineCallError(f"{self.settings.target_model} returned no output_log_probs for return_log_probs")
        return new, [float(x) for x in np.asarray(out["output_log_probs"]).reshape(-1)[: len(new)]], alternatives

    def _plain_run(
        self, seq: list[int], common: Mapping[str, np.ndarray], min_tokens: int, plain: int,
        engine_drafts: list[int] | None,
    ) -> Iterator[list[int]]:
        """A plain run of up to `plain` tokens, streamed by the engine: each response's new tokens as they come
        (TensorRT-LLM's streamed responses carry only the tokens not sent before, sequence_length their count)."""
        tensors = self._ask(common, seq, plain, min_tokens)
        tensors["streaming"] = np.array([[True]])
        wanted = ["output_ids", "sequence_length"]
        if engine_drafts is not None:  # counted in the final response
            tensors["return_perf_metrics"] = np.array([[True]])
            wanted += ENGINE_DRAFTS
        for out in self.stream(self.settings.target_model, tensors, wanted):
            if engine_drafts is not None and ENGINE_DRAFTS[0] in out:
                engine_drafts[:] = _engine_drafts(out)
            ids = np.asarray(out["output_ids"]).reshape(-1)
            n = int(np.asarray(out["sequence_length"]).reshape(-1)[0])
            yield [int(x) for x in ids[:n]]

    # -------------------------------------------------------------- the loop

    def _drafters(self, sources: Sequence[str], common: Mapping[str, np.ndarray]) -> dict[str, Drafter]:
        call = self._draft_call(common)
        return {name: SOURCES[name].make(self.settings, call) for name in sources}

    def planner(self, req: LoopRequest, drafting: bool = True) -> Planner:
        """The request's decisions (trtspec.spec.planner): its sources, policy and k, on this deployment; `drafting` false:
        none (a guided request on an engine that cannot verify drafts under its guide)."""
        spec = self.settings.speculative
        selection = req.draft_source or spec.draft_source
        in_target = drafts_in_target(self.settings)
        sources = Planner.sources_for(selection, self.settings.draft_model is not None, in_target,
                                      self.settings.draft_disabled or not drafting)
        policy = RequestPolicy(
            max_tokens=req.max_tokens,
            k=self.settings.requested_k(req),
            adaptive=(req.draft_length_policy or spec.draft_length_policy) == "adaptive",
            selection=selection,
            stream=req.stream and not self._streams_runs(req),
        )
        return Planner(spec, self.estimates, policy, sources, in_target=in_target and "model" in sources)

    def _streams_runs(self, req: LoopRequest) -> bool:
        """Whether a streamed request's plain runs can stream from the engine: its engines stream, and it asks for
        nothing the engine gives a whole answer only (log-probabilities, logits) or the loop checks token by token
        (a guide)."""
        return self.stream is not None and not (req.return_log_probs or req.top_log_probs
                                                or req.guided_decoding_guide_type)

    def run(self, req: LoopRequest) -> Iterator[Step]:
        """Yields one Step per target call, and one per engine response of a streamed plain run (the last has
        final=True). Raises RequestError."""
        validate(req, self.settings)
        guided = GuidedRequest.start(req, self.settings)  # guided decoding (trtspec.guided): None without a guide
        # Medusa: the engine speculates by itself; the loop drafts nothing and asks for runs it passes through
        passthrough = in_engine(self.settings.speculative.method)
        planner = self.planner(req, drafting=(guided is None or guided.drafts) and not passthrough)
        planner.stats.guided_without_drafting = int(guided is not None and not guided.drafts)
        common = self._sampling_tensors(req)
        common.update(guided.engine_tensors() if guided else {})
        verify_common = dict(common, stop_words_list=to_words_list(req.stop_words)) if req.stop_words else common
        drafters = self._drafters(planner.sources, common)
        in_target = drafters.get("model") if planner.in_target else None
        seq, generated = list(req.prompt), []

        def propose(source: str, tokens: Sequence[int], k: int) -> Proposal:
            # the sources that need no engine call; the target's own drafter: the whole draft of the last answer
            return Proposal(list(in_target.next)) if in_target is not None and source == "model" else \
                drafters[source].propose(tokens, k, False)

        last: tuple[float, float] | None = None  # the last iteration's start and its engine calls' seconds
        while True:
            started = time.perf_counter()
            # the last iteration's time outside its calls: this loop's work and its answer's way to the client
            overhead_s = None if last is None else started - last[0] - last[1]
            load = self.in_flight()
            plan = planner.plan(load, seq, propose)
            proposal, draft_s, draft_failed = Proposal(plan.tokens or []), None, False
            batch = [1, max(0, plan.missed - 2)]
            if plan.calls_draft_model:
                t0 = time.perf_counter()
                with self.estimates.draft_call(plan.missed) as batch:
                    try:
                        proposal = drafters[plan.source].propose(
                            seq, plan.k, req.use_draft_logits and SOURCES[plan.source].gives_logits)
                    except EngineCallError:
                        draft_failed = True
                draft_s = time.perf_counter() - t0
            engine_drafts = [0, 0] if passthrough and self.settings.engine_reports_drafts else None
            proposal = guided.cut(proposal, plan.plain) if guided else proposal  # no token the grammar refuses
            draft = proposal.tokens
            remaining = req.max_tokens - len(generated)
            engine_streams = req.stream and self._streams_runs(req)  # a run's tokens come as the engine makes them
            if passthrough:  # the whole rest in one call; streamed: a tree's worth a call, or a streamed run
                plan = replace(plan, plain=remaining if not req.stream else
                               min(remaining, PLAIN_RUN_MAX if engine_streams else self.settings.speculative.max_k + 1))
            plan = replace(plan, plain=guided.plain(plan.plain, remaining)) if guided else plan
            streamed = engine_streams and not draft and plan.plain > 1
            t0, sent = time.perf_counter(), 0
            with self.estimates.target_call(planner.call_tokens(seq, draft)) as step:
                if streamed:
                    new, log_probs, top = [], None, None
                    for part in self._plain_run(seq, verify_common, (req.min_tokens or 0) - len(generated),
                                                plan.plain, engine_drafts):
                        new += part
                        if len(new) < plan.plain:  # the run's last tokens go with the iteration's own step
                            yield Step(part, generated + new[: sent], planner.stats)
                            sent = len(new)
                else:
                    new, log_probs, top = self._verify(
                        seq, proposal, verify_common, (req.min_tokens or 0) - len(generated),
                        bool(req.return_log_probs), in_target, plan.next_k, req.top_log_probs or 0, req.temperature,
                        plan.plain, guided, engine_drafts,
                    )
            verify_s = time.perf_counter() - t0
            raw = list(new)
            accepted = next((i for i, (a, b) in enumerate(zip(draft, new)) if a != b), min(len(draft), len(new)))
            # a token asked for is missing: the end token came, which TensorRT-LLM never returns
            done = len(new) < accepted + (1 if draft else plan.plain)
            new = new[:remaining]
            done = done or len(generated) + len(new) >= req.max_tokens
            if req.end_id is not None and req.end_id in new:
                new, done = new[: new.index(req.end_id)], True  # an engine that returns the end token
            if req.stop_words:
                cut = find_stop(generated + new, req.stop_words, start=len(generated))
                if cut is not None:
                    new, done = (generated + new)[len(generated) : cut], True
            before = list(generated)
            generated += new
            if guided:
                guided.accept(new)
            seq += new
            planner.outcome(plan, load, draft, raw, verify_s, draft_s, seq, len(new), propose, draft_failed, batch[0],
                            step[0], batch[1], overhead_s)
            last = (started, verify_s + (draft_s or 0.0))
            if engine_drafts and engine_drafts[0]:  # the engine's drafts in this call (derived rates: SpecStats)
                stats = planner.stats
                stats.num_drafts += 1
                stats.total_draft_tokens += engine_drafts[0]
                stats.total_accepted_draft_tokens += engine_drafts[1]
            # a streamed run's earlier tokens went out as they came (the engine stops at stop words and end tokens
            # itself, so no cut reaches them)
            yield Step(new[sent:], before + new[:sent], planner.stats, final=done,
                       log_probs=None if log_probs is None else log_probs[: len(new)],
                       top=None if top is None else top.head(len(new)))
            if done:
                return
