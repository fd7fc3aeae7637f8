"""Weight-only quantized linear layers: `Int8Linear`, `Int4Linear` and `Fp16Linear` (CPU "auto"
without the native kernels), swapped in for a loaded model's `nn.Linear`s by `quantize_linears`.
int weights start in the canonical layout of engine/layers/quant.py.

On the CPU, int4 and int8 run engine/native/gemv.cpp: decode rows (up to NATIVE_MAX_ROWS) through
its kernels on the quantized weight, fp32 activations (within fp32 rounding of
dequantize-then-matmul); more rows dequantize the weight into a scratch tensor for oneDNN. Without
the library (no compiler, OPENCLAW_CPU_KERNELS=0, a failed probe) each module keeps the torch
path: dequantize per call (`_weight_int8pack_mm` at one int8 row). Activations stay float: 8-bit
activations broke the embedded model's greedy tokens, per tensor (fbgemm's dynamic int8: 4 of 128
kept) and per block of 32 (gemv.cpp's VNNI tier, "int4-q8": 56 of 128); its activations are
heavy-tailed (median |x| 0.01 against a max of 1.3 to 477). docs/engine.md, "Quantization".

On CUDA both call the Triton kernels of engine/kernels/quant_matmul.py on the canonical tensors,
imported on first use (triton raises without a driver)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.linear import onednn_available, onednn_linear
from engine.layers.quant import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8
from engine.native import gemv

# "int4-q8": int4 weights whose decode rows run with activations rounded to int8 per block of 32
# (gemv.cpp's VNNI tier; CPU only; for measurements: it lost the embedded model's greedy tokens).
# "int4-fp16" / "int8-fp16": CPU "auto" (RowSplitLinear, SPLIT_ROWS).
QUANTIZATIONS = ("int8", "int4", "int4-q8", "fp16", "int4-fp16", "int8-fp16")
INT4_GROUP = 32
# Up to this many rows (decode) the native kernel reads the quantized weight as it is; more rows
# (prefill) dequantize it into a scratch fp32 weight for a float GEMM, which is compute-bound and
# does better there (docs/BENCHMARKS.md, "Quantized linears on the CPU").
NATIVE_MAX_ROWS = 16
# "int4-fp16" (CPU "auto"): up to this many rows the int4 kernel, more rows an fp16 copy through
# fbgemm. The kernel's cost grows with the rows (4 rows ~1.6x one, 16 rows ~8x), and a prefill's
# scratch dequantization and oneDNN's per-call reorder tripled a short prompt's time to first token
# (20 tokens: 43 -> 164 ms); fbgemm fp16 is about even with fp32 from 4 rows up.
SPLIT_ROWS = 4


def cpu_auto_quantization(bits: int | None = None) -> str:
    """What "auto" runs a quantized checkpoint as on the CPU: "int4-fp16" (decode rows on the
    file's 4-bit blocks, the head int8, through engine/native/gemv.cpp; prefill on an fp16 copy
    through fbgemm; "int8-fp16" for a file of 5 bits or more, which 4 bits would lose), the int
    mode alone where fbgemm is missing, fbgemm's "fp16" where our library is."""
    # Not "int4-q8": its block-rounded activations kept 56 of 128 greedy tokens of the embedded
    # model (docs/engine.md, "Quantization"); the fp32-activation tier is exact to rounding.
    if gemv.kernels() is None:
        return "fp16"
    mode = "int8" if bits is not None and bits > 4 else "int4"
    return f"{mode}-fp16" if fbgemm_fp16_available() else mode


def _native_rows(x: torch.Tensor, in_features: int) -> torch.Tensor:
    """x as the (rows, in) contiguous fp32 tensor the native kernels take (no copy if it is one).
    A row of another width, or a tensor off the CPU, is refused: the kernel would read past it."""
    if x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous() and x.is_cpu:
        if x.shape[1] != in_features:
            raise ValueError(f"a linear of {in_features} inputs was given rows of {x.shape[1]}")
        return x  # the model's own case: the ops below are no-ops but cost ~2 us each
    if x.shape[-1] != in_features or not x.is_cpu:
        raise ValueError(f"a CPU linear of {in_features} inputs was given {tuple(x.shape)} on {x.device}")
    return x.reshape(-1, in_features).to(torch.float32).contiguous()


def _check_native(module: nn.Module, *tensors: torch.Tensor) -> None:
    """A natively bound module's buffers as its kernel reads them: on the CPU, scales float32."""
    for t in tensors:
        if not t.is_cpu or (t.is_floating_point() and t.dtype != torch.float32):
            raise ValueError(f"{type(module).__name__}: its native CPU kernel reads {t.dtype} on "
                             f"{t.device}; keep a natively packed layer on the CPU in float32")


