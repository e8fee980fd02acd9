"""ReferenceEngine: the model, its forward over a ragged batch, and a request as a generator of forward steps
(see the package docstring for the executor semantics it follows)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import warnings
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from trtspec.guided import EngineGuide, GuideCache, dead_end, guide_masks
from trtspec.reference_engine.ragged import ATTENTION, RaggedBatch, Segment, register as register_attention
from trtspec.reference_engine import device as device_settings
from trtspec.reference_engine.device import _DTYPES, choose_precision, pick_device, tune_for_cpu
from trtspec.reference_engine.draft_vocab import draft_head, load_draft_vocab
from trtspec.reference_engine.eagle3 import InEngineDrafter
from trtspec.reference_engine.kv_cache import new_cache
from trtspec import medusa as medusa_lib
from trtspec.reference_engine.medusa import MedusaHeads, TreeWork, keep_rows
from trtspec.reference_engine.tree_size import Proposal, TreeSize
from trtspec.reference_engine.compiled_linear import CompiledLinear
from trtspec.reference_engine.packed_linear import PackedLinear
from trtspec.reference_engine.prefix_cache import PrefixCache, cache_nbytes
from trtspec.reference_engine.request import EngineRequest, EngineResult, Steps
from trtspec.spec.speculative import (
    SamplingParams,
    find_stop,
    probabilities,
    sample,
    verify_by_target_sample,
    verify_greedy,
    verify_rejection,
)

log = logging.getLogger("trtspec.reference_engine")


def lm_head_product(model: torch.nn.Module, kernels: dict | None = None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """hidden rows [n, hidden] -> logits [n, vocab] for all of a step's rows at once, where the LM head is a plain
    linear map (no bias, softcapping or logit scaling); None: the model's own head does it.

    The head (vocabulary x hidden, often tied to the embedding) is the largest single product of a step, and how
    it is stored decides what a verify or a batch costs (figures: docs/benchmarks/engine.md):
    * column-major (tune_for_cpu, one torch thread): MKL's 1-row product reads it fastest, but its few-row
      products are many times dearer than one row. So the decoder's kernel choice applies to the head too:
      PackedLinear keeps the 1-row product on this weight and gives 2+ rows oneDNN's packed copy (a second copy
      of the head in memory);
    * row-major (as loaded, more threads): head @ hidden^T, which MKL streams once for all the rows (the usual
      hidden @ head^T packs the whole head for every multi-row call);
    * with compiled kernels (device.LINEAR_KERNELS "compiled"): the head's own compiled kernel at every row
      count (its blocked copy in memory; a row's logits bitwise the same at any row count)."""
    head = model.get_output_embeddings()
    config = model.config
    plain = isinstance(head, torch.nn.Linear) and head.bias is None and not any(
        getattr(config, a, None) not in (None, 1.0) for a in ("final_logit_softcapping", "logit_scale", "logits_scaling")
    )
    if not plain:
        return None
    w = head.weight.detach()
    kernel = (kernels or {}).get((head.out_features, head.in_features))
    if kernel is not None and w.dtype == torch.float32 and w.device.type == "cpu":
        return CompiledLinear(head, kernel)
    if w.is_contiguous():
        return lambda h: torch.mm(w, h.t()).t()
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    if packed and w.dtype == torch.float32 and w.device.type == "cpu":
        return PackedLinear(head, gemv=packed[0].gemv is not None)
    return None


class ReferenceEngine:
    def __init__(
        self,
        checkpoint: str | Path,
        device: str = "auto",
        dtype: str = "auto",
        cache_entries: int = 16,
        cache_bytes: int | None = None,
        cache_tokens: int | None = None,
        salt: int = 0,
        use_draft_vocab: bool = False,
        eagle3_head: str | Path | None = None,
        linear_kernels: str = "auto",
        kernel_dir: str | Path | None = None,
        xgrammar_tokenizer_info: str | Path | None = None,
        medusa_heads: str | Path | None = None,
        medusa_choices: Sequence[Sequence[int]] | None = None,
        medusa_tree_size: str | int = "auto",
    ):
        from transformers import AutoModelForCausalLM

        self.device = pick_device(device)
        self.precision = choose_precision(dtype, self.device)
        if self.precision.warning:
            warnings.warn(f"{checkpoint}: {self.precision.warning}", stacklevel=2)
        log.info("%s: %s on %s (%s)", checkpoint, self.precision.dtype, self.device, self.precision.reason)
        self.model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=_DTYPES[self.precision.dtype]).to(self.device)
        self.model.eval()
        register_attention()
        self.model.set_attn_implementation(ATTENTION)
        kernels = tune_for_cpu(self.model, linear_kernels, kernel_dir, label=f"{checkpoint}: ") if self.device == "cpu" else None
        # On compiled kernels every product is batch-invariant (compiled_linear); with attention one query row at
        # a time (RaggedBatch.row_invariant) a position's logits are bitwise the same in a decode, a verify and a batch.
        self.batch_invariant = kernels is not None and device_settings.BATCH_INVARIANT_ATTENTION
        self.vocab_size = int(self.model.config.vocab_size)
        # With a draft vocabulary the head scores only those ids; every other logit is -inf, so greedy and
        # sampled proposals and the draft logits returned for rejection sampling all stay within it.
        self.draft_vocab: torch.Tensor | None = None
        ids = load_draft_vocab(checkpoint, self.vocab_size) if use_draft_vocab else None
        if ids is not None:
            try:
                self._draft_head_t = draft_head(self.model, ids)
            except ValueError as e:
                raise ValueError(f"{checkpoint}: {e}") from None
            self.draft_vocab = torch.tensor(ids, dtype=torch.long, device=self.device)
        self._head = lm_head_product(self.model, kernels) if self.device == "cpu" and self.draft_vocab is None else None
        # An EAGLE-3 head drafting in this engine: a request's next_draft_len asks it for the next call's draft.
        self.eagle3 = InEngineDrafter(eagle3_head, self.model, cache_entries) if eagle3_head else None
        # Medusa heads on the target's last hidden state: every generation step verifies a prefix of their tree
        # (engine_flow's in-engine speculation; trtspec.reference_engine.medusa), as much as pays for the step's
        # batch ("auto": trtspec.reference_engine.tree_size) or a fixed number of its nodes
        self.medusa = self.medusa_tree = self.tree_size = None
        self.medusa_work = TreeWork()
        if medusa_heads:
            self.medusa = MedusaHeads(medusa_heads, self.model)
            choices = medusa_choices or medusa_lib.default_choices(self.medusa.info.num_heads)
            problems = medusa_lib.choices_problems(choices, self.medusa.info.num_heads)
            if problems:
                raise medusa_lib.MedusaError(f"{medusa_heads}: " + "; ".join(problems))
            self.medusa_tree = medusa_lib.Tree.from_choices(choices)
            self.tree_size = TreeSize(self.medusa_tree, None if medusa_tree_size == "auto" else int(medusa_tree_size))
            if self.draft_vocab is not None:
                raise ValueError("medusa_heads: a target engine scores the whole vocabulary (no draft vocabulary)")
        if cache_bytes is None and cache_tokens:  # a budget in tokens: this model's KV bytes per token decide
            cache_bytes = cache_tokens * self.kv_bytes_per_token()
        self.cache = PrefixCache(cache_entries, cache_bytes)
        # guided decoding as TensorRT-LLM's engine with guided_decoding_backend xgrammar (trtspec.guided)
        self.guides = GuideCache(xgrammar_tokenizer_info, self.vocab_size) if xgrammar_tokenizer_info else None
        self.salt = salt  # decorrelates the random streams of the draft and the target under one seed
        if self.tree_size is not None and self.tree_size.fixed is None:
            self.time_tree_steps()

    def time_tree_steps(self, context: int = 64, warm: int = 3) -> None:
        """Before any request, a Medusa engine times a step of every row count one request's tree can make (the
        root and 0 to all of the tree's nodes), `warm` times after a cold one, on a `context`-token sequence: the
        sizing then prices every tree from its own step from the first request on. Priced along a line through
        the row counts chosen so far instead, the demo target's tree of two nodes read 1.2x a plain step where it
        costs 1.0x (its steps cost the same from 1 to 4 rows, 1.4x at 6), and the engine verified the root alone
        for most of a run (docs/benchmarks/medusa.md)."""
        cache = new_cache(self.model.config)
        self.forward([Segment(cache, list(range(context)), 0, 1)])
        # forward() times each step whose every row has logits, but a row count's first (cold); in passes over the
        # row counts, so that the engine's own first steps and any other load at the time weigh on each alike
        for _ in range(1 + warm):
            for rows in range(1, len(self.medusa_tree) + 2):
                self.forward([Segment(cache, list(range(rows)), context, rows)])
                cache.crop(context - cache.get_seq_length())
        costs = self.tree_size.costs
        log.info("Medusa: a step of 1-%d rows (the root and 0-%d tree nodes) timed at %s ms; the heads' LM-head "
                 "products take up to %d rows", len(self.medusa_tree) + 1, len(self.medusa_tree),
                 " / ".join(f"{costs.seconds(r) * 1e3:.1f}" for r in range(1, len(self.medusa_tree) + 2)),
                 self.tree_size.product_rows())

    def kv_bytes_per_token(self) -> int:
        """Measured: the KV cache one token leaves behind (any architecture, dtype and head layout)."""
        segment = Segment(new_cache(self.model.config), [0], 0, 1)
        self.forward([segment])
        return cache_nbytes(segment.cache)

    # ------------------------------------------------------------------ forward with prefix reuse

    def _open(self, tokens: list[int], need_logits: int = 1, max_reuse: int | None = None,
              capture: bool = False) -> tuple[Segment, int]:
        """The segment that computes what `tokens` adds to its longest cached prefix (the cache taken out of
        the prefix cache), and how many tokens the cache served (at most `max_reuse`: the EAGLE-3 head needs the
        features of every position its own cache lacks; `capture`: keep those features)."""
        limit = min(len(tokens) - need_logits, len(tokens) if max_reuse is None else max_reuse)
        cache, reuse = self.cache.take(tokens, limit)
        reuse = min(reuse, limit)
        if cache is None or reuse == 0:
            cache, reuse = new_cache(self.model.config), 0
        elif cache.get_seq_length() > reuse:
            cache.crop(reuse - cache.get_seq_length())  # negative: drop that many (transformers 4.x and 5.x)
        return Segment(cache, list(tokens[reuse:]), reuse, need_logits, capture=capture), reuse

    def forward(self, segments: list[Segment]) -> None:
        """One forward pass over all segments; sets each one's logits (raw, float32) and extends its cache.
        Only the wanted rows go through the LM head: with a 49k vocabulary the head over a whole prompt
        would cost as much as the prefill itself."""
        if self.medusa is not None:
            self.size_trees(segments)
            started = time.perf_counter()
        batch = RaggedBatch(segments, row_invariant=self.batch_invariant)
        ids, pos, rows = batch.inputs(self.device)
        # the head's capture hooks only on a forward where some segment wants its features
        capture = self.eagle3 is not None and any(seg.capture for seg in segments)
        want_hidden = any(seg.want_hidden for seg in segments)
        hidden = None
        with torch.inference_mode(), self.eagle3.capturing() if capture else contextlib.nullcontext():
            if self.draft_vocab is None and (self._head is not None or want_hidden):
                out = self.model.base_model(input_ids=ids, position_ids=pos, use_cache=False, **batch.kwargs())
                hidden = out.last_hidden_state[0, rows]
                head = self._head if self._head is not None else self.model.get_output_embeddings()
                logits = head(hidden).float().contiguous()
            elif self.draft_vocab is None:
                out = self.model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=rows, **batch.kwargs())
                logits = out.logits[0].float()
            else:
                out = self.model.base_model(input_ids=ids, position_ids=pos, use_cache=False, **batch.kwargs())
                scores = (out.last_hidden_state[0, rows] @ self._draft_head_t).float()
                logits = torch.full((len(rows), self.vocab_size), float("-inf"), device=scores.device)
                logits[:, self.draft_vocab] = scores
        batch.split_logits(logits, hidden)
        step_rows = sum(len(seg.tokens) for seg in segments)
        if self.medusa is not None and step_rows == sum(seg.logit_rows for seg in segments):
            # a step whose every row has logits (decode and tree rows; prefill rows skip the LM head): its time
            # by rows prices the tree (logits are on the host by now on a CPU; a GPU is synchronized for the clock)
            if logits.is_cuda:
                torch.cuda.synchronize(logits.device)
            self.tree_size.costs.record(step_rows, time.perf_counter() - started)
        if capture:
            wanted = [(seg, bounds) for seg, bounds in zip(segments, batch.bounds) if seg.capture]
            for (seg, _), feats in zip(wanted, self.eagle3.features([b for _, b in wanted])):
                seg.features = feats

    def size_trees(self, segments: list[Segment]) -> None:
        """Before a step: how much of the Medusa tree its Medusa requests verify (one size for the step, whose cost
        they share: TreeSize), their heads run together (to that depth, or one deeper on a step that explores), and
        their segments extended with those nodes. Segments sized already (a chunk's later pieces) are left as they
        are."""
        pending = [s for s in segments if s.proposal is not None and s.proposal.tokens is None]
        if not pending:
            return
        others = [s for s in segments if s.proposal is None or s.proposal.tokens is not None]
        tree = self.medusa_tree
        sizing = self.tree_size.choose([len(s.tokens) for s in pending], sum(len(s.tokens) for s in others),
                                       sum(1 for s in others if s.logit_rows))
        size, heads = sizing.nodes, sizing.heads
        tops: list[list[list[int]]] = [[] for _ in pending]  # the root alone runs no head: a plain step's cost
        if heads:
            started = time.perf_counter()
            tops = self.medusa.top(torch.stack([s.proposal.hidden for s in pending]), tree.topk[:heads], self._head,
                                   self.tree_size.product_rows())
            self.tree_size.record_heads(len(pending), heads, time.perf_counter() - started)
        for seg, top in zip(pending, tops):
            seg.proposal.tokens, seg.proposal.size = tree.tokens(top), size
            if not size:
                continue  # the root alone: exactly a plain decode step's segment
            base, root = len(seg.tokens), seg.start + len(seg.tokens) - 1
            seg.tokens = seg.tokens + seg.proposal.tokens[:size]
            seg.parents = [*range(-1, base - 1), *(base - 1 if p < 0 else base + p for p in tree.parent[:size])]
            seg.positions = [*range(seg.start, seg.start + base), *(root + d for d in tree.depth[:size])]
            seg.logit_rows = 1 + size

    def _rng(self, req: EngineRequest) -> np.random.Generator:
        kind = 1 if req.draft_ids else 0
        if req.seed is None:
            return np.random.default_rng()
        return np.random.default_rng([int(req.seed), len(req.input_ids), kind, self.salt])

    @staticmethod
    def _process(raw: np.ndarray, context: Sequence[int], req: EngineRequest, generated: int) -> np.ndarray:
        """The logits the executor samples from, in penaltyKernels.cu's order (module docstring)."""
        x = np.array(raw, dtype=np.float32)
        if req.embedding_bias is not None:
            x += req.embedding_bias
        if req.sampling.temperature > 0:  # unset (0 here) is TensorRT-LLM's default 1.0
            x /= np.float32(req.sampling.temperature)
        rep, pres, freq = req.repetition_penalty, req.presence_penalty, req.frequency_penalty
        if rep not in (None, 1.0) or pres or freq:
            ids, counts = np.unique(np.asarray(context, dtype=np.int64), return_counts=True)
            keep = ids < len(x)
            ids, counts = ids[keep], counts[keep]
            v = x[ids]
            if rep not in (None, 1.0):
                v = np.where(v < 0, v * rep, v / rep)
            if pres:
                v = v - pres
            if freq:
                v = v - freq * counts
            x[ids] = v
        banned = [w[-1] for w in req.bad_words if w and list(context[len(context) - len(w) + 1 :]) == list(w[:-1])]
        if req.end_id is not None and generated < req.min_tokens:
            banned.append(req.end_id)
        banned = [b for b in banned if 0 <= b < len(x)]
        if banned:
            x[banned] = -np.inf
        return x

    @staticmethod
    def _sampling(req: EngineRequest) -> SamplingParams:
        """Temperature is already in the processed logits: what is left is top-k/top-p (or greedy)."""
        return req.sampling if req.sampling.greedy else dataclasses.replace(req.sampling, temperature=1.0)

    @staticmethod
    def _log_prob(row: np.ndarray, token: int) -> float:
        finite = row[np.isfinite(row)]
        m = finite.max()
        return float(row[token] - m - np.log(np.exp(finite - m).sum()))

    # ------------------------------------------------------------------ the two request kinds

    def run(self, req: EngineRequest) -> EngineResult:
        """Serve one request alone (a batch of one at every step)."""
        steps = self.steps(req)
        try:
            segment = next(steps)
            while True:
                self.forward([segment])
                segment = steps.send(None)
        except StopIteration as done:
            return done.value

    def steps(self, req: EngineRequest) -> Steps:
        """The request as a generator of forward steps: it yields a Segment, expects its logits set (by
        `forward`, alone or batched with other requests' segments), and returns the EngineResult. The
        request is checked here, before the first step."""
        if not req.input_ids:
            raise ValueError("input_ids is empty")
        if req.embedding_bias is not None and req.embedding_bias.shape != (self.vocab_size,):
            raise ValueError(f"embedding_bias must hold one value per vocabulary entry ({self.vocab_size}), got shape {req.embedding_bias.shape}")
        if req.next_draft_len and self.eagle3 is None:
            raise ValueError("next_draft_len: this engine has no EAGLE-3 head to draft with (deploy with "
                             "speculative.method: eagle3); leave next_draft_len out")
        if req.guide is not None and self.guides is None:
            raise ValueError("guided_decoding_guide_type: this engine was deployed without guided_decoding_backend "
                             "xgrammar (and xgrammar_tokenizer_info_path); leave the guide out")
        # the guide is compiled and replayed over the output in input_ids here: a bad one fails before any step
        guide = None if req.guide is None else EngineGuide(self.guides, req.guide, req.input_ids, req.guide_start)
        if req.draft_ids:
            return self._verify(req, guide)
        if self.medusa is not None and self._medusa_serves(req):
            return self._generate_medusa(req)
        return self._generate(req, guide)

    def _generate(self, req: EngineRequest, guide: EngineGuide | None = None) -> Steps:
        rng = self._rng(req)
        n_in = len(req.input_ids)
        tokens = list(req.input_ids)
        result = EngineResult(tokens, input_len=n_in)
        logits_rows: list[np.ndarray] = []
        log_probs: list[float] = []
        sampling = self._sampling(req)
        head = self.eagle3.begin(tokens) if req.next_draft_len else None
        feats = _Features()
        ended = False
        for step in range(req.output_len):
            need = n_in if step == 0 and req.return_context_logits else 1
            segment, reuse = self._open(tokens, need, head.length if head is not None and step == 0 else None,
                                        capture=head is not None)
            yield segment
            feats.add(segment)
            logits, cache, n_computed = segment.logits, segment.cache, len(segment.tokens)
            if step == 0:
                result.reused_tokens = reuse
                if req.return_context_logits:
                    result.context_logits = logits.cpu().numpy().astype(np.float32)
            result.computed_tokens += n_computed
            raw = logits[-1].cpu().numpy()
            self.cache.put(list(tokens), cache)
            if req.return_generation_logits:
                logits_rows.append(raw)
            row = self._process(raw, tokens, req, step)
            if guide is not None:  # the bitmask, before sampling
                row = guide.mask(row)
                allowed = guide.matcher.last_allowed
                if self.draft_vocab is not None and not np.isfinite(row).any() and not (
                        req.end_id is not None and allowed[req.end_id]):
                    break  # nothing in the draft vocabulary that the grammar allows here: the proposal ends
                row = dead_end(row, allowed, req.end_id, len(tokens) - n_in)
            t = int(row.argmax()) if sampling.greedy else sample(probabilities(row, sampling), rng)
            result.last_token_ns = time.monotonic_ns()
            result.first_token_ns = result.first_token_ns or result.last_token_ns
            if req.end_id is not None and t == req.end_id:
                ended = True
                break  # the end token is not output and not counted
            if guide is not None:
                guide.accept(t)
            tokens.append(t)
            if guide is not None and guide.matcher.terminated:
                break  # the guide accepted a stop token that is not end_id: nothing may follow it
            if req.return_log_probs:  # a softmax over the vocabulary: only when asked
                log_probs.append(self._log_prob(row, t))
            if req.stop_words and find_stop(tokens, req.stop_words, start=n_in) is not None:
                break
            if req.on_tokens is not None and step < req.output_len - 1:  # the last comes with the final answer
                req.on_tokens([t])
        if logits_rows:
            result.generation_logits = np.stack(logits_rows).astype(np.float32)
        if req.return_log_probs:
            result.log_probs = log_probs
        if head is not None and not ended and feats.rows is not None:
            result.next_draft_ids = self.eagle3.finish(head, tokens, feats.start, feats.rows, req.next_draft_len)
        return result

    def _medusa_serves(self, req: EngineRequest) -> bool:
        """Requests the tree walk serves; the others (logits, a guide, an EAGLE-3 draft) step plainly, as exact."""
        return not (req.return_generation_logits or req.return_context_logits or req.guide is not None
                    or req.next_draft_len)

    def _generate_medusa(self, req: EngineRequest) -> Steps:
        """Generation with the Medusa tree: each step computes the last token with the tree the heads proposed from
        the step before, walks the tree with the target's own choices (greedy or sampled: every token is the
        target's, so the output is what target-only decoding gives), and keeps only the accepted path's KV."""
        rng = self._rng(req)
        tree, n_in = self.medusa_tree, len(req.input_ids)
        tokens = list(req.input_ids)
        result = EngineResult(tokens, input_len=n_in)
        sampling = self._sampling(req)
        log_probs: list[float] = []
        hidden = None  # the row the heads propose this step's tree from (None: the prefill)
        while True:
            segment, reuse = self._open(tokens, 1)
            base = len(segment.tokens)  # the committed tokens the cache lacks (the last: the tree's root)
            segment.want_hidden = True
            if hidden is not None:
                segment.proposal = Proposal(hidden)  # sized and appended before the forward (size_trees)
            if not result.computed_tokens:
                result.reused_tokens = reuse
            yield segment
            result.computed_tokens += len(segment.tokens)
            rows = segment.logits.cpu().numpy()
            prop = segment.proposal
            size = prop.size if prop is not None and prop.tokens is not None else 0
            nodes = prop.tokens[:size] if size else []
            # the walk: row 0 is the root's, row 1 + i node i's; a child holding the target's token is accepted
            path: list[int] = []
            picks: list[tuple[int, int]] = []  # (token, the row that chose it)
            node, row = -1, 0
            while True:
                context = tokens + [nodes[i] for i in path]
                p = self._process(rows[row], context, req, len(context) - n_in)
                t = int(p.argmax()) if sampling.greedy else sample(probabilities(p, sampling), rng)
                picks.append((t, row))
                if req.return_log_probs:
                    log_probs.append(self._log_prob(p, t))
                child = next((c for c in tree.children(node, size) if nodes[c] == t), None)
                if child is None:
                    break
                path.append(child)
                node, row = child, child + 1
            if prop is not None and prop.tokens is not None:  # every node whose head ran is scored, verified or not
                self.tree_size.acceptance.score(prop.tokens, [t for t, _ in picks], path)
            # what is emitted: up to output_len, not the end token, up to a stop word
            emitted, ended = [], False
            for t, _ in picks:
                if len(tokens) + len(emitted) - n_in >= req.output_len:
                    break
                if req.end_id is not None and t == req.end_id:
                    ended = True
                    break
                emitted.append(t)
                if req.stop_words and find_stop(tokens + emitted, req.stop_words, start=n_in) is not None:
                    ended = True
                    break
            if prop is not None:
                self.medusa_work.record(len(path), size)
                result.num_drafted += tree.prefix_depth(size)
                result.num_accepted += min(len(path), len(emitted))
            # the cache keeps the committed sequence but its last token: the accepted nodes emitted before it
            kept = path[: max(0, len(emitted) - 1)]
            keep_rows(segment.cache, segment.start + base, kept)
            self.cache.put(tokens + emitted[:-1] if emitted else list(tokens), segment.cache)
            del log_probs[len(tokens) - n_in + len(emitted):]
            tokens.extend(emitted)
            result.last_token_ns = time.monotonic_ns()
            result.first_token_ns = result.first_token_ns or result.last_token_ns
            if ended or not emitted or len(tokens) - n_in >= req.output_len:
                break
            if req.on_tokens is not None:  # the step that finishes comes with the final answer
                req.on_tokens(list(emitted))
            hidden = segment.hidden[picks[len(emitted) - 1][1]]
        if req.return_log_probs:
            result.log_probs = log_probs
        return result

    def _verify(self, req: EngineRequest, guide: EngineGuide | None = None) -> Steps:
        seq, draft = list(req.input_ids), [int(t) for t in req.draft_ids or []]
        k = len(draft)
        need = len(seq) + k if req.return_context_logits else k + 1
        head = self.eagle3.begin(seq) if req.next_draft_len else None
        segment, reuse = self._open(seq + draft, need, None if head is None else head.length, capture=head is not None)
        yield segment
        logits, n_computed = segment.logits, len(segment.tokens)
        self.cache.put(seq + draft, segment.cache, committed=len(seq))
        all_rows = logits.cpu().numpy()
        raw = all_rows[-(k + 1) :]
        rows = np.stack([self._process(raw[i], seq + draft[:i], req, i) for i in range(k + 1)])
        # under a guide every position is masked by the grammar's state after the draft tokens before it
        masks = [] if guide is None else guide_masks(guide, draft)
        for i, allowed in enumerate(masks):
            rows[i, ~allowed] = -np.inf
            start = len(seq) if req.guide_start is None else req.guide_start
            rows[i] = dead_end(rows[i], allowed, req.end_id, len(seq) - start + i)
        sampling = self._sampling(req)
        if sampling.greedy:
            v = verify_greedy(draft, rows.argmax(axis=-1).tolist())
        else:
            rng = self._rng(req)
            p = probabilities(rows, sampling)
            if req.draft_logits is not None and len(req.draft_logits) >= k:
                q_logits = np.array(req.draft_logits[-k:], dtype=np.float64)
                for i, allowed in enumerate(masks[:k]):  # the draft sampled from its masked distribution
                    q_logits[i, ~allowed] = -np.inf
                # a row the guide leaves nothing in (a draft token the grammar refuses, from a draft that was not
                # masked) is q = 0: its token is rejected and the target samples its own there (a softmax of -inf
                # rows is NaN, and a NaN q would accept any token)
                live = np.isfinite(q_logits).any(axis=-1)
                q = np.zeros_like(q_logits)
                q[live] = probabilities(q_logits[live], req.sampling)
                v = verify_rejection(draft, q, p, rng)
            else:
                v = verify_by_target_sample(draft, p, rng)
        new = v.tokens
        ended = req.end_id is not None and req.end_id in new
        if ended:  # the end token ends the sequence, unoutput
            new = new[: new.index(req.end_id)]
        next_draft = None
        if head is not None and not ended:
            next_draft = self.eagle3.finish(head, seq + new, segment.start, segment.features, req.next_draft_len)
        now = time.monotonic_ns()
        return EngineResult(
            seq + new,
            input_len=len(seq),
            generation_logits=raw[: len(new)].astype(np.float32) if req.return_generation_logits and new else None,
            context_logits=all_rows[: len(seq)].astype(np.float32) if req.return_context_logits else None,
            log_probs=[self._log_prob(rows[i], t) for i, t in enumerate(new)] if req.return_log_probs else None,
            num_drafted=k,
            num_accepted=v.num_accepted,
            reused_tokens=reuse,
            computed_tokens=n_computed,
            first_token_ns=now,
            last_token_ns=now,
            next_draft_ids=next_draft,
        )


class _Features:
    """The captured features of a request's consecutive steps, one row per position from `start` on."""

    def __init__(self) -> None:
        self.start: int | None = None
        self.rows: torch.Tensor | None = None

    def add(self, segment: Segment) -> None:
        if segment.features is None:
            return
        if self.rows is None:
            self.start, self.rows = segment.start, segment.features
            return
        have = self.start + self.rows.shape[0]
        if segment.start > have:  # a gap (the prefix cache lost the sequence): the head cannot extend
            self.rows = None
            return
        self.rows = torch.cat([self.rows, segment.features[have - segment.start :]])
