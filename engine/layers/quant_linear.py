"""Weight-only quantized linear layers: `Int8Linear` and `Int4Linear`, swapped in for a loaded model's
`nn.Linear`s by `quantize_linears`. Weights start in the canonical layout of engine/layers/quant.py.

CPU kernels, measured on the embedded model's shapes (docs/engine.md, "Quantization"): fbgemm's
dynamic int8 linear (`quantized::linear_dynamic`: int8 weights, activations quantized per call,
int32 accumulation) beat our oneDNN fp32 `PackedLinear` at every row count, by 3-10x at 1-8 rows
and ~1.6x at 512; oneDNN's `qlinear_pointwise` (with the activation quantized in torch ops), bf16
weights, `_weight_int8pack_mm` and `_weight_int4pack_mm_for_cpu` were all slower. No int4 kernel
here beats int8, so int4 on the CPU dequantizes its weights per call (exact against
`dequantize_int4`, slow: for memory, not speed), and "auto" picks int8 on the CPU.

On CUDA both call the Triton kernels of engine/kernels/quant_matmul.py on the canonical tensors,
imported on first use (triton raises without a driver)."""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.quant import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8

QUANTIZATIONS = ("int8", "int4")
INT4_GROUP = 32


@functools.cache
def fbgemm_mode() -> bool | None:
    """How fbgemm's dynamic int8 linear runs here: False (full-range activations), True (7-bit
    activations: CPUs without VNNI saturate u8*s8 pair sums in 16 bits), None when the op is
    missing or wrong. The probe holds the worst case for saturation (all-max activations and
    weights) and an ordinary one, against the exact product."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return None
    probe_w = torch.cat([torch.full((2, 64), 127, dtype=torch.int8),
                         torch.arange(-64, 64, dtype=torch.int8).reshape(2, 64)])
    scale = torch.tensor([0.01, 0.02, 0.03, 0.04])
    x = torch.cat([torch.full((1, 64), 2.0), torch.linspace(-1, 2, 64)[None]])
    want = x @ dequantize_int8(probe_w, scale).T
    for reduce_range in (False, True):
        try:
            with torch.inference_mode():
                got = torch.ops.quantized.linear_dynamic(x, _prepack(probe_w, scale, None), reduce_range)
        except (RuntimeError, AttributeError):
            return None
        # Activation rounding alone stays within a few per mille of these sums.
        if torch.allclose(got, want, rtol=2e-2, atol=5e-2):
            return reduce_range
    return None


def _prepack(qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
    zero = torch.zeros(scale.shape[0], dtype=torch.long)
    # The qint8 tensor type is deprecated (the probe falls back when it goes); the warning would
    # repeat for every layer at every load.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*quantized tensor creation functions", UserWarning)
        qt = torch._make_per_channel_quantized_tensor(qweight, scale.double(), zero, 0)
    return torch.ops.quantized.linear_prepack(qt, None if bias is None else bias.float())


class Int8Linear(nn.Module):
    """y = x @ (qweight * scale[:, None]).T + bias. On the CPU the weight lives only in fbgemm's
    packed form when fbgemm works here (`fbgemm_mode`), else as int8 for `_weight_int8pack_mm`."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.packed = None
        self.reduce_range = fbgemm_mode() if qweight.device.type == "cpu" else None
        if self.reduce_range is not None:
            self.packed = _prepack(qweight, scale, bias)
            qweight = scale = bias = None  # held once, packed
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", None if scale is None else scale.float())
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.packed is not None:
            out = torch.ops.quantized.linear_dynamic(x2.float(), self.packed, self.reduce_range)
            out = out.to(x.dtype)
        elif x.device.type == "cuda":
            from engine.kernels.quant_matmul import int8_weight_matmul

            out = int8_weight_matmul(x2, self.qweight, self.scale, self.bias)
        else:
            out = torch._weight_int8pack_mm(x2, self.qweight, self.scale.to(x.dtype))
            if self.bias is not None:
                out = out + self.bias.to(out.dtype)
        return out.view(*shape, self.out_features)

    def canonical(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(qweight, scale) in the canonical layout, whichever form the module holds."""
        if self.packed is None:
            return self.qweight, self.scale
        qt, _ = torch.ops.quantized.linear_unpack(self.packed)
        return qt.int_repr(), qt.q_per_channel_scales().float()

    def nbytes(self) -> int:
        bias = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return self.out_features * (self.in_features + 4) + bias

    def extra_repr(self) -> str:
        kind = "fbgemm" if self.packed is not None else "int8"
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}"


class Int4Linear(nn.Module):
    """y = x @ dequantize_int4(qweight, scale, offset, group).T + bias, the canonical int4 layout."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group: int,
                 bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape[0], qweight.shape[1] * 2
        self.group = group
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale.float())
        self.register_buffer("offset", offset.float())
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x.device.type == "cuda":
            from engine.kernels.quant_matmul import int4_weight_matmul

            out = int4_weight_matmul(x2, self.qweight, self.scale, self.offset, self.group, self.bias)
        else:
            w = dequantize_int4(self.qweight, self.scale, self.offset, self.group).to(x.dtype)
            out = F.linear(x2, w, None if self.bias is None else self.bias.to(x.dtype))
        return out.view(*shape, self.out_features)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}"


def quantized_linear(linear: nn.Linear, mode: str, group: int = INT4_GROUP) -> nn.Module:
    """The quantized module for one loaded `nn.Linear` (its weight is not kept). int4 needs
    in_features divisible by `group`; a linear that is not gets int8."""
    with torch.inference_mode():
        w = linear.weight.detach()
        bias = None if linear.bias is None else linear.bias.detach().clone()
        if mode == "int4" and linear.in_features % group == 0:
            return Int4Linear(*quantize_int4(w, group), group, bias)
        return Int8Linear(*quantize_int8(w), bias)


def quantize_linears(model: nn.Module, mode: str, group: int = INT4_GROUP) -> int:
    """Replace every `nn.Linear` of a loaded model by its quantized module, one at a time, so only
    one float weight is in flight beyond what the model held; how many were. A tied LM head gets
    its own quantized copy: the embedding keeps its rows for exact lookups."""
    if mode not in QUANTIZATIONS:
        raise ValueError(f"quantization={mode!r}: must be one of {', '.join(QUANTIZATIONS)}")
    linears = [(parent, name) for parent in model.modules()
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    for parent, name in linears:
        setattr(parent, name, quantized_linear(getattr(parent, name), mode, group))
    return len(linears)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights: parameters, buffers and the packed quantized weights."""
    seen = {id(t): t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())}
    packed = sum(m.nbytes() for m in model.modules() if isinstance(m, Int8Linear) and m.packed is not None)
    return sum(seen.values()) + packed