def _prefill(x2: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Many rows: the dequantized scratch weight through oneDNN (measured faster here than
    F.linear's MKL, as for the float layers; engine/layers/linear.py)."""
    bias = None if bias is None else bias.float()
    if onednn_available():
        return onednn_linear(x2, w, bias, w.shape[1], w.shape[0])
    return F.linear(x2, w, bias)


def _native_out(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 2 and x.dtype == torch.float32:
        return out
    return out.to(x.dtype).view(*x.shape[:-1], out.shape[-1])


@functools.cache
def int8pack_available() -> bool:
    """Whether torch's weight-only int8 GEMV (`_weight_int8pack_mm`) is here and computes
    x @ (qweight * scale).T; else Int8Linear dequantizes per call."""
    if not hasattr(torch, "_weight_int8pack_mm"):
        return False
    q = torch.arange(-32, 32, dtype=torch.int8).reshape(4, 16)
    scale = torch.tensor([0.5, 0.25, 1.0, 2.0])
    x = torch.linspace(-1, 1, 16)[None]
    try:
        with torch.inference_mode():
            got = torch._weight_int8pack_mm(x, q, scale)
    except (RuntimeError, TypeError):
        return False
    return torch.allclose(got, x @ dequantize_int8(q, scale).T, rtol=1e-5, atol=1e-5)


@functools.cache
def fbgemm_fp16_available() -> bool:
    """Whether fbgemm's fp16-weight linear (`quantized::linear_dynamic_fp16`: fp16 weights, fp32
    activations and sums) is here and computes x @ w.T + b with w rounded to fp16."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return False
    w = torch.linspace(-1, 1, 64).reshape(4, 16)
    b, x = torch.tensor([0.5, -1.0, 0.0, 2.0]), torch.linspace(-2, 2, 32).reshape(2, 16)
    try:
        with torch.inference_mode():
            got = torch.ops.quantized.linear_dynamic_fp16(x, torch.ops.quantized.linear_prepack_fp16(w, b))
    except (RuntimeError, AttributeError):
        return False
    return torch.allclose(got, x @ w.half().float().T + b, rtol=1e-4, atol=1e-4)


class Fp16Linear(nn.Module):
    """y = x @ fp16(w).T + b through fbgemm, the weight held only in its packed fp16 form. Weight-only
    and near exact (fp16 keeps 11 bits), half the bytes of fp32: measured 2.7x faster than our
    oneDNN fp32 path at one row, about even at 8 and 512 rows (docs/engine.md, "Quantization")."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack_fp16(linear.weight.detach().float(), bias)
        self.op = torch.ops.quantized.linear_dynamic_fp16.default

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.dtype == torch.float32:
            # The model's own case, the op alone: the reshape and casts below are no-ops here but
            # cost ~5 us a call, a quarter of a small layer's at one row.
            return self.op(x, self.packed)
        x2 = x.reshape(-1, self.in_features).float()
        out = torch.ops.quantized.linear_dynamic_fp16(x2, self.packed).to(x.dtype)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fbgemm fp16"


class Int8Linear(nn.Module):
    """y = x @ (qweight * scale[:, None]).T + bias, weight-only: the activations stay float (8-bit
    activations lost greedy agreement on the embedded model; docs/engine.md, "Quantization")."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scale", scale.float().contiguous())
        self.register_buffer("bias", bias)
        self.native = qweight.device.type == "cpu" and gemv.kernels() is not None
        self._bind()

    def _bind(self) -> None:
        if self.native:
            _check_native(self, self.qweight, self.scale)
            bias = None if self.bias is None else self.bias.float().contiguous()
            self.decode = gemv.bind_int8(gemv.kernels(), self.qweight, self.scale, bias)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._bind()  # the buffers may be new tensors now
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1]
        if self.native:
            x2 = _native_rows(x, self.in_features)
            if x2.shape[0] <= NATIVE_MAX_ROWS:
                return _native_out(self.decode(x2), x)
            w = gemv.int8_dequantize(gemv.kernels(), self.qweight, self.scale)
            return _native_out(_prefill(x2, w, self.bias), x)
        x2 = x.reshape(-1, self.in_features)
        if x.device.type == "cuda":
            from engine.kernels.quant_matmul import int8_weight_matmul

            out = int8_weight_matmul(x2, self.qweight, self.scale, self.bias)
            return out.view(*shape, self.out_features)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if x2.shape[0] == 1 and int8pack_available():
            # One row: the GEMV reads the int8 weight as it is. More rows: its kernel is slow
            # here (measured 10x F.linear at 8 rows), so the weight is dequantized for the call.
            out = torch._weight_int8pack_mm(x2, self.qweight, self.scale.to(x.dtype))
            out = out if bias is None else out + bias
        else:
            out = F.linear(x2, dequantize_int8(self.qweight, self.scale).to(x.dtype), bias)
        return out.view(*shape, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class Int4Linear(nn.Module):
    """y = x @ dequantize_int4(qweight, scale, offset, group).T + bias. On the CPU with the native
    kernels, `qweight` holds gemv.cpp's repacking of the canonical layout (`self.native`;
    `gemv.canonical_int4` gives it back), read as it is at decode."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group: int,
                 bias: torch.Tensor | None, int8_activations: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape[0], qweight.shape[1] * 2
        self.group = group
        self.native = qweight.device.type == "cpu" and group % 32 == 0 and gemv.kernels() is not None
        # Decode rows through the int8-activation (VNNI) tier: groups of 32 only.
        self.int8_activations = int8_activations and self.native and group == 32
        self.register_buffer("qweight", gemv.repack_int4(qweight) if self.native else qweight)
        self.register_buffer("scale", scale.float().contiguous())
        self.register_buffer("offset", offset.float().contiguous())
        self.register_buffer("bias", bias)
        self._bind()

    def _bind(self) -> None:
        if self.native:
            _check_native(self, self.qweight, self.scale, self.offset)
            bias = None if self.bias is None else self.bias.float().contiguous()
            self.decode = gemv.bind_int4(gemv.kernels(), self.qweight, self.scale, self.offset, self.group,
                                         bias, self.int8_activations)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._bind()  # the buffers may be new tensors now
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1]
        if self.native:
            x2 = _native_rows(x, self.in_features)
            if x2.shape[0] <= NATIVE_MAX_ROWS:
                return _native_out(self.decode(x2), x)
            w = gemv.int4_dequantize(gemv.kernels(), self.qweight, self.scale, self.offset, self.group)
            return _native_out(_prefill(x2, w, self.bias), x)
        x2 = x.reshape(-1, self.in_features)
        if x.device.type == "cuda":
            from engine.kernels.quant_matmul import int4_weight_matmul

            out = int4_weight_matmul(x2, self.qweight, self.scale, self.offset, self.group, self.bias)
        else:
            w = dequantize_int4(self.qweight, self.scale, self.offset, self.group).to(x.dtype)
            out = F.linear(x2, w, None if self.bias is None else self.bias.to(x.dtype))
        return out.view(*shape, self.out_features)

    def extra_repr(self) -> str:
        tier = ", int8 activations" if self.int8_activations else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}{tier}"


