"""speculative.method: medusa: the head set against its target, the engine-flow plan against NVIDIA's parsers, the
refusal on the LLM API, and the reference engine's tree verify (exact, and only the accepted path's KV is kept).

NVIDIA sources of the flags and parameters checked here: docs/medusa.md.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from trtspec import medusa
from trtspec.config import ConfigError, parse_config

try:
    from tests.test_build_plan import TOOLS, TRTLLM_BUILD_FLAGS, check_argv, tool_of
    from tests.test_checkpoint import LLAMA_31_8B, SMOLLM2_135M, example_config, make_checkpoint
except ImportError:  # tests/ on sys.path instead of the repo root
    from test_build_plan import TOOLS, TRTLLM_BUILD_FLAGS, check_argv, tool_of  # type: ignore[no-redef]
    from test_checkpoint import LLAMA_31_8B, SMOLLM2_135M, example_config, make_checkpoint  # type: ignore[no-redef]

# Source: NVIDIA/TensorRT-LLM examples/medusa/convert_checkpoint.py, parse_arguments, as stored at 063e02f7 and
# b93e14ca (the second adds --model_type); flags trtspec does not pass are left out unless they share a prefix.
MEDUSA_CONVERT_FLAGS: dict[str, dict] = {
    "--model_dir": {"type": "str"}, "--meta_ckpt_dir": {"type": "str"}, "--tp_size": {"type": "int"},
    "--pp_size": {"type": "int"}, "--dtype": {"type": "str", "choices": ["float32", "bfloat16", "float16"]},
    "--vocab_size": {"type": "int"}, "--n_positions": {"type": "int"}, "--n_layer": {"type": "int"},
    "--use_weight_only": {"type": "flag"}, "--calib_dataset": {"type": "str"}, "--smoothquant": {"type": "float"},
    "--per_channel": {"type": "flag"}, "--per_token": {"type": "flag"}, "--int8_kv_cache": {"type": "flag"},
    "--per_group": {"type": "flag"}, "--load_by_shard": {"type": "flag"}, "--hidden_act": {"type": "str"},
    "--rotary_base": {"type": "float"}, "--group_size": {"type": "int"}, "--use_parallel_embedding": {"type": "flag"},
    "--embedding_sharding_dim": {"type": "int", "choices": [0, 1]}, "--output_dir": {"type": "str"},
    "--workers": {"type": "int"}, "--num_medusa_heads": {"type": "int"}, "--num_medusa_layers": {"type": "int"},
    "--max_medusa_token_len": {"type": "int"}, "--medusa_hidden_act": {"type": "str"},
    "--medusa_model_dir": {"type": "str"},
}  # fmt: skip

H = 576


def write_heads(dest: Path, n: int = 3, hidden: int = H, vocab: int | None = None, seed: int = 0, scale: float = 0.02) -> Path:
    """A Medusa head set in the layout TensorRT-LLM reads (vocab None: sharing the target's LM head)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    t = {}
    for h in range(n):
        t[f"{h}.0.linear.weight"] = (torch.randn(hidden, hidden, generator=g) * scale).half()
        t[f"{h}.0.linear.bias"] = torch.zeros(hidden).half()
        if vocab is not None:
            t[f"{h}.1.weight"] = (torch.randn(vocab, hidden, generator=g) * scale).half()
    dest.mkdir(parents=True, exist_ok=True)
    save_file(t, str(dest / medusa.TENSORS_FILE))
    cfg = {"medusa_num_heads": n, "medusa_num_layers": 1, "hidden_size": hidden}
    if vocab is None:
        cfg["lm_head"] = medusa.SHARED_LM_HEAD
    (dest / medusa.CONFIG_FILE).write_text(json.dumps(cfg))
    return dest


# ------------------------------------------------------------------------------------------ tree and config


def test_tree_follows_medusa_choices_and_the_backend_format():
    tree = medusa.Tree.from_choices([[0], [0, 0], [1], [0, 0, 0], [0, 1]])
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (0, 0, 0))
    assert tree.parent == (-1, -1, 0, 0, 2) and tree.depth == (1, 1, 2, 2, 3) and tree.topk == (2, 2, 1)
    assert tree.tokens([[10, 11], [20, 21], [30]]) == [10, 11, 20, 21, 30]
    text = medusa.to_pbtxt(tree.paths)
    assert text == "{0}, {1}, {0, 0}, {0, 1}, {0, 0, 0}"  # tensorrtllm_backend's csvStrToVecVecInt format
    assert medusa.from_pbtxt(text) == [list(p) for p in tree.paths]
    # the walk: the target's token after the root is 11 (node 1), then 99 (no child holds it)
    assert medusa.accept(tree, [10, 11, 20, 21, 30], lambda row: {0: 11, 2: 99}[row]) == [1]
    assert medusa.accept(tree, [10, 11, 20, 21, 30], lambda row: {0: 10, 1: 21, 4: 5}[row]) == [0, 3]
    with pytest.raises(medusa.MedusaError, match="parent"):
        medusa.Tree.from_choices([[0], [1, 0]])


