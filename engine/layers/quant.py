"""Weight-only quantized weights: the canonical layout every backend starts from, and its references.

The loader produces, for each quantized linear, before any backend repacks it:

int8 (per output channel, symmetric)
    `qweight` int8 (out, in); `scale` float32 (out,); w[o, i] = qweight[o, i] * scale[o].

int4 (group-wise, group g = 32 by default, also 128; in % g == 0)
    `qweight` uint8 (out, in // 2): the LOW nibble holds column 2j, the HIGH nibble column 2j + 1,
    values 0..15; `scale` float32 (out, in // g); `offset` float32 (out, in // g);
    w[o, i] = q[o, i] * scale[o, i // g] + offset[o, i // g].
    GGUF Q4_0 gives offset = -8 * scale, Q4_1 gives offset = min.

A backend may repack at load (oneDNN's or fbgemm's layout); tests and references dequantize from
this form (`dequantize_int8`, `dequantize_int4`), and the CUDA kernels read it as it is."""

from __future__ import annotations

import torch

INT4_GROUPS = (32, 128)


def dequantize_int8(qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 (out, in) weight an int8 (qweight, scale) pair stands for."""
    return qweight.to(torch.float32) * scale.to(torch.float32)[:, None]


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """uint8 (out, in // 2) packed nibbles -> uint8 (out, in) values 0..15 (low nibble first)."""
    low = qweight & 0x0F
    high = qweight >> 4
    return torch.stack((low, high), dim=-1).reshape(qweight.shape[0], qweight.shape[1] * 2)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 (out, in) values 0..15 -> (out, in // 2): column 2j in the low nibble, 2j + 1 high."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def dequantize_int4(qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                    group: int) -> torch.Tensor:
    """The float32 (out, in) weight an int4 (qweight, scale, offset) group-wise set stands for."""
    q = unpack_int4(qweight).to(torch.float32)
    out, cols = q.shape
    q = q.view(out, cols // group, group)
    w = q * scale.to(torch.float32)[..., None] + offset.to(torch.float32)[..., None]
    return w.view(out, cols)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 of a float (out, in) weight: (qweight, scale)."""
    w = w.to(torch.float32)
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8)
    return q, scale


def quantize_int4(w: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric group-wise int4 (min/max per group, as GGUF Q4_1) of a float (out, in) weight:
    (qweight, scale, offset)."""
    w = w.to(torch.float32)
    out, cols = w.shape
    if cols % group:
        raise ValueError(f"int4 quantization: in_features {cols} is not a multiple of group {group}")
    g = w.view(out, cols // group, group)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = (hi - lo) / 15.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round((g - lo[..., None]) / scale[..., None]), 0, 15).view(out, cols)
    return pack_int4(q), scale, lo
