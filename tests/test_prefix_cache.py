"""The reference engine's prefix cache: bounded in bytes, least recently used first, prefixes shared as views.

Tiny models and hand-made caches, no Triton: these run in seconds.
"""

import time

import pytest
import torch
from transformers import DynamicCache

from trtspec.config import ConfigError, parse_config
from trtspec.reference_engine import EngineRequest, PrefixCache, ReferenceEngine, cache_nbytes

LAYERS, HEADS, DIM = 2, 2, 4
BYTES_PER_TOKEN = LAYERS * 2 * HEADS * DIM * 4  # keys + values, float32


def make_cache(n: int, fill: float = 0.0) -> DynamicCache:
    cache = DynamicCache()
    for layer in range(LAYERS):
        kv = torch.full((1, HEADS, n, DIM), fill) + torch.arange(n, dtype=torch.float32)[None, None, :, None]
        cache.update(kv.clone(), -kv, layer)
    return cache


def layer_tensors(cache) -> list[torch.Tensor]:
    if hasattr(cache, "layers"):
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return [*cache.key_cache, *cache.value_cache]


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_cache_nbytes_counts_keys_and_values():
    assert cache_nbytes(make_cache(10)) == 10 * BYTES_PER_TOKEN


def test_bytes_bound_evicts_least_recently_used():
    pc = PrefixCache(max_entries=100, max_bytes=25 * BYTES_PER_TOKEN)  # room for two 10-token entries
    a, b, c = [1] * 10, [2] * 10, [3] * 10
    pc.put(a, make_cache(10))
    pc.put(b, make_cache(10))
    assert len(pc) == 2 and pc.nbytes == 20 * BYTES_PER_TOKEN
    shared, n = pc.take(a[:5] + [9])  # a hit that shares a's prefix: counts as use of a, a stays held
    assert n == 5 and shared.get_seq_length() == 5 and len(pc) == 2
    pc.put(c, make_cache(10))  # over the budget: b is now the least recently used
    assert len(pc) == 2 and pc.nbytes <= pc.max_bytes
    assert pc.take(b) == (None, 0)
    assert pc.take(a)[1] == 10 and pc.take(c)[1] == 10  # the own entries are taken out...
    assert len(pc) == 0 and pc.nbytes == 0  # ...and no longer counted


def test_entry_larger_than_budget_is_not_kept_and_zero_keeps_nothing():
    pc = PrefixCache(max_entries=8, max_bytes=5 * BYTES_PER_TOKEN)
    pc.put([1] * 4, make_cache(4))
    pc.put([2] * 10, make_cache(10))
    assert len(pc) == 0 and pc.nbytes == 0
    none = PrefixCache(max_entries=8, max_bytes=0)
    none.put([1], make_cache(1))
    assert len(none) == 0


def test_shared_prefix_is_views_not_a_copy_and_the_owner_stays_intact():
    pc = PrefixCache(max_entries=8)
    owner = make_cache(12, fill=1.0)
    before = [t.clone() for t in layer_tensors(owner)]
    pc.put(list(range(12)), owner, committed=12)
    shared, n = pc.take(list(range(6)) + [99, 98])
    assert n == 6 and shared is not owner and len(pc) == 1
    for s, o in zip(layer_tensors(shared), layer_tensors(owner)):
        assert s.shape[-2] == 6 and s.data_ptr() == o.data_ptr()  # same storage: nothing copied
    # the sharer grows and crops its cache as a request does; the owner's tensors must not change
    for layer in range(LAYERS):
        shared.update(torch.full((1, HEADS, 2, DIM), -7.0), torch.full((1, HEADS, 2, DIM), -7.0), layer)
    shared.crop(-3)
    assert shared.get_seq_length() == 5
    assert all(torch.equal(t, b) for t, b in zip(layer_tensors(owner), before))
    own, m = pc.take(list(range(12)) + [5])
    assert own is owner and m == 12


def test_a_sequence_takes_its_own_entry_over_a_longer_one_it_could_only_borrow():
    pc = PrefixCache(max_entries=8)
    earlier = make_cache(12, fill=1.0)
    pc.put(list(range(12)), earlier, committed=12)  # an earlier run of the same tokens, and more
    own = make_cache(6)
    pc.put(list(range(6)), own, committed=6)  # this request's, after its last step
    # its next step computes token 6: both offer the 6 positions it can use, and its own is taken, not a view lent
    taken, n = pc.take(list(range(7)), limit=6)
    assert taken is own and n == 6
    assert len(pc) == 1  # the earlier run's entry stays for others


