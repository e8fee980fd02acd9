"""Linear layers whose weights oneDNN has packed once, at load, for the few-row products of a verify or a batch
(CPU, float32; device.LINEAR_KERNELS chooses).

oneDNN's packed products of a few rows are cheaper than MKL's (nn.Linear), and a product's row is bitwise the same
whether it is computed alone or among many rows (MKL's sgemm switches kernels with the row count); but oneDNN's
1-row product reads the weights slower than MKL's GEMV (figures: docs/benchmarks/engine.md). So by default a 1-row
product (a decode step) stays on MKL, with its own column-major copy of the weight: the decoder's weights are held
twice."""

from __future__ import annotations

import torch

# The row count the weights are packed for. Packed for 1, a 1-row product takes a GEMV path whose sums differ
# from the 2+-row kernel's; packed for 4, 1 .. 300 rows all take one kernel (measured, demo shapes).
PACK_ROWS = 4


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(torch.nn.Module):
    """y = x W^T + b with W in oneDNN's blocked layout; with `gemv`, a 1-row x goes to MKL with a column-major
    copy of W instead (without it the original weight is released)."""

    def __init__(self, linear: torch.nn.Linear, gemv: bool = True):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), PACK_ROWS)
        self.gemv = w.t().contiguous().t() if gemv else None
        self.bias = None if linear.bias is None else linear.bias.detach()

    @property
    def nbytes(self) -> int:
        return self.in_features * self.out_features * 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemv is not None and x.numel() == self.in_features:
            return torch.nn.functional.linear(x, self.gemv, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, packed=oneDNN, 1 row={'MKL' if self.gemv is not None else 'oneDNN'}"


def pack_linears(model: torch.nn.Module, gemv: bool = True) -> int:
    """Replace the float32 nn.Linear layers of `model`'s decoder (not the LM head or anything sharing a weight,
    e.g. a tied embedding) by PackedLinear; returns how many were replaced."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (isinstance(child, torch.nn.Linear) and child is not head and child.weight.dtype == torch.float32
                    and counts.get(id(child.weight), 0) == 1 and child.weight.device.type == "cpu"):
                setattr(parent, name, PackedLinear(child, gemv))
                replaced += 1
    return replaced
