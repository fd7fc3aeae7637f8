"""Linear layers on the CPU: oneDNN with each weight reordered once, when the model is loaded.

`F.linear` on the CPU goes to MKL's GEMM/GEMV. On the AMD EPYC machines we measure on, MKL runs its
generic code path (it picks its fast ones by CPU vendor), and a batch-1 decode step read the weights
at about 16 GB/s. oneDNN picks its kernels by instruction set, and with the weight in its own
blocked layout the same 30 layers of weights stream at about 45 GB/s. Measured on the embedded
model (2 threads, fp32): batch-1 decode 25 -> 44 tokens/s, prefill of 16 prompts 3.3 -> 1.9 s,
decode at 16 sequences 200 -> 330 tokens/s, the same greedy tokens (docs/BENCHMARKS.md).
The results are float32 like MKL's but not bit-identical (another summation order).

Only on the CPU: on CUDA cuBLAS is already at the bandwidth ceiling, and the weights stay
ordinary tensors (CUDA graphs, the Triton path).

Row buckets. oneDNN builds (JIT-compiles) a primitive for each input shape and keeps it in two
native caches of 1024 entries each: its own primitive cache (ONEDNN_PRIMITIVE_CACHE_CAPACITY, two
entries per call) and ideep's per-thread LRU (LRU_CACHE_CAPACITY; 0 crashes torch 2.13). Each
(weight shape, row count) holds about 0.6 MB there and takes 1-8 ms to build. The row count is a
step's token count, so an engine prefilling prompts of every length grew by about 2.7 MB per new
length until both caches were full: +506 MB on the embedded model. So rows go in padded up to a
bucket (`bucket_rows`): exact up to 16 (decode batches), then 8 buckets per doubling, at most
12.5% extra rows; 72 shapes up to 2048 rows, a bounded +180 MB at worst (docs/BENCHMARKS.md).
oneDNN computes each row on its own, so the real rows of a padded call have the bits of an exact
call (checked up to 2048 rows; a single row is kept single: its kernel sums in another order)."""

from __future__ import annotations

import functools

import torch
from torch import nn

# oneDNN's fp32 and bf16 kernels; an fp16 model on the CPU keeps F.linear.
PACKED_DTYPES = (torch.float32, torch.bfloat16)

# Row counts below this go to oneDNN as they are; above, rounded up to 8 buckets per doubling.
EXACT_ROWS = 16
_BUCKET_BITS = 3  # 2**3 buckets per doubling: at most 1/8 extra rows


def bucket_rows(rows: int) -> int:
    """The row count a linear runs at for `rows` input rows: `rows` itself up to EXACT_ROWS, else
    the next multiple of 2**(k - 3) for rows in (2**k, 2**(k+1)]. So 1..2048 rows make 72 shapes
    (16 exact, then 18, 20, ..., 32, 36, ..., 64, 72, ..., 1920, 2048), not 2048."""
    if rows <= EXACT_ROWS:
        return rows
    step = 1 << ((rows - 1).bit_length() - 1 - _BUCKET_BITS)
    return -(-rows // step) * step


@functools.cache
def onednn_available() -> bool:
    """Whether this torch build has oneDNN's linear ops and they compute what F.linear does. They
    are torch's internal ops (its compiler's CPU path uses them), so a build that changed them
    falls back to F.linear rather than failing or computing something else."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        with torch.inference_mode():
            probe = nn.Linear(8, 4)
            x = torch.arange(16, dtype=torch.float32).reshape(2, 8)
            return torch.allclose(PackedLinear(probe)(x), probe(x), rtol=1e-5, atol=1e-5)
    except (RuntimeError, TypeError):
        return False


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, in_features: int,
                  out_features: int) -> torch.Tensor:
    """x @ weight.T + bias through oneDNN, rows padded up to their bucket; `weight` reordered
    (`_reorder_linear_weight`) or a plain (out, in) tensor (the quantized linears' prefill)."""
    rows = x.numel() // in_features if in_features else 0
    padded = bucket_rows(rows)
    if padded == rows:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    # Pad rows up to the bucket: one copy of the input (the padding rows zeroed, not left
    # uninitialised: denormals there would slow the kernel), then a view of the real rows.
    x2 = x.reshape(rows, in_features)
    buf = x2.new_empty((padded, in_features))
    buf[:rows].copy_(x2)
    buf[rows:].zero_()
    out = torch.ops.mkldnn._linear_pointwise(buf, weight, bias, "none", [], "")[:rows]
    return out.view(*x.shape[:-1], out_features)


class PackedLinear(nn.Module):
    """`nn.Linear`'s forward with its weight in oneDNN's layout (an opaque tensor: it can be
    multiplied, not indexed or saved). Replaces a loaded `nn.Linear`; see `pack_linears`."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # No batch-size hint: the default layout did as well as any hint from 1 to 512 rows.
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_linear(x, self.weight, self.bias, self.in_features, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn"


def pack_linears(model: nn.Module) -> int:
    """Replace every loaded `nn.Linear` of a CPU model by a `PackedLinear`; how many were. Nothing
    when oneDNN is missing or the weights are neither fp32 nor bf16. A tied LM head gets a packed
    copy of the embedding (which keeps its own: lookups need plain rows)."""
    if not onednn_available():
        return 0
    linears = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    if not linears or any(child.weight.device.type != "cpu" or child.weight.dtype not in PACKED_DTYPES
                          for _, _, child in linears):
        return 0
    with torch.inference_mode():
        for parent, name, child in linears:
            setattr(parent, name, PackedLinear(child))
    return len(linears)
