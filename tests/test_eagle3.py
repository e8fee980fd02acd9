"""The shipped EAGLE-3 head for the demo target (trtspec/assets/demo_eagle3), drafting inside the reference engine.

Against the real head: its checkpoint has the keys and shapes TensorRT-LLM / vLLM / SGLang load; through a real
Triton server greedy output is token-identical to target-only (alone and concurrent) while the head's drafts
are accepted, and the responses carry the acceptance statistics.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import load_script
from trtspec.client import Client
from trtspec.config import parse_config
from trtspec.demo_pair import EAGLE3_ASSET_DIR, VOCAB_SIZE
from trtspec.reference_engine import eagle3

MAX_TOKENS = 24
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = [
    CHAT.format("What is the capital of France?"),
    CHAT.format("Write a haiku about the sea."),
    CHAT.format("How do I boil an egg?"),
    CHAT.format("List the planets of the solar system."),
]


def _tensors() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(EAGLE3_ASSET_DIR / eagle3.TENSORS_FILE))


def test_head_store_keeps_one_entry_per_sequence_not_one_per_call():
    # a repeated prompt's calls each borrow its earlier run's longer entry; each call's own entry used to be put
    # beside it, until the store held nothing else
    store = eagle3.HeadStore(4)
    state = lambda n: eagle3.HeadState(torch.zeros(1, n, 2), torch.zeros(1, n, 2))  # noqa: E731
    other = [7, 7, 7]
    store.put(other, state(2))
    store.put([1, 2, 3, 4, 5, 6], state(5))  # the earlier run
    for n in (3, 4, 5):  # the calls of the repeat
        assert store.take([1, 2, 3, 4, 5, 6][:n]).length == n - 1
        store.put([1, 2, 3, 4, 5, 6][:n], state(n - 1))
    store.put([1, 2, 3, 4, 5, 6, 8], state(6))
    assert len(store) == 2  # the repeat's last call's (it extends the earlier run's) and the other prompt's
    assert store.take(other + [9]).length == 2


def test_checkpoint_has_the_layout_the_loaders_read():
    cfg = json.loads((EAGLE3_ASSET_DIR / eagle3.CONFIG_FILE).read_text())
    assert cfg["architectures"] == [eagle3.ARCHITECTURE]
    H, V, Vd = cfg["hidden_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    hd = cfg["head_dim"]
    q, kv, inter = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["intermediate_size"]
    assert (H, V, Vd, cfg["num_hidden_layers"]) == (576, VOCAB_SIZE, 8192, 1)
    # outputs of layers 1, 14, 26: SGLang's spelling (layer outputs) and vLLM's (inputs of layer j)
    assert cfg["eagle_config"][eagle3.AUX_LAYERS_KEY] == [1, 14, 26]
    assert cfg[eagle3.AUX_LAYERS_KEY] == [2, 15, 27]
    want = {
        "fc.weight": (H, 3 * H),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * H),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * H),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, q),
        "midlayer.mlp.gate_proj.weight": (inter, H),
        "midlayer.mlp.up_proj.weight": (inter, H),
        "midlayer.mlp.down_proj.weight": (H, inter),
        "norm.weight": (H,),
        "lm_head.weight": (Vd, H),
        "d2t": (Vd,),
        "t2d": (V,),
    }
    t = _tensors()
    assert {k: tuple(v.shape) for k, v in t.items()} == want  # no embed_tokens: the target's is shared
    assert t["d2t"].dtype == torch.int64 and t["t2d"].dtype == torch.bool
    assert all(v.dtype == torch.float16 for k, v in t.items() if k not in ("d2t", "t2d"))
    target_ids = torch.arange(Vd) + t["d2t"]  # target id = draft id + d2t[draft id]
    assert int(target_ids.min()) >= 0 and int(target_ids.max()) < V
    assert len(set(target_ids.tolist())) == Vd
    assert t["t2d"].sum() == Vd and bool(t["t2d"][target_ids].all())


def test_a_head_for_another_target_is_refused_by_field():
    from types import SimpleNamespace

    cfg = json.loads((EAGLE3_ASSET_DIR / eagle3.CONFIG_FILE).read_text())
    target = SimpleNamespace(num_hidden_layers=30, hidden_size=576, vocab_size=VOCAB_SIZE)
    eagle3.check_against_target(cfg, target, "head")
    with pytest.raises(eagle3.Eagle3Error, match="hidden_size"):
        eagle3.check_against_target(cfg, SimpleNamespace(num_hidden_layers=30, hidden_size=960, vocab_size=VOCAB_SIZE), "head")
    with pytest.raises(eagle3.Eagle3Error, match=eagle3.AUX_LAYERS_KEY):
        eagle3.check_against_target(cfg, SimpleNamespace(num_hidden_layers=16, hidden_size=576, vocab_size=VOCAB_SIZE), "head")


def test_heldout_prompts_are_in_no_prompt_set_and_not_in_training():
    """The held-out evaluation set shares no text, topic or instruction form with the head's training prompts
    (rebuilt exactly: provenance.json's counts) and appears in no prompt set the bench, the demo or the tests send;
    provenance.json records the overlap of those sets with training as it is."""
    audit_mod = load_script("eagle3_prompt_overlap")
    train = audit_mod.training_prompts()
    prov = json.loads((EAGLE3_ASSET_DIR / "provenance.json").read_text())
    kinds = {k: sum(t["kind"] == k for t in train) for k in ("chat", "plain")}
    assert kinds == prov["data"]["by_kind"]  # the rebuild is the data the head was trained on
    audit = audit_mod.audit()
    held = audit["sets"]["heldout"]
    assert held["prompts"] >= 8
    assert not any(held[k] for k in ("exact_training_prompt", "sharing_a_training_topic", "in_a_training_form",
                                     "sharing_4_words_with_a_training_form"))
    heldout = set(audit_mod.heldout_prompts())
    for name, texts in audit_mod.project_prompts().items():
        assert not heldout & set(texts), name
    recorded = prov["prompt_overlap"]["sets"]
    for name, got in audit["sets"].items():
        for key in ("exact_training_prompt", "sharing_a_training_topic", "in_a_training_form",
                    "sharing_4_words_with_a_training_form"):
            assert len(recorded[name][key]) == len(got[key]), (name, key)


def _one_model_loop(engine, prompt: list[int], n: int, k: int) -> tuple[list[int], int, int]:
    """Each call verifies the previous answer's next_draft_ids and asks for the next k: (tokens, drafted, accepted)."""
    from trtspec.reference_engine import EngineRequest

    seq, draft, drafted, accepted = list(prompt), [], 0, 0
    while len(seq) - len(prompt) < n:
        r = engine.run(EngineRequest(seq, len(draft) + 1, draft_ids=draft or None, next_draft_len=k))
        drafted, accepted = drafted + len(draft), accepted + r.num_accepted
        seq, draft = r.tokens, r.next_draft_ids
        assert draft is not None and len(draft) == k
    return seq[len(prompt):][:n], drafted, accepted


def test_in_engine_drafting_is_exact_and_shares_prefixes(demo_pair):
    from trtspec.reference_engine import EngineRequest, ReferenceEngine

    engine = ReferenceEngine(demo_pair.target, device="cpu", eagle3_head=EAGLE3_ASSET_DIR, cache_entries=4)
    with pytest.raises(ValueError, match="next_draft_len"):
        ReferenceEngine(demo_pair.target, device="cpu").steps(EngineRequest([1, 2, 3], 1, next_draft_len=2))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_pair.target)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:2]]
    for prompt in prompts:
        want = engine.run(EngineRequest(prompt, 16)).new_tokens
        got, drafted, accepted = _one_model_loop(engine, prompt, 16, 3)
        assert got == want[:16]
        assert drafted > 0 and accepted > 0
    # a sequence sharing 8 tokens with one served gets the head's entries 0..6 (entry j reads token j+1), lent
    head = engine.eagle3.begin(prompts[1][:8] + [7, 7, 7])
    assert head.length == 7