def test_an_entry_that_a_later_one_extends_is_replaced_not_kept_twice():
    pc = PrefixCache(max_entries=8)
    pc.put(list(range(12)), make_cache(12))
    pc.put([7, 8], make_cache(2))
    pc.put(list(range(14)), make_cache(14))
    assert sorted(len(e.tokens) for e in pc._entries.values()) == [2, 14]
    assert pc.nbytes == 16 * BYTES_PER_TOKEN


def test_a_repeated_prompt_keeps_one_entry_and_evicts_no_other(tiny_target):
    # greedy, a repeated prompt runs through the tokens its earlier run left in the cache: every step could borrow
    # the earlier entry's prefix, and each step's own entry was put beside it until the cache was full of them
    eng = ReferenceEngine(tiny_target, device="cpu", cache_entries=8)
    a, b = [0, 3, 4, 3, 5, 6, 7, 2, 8], [9, 10, 11, 1, 2]
    first = eng.run(EngineRequest(list(a), output_len=12))
    eng.run(EngineRequest(list(b), output_len=4))
    again = eng.run(EngineRequest(list(a), output_len=12))
    assert again.tokens == first.tokens and again.reused_tokens == len(a) - 1
    assert len(eng.cache) == 2
    assert eng.run(EngineRequest(list(b), output_len=4)).reused_tokens == len(b) - 1


@pytest.fixture(scope="module")
def engines(tiny_target):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield {
        "unbounded": ReferenceEngine(tiny_target, device="cpu"),
        "tight": ReferenceEngine(tiny_target, device="cpu", cache_bytes=3000),  # evicts on nearly every put
        "none": ReferenceEngine(tiny_target, device="cpu", cache_bytes=0),
    }
    torch.set_num_threads(threads)


def test_greedy_outputs_unchanged_by_the_bound_and_by_sharing(engines):
    system = [0, 3, 4, 3, 5, 6, 7]
    prompts = [system + [2, 8], system + [9, 10, 11], system + [2, 8, 4]]
    results = {}
    for name, eng in engines.items():
        out = []
        for p in prompts:  # interleaved: later prompts share the system prefix of earlier requests
            first = eng.run(EngineRequest(list(p), output_len=4))
            verify = eng.run(EngineRequest(first.tokens, output_len=4, draft_ids=first.new_tokens[:2] + [1, 2]))
            out.append((first.tokens, verify.tokens))
        results[name] = out
        assert eng.cache.max_bytes is None or eng.cache.nbytes <= eng.cache.max_bytes
    assert results["tight"] == results["unbounded"] == results["none"]
    # the unbounded engine reused the shared system prompt; the one keeping nothing recomputed everything
    assert engines["unbounded"].run(EngineRequest(system + [6], output_len=1)).reused_tokens == len(system)
    assert engines["none"].run(EngineRequest(system + [6], output_len=1)).reused_tokens == 0


def test_config_budget_is_validated_with_the_fix():
    base = {"target": {"checkpoint": "demo:target"}, "speculative": {"draft_source": "ngram"}}
    ok = parse_config({**base, "target": {"checkpoint": "demo:target", "kv_cache_max_bytes": "512MiB"}})
    assert ok.target.kv_cache_max_bytes == 512 * 1024**2
    with pytest.raises(ConfigError, match=r"target.kv_cache_max_bytes: 'lots': not a size.*like 256MiB or 2GB"):
        parse_config({**base, "target": {"checkpoint": "demo:target", "kv_cache_max_bytes": "lots"}})
    with pytest.raises(ConfigError, match=r"kv_cache_max_bytes applies to engine: reference.*kv_cache_free_gpu_mem_fraction"):
        parse_config({**base, "engine": "tensorrt_llm", "target": {"checkpoint": "demo:target", "kv_cache_max_bytes": "1GB"}})


