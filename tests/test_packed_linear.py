"""oneDNN-packed Linear layers (reference_engine.packed_linear): same products as nn.Linear, tied weights left alone."""

import pytest
import torch

from trtspec.reference_engine import packed_linear
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


def test_pack_linears_skips_the_head_and_tied_weights():
    torch.manual_seed(0)

    class Tiny(torch.nn.Module):
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

    model = Tiny().eval()
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        before = model(ids)
    assert pack_linears(model) == 2
    assert isinstance(model.up, PackedLinear) and isinstance(model.down, PackedLinear)
    assert type(model.head) is torch.nn.Linear and model.head.weight is model.emb.weight
    with torch.inference_mode():
        torch.testing.assert_close(model(ids), before, rtol=1e-5, atol=1e-5)