def test_a_k0_stretch_does_no_head_work_and_the_catch_up_drafts_as_if_it_never_stopped(demo_pair):
    """A call asking no draft (next_draft_len 0) runs the target alone: no capture, no head extension, no draft.
    The next call that asks catches the head up on every position it missed in one batched extension, and drafts
    what a head that never stopped drafts there; greedy output stays the target's."""
    from transformers import AutoTokenizer

    from trtspec.reference_engine import EngineRequest, ReferenceEngine

    tok = AutoTokenizer.from_pretrained(demo_pair.target)
    prompt = tok(PROMPTS[3], add_special_tokens=False)["input_ids"]
    current = ReferenceEngine(demo_pair.target, device="cpu", eagle3_head=EAGLE3_ASSET_DIR)  # asks every call
    paused = ReferenceEngine(demo_pair.target, device="cpu", eagle3_head=EAGLE3_ASSET_DIR)
    want = current.run(EngineRequest(prompt, 20)).new_tokens
    assert current.eagle3.work.captured_rows == 0  # a request asking no draft: the head did nothing at all

    seq, drafts_current = list(prompt), {}
    for _ in range(8):  # the head kept current: a draft asked at every call
        r = current.run(EngineRequest(seq, 1, next_draft_len=3))
        seq = r.tokens
        drafts_current[len(seq)] = r.next_draft_ids
    seq = paused.run(EngineRequest(list(prompt), 1, next_draft_len=3)).tokens
    before = paused.eagle3.work.as_dict()
    for _ in range(6):  # a k = 0 stretch
        seq = paused.run(EngineRequest(seq, 1)).tokens
    assert paused.eagle3.work.as_dict() == before
    r = paused.run(EngineRequest(seq, 1, next_draft_len=3))  # drafting resumes: the catch-up
    work = paused.eagle3.work
    assert work.extended_positions - before["extended_positions"] == 7  # 6 missed positions + this call's own
    assert r.next_draft_ids == drafts_current[len(r.tokens)]
    # greedy output through stretch, catch-up and verification is the target's
    seq, draft, n = list(r.tokens), r.next_draft_ids, 0
    while len(seq) - len(prompt) < 20:
        n += 1
        ask = 0 if n % 3 == 0 else 3  # every third call asks nothing: stretches and catch-ups all along
        r = paused.run(EngineRequest(seq, len(draft) + 1, draft_ids=draft or None, next_draft_len=ask))
        seq, draft = r.tokens, r.next_draft_ids or []
    assert seq[len(prompt):][:20] == want


