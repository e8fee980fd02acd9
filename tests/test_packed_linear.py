"""oneDNN-packed Linear layers (reference_engine.packed_linear): same products as nn.Linear, tied weights left alone."""

from types import SimpleNamespace

import pytest
import torch

from trtspec.reference_engine import packed_linear
from trtspec.reference_engine.device import tune_for_cpu
from trtspec.reference_engine.engine import lm_head_product
from trtspec.reference_engine.packed_linear import PackedLinear, pack_linears

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("gemv", [True, False])
def test_packed_linear_matches_linear_for_any_row_count(gemv):
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 40, bias=True)
    packed = PackedLinear(lin, gemv)
    for rows in (1, 3, 17):
        x = torch.randn(1, rows, 96)
        with torch.inference_mode():
            torch.testing.assert_close(packed(x), lin(x), rtol=1e-5, atol=1e-5)
            assert packed(x).shape == (1, rows, 40)
    assert (packed.gemv is not None) == gemv
    if gemv:  # a 1-row product takes MKL's GEMV on the column-major copy (a decode step as before packing)
        one = torch.randn(1, 1, 96)
        with torch.inference_mode():
            assert torch.equal(packed(one), torch.nn.functional.linear(one, packed.gemv, lin.bias))


class Tiny(torch.nn.Module):
    config = SimpleNamespace()  # no logit scaling or softcapping: a plain head

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.up = torch.nn.Linear(16, 32, bias=False)
        self.down = torch.nn.Linear(32, 16, bias=False)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight  # tied, as SmolLM2's LM head

    def get_output_embeddings(self):
        return self.head

    def forward(self, ids):
        return self.head(self.down(self.up(self.emb(ids))))


def test_pack_linears_skips_the_head_and_tied_weights():
    torch.manual_seed(0)

    model = Tiny().eval()
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        before = model(ids)
    assert pack_linears(model) == 2
    assert isinstance(model.up, PackedLinear) and isinstance(model.down, PackedLinear)
    assert type(model.head) is torch.nn.Linear and model.head.weight is model.emb.weight
    with torch.inference_mode():
        torch.testing.assert_close(model(ids), before, rtol=1e-5, atol=1e-5)


def test_the_lm_head_follows_the_decoders_kernels():
    """Tuned at one thread (as served), the tied head is column-major: its 1-row product stays on that weight (no
    copy) and more rows take oneDNN's packed copy, whose row is bitwise the same for any row count."""
    torch.manual_seed(0)
    model = Tiny().eval()
    hidden = torch.randn(9, 16)
    with torch.inference_mode():
        expected = model.head(hidden)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tune_for_cpu(model)
    finally:
        torch.set_num_threads(threads)
    head = lm_head_product(model)
    assert isinstance(head, PackedLinear)
    assert head.gemv.data_ptr() == model.emb.weight.data_ptr()  # the tied weight itself, not a copy
    with torch.inference_mode():
        torch.testing.assert_close(head(hidden), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(head(hidden[:1]), expected[:1], rtol=1e-5, atol=1e-5)
        assert all(torch.equal(head(hidden[:n])[1], head(hidden)[1]) for n in (2, 5, 9))
