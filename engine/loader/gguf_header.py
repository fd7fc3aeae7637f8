"""A GGUF file's header read in one pass: its metadata as Python values, its tensors as views.

gguf's own GGUFReader builds a numpy view per string of every array (a vocabulary's 49k tokens
and as many merges): about 3 s per load, paid by every start. Here a string array is decoded
straight from the mapped bytes and a numeric array is one `frombuffer`: tens of milliseconds.
The values are the ones `ReaderField.contents()` gives; a tensor has the attributes of gguf's
ReaderTensor that the loader and `gguf.quants.dequantize` use.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_NESTING = 8  # arrays of arrays: GGUF files use one level
MAX_DIMS = 4  # GGML's own limit on a tensor's dimensions

# Scalar value types: struct format letter (after the byte order) and numpy dtype.
_SCALARS: dict[int, tuple[str, str]] = {
    GGUFValueType.UINT8: ("B", "u1"), GGUFValueType.INT8: ("b", "i1"),
    GGUFValueType.UINT16: ("H", "u2"), GGUFValueType.INT16: ("h", "i2"),
    GGUFValueType.UINT32: ("I", "u4"), GGUFValueType.INT32: ("i", "i4"),
    GGUFValueType.FLOAT32: ("f", "f4"), GGUFValueType.BOOL: ("?", "?"),
    GGUFValueType.UINT64: ("Q", "u8"), GGUFValueType.INT64: ("q", "i8"),
    GGUFValueType.FLOAT64: ("d", "f8"),
}
# Tensor types stored as plain numbers; every other type is blocks of bytes.
_PLAIN_TENSORS = {
    GGMLQuantizationType.F16: "f2", GGMLQuantizationType.F32: "f4", GGMLQuantizationType.F64: "f8",
    GGMLQuantizationType.I8: "i1", GGMLQuantizationType.I16: "i2", GGMLQuantizationType.I32: "i4",
    GGMLQuantizationType.I64: "i8",
}


class GGUFFormatError(ValueError):
    """The bytes are not a GGUF header this reader understands (cut short, damaged, unknown)."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: the fastest-varying dimension first
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray  # a read-only view of the mapped file, numpy order (bytes for block types)


@dataclass(frozen=True)
class GGUFHeader:
    fields: dict[str, Any]
    tensors: list[GGUFTensor]
    data_offset: int  # where the tensor data begins
    file_size: int


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """The metadata and tensor table of the GGUF at `path`; GGUFFormatError when it is not one,
    is cut short inside its header, or its tensors reach past the file's end."""
    mapped = np.memmap(path, mode="r")
    try:
        return _Parser(mapped).header()
    except (struct.error, UnicodeDecodeError, OverflowError) as exc:
        raise GGUFFormatError(f"unreadable GGUF header ({exc})") from exc


