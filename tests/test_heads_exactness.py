"""Greedy exactness of the head methods in the reference engine, per precision: EAGLE-3 drafting inside the engine
(with k = 0 stretches and the head's catch-up) and Medusa's tree verify (the whole tree, and the size the engine
chooses) give the target-only tokens, alone and with requests stepped together.

The tests in test_eagle3.py and test_medusa.py check the same on this CPU in float32. This file runs every dtype the
engine offers on the device (TRTSPEC_TEST_DEVICE, cpu unless set): bf16 on a CPU with native bf16 only, float16 on a
GPU only. Attention over a tree or a verify row runs other kernels than a decode's there.

float32 must give the target-only tokens exactly. bf16 and fp16 are not batch-invariant
(device.Precision.batch_invariant): a verify row may round a logit otherwise than a decode. Their tokens must match
up to a first difference, and there the target-only decode's top two logits must be a rounding apart (within
NEAR_TIE_ULPS units in the last place of that dtype at the top logit's magnitude). A wrong mask, position or cache
entry shows as a difference where the decode's choice was clear.

scripts/gpu_check.sh runs it on a GPU with TRTSPEC_TEST_PAIR=TARGET_DIR:DRAFT_DIR: a random-weight target of the
demo's shapes, on which the shipped heads load. Greedy identity does not depend on the weights; acceptance does, so
none is asserted there."""

import os
from pathlib import Path

import numpy as np
import pytest

from trtspec.demo_pair import EAGLE3_ASSET_DIR, MEDUSA_ASSET_DIR
from trtspec.reference_engine import EngineRequest, ReferenceEngine
from conftest import native_bf16, step_together

DEVICE = os.environ.get("TRTSPEC_TEST_DEVICE", "cpu")
# float32; bf16 where the device computes it natively (emulated on a CPU it takes minutes); fp16 on a GPU
DTYPES = (["float32", "bfloat16", "float16"] if DEVICE != "cpu"
          else ["float32"] + (["bfloat16"] if native_bf16() else []))
PROMPTS = [  # demo-vocabulary ids: a chat turn's opening and a few words
    [1, 9690, 314, 253, 7018, 11173, 28, 3781, 2, 198, 1, 4093, 198],
    [1, 4093, 198, 7018, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
]
N_NEW = 24
NEAR_TIE_ULPS = 2  # real bf16 differences here read 0-1; a tree mask letting rows see their siblings read 3


@pytest.fixture(scope="module")
def target_dir(request) -> Path:
    given = os.environ.get("TRTSPEC_TEST_PAIR")
    return Path(given.partition(":")[0]) if given else request.getfixturevalue("demo_pair").target


@pytest.fixture(scope="module", params=DTYPES)
def dtype(request):
    return request.param


def _engine(target_dir, dtype, **heads) -> ReferenceEngine:
    return ReferenceEngine(target_dir, device=DEVICE, dtype=dtype, cache_entries=8, **heads)


class Expected(list):
    """Target-only tokens per prompt, and at each position the decode's top-two margin and top logit."""

    margins: list[list[tuple[float, float]]]


@pytest.fixture(scope="module")
def expected(target_dir, dtype) -> Expected:
    plain, want = _engine(target_dir, dtype), Expected()
    want.margins = []
    for p in PROMPTS:
        r = plain.run(EngineRequest(list(p), N_NEW, return_generation_logits=True))
        logits = np.asarray(r.generation_logits, dtype=np.float32).reshape(-1, r.generation_logits.shape[-1])
        top2 = np.sort(logits, axis=-1)[:, -2:]
        want.append(r.new_tokens)
        want.margins.append([(float(b - a), float(abs(b))) for a, b in top2])
    return want


def assert_greedy_same(got: list[list[int]], want: Expected, dtype: str, label: str = "") -> None:
    """Exactly the target-only tokens in float32; in bf16 / fp16 the same up to a first difference at a near-tie."""
    import torch

    if got == list(want) or dtype == "float32":
        assert got == list(want), (dtype, label)
        return
    eps = torch.finfo(getattr(torch, dtype)).eps
    for i, (g, w) in enumerate(zip(got, want)):
        at = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), None)
        if at is None:
            assert len(g) == len(w), (dtype, label, i)
            continue
        margin, top = want.margins[i][at]
        ulp = eps * 2.0 ** np.floor(np.log2(max(top, 1e-6)))
        print(f"{label} {dtype} prompt {i}: first difference at token {at}, the decode's top-two margin "
              f"{margin:.4f} = {margin / ulp:.1f} ulps")
        assert margin <= NEAR_TIE_ULPS * ulp, (f"{label} {dtype} prompt {i}: token {at} differs where the "
                                               f"target-only decode's margin was {margin:.4f} ({margin / ulp:.1f} ulps)")