def _sizer(step_s, hit: bool, scores: int = 200):
    """The default tree's TreeSize with `scores` walks that accepted every node (hit) or none, and steps timed at
    1..64 rows as step_s(rows) seconds."""
    from trtspec.reference_engine.tree_size import TreeSize

    tree = medusa.Tree.from_choices(medusa.DEFAULT_CHOICES)
    size = TreeSize(tree)
    tokens = [10, 11, 20, 21, 30]
    for _ in range(scores):  # a walk down [0], [0, 0], [0, 0, 0], or off at the root
        size.acceptance.score(tokens, [10, 20, 30, 99] if hit else [99], [0, 2, 4] if hit else [])
    for rows in range(1, 65):
        for _ in range(2):  # the first step of a row count runs cold: not kept
            size.costs.record(rows, step_s(rows))
    size.record_heads(1, 1, step_s(1) * 0.01)
    return tree, size


def test_tree_size_from_acceptance_and_the_cost_of_rows():
    cheap = lambda rows: 0.05 + 0.0005 * rows  # noqa: E731  memory-bound: a row adds 1% of a step
    dear = lambda rows: 0.05 * rows  # noqa: E731  compute-bound: a row costs a step
    tree, size = _sizer(cheap, hit=True)
    assert [size.choose([1] * b).nodes for b in (1, 4, 8)] == [len(tree)] * 3  # accepted and cheap: the whole tree
    _, size = _sizer(dear, hit=True)
    assert size.choose([1]).nodes == 0 and size.choose([1] * 8, other_rows=8, other_tokens=8).nodes == 0
    _, size = _sizer(cheap, hit=False)
    assert size.choose([1]).nodes == 0  # never accepted: the root alone, a plain step
    # every EXPLORE_EVERY-th choice runs one head deeper, so that head's nodes are scored, and verifies the
    # choice alone: a deeper tree's rows are not paid for to learn its acceptance
    from trtspec.reference_engine.tree_size import EXPLORE_EVERY, Sizing, TreeSize

    picks = [size.choose([1]) for _ in range(2 * EXPLORE_EVERY)]
    assert picks.count(Sizing(0, 1)) == 2 and picks.count(Sizing(0, 0)) == 2 * EXPLORE_EVERY - 2
    # the explored head's nodes are scored from the root's row: a step that verified nothing but ran head 1
    explored = TreeSize(tree)
    explored.acceptance.score(tree.tokens([[10, 11]]), [10], [])  # head 1's best two: nodes [0] and [1]
    assert explored.acceptance.seen[:2].tolist() == [1.0, 1.0] and explored.acceptance.hits[:2].tolist() == [1.0, 0.0]
    # a tree is verified for a gain beyond the readings' noise (TREE_MARGIN), else the root alone
    from trtspec.reference_engine.tree_size import TREE_MARGIN

    size.rates = lambda *a: [10.0, 10.0 * (1 + TREE_MARGIN / 2), 9.0, 8.0, 7.0, 6.0]
    assert size.choose([1, 1]).nodes == 0
    size.rates = lambda *a: [10.0, 10.0 * (1 + 2 * TREE_MARGIN), 9.0, 8.0, 7.0, 6.0]
    assert size.choose([1, 1]).nodes == 1
    # nothing timed yet: the whole tree, then the row count farthest from it, then a choice
    fresh = TreeSize(tree)
    assert fresh.choose([1]) == Sizing(len(tree), max(tree.depth))
    fresh.costs.record(1 + len(tree), 0.3)  # cold: not kept, and the whole tree is timed again
    assert fresh.choose([1]) == Sizing(len(tree), max(tree.depth))
    fresh.costs.record(1 + len(tree), 0.1)
    assert fresh.choose([1]).nodes == 0
    fresh.costs.record(1, 0.09)
    fresh.costs.record(1, 0.05)
    assert fresh.rates([1]) is not None