class RowSplitLinear(nn.Module):
    """One linear held twice: `few` (quantized, read as it is) for up to `rows` rows, `many` (an
    fp16 copy) for more, each the faster there (SPLIT_ROWS)."""

    def __init__(self, few: nn.Module, many: nn.Module, rows: int = SPLIT_ROWS) -> None:
        super().__init__()
        self.few, self.many, self.rows = few, many, rows
        self.in_features, self.out_features = few.in_features, few.out_features

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name in ("few", "many"):
            # Its forward bound here, outside nn.Module's attribute lookup and __call__ (hook
            # checks): ~4 us a call, 121 calls a decode step. Set again with the module.
            self.__dict__[f"_{name}"] = value.forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0] if x.dim() == 2 else x.numel() // self.in_features
        return self._few(x) if rows <= self.rows else self._many(x)


def quantized_linear(linear: nn.Linear, mode: str, group: int = INT4_GROUP) -> nn.Module:
    """The quantized module for one loaded `nn.Linear` (its weight is not kept). int4 needs
    in_features divisible by `group`; a linear that is not gets int8."""
    with torch.inference_mode():
        if mode == "fp16":
            return Fp16Linear(linear)
        if mode in ("int4-fp16", "int8-fp16"):
            few = quantized_linear(linear, mode.split("-")[0], group)
            return RowSplitLinear(few, Fp16Linear(linear)) if fbgemm_fp16_available() else few
        w = linear.weight.detach()
        bias = None if linear.bias is None else linear.bias.detach().clone()
        if mode in ("int4", "int4-q8") and linear.in_features % group == 0:
            return Int4Linear(*quantize_int4(w, group), group, bias, int8_activations=mode == "int4-q8")
        return Int8Linear(*quantize_int8(w), bias)


def quantize_linears(model: nn.Module, mode: str, group: int = INT4_GROUP) -> int:
    """Replace every `nn.Linear` of a loaded model by its quantized module, one at a time, so only
    one float weight is in flight beyond what the model held; how many were. A tied LM head gets
    its own quantized copy: the embedding keeps its rows for exact lookups. The LM head (`lm_head`)
    is int8 in int4 mode too: its logits are what sampling sees, and a 4-bit head moved the
    embedded model's prefill logits by up to 4.7 where its 4-bit layers (Q4_1, lossless) moved
    nothing."""
    if mode not in QUANTIZATIONS:
        raise ValueError(f"quantization={mode!r}: must be one of {', '.join(QUANTIZATIONS)}")
    if mode == "fp16" and not fbgemm_fp16_available():
        return 0  # the float path stays (oneDNN fp32)
    linears = [(parent, name) for parent in model.modules()
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    for parent, name in linears:
        kind = mode
        if name == "lm_head" and mode.startswith("int4"):
            kind = "int8-fp16" if mode == "int4-fp16" else "int8"
        setattr(parent, name, quantized_linear(getattr(parent, name), kind, group))
    return len(linears)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (a tied tensor counted once)."""
    seen = {id(t): t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())}
    return sum(seen.values())
