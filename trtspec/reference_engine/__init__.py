"""The reference engine: a Hugging Face causal LM with the semantics of TensorRT-LLM's executor.

One call = one TensorRT-LLM request:
  * without draft tokens: generate up to `output_len` tokens (greedy or sampled);
  * with draft tokens: verify all of them in ONE forward pass over sequence + draft and return
    the accepted prefix plus one target token (greedy comparison, token comparison under
    sampling, or rejection sampling against the draft's logits).

What TensorRT-LLM's executor does, this does (the reasons are cited where they are applied):
  * the end token ends the sequence and is never part of the output or of its length
    (externalDraftTokensKernels.cu: "Do not increase seq len when EOS is generated"): a verify whose
    next target token is the end token returns the input plus the accepted prefix only, and one whose
    first token is the end token returns the input unchanged; stop words stay in the output;
  * the logits of each step go through penaltyKernels.cu's order: + embedding_bias, x / temperature,
    then for every token already in prompt + output: repetition (divide a positive logit, multiply a
    negative one), presence (subtract once), frequency (subtract count x penalty); then the end token
    is masked while fewer than min_tokens were generated; then bad words are masked; then top-k/top-p;
  * output log probs are log-softmax of those processed logits at the chosen token (full vocabulary);
    generation and context logits are the model's raw logits, as the engine gathers them.

Prefix KV-cache reuse plays the role of TensorRT-LLM's enable_kv_cache_reuse: the loop resends
the whole running sequence every iteration, so each call only computes the tokens that are new
since the longest cached prefix.

A request is a generator of forward steps (`steps`); `run` serves one alone, and trtspec.reference_engine.batching's scheduler
steps many together, one forward pass over all of them per step (the executor's in-flight batching).

Modules: engine (ReferenceEngine: the forward and the request's steps), request (EngineRequest,
EngineResult), prefix_cache (PrefixCache, share_prefix, memory release), tensor_io (the tensorrtllm
backend's tensors in and out), device (device, precision, CPU tuning), draft_vocab (a draft's reduced
vocabulary), limits (the step against the machine's weight-streaming limit: trtspec bench-engine).
"""

from trtspec.reference_engine.device import Precision, choose_precision, cpu_flags, pick_device, tune_for_cpu
from trtspec.reference_engine.draft_vocab import DRAFT_VOCAB_FILE, draft_head, load_draft_vocab
from trtspec.reference_engine.engine import ReferenceEngine
from trtspec.reference_engine.prefix_cache import PrefixCache, cache_nbytes, release_memory, share_prefix
from trtspec.reference_engine.request import TOKENS_PER_BLOCK, EngineRequest, EngineResult, Steps
from trtspec.reference_engine.tensor_io import (
    DEFAULTS,
    UNSUPPORTED_INPUTS,
    RequestTensorError,
    TensorGetter,
    request_from_tensors,
    result_tensors,
    run_tensors,
)

__all__ = [
    "DEFAULTS",
    "DRAFT_VOCAB_FILE",
    "TOKENS_PER_BLOCK",
    "UNSUPPORTED_INPUTS",
    "EngineRequest",
    "EngineResult",
    "Precision",
    "PrefixCache",
    "ReferenceEngine",
    "RequestTensorError",
    "Steps",
    "TensorGetter",
    "cache_nbytes",
    "choose_precision",
    "cpu_flags",
    "draft_head",
    "load_draft_vocab",
    "pick_device",
    "release_memory",
    "request_from_tensors",
    "result_tensors",
    "run_tensors",
    "share_prefix",
    "tune_for_cpu",
]