def test_heads_sharing_the_lm_head_run_together_in_products_of_the_rows_a_step_takes_at_one_rows_cost(engines):
    # Measured on the demo target (compiled kernels, one thread): its steps cost the same from 1 to 4 rows, and one
    # LM-head product per head made two heads cost 12.2 ms and three 18.6 where one product of their rows costs 6.6
    # and 6.9: a quarter of a step at one in flight. The heads' rows go through it in products of as many rows as
    # a step takes at about one row's cost, and the sizing prices the heads by those products.
    import torch

    from trtspec.reference_engine.tree_size import TreeSize

    tree = medusa.Tree.from_choices(medusa.DEFAULT_CHOICES)
    size = TreeSize(tree)
    assert size.product_rows() == 1  # nothing timed: a product per head's rows
    for rows in range(1, 9):
        for _ in range(2):
            size.costs.record(rows, 0.040 if rows <= 4 else 0.010 * rows)
    assert size.product_rows() == 4
    assert [size.products(1, d) for d in (1, 2, 3)] == [1, 1, 1]
    assert [size.products(2, 3), size.products(4, 3), size.products(8, 2)] == [2, 3, 2]
    size.record_heads(1, 3, 0.007)
    assert size.heads_seconds(1, 3) == pytest.approx(0.007) and size.heads_seconds(1, 0) == 0.0
    assert size.heads_seconds(4, 3) == pytest.approx(3 * 0.007)  # priced at the nearest batch timed, by products
    # the tokens are each head's own, whatever the products
    _, with_heads = engines
    engine = with_heads["demo"]
    hidden = torch.randn(3, engine.model.config.hidden_size)
    shared = engine._head
    alone = engine.medusa.top(hidden, [2, 1, 1], shared, 1)
    assert engine.medusa.top(hidden, [2, 1, 1], shared, 9) == alone
    assert engine.medusa.top(hidden, [2, 1, 1], None, 4) == alone


def test_a_row_counts_first_step_runs_cold_and_does_not_price_it():
    # The demo target's first step of a shape ran at 45 ms for one row whose later steps took 32, and at 104 ms for
    # three rows against 32 (one torch thread, compiled kernels). A tree size not chosen is not timed again, so one
    # cold timing held the engine at one tree size, or none, for a whole run: 0.97x to 1.39x target-only from run to
    # run in process. A row count's first step is not kept.
    from trtspec.reference_engine.tree_size import StepCosts

    costs = StepCosts()
    costs.record(3, 0.104)
    assert costs.seconds(3) is None
    costs.record(3, 0.032)
    costs.record(1, 0.045)
    costs.record(1, 0.032)
    assert costs.seconds(3) == pytest.approx(0.032) and costs.seconds(1) == pytest.approx(0.032)


def _medusa_config(heads: Path, target: Path, **spec) -> dict:
    return {
        "name": "m", "engine": "reference", "device": "cpu",
        "target": {"checkpoint": str(target), "dtype": "float32"},
        "draft": {"checkpoint": str(heads), "dtype": "float32"},
        "speculative": {"method": "medusa", **spec},
    }