class _Parser:
    def __init__(self, mapped: np.memmap) -> None:
        self.mapped = mapped
        self.buf = memoryview(mapped)
        self.size = len(mapped)
        self.off = 0
        self.order = "<"

    def header(self) -> GGUFHeader:
        if bytes(self.take(4)) != b"GGUF":
            raise GGUFFormatError("GGUF magic invalid")
        (version,) = struct.unpack_from("<I", self.buf, self.off)
        if version & 0xFFFF == 0:  # written on a machine of the other byte order
            self.order = ">"
            (version,) = struct.unpack_from(">I", self.buf, self.off)
        self.off += 4
        if version not in SUPPORTED_VERSIONS:
            raise GGUFFormatError(f"GGUF version {version} is not supported")
        n_tensors, n_fields = self.unpack("QQ")
        fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = self.string()
            if key in fields:
                raise GGUFFormatError(f"GGUF metadata key {key!r} appears twice")
            fields[key] = self.value(self.unpack("I")[0])
        infos = [self.tensor_info() for _ in range(self.count(n_tensors, 24))]
        alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFFormatError(f"GGUF alignment {alignment!r} is not a power of two")
        start = -(-self.off // alignment) * alignment
        tensors = [self.tensor(start, *info) for info in infos]
        if len({t.name for t in tensors}) != len(tensors):
            raise GGUFFormatError("a GGUF tensor name appears twice")
        return GGUFHeader(fields=fields, tensors=tensors, data_offset=start, file_size=self.size)

    def take(self, n: int) -> memoryview:
        if n < 0 or self.off + n > self.size:
            raise GGUFFormatError(f"the header needs {n:,} bytes at offset {self.off:,}, past the end")
        view = self.buf[self.off:self.off + n]
        self.off += n
        return view

    def unpack(self, fmt: str) -> tuple:
        fmt = self.order + fmt
        values = struct.unpack_from(fmt, self.buf, self.off)
        self.off += struct.calcsize(fmt)
        return values

    def count(self, n: int, least_bytes: int) -> int:
        """`n` items of at least `least_bytes` each, refused when the file cannot hold them (a
        damaged count would otherwise loop for hours)."""
        if n * least_bytes > self.size - self.off:
            raise GGUFFormatError(f"a count of {n:,} items at offset {self.off:,} is past the end")
        return n

    def string(self) -> str:
        (n,) = self.unpack("Q")
        return str(self.take(n), "utf-8")

    def value(self, kind: int, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind][0])[0]
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            item_kind, n = self.unpack("IQ")
            if item_kind in _SCALARS:
                dtype = np.dtype(_SCALARS[item_kind][1]).newbyteorder(self.order)
                return np.frombuffer(self.take(self.count(n, dtype.itemsize) * dtype.itemsize),
                                     dtype=dtype).tolist()
            if item_kind == GGUFValueType.STRING:
                return self.strings(self.count(n, 8))
            if item_kind == GGUFValueType.ARRAY:  # gguf's reader flattens nested arrays too
                if depth >= MAX_NESTING:  # a hostile file's thousand levels: no RecursionError
                    raise GGUFFormatError(f"arrays nested deeper than {MAX_NESTING} at offset {self.off:,}")
                return [v for _ in range(self.count(n, 12)) for v in self.value(item_kind, depth + 1)]
        raise GGUFFormatError(f"GGUF value type {kind} is not understood")

    def strings(self, n: int) -> list[str]:
        # The hot loop of a vocabulary: locals only, one bounds check per string.
        buf, off, size, out = self.buf, self.off, self.size, []
        length = struct.Struct(self.order + "Q").unpack_from
        for _ in range(n):
            (ln,) = length(buf, off)
            off += 8
            if off + ln > size:
                raise GGUFFormatError(f"a string of {ln:,} bytes at offset {off:,} is past the end")
            out.append(str(buf[off:off + ln], "utf-8"))
            off += ln
        self.off = off
        return out

    def tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self.string()
        (n_dims,) = self.unpack("I")
        if n_dims > MAX_DIMS:  # GGML tensors have at most 4
            raise GGUFFormatError(f"GGUF tensor {name!r}: {n_dims:,} dimensions")
        dims = self.unpack("Q" * self.count(n_dims, 8))
        raw_type, offset = self.unpack("IQ")
        return name, dims, raw_type, offset

    def tensor(self, start: int, name: str, dims: tuple[int, ...], raw_type: int,
               offset: int) -> GGUFTensor:
        try:
            kind = GGMLQuantizationType(raw_type)
        except ValueError:
            raise GGUFFormatError(f"GGUF tensor {name!r}: type {raw_type} is not known") from None
        n_elements = math.prod(dims)  # Python ints: a forged shape cannot wrap around to 0
        block, type_size = GGML_QUANT_SIZES[kind]
        if (dims and dims[0] % block) or n_elements % block:
            raise GGUFFormatError(f"GGUF tensor {name!r}: shape {dims} is not whole {kind.name} blocks")
        n_bytes = n_elements * type_size // block
        begin = start + offset
        if begin + n_bytes > self.size:
            raise GGUFFormatError(f"its tensors need {begin + n_bytes:,} bytes")
        np_shape = tuple(reversed(dims))
        raw = self.mapped[begin:begin + n_bytes]
        if kind in _PLAIN_TENSORS:
            data = raw.view(np.dtype(_PLAIN_TENSORS[kind]).newbyteorder(self.order))
        else:
            data = raw
            np_shape = quant_shape_to_byte_shape(np_shape, kind)
        return GGUFTensor(name=name, tensor_type=kind, shape=dims, n_elements=n_elements,
                          n_bytes=n_bytes, data_offset=begin, data=data.reshape(np_shape))
