"""The loader's own GGUF header reader gives what gguf's GGUFReader gives, at every value type and
byte order, and refuses a damaged header instead of reading past the file or looping on a count."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest

from engine.loader.gguf_header import GGUFFormatError, read_gguf_header


def assert_same_as_gguf_reader(path) -> None:
    ours = read_gguf_header(path)
    reader = gguf.GGUFReader(str(path))
    theirs = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert ours.fields == theirs
    assert [type(v) for v in ours.fields.values()] == [type(v) for v in theirs.values()]
    assert ours.data_offset == reader.data_offset
    assert [t.name for t in ours.tensors] == [t.name for t in reader.tensors]
    for mine, t in zip(ours.tensors, reader.tensors, strict=True):
        assert (mine.tensor_type, mine.shape, mine.n_elements, mine.n_bytes, mine.data_offset) == (
            t.tensor_type, tuple(t.shape.tolist()), t.n_elements, t.n_bytes, t.data_offset)
        assert mine.data.shape == t.data.shape and mine.data.dtype == t.data.dtype
        assert np.array_equal(mine.data, t.data)


def write_every_kind(path, endianess=gguf.GGUFEndian.LITTLE) -> None:
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endianess)
    scalars = {
        gguf.GGUFValueType.UINT8: 200, gguf.GGUFValueType.INT8: -100,
        gguf.GGUFValueType.UINT16: 60000, gguf.GGUFValueType.INT16: -30000,
        gguf.GGUFValueType.UINT32: 4_000_000_000, gguf.GGUFValueType.INT32: -2_000_000_000,
        gguf.GGUFValueType.UINT64: 2**63 + 5, gguf.GGUFValueType.INT64: -(2**62),
        gguf.GGUFValueType.FLOAT32: 0.25, gguf.GGUFValueType.FLOAT64: 1e-300,
        gguf.GGUFValueType.BOOL: True,
    }
    for kind, value in scalars.items():
        writer.add_key_value(f"test.{kind.name}", value, kind)
        writer.add_key_value(f"test.{kind.name}s", [value, value], gguf.GGUFValueType.ARRAY, kind)
    writer.add_string("test.string", "héllo ▁wörld <|im_end|>")
    writer.add_array("test.strings", ["", "a b", "Ġ€", "\n"] * 50)
    writer.add_token_scores([0.5, -1.5, 3.0])
    writer.add_tensor("f32", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("f16", np.arange(64, dtype=np.float16).reshape(2, 32))
    writer.add_tensor("i32", np.arange(5, dtype=np.int32))
    q8 = gguf.quants.quantize(np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64),
                              gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_embedded_model_reads_as_gguf_reads_it(smollm_gguf_path):
    assert_same_as_gguf_reader(smollm_gguf_path)


@pytest.mark.parametrize("endianess", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_value_and_tensor_type_reads_as_gguf_reads_it(tmp_path, endianess):
    path = tmp_path / f"every-{endianess.name}.gguf"
    write_every_kind(path, endianess)
    assert_same_as_gguf_reader(path)
    fields = read_gguf_header(path).fields
    assert fields["test.UINT64"] == 2**63 + 5 and fields["test.BOOLs"] == [True, True]
    assert fields["test.strings"][:4] == ["", "a b", "Ġ€", "\n"]


def test_a_damaged_count_or_length_is_refused_not_read_past_the_end(tmp_path):
    good = tmp_path / "good.gguf"
    write_every_kind(good)
    whole = bytearray(good.read_bytes())
    # The header: magic, version (u32), tensor count (u64), metadata count (u64).
    for offset in (8, 16):
        bad = bytearray(whole)
        struct.pack_into("<Q", bad, offset, 2**61)
        path = tmp_path / f"bad-{offset}.gguf"
        path.write_bytes(bad)
        with pytest.raises(GGUFFormatError):
            read_gguf_header(path)
    # The first key's length (a u64 after the counts): a string past the end of the file.
    bad = bytearray(whole)
    struct.pack_into("<Q", bad, 24, len(whole))
    (tmp_path / "long-key.gguf").write_bytes(bad)
    with pytest.raises(GGUFFormatError, match="past the end"):
        read_gguf_header(tmp_path / "long-key.gguf")
    # The string array's count: more strings than the file has bytes for.
    at = whole.index(b"test.strings") + len(b"test.strings") + 4 + 4  # value type, item type
    bad = bytearray(whole)
    struct.pack_into("<Q", bad, at, 2**40)
    (tmp_path / "many-strings.gguf").write_bytes(bad)
    with pytest.raises(GGUFFormatError, match="past the end"):
        read_gguf_header(tmp_path / "many-strings.gguf")
    end = max(t.data_offset + t.n_bytes for t in read_gguf_header(good).tensors)
    for size in (3, 20, end - 1):  # inside the magic, the counts, the last tensor
        (tmp_path / "cut.gguf").write_bytes(whole[:size])
        with pytest.raises(GGUFFormatError):
            read_gguf_header(tmp_path / "cut.gguf")


def test_a_hostile_header_is_refused_with_a_format_error(tmp_path):
    def header(*kv: bytes, tensors: bytes = b"", n_tensors: int = 0, n_kv: int = 1) -> bytes:
        return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + b"".join(kv) + tensors

    def key(name: bytes) -> bytes:
        return struct.pack("<Q", len(name)) + name

    # Arrays of arrays thousands deep: a RecursionError in a reader that follows them all.
    nested = key(b"deep") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 4, 0)
    (tmp_path / "deep.gguf").write_bytes(header(nested) + bytes(4096))
    with pytest.raises(GGUFFormatError, match="nested"):
        read_gguf_header(tmp_path / "deep.gguf")
    # A tensor whose dimensions multiply past 64 bits (0 in int64 arithmetic) or are not blocks.
    for dims, words in (([2**32, 2**32], "past the end|bytes"), ([33, 1], "blocks")):
        info = key(b"t") + struct.pack("<I", len(dims)) + struct.pack("<" + "Q" * len(dims), *dims)
        info += struct.pack("<IQ", int(gguf.GGMLQuantizationType.Q4_0), 0)
        path = tmp_path / f"dims-{dims[0]}.gguf"
        path.write_bytes(header(tensors=info, n_tensors=1, n_kv=0) + bytes(4096))
        with pytest.raises(GGUFFormatError, match=words):
            read_gguf_header(path)
    # More dimensions than GGML has.
    info = key(b"t") + struct.pack("<I", 5000) + bytes(8 * 5000)
    (tmp_path / "dims.gguf").write_bytes(header(tensors=info, n_tensors=1, n_kv=0) + bytes(4096))
    with pytest.raises(GGUFFormatError, match="dimensions"):
        read_gguf_header(tmp_path / "dims.gguf")