def test_config_refuses_what_medusa_cannot_do(tmp_path):
    heads, target = write_heads(tmp_path / "heads"), make_checkpoint(tmp_path / "t", SMOLLM2_135M)
    parse_config(_medusa_config(heads, target))
    with pytest.raises(ConfigError, match="max_draft_len"):
        parse_config(_medusa_config(heads, target, max_draft_len=2, medusa_choices=[[0], [1], [0, 0]]))
    with pytest.raises(ConfigError, match="draft_source"):
        parse_config(_medusa_config(heads, target, draft_source="ngram"))
    with pytest.raises(ConfigError, match="method medusa only"):
        parse_config({**_medusa_config(heads, target), "speculative": {"method": "eagle3", "medusa_choices": [[0]]}})
    # the LLM API parses MedusaDecodingConfig but its PyTorch backend does not run it: refused by name
    with pytest.raises(ConfigError, match=r"medusa with engine: llmapi.*PyTorch backend does not run Medusa"):
        parse_config({**_medusa_config(heads, target), "engine": "llmapi"})


def test_a_head_set_for_another_target_is_refused_by_field(tmp_path):
    from trtspec.checkpoint import check_medusa_heads, inspect_checkpoint

    target = inspect_checkpoint(make_checkpoint(tmp_path / "t", SMOLLM2_135M))

    def codes(heads: Path, choices=None, engine="reference") -> set[str]:
        return {c for _, c, _ in check_medusa_heads(target, inspect_checkpoint(heads), choices, engine)}

    assert codes(write_heads(tmp_path / "ok")) == set()
    assert codes(write_heads(tmp_path / "wide", hidden=640)) == {"medusa-hidden-size"}
    assert codes(write_heads(tmp_path / "vocab", vocab=32000)) == {"medusa-vocab"}
    assert codes(write_heads(tmp_path / "ok"), [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]) == {"medusa-choices"}
    assert codes(write_heads(tmp_path / "ok"), engine="tensorrt_llm") == {"medusa-lm-head"}  # NVIDIA needs its own
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    assert codes(tmp_path / "empty") == {"medusa-layout"}


# ------------------------------------------------------------------------------------------ engine flow