def test_default_budget_holds_a_full_batch_of_max_seq_len(tiny_target, tmp_path):
    """Without kv_cache_max_bytes the engine gets a budget in tokens (max_batch_size x max_seq_len) and sizes it
    with its own KV bytes per token: a full batch of long streams keeps its caches between iterations."""
    from trtspec.repository import generate_repository

    cfg = parse_config({"engine": "reference", "device": "cpu", "target": {"checkpoint": str(tiny_target)},
                        "speculative": {"draft_source": "ngram"},
                        "limits": {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 80}})
    config = (generate_repository(cfg, tmp_path / "repo") / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'key: "kv_cache_max_tokens"\n  value {\n    string_value: "320"' in config
    assert "kv_cache_max_bytes" not in config
    engine = ReferenceEngine(tiny_target, device="cpu", cache_tokens=320)
    per_token = engine.kv_bytes_per_token()
    cfg_model = engine.model.config
    kv_heads = getattr(cfg_model, "num_key_value_heads", cfg_model.num_attention_heads)
    assert per_token == 2 * cfg_model.num_hidden_layers * kv_heads * (cfg_model.hidden_size // cfg_model.num_attention_heads) * 4
    assert engine.cache.max_bytes == 320 * per_token


def test_evictions_hand_memory_back_once_per_burst_not_per_eviction(monkeypatch):

    import trtspec.reference_engine.prefix_cache as engine_module

    if engine_module._malloc_trim() is None:
        pytest.skip("not glibc: no malloc_trim")
    calls = []
    trim = engine_module._DeferredTrim(0.2, action=lambda: calls.append(time.monotonic()))
    monkeypatch.setattr(engine_module, "_TRIM", trim)
    pc = PrefixCache(max_entries=1)
    t0 = time.monotonic()
    for i in range(6):  # five evictions in a burst
        pc.put([i], make_cache(1))
    assert calls == []  # deferred, not run at an eviction
    wait_until(lambda: calls)
    assert calls[0] - t0 >= 0.2
    time.sleep(0.5)  # nothing more was evicted: no second trim
    assert len(calls) == 1  # one trim for the whole burst
    pc.put([9], make_cache(1))
    wait_until(lambda: len(calls) == 2)  # a later eviction gets its own


def test_engine_cache_writes_in_place_and_copies_once_shared():
    """The engine's KV layers (kv_cache.GrowingLayer) write a step's positions into their buffer; once a prefix is
    lent as views, lender and borrower each copy on their next write, so neither sees the other's positions."""
    from transformers import LlamaConfig

    from trtspec.reference_engine import share_prefix
    from trtspec.reference_engine.kv_cache import new_cache

    config = LlamaConfig(num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS, hidden_size=HEADS * DIM)
    kv = lambda n, fill: torch.full((1, HEADS, n, DIM), float(fill))  # noqa: E731
    owner = new_cache(config)
    for layer in range(LAYERS):
        owner.update(kv(5, 1), kv(5, -1), layer)
    ptr = owner.layers[0].keys.data_ptr()
    for layer in range(LAYERS):
        owner.update(kv(1, 2), kv(1, -2), layer)
    assert owner.layers[0].keys.data_ptr() == ptr and owner.get_seq_length() == 6  # in place, no copy
    owner.crop(-1)  # the step rejected: the next write reuses the position
    for layer in range(LAYERS):
        owner.update(kv(1, 3), kv(1, -3), layer)
    assert owner.layers[0].keys.data_ptr() == ptr and owner.layers[0].keys[0, 0, 5, 0] == 3
    before = [t.clone() for t in layer_tensors(owner)]
    borrower = share_prefix(owner, 4)
    assert borrower.layers[0].keys.data_ptr() == ptr  # lent as views
    for layer in range(LAYERS):
        borrower.update(kv(3, 7), kv(3, -7), layer)
    assert all(torch.equal(t, b) for t, b in zip(layer_tensors(owner), before))
    assert borrower.layers[0].keys[0, 0, :, 0].tolist() == [1, 1, 1, 1, 7, 7, 7]
    owner.update(kv(1, 9), kv(1, -9), 1)  # the lender's write copies too: the borrower's views stay as they were
    assert borrower.layers[1].keys[0, 0, :, 0].tolist() == [1, 1, 1, 1, 7, 7, 7]
    assert owner.layers[1].keys[0, 0, :, 0].tolist() == [1, 1, 1, 1, 1, 3, 9]