def test_a_chunked_prefill_gives_the_head_every_rows_features(demo_pair):
    """The batcher splits a long prompt into chunks (max_num_tokens): the head still gets the features of every
    row, in order, and drafts what it drafts after an unchunked prefill."""
    from transformers import AutoTokenizer

    from trtspec.reference_engine.batching import BatchScheduler
    from trtspec.reference_engine import EngineRequest, ReferenceEngine

    tok = AutoTokenizer.from_pretrained(demo_pair.target)
    prompt = tok(PROMPTS[2], add_special_tokens=False)["input_ids"]
    want = ReferenceEngine(demo_pair.target, device="cpu", eagle3_head=EAGLE3_ASSET_DIR).run(
        EngineRequest(prompt, 1, next_draft_len=3))
    engine = ReferenceEngine(demo_pair.target, device="cpu", eagle3_head=EAGLE3_ASSET_DIR)
    scheduler = BatchScheduler(engine, max_batch_size=2, max_num_tokens=len(prompt) // 3 + 1)
    try:
        got = scheduler.submit(EngineRequest(prompt, 1, next_draft_len=3)).result(120)
    finally:
        scheduler.close()
    assert got.tokens == want.tokens and got.next_draft_ids == want.next_draft_ids
    assert engine.eagle3.work.captured_rows == len(prompt)


def test_engine_drafts_what_training_predicts(demo_pair):
    """Train/serve alignment: after each call the engine's draft (capture layers, feature t paired with token t+1,
    the first step after verification, d2t) is the training forward's argmax at that position, step by step
    (a later step compared only where the earlier drafts were the committed tokens, as training feeds those)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtspec.reference_engine import EngineRequest, ReferenceEngine

    train = load_script("train_eagle3")
    engine = ReferenceEngine(demo_pair.target, device="cpu", eagle3_head=EAGLE3_ASSET_DIR)
    tok = AutoTokenizer.from_pretrained(demo_pair.target)
    prompt = tok(PROMPTS[2], add_special_tokens=False)["input_ids"]
    k, seq, draft, calls = 3, list(prompt), [], []
    while len(seq) - len(prompt) < 20:
        r = engine.run(EngineRequest(seq, len(draft) + 1, draft_ids=draft or None, next_draft_len=k))
        seq, draft = r.tokens, r.next_draft_ids
        calls.append((len(seq), draft))
    model = AutoModelForCausalLM.from_pretrained(str(demo_pair.target), dtype=torch.float32).eval()
    head, layers = eagle3.load_head(EAGLE3_ASSET_DIR, model)
    cap = train.Capture(model, layers)
    n = len(seq) - 1
    preds = []
    with torch.no_grad():
        last = model.model(input_ids=torch.tensor([seq])).last_hidden_state[:, :n]
        train.ttt_forward(head, torch.tensor([seq]), cap.stacked()[:, :n], last, torch.ones(1, n),
                          torch.ones(1, n, dtype=torch.bool), head.lm_head.weight, k, 0.8, preds)
    compared = [0] * k
    for length, d in calls:
        for s in range(k):
            if length + s > n or (s > 0 and d[s - 1] != seq[length + s - 1]):
                break
            # the draft after `length` committed tokens comes from the entry at position length-2
            assert d[s] == int(head.to_target(preds[s][0, length - 2])), (length, s)
            compared[s] += 1
    assert compared[0] >= 5 and compared[1] >= 1


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from trtspec.repository import generate_repository
    from trtspec.server import ServerOptions, create_server

    cfg = parse_config(
        {
            "name": "test-eagle3",
            "engine": "reference",
            "device": "cpu",
            "target": {"checkpoint": "demo:target", "dtype": "float32"},
            "draft": {"checkpoint": "demo:eagle3", "dtype": "float32"},
            # drafting pauses above 2 requests in flight: concurrent requests run k = 0 stretches and catch up
            "speculative": {"method": "eagle3", "max_draft_len": 8, "num_draft_tokens": 3, "max_concurrency": 2,
                            "draft_length_policy": "fixed"},
            "limits": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 320},
            "triton": {"speculative_instance_count": 2},
        }
    )
    repo = generate_repository(cfg, tmp_path_factory.mktemp("repo") / "model_repository")
    assert not (repo / "tensorrt_llm_draft").exists()  # the head drafts inside the target engine
    with create_server(ServerOptions(repo, http_port="auto", grpc_port="auto", metrics_port="auto")) as s:
        s.wait_ready(300)
        yield s


def _client(server, model="ensemble"):
    return Client(server.endpoints.http_address, "http", model)


@pytest.fixture(scope="module")
def baseline(server):
    client = _client(server, "baseline")
    return [client.generate(p, MAX_TOKENS).token_ids for p in PROMPTS]


@pytest.mark.slow
def test_greedy_identical_alone_and_concurrent(server, baseline):
    client = _client(server)
    alone = [client.generate(p, MAX_TOKENS, num_draft_tokens=3) for p in PROMPTS]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: client.generate(p, MAX_TOKENS, num_draft_tokens=3), PROMPTS))
    for gens in (alone, together):
        assert [g.token_ids for g in gens] == baseline
    drafted = sum(g.stats.total_draft_tokens for g in alone)
    accepted = sum(g.stats.total_accepted_draft_tokens for g in alone)
    assert drafted > 0 and accepted > 0  # the head drafts, and the target keeps some of it


@pytest.mark.slow
def test_response_reports_acceptance(server):
    g = _client(server).generate(PROMPTS[0], MAX_TOKENS, stream=True, num_draft_tokens=3)
    s = g.stats
    assert s.total_draft_tokens > 0
    assert s.acceptance_rate == pytest.approx(s.total_accepted_draft_tokens / s.total_draft_tokens, abs=1e-6)
    # a chunk per target call: its accepted drafts and one token of its own (the last may stop short)
    calls = [(0, 0, 0)] + [(c.stats.num_iterations, c.stats.total_accepted_draft_tokens, len(c.token_ids)) for c in g.chunks]
    assert all((i - pi, n) == (1, a - pa + 1) for (pi, pa, _), (i, a, n) in zip(calls[:-2], calls[1:-1])), calls
    assert sum(s.accepted_per_position) == s.total_accepted_draft_tokens
    assert s.accepted_by_source[0] == s.total_accepted_draft_tokens  # "model": the deployment's drafter


def _head_work(server) -> dict[str, float]:
    from trtspec.bench.metrics import scrape, value
    from trtspec.spec.metrics import ENGINE_EAGLE3_HEAD_COUNTER
    from trtspec.reference_engine.eagle3 import HeadWork

    samples = scrape(server.endpoints.metrics)
    return {kind: value(samples, ENGINE_EAGLE3_HEAD_COUNTER, model="tensorrt_llm", kind=kind) for kind in HeadWork().as_dict()}


@pytest.mark.slow
def test_a_k0_stretch_sends_the_target_the_baselines_work(server, baseline):
    """num_draft_tokens 0 on the speculative endpoint: every call is a plain target step asking no draft, so the
    engine's head does nothing (its work counters stay put) and the answer is the baseline's."""
    before = _head_work(server)
    g = _client(server).generate(PROMPTS[1], MAX_TOKENS, num_draft_tokens=0)
    assert g.token_ids == baseline[1] and g.stats.total_draft_tokens == 0
    assert _head_work(server) == before
    _client(server).generate(PROMPTS[1], MAX_TOKENS, num_draft_tokens=3)
    after = _head_work(server)
    assert after["captured_rows"] > before["captured_rows"] and after["drafted_tokens"] > before["drafted_tokens"]


@pytest.mark.slow
def test_drafting_resumed_after_a_load_pause_catches_up_and_stays_greedy_identical(server, baseline):
    """Three requests in flight (> max_concurrency 2): each runs plain steps that ask the head nothing; when the
    shorter ones end, the longest drafts again, its head catching up on every position it missed."""
    client = _client(server)
    lengths = [4, 10, MAX_TOKENS]
    with ThreadPoolExecutor(3) as pool:
        gens = list(pool.map(lambda i: client.generate(PROMPTS[i], lengths[i], num_draft_tokens=3), range(3)))
    for i, g in enumerate(gens):
        assert g.token_ids == baseline[i][: lengths[i]]
    longest = gens[2].stats
    assert longest.load_paused_iterations > 0 and longest.total_draft_tokens > 0