def test_engine_flow_plan_converts_with_the_heads_and_builds_medusa(tmp_path):
    from trtspec.machine import synthetic_machine
    from trtspec.pipeline.plan import make_plan
    from trtspec.repository import generate_repository

    # Llama-3.1-8B's architecture at a small size: the heads' LM heads are written out (TensorRT-LLM reads them)
    small = {**LLAMA_31_8B, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
             "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1024}
    target = make_checkpoint(tmp_path / "Llama-3.1-8B-Instruct", small)
    heads = write_heads(tmp_path / "heads", n=4, hidden=256, vocab=1024)
    data = example_config("llama-3.1-8b_medusa_h100.yaml", {"target": target, "draft": heads})
    for version in ("0.17.0", "0.19.0", "0.20.0", "1.0.0", "1.2.1"):
        cfg = parse_config({**data, "tensorrt_llm_version": version}, source_dir=tmp_path)
        plan = make_plan(cfg, tmp_path / "out", synthetic_machine("h100x1", tensorrt_llm_version=version), tools=TOOLS)
        assert [s.name for s in plan.steps] == ["preflight", "convert-target", "build-target", "repository"]
        assert not plan.preflight.errors, plan.preflight.errors
        convert = plan.step("convert-target").argv
        assert convert[1].endswith("examples/medusa/convert_checkpoint.py")
        ns = check_argv(MEDUSA_CONVERT_FLAGS, convert[2:])
        assert (ns.medusa_model_dir, ns.num_medusa_heads, ns.max_medusa_token_len) == (str(heads), 4, 8)
        tool, args = tool_of(plan.step("build-target").argv)
        ns = check_argv(TRTLLM_BUILD_FLAGS, args)
        assert (ns.speculative_decoding_mode, ns.max_draft_len) == ("medusa", 8)
        repo = generate_repository(cfg, tmp_path / f"repo-{version}", target_engine_dir=tmp_path / "engines" / "target",
                                   trtllm_version=version)
        text = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
        assert not (repo / "tensorrt_llm_draft").exists()
        params = _params(text)
        assert params["decoding_mode"] == "medusa"
        assert medusa.from_pbtxt(params["medusa_choices"]) == cfg.speculative.medusa_choices


def _params(pbtxt: str) -> dict[str, str]:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = text_format.Parse(pbtxt, mc.ModelConfig())
    return {k: v.string_value for k, v in config.parameters.items()}


# ------------------------------------------------------------------------------------------ reference engine


@pytest.fixture(scope="module")
def engines(demo_pair, tmp_path_factory):
    """The demo target alone, with the shipped demo heads (mostly accepted on chat) and with a random head set
    (mostly rejected: the walk goes down rejected branches)."""
    from trtspec.demo_pair import MEDUSA_ASSET_DIR
    from trtspec.reference_engine import ReferenceEngine

    noisy = write_heads(tmp_path_factory.mktemp("medusa") / "noisy", scale=0.05, seed=1)
    plain = ReferenceEngine(demo_pair.target, device="cpu", dtype="float32", cache_entries=4)
    return plain, {n: ReferenceEngine(demo_pair.target, device="cpu", dtype="float32", cache_entries=4,
                                      medusa_heads=h) for n, h in (("demo", MEDUSA_ASSET_DIR), ("noisy", noisy))}


CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = [CHAT.format("What is the capital of France?"), CHAT.format("Write a haiku about the sea.")]


@contextlib.contextmanager
def fixed_tree_size(engine, size: int):
    """The engine verifies `size` nodes every step (as ReferenceEngine(medusa_tree_size=size)), then chooses again."""
    from trtspec.reference_engine.tree_size import TreeSize

    chosen, engine.tree_size = engine.tree_size, TreeSize(engine.medusa_tree, size)
    try:
        yield
    finally:
        engine.tree_size = chosen


def test_tree_verify_is_greedy_identical_and_keeps_only_the_accepted_path(engines, demo_pair):
    import torch
    from transformers import AutoTokenizer

    from trtspec.reference_engine import EngineRequest

    plain, with_heads = engines
    tok = AutoTokenizer.from_pretrained(demo_pair.target)
    accepted = 0
    for text in PROMPTS:
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        want = plain.run(EngineRequest(prompt, 24)).new_tokens
        for name, engine in with_heads.items():
            with fixed_tree_size(engine, len(engine.medusa_tree)):  # every step verifies the whole tree
                r = engine.run(EngineRequest(prompt, 24))
            assert r.new_tokens == want, (name, text)
            assert r.num_drafted > 0
            accepted += r.num_accepted
            # the cache kept is the committed sequence but its last token, and its KV is what a plain prefill of
            # those tokens computes: no position of a rejected branch is left in it
            seq = r.tokens
            cache, n = engine.cache.take(seq)
            assert n == len(seq) - 1 and cache.get_seq_length() == len(seq) - 1
            from trtspec.reference_engine.ragged import Segment
            from trtspec.reference_engine.kv_cache import new_cache

            fresh = Segment(new_cache(plain.model.config), seq[:-1], 0, 1)
            plain.forward([fresh])
            for a, b in zip(cache.layers, fresh.cache.layers):
                assert torch.allclose(a.keys, b.keys, atol=1e-3) and torch.allclose(a.values, b.values, atol=1e-3)
    assert accepted > 0  # the demo heads' proposals are taken


def test_a_fresh_engine_has_timed_every_tree_it_can_verify_before_any_request(demo_pair):
    # Priced along a line through the row counts chosen so far, the demo target's two-node tree read 1.2x a plain
    # step where it costs 1.0x (its steps cost about the same from 1 to 4 rows), and the engine verified the root
    # alone for most of a run. It times them all at load instead, warm (a row count's first step is not kept).
    from trtspec.demo_pair import MEDUSA_ASSET_DIR
    from trtspec.reference_engine import ReferenceEngine

    choices = [[0], [0, 0], [1], [0, 0, 0], [0, 1]]
    engine = ReferenceEngine(demo_pair.target, device="cpu", dtype="float32", cache_entries=4,
                             medusa_heads=MEDUSA_ASSET_DIR, medusa_choices=choices)
    costs = engine.tree_size.costs
    assert costs.timed().tolist() == list(range(1, len(choices) + 2))
    assert [int(costs.est.step_n[r]) for r in costs.timed()] == [3] * (len(choices) + 1)
    assert engine.tree_size.rates([1]) is not None and engine.medusa_work.sizes == []  # no request ran
    fixed = ReferenceEngine(demo_pair.target, device="cpu", dtype="float32", cache_entries=4,
                            medusa_heads=MEDUSA_ASSET_DIR, medusa_choices=choices, medusa_tree_size=2)
    assert fixed.tree_size.costs.timed().size == 0  # a fixed size needs no prices


def test_tree_size_chosen_by_the_engine_stays_exact(engines, demo_pair):
    """Each step verifies the prefix of the tree that pays, from what the engine measures: random heads are never
    accepted and shrink to the root alone (a plain step, but for exploration), and greedy output stays the
    target's through every change of size, with any fixed prefix too."""
    from transformers import AutoTokenizer

    from trtspec.reference_engine import EngineRequest
    from trtspec.reference_engine.medusa import TreeWork
    plain, with_heads = engines
    tok = AutoTokenizer.from_pretrained(demo_pair.target)
    prompt = tok(PROMPTS[1], add_special_tokens=False)["input_ids"]
    want = plain.run(EngineRequest(prompt, 48)).new_tokens
    noisy = with_heads["noisy"]
    noisy.medusa_work = TreeWork()
    assert noisy.run(EngineRequest(prompt, 48)).new_tokens == want
    sizes = noisy.medusa_work.sizes
    assert sizes[0] >= 0.75 * sum(sizes), sizes  # the root alone, once two row counts are timed
    demo = with_heads["demo"]
    demo.medusa_work = TreeWork()
    assert demo.run(EngineRequest(prompt, 48)).new_tokens == want
    assert sum(1 for n in demo.medusa_work.sizes if n) >= 2  # the size changed (measuring, exploring, choosing)
    for fixed in (0, 2, 5):
        demo.medusa_work = TreeWork()
        with fixed_tree_size(demo, fixed):
            assert demo.run(EngineRequest(prompt, 24)).new_tokens == want[:24]
        assert demo.medusa_work.sizes[fixed] == sum(demo.medusa_work.sizes)


def test_sampling_walk_and_stops(engines, demo_pair):
    from trtspec.reference_engine import EngineRequest
    from trtspec.spec.speculative import SamplingParams

    plain, with_heads = engines
    engine = with_heads["demo"]
    prompt = list(range(100, 120))
    r = engine.run(EngineRequest(prompt, 12, sampling=SamplingParams(temperature=0.8, top_k=20), seed=3))
    assert len(r.new_tokens) <= 12
    # the end token ends the output unemitted; output_len is never exceeded, even mid-path
    want = plain.run(EngineRequest(prompt, 12)).new_tokens
    end = want[5]
    r = engine.run(EngineRequest(prompt, 12, end_id=end))
    assert r.new_tokens == want[: want.index(end)]
    for n in (1, 2, 3, 7):
        assert engine.run(EngineRequest(prompt, n)).new_tokens == want[:n]


# ------------------------------------------------------------------------------------------ real Triton


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_pair):
    from trtspec.repository import generate_repository, list_models
    from trtspec.server import ServerOptions, create_server

    cfg = parse_config(
        {
            "name": "test-medusa", "engine": "reference", "device": "cpu",
            "target": {"checkpoint": "demo:target", "dtype": "float32"},
            "draft": {"checkpoint": "demo:medusa", "dtype": "float32"},
            "speculative": {"method": "medusa", "max_draft_len": 8, "medusa_choices": [[0], [0, 0], [1], [0, 0, 0]]},
            "limits": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 320},
            "triton": {"speculative_instance_count": 2},
        }
    )
    repo = generate_repository(cfg, tmp_path_factory.mktemp("repo") / "model_repository")
    assert not (repo / "tensorrt_llm_draft").exists()  # the heads speculate inside the target engine
    # ... so the target-only endpoints get one without them, the same engine otherwise (guided decoding included)
    models = list_models(repo)
    with_heads, target_only = models["tensorrt_llm"], models["tensorrt_llm_target_only"]
    medusa_params = {"medusa_heads", "medusa_choices"}
    assert medusa_params <= set(with_heads.parameters) and not medusa_params & set(target_only.parameters)
    for p in medusa_params:
        del with_heads.parameters[p]
    with_heads.name = target_only.name
    assert with_heads == target_only
    assert "guided_decoding_backend" in target_only.parameters
    with create_server(ServerOptions(repo, http_port="auto", grpc_port="auto", metrics_port="auto")) as s:
        s.wait_ready(300)
        yield s