def test_eagle3_in_engine_drafting_with_stretches_and_catch_ups_is_greedy_identical(target_dir, dtype, expected):
    engine, got = _engine(target_dir, dtype, eagle3_head=EAGLE3_ASSET_DIR), []
    for prompt in PROMPTS:
        seq, draft, n, drafted = list(prompt), [], 0, 0
        while len(seq) - len(prompt) < N_NEW:
            n += 1
            ask = 0 if n % 4 == 0 else 1 + n % 3  # k = 1..3, and every fourth call a stretch of k = 0
            r = engine.run(EngineRequest(seq, len(draft) + 1, draft_ids=draft or None, next_draft_len=ask))
            drafted += len(draft)
            seq, draft = r.tokens, r.next_draft_ids or []
        got.append(seq[len(prompt):][:N_NEW])
        assert drafted > 0
    assert_greedy_same(got, expected, dtype, "eagle3")


def test_eagle3_verify_rows_stepped_together_are_greedy_identical(target_dir, dtype, expected):
    engine = _engine(target_dir, dtype, eagle3_head=EAGLE3_ASSET_DIR)
    seqs = [list(p) for p in PROMPTS]
    drafts: list[list[int]] = [[] for _ in PROMPTS]
    while min(len(s) - len(p) for s, p in zip(seqs, PROMPTS)) < N_NEW:
        reqs = [EngineRequest(s, len(d) + 1, draft_ids=d or None, next_draft_len=2) for s, d in zip(seqs, drafts)]
        for i, r in enumerate(step_together(engine, reqs)):
            seqs[i], drafts[i] = r.tokens, r.next_draft_ids or []
    assert_greedy_same([s[len(p):][:N_NEW] for s, p in zip(seqs, PROMPTS)], expected, dtype, "eagle3 together")


def test_medusa_tree_verify_is_greedy_identical_whole_tree_and_chosen_size(target_dir, dtype, expected):
    from trtspec.reference_engine.medusa import TreeWork
    from trtspec.reference_engine.tree_size import TreeSize

    engine = _engine(target_dir, dtype, medusa_heads=MEDUSA_ASSET_DIR)
    chosen = engine.tree_size
    for size in (len(engine.medusa_tree), None):  # every step verifies the whole tree; then the engine chooses
        engine.tree_size = TreeSize(engine.medusa_tree, size) if size else chosen
        engine.medusa_work = TreeWork()
        got = [engine.run(EngineRequest(list(p), N_NEW)).new_tokens for p in PROMPTS]
        assert_greedy_same(got, expected, dtype, f"medusa tree size {size or 'chosen'}")
        assert sum(engine.medusa_work.sizes[1:]) > 0  # trees were verified, not plain steps alone


def test_medusa_trees_stepped_together_are_greedy_identical(target_dir, dtype, expected):
    from trtspec.reference_engine.tree_size import TreeSize

    engine = _engine(target_dir, dtype, medusa_heads=MEDUSA_ASSET_DIR)
    engine.tree_size = TreeSize(engine.medusa_tree, len(engine.medusa_tree))
    got = [r.new_tokens for r in step_together(engine, [EngineRequest(list(p), N_NEW) for p in PROMPTS])]
    assert_greedy_same(got, expected, dtype, "medusa together")