@pytest.mark.slow
def test_served_greedy_identical_to_target_only_alone_and_concurrent(server, engines, demo_pair):
    from concurrent.futures import ThreadPoolExecutor

    from transformers import AutoTokenizer

    from trtspec.client import Client
    from trtspec.reference_engine import EngineRequest

    plain, _ = engines
    tok = AutoTokenizer.from_pretrained(demo_pair.target)
    end = tok.convert_tokens_to_ids("<|im_end|>")  # the end token the text endpoint sends
    want = [plain.run(EngineRequest(tok(p, add_special_tokens=False)["input_ids"], 24, end_id=end)).new_tokens
            for p in PROMPTS]
    client = Client(server.endpoints.http_address, "http", "ensemble")
    alone = [client.generate(p, 24) for p in PROMPTS]
    streamed = [client.generate(p, 24, stream=True) for p in PROMPTS]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: client.generate(p, 24), PROMPTS * 2))
    for gens in (alone, streamed, together[:2], together[2:]):
        assert [g.token_ids for g in gens] == want
    # the statistics are the engine's own: per tree step the depth of the prefix it verified, the accepted path
    # kept (a fresh engine verifies the whole tree first; later steps verify what pays, maybe the root alone)
    assert sum(g.stats.total_draft_tokens for g in alone) > 0
    for g in alone:
        assert 0 <= g.stats.total_accepted_draft_tokens <= g.stats.total_draft_tokens
    # target-only is target-only: the baseline endpoint's calls go to the engine without the heads (on the Medusa
    # engine they would verify trees, and a bench would measure Medusa against itself)
    import tritonclient.http

    stats = tritonclient.http.InferenceServerClient(server.endpoints.http_address)

    def calls(model: str) -> int:
        return int(stats.get_inference_statistics(model)["model_stats"][0]["inference_count"])

    before = {m: calls(m) for m in ("tensorrt_llm", "tensorrt_llm_target_only")}
    baseline = [Client(server.endpoints.http_address, "http", "baseline").generate(p, 24) for p in PROMPTS]
    assert [g.token_ids for g in baseline] == want
    assert calls("tensorrt_llm") == before["tensorrt_llm"]
    assert calls("tensorrt_llm_target_only") > before["tensorrt_llm_target_only"]


@pytest.mark.slow
def test_served_engine_counts_its_steps_by_the_tree_nodes_verified(server):
    from trtspec.bench.metrics import scrape, tree_steps
    from trtspec.client import Client

    tree = medusa.Tree.from_choices([[0], [0, 0], [1], [0, 0, 0]])  # the server's medusa_choices
    url = server.endpoints.metrics
    before = scrape(url)
    gen = Client(server.endpoints.http_address, "http", "ensemble").generate(PROMPTS[1], 24)
    steps = tree_steps(before, scrape(url))
    assert len(steps) == len(tree) + 1  # every size is on /metrics from the start, at 0
    # the request's own statistics are the engine's: the heads run to each tree step's depth
    assert sum(n * tree.prefix_depth(m) for m, n in enumerate(steps)) == gen.stats.total_draft_tokens
    # after the prefill's token, a step emits 1 + its accepted path (less where the output ends)
    assert sum(steps) <= len(gen.token_ids) - 1 <= sum(steps) + gen.stats.total_accepted_draft_tokens
