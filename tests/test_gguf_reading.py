"""edgespec.models.convert.faster_gguf_reading: the same dequantised values as gguf's own
reading, a GGUF parsed once per file, and gguf left as it was afterwards."""

from __future__ import annotations

import gguf
import gguf.quants
import numpy as np
import pytest

import edgespec.models.convert as convert
from edgespec.models.convert import faster_gguf_reading

QTYPES = [gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K]
"""The block types of the default pair's q4_k_m files."""


@pytest.mark.parametrize("qtype", QTYPES + [gguf.GGMLQuantizationType.Q8_0])
def test_dequantised_values_equal_gguf_own(tmp_path, monkeypatch, qtype):
    # several row blocks per tensor, and a last block that is cut short
    monkeypatch.setattr(convert, "DEQUANTIZE_BLOCK_VALUES", 3000)
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(int(qtype))
    raw = rng.integers(0, 256, size=(37, 3 * type_size), dtype=np.uint8)
    path = tmp_path / "blocks.bin"
    raw.tofile(path)
    data = np.memmap(path, dtype=np.uint8, mode="r", shape=raw.shape)  # as GGUFReader maps it
    with np.errstate(all="ignore"):  # random scales overflow now and then
        plain = gguf.dequantize(data, qtype)
        with faster_gguf_reading():
            fast = gguf.dequantize(data, qtype)
    assert plain.shape == fast.shape == (37, 3 * block_size)
    assert np.array_equal(plain, fast, equal_nan=True)
    assert np.isfinite(plain).mean() > 0.5  # random scales: mostly real numbers


def test_reader_built_once_per_file_and_gguf_restored(tmp_path):
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("w", np.arange(64, dtype=np.float32).reshape(8, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    originals = (gguf.dequantize, gguf.GGUFReader, gguf.quants._apply_over_grouped_rows)
    with faster_gguf_reading():
        first = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(str(path)) is first
        assert np.array_equal(first.tensors[0].data, np.arange(64, dtype=np.float32).reshape(8, 8))
    assert (gguf.dequantize, gguf.GGUFReader, gguf.quants._apply_over_grouped_rows) == originals
    assert gguf.GGUFReader(str(path)) is not gguf.GGUFReader(str(path))


def _write_gguf_with_metadata(path, endianess):
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endianess)
    writer.add_block_count(2)
    writer.add_string("general.name", "tiny ünïcode ✓")
    writer.add_float32("test.scale", 0.125)
    writer.add_bool("test.flag", True)
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "a", "", "bc", "数学", "Ġthe"] * 50)
    writer.add_array("tokenizer.ggml.token_type", [1, 2, 3] * 100)
    writer.add_array("tokenizer.ggml.scores", [0.5, -1.25, 3.0])
    writer.add_tensor("w", np.arange(48, dtype=np.float32).reshape(6, 8))
    writer.add_tensor("b", np.arange(8, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("endianess", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_fields_and_tensors_equal_gguf_own_reading(tmp_path, endianess):
    path = tmp_path / "meta.gguf"
    _write_gguf_with_metadata(path, endianess)
    plain = gguf.GGUFReader(str(path))
    plain_get = gguf.gguf_reader.GGUFReader._get
    with faster_gguf_reading():
        fast = gguf.GGUFReader(str(path))
    assert gguf.gguf_reader.GGUFReader._get is plain_get
    assert fast.byte_order == plain.byte_order == ("S" if endianess is gguf.GGUFEndian.BIG else "I")
    assert list(fast.fields) == list(plain.fields)
    for name, field in plain.fields.items():
        other = fast.fields[name]
        assert (other.offset, other.data, other.types) == (field.offset, field.data, field.types)
        assert len(other.parts) == len(field.parts)
        for a, b in zip(field.parts, other.parts, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert plain.fields["tokenizer.ggml.tokens"].contents()[4] == "数学"
    assert fast.fields["tokenizer.ggml.tokens"].contents() == (
        plain.fields["tokenizer.ggml.tokens"].contents()
    )
    assert [t.name for t in fast.tensors] == [t.name for t in plain.tensors] == ["w", "b"]
    for a, b in zip(plain.tensors, fast.tensors, strict=True):
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data)
        assert (a.data_offset, a.n_bytes) == (b.data_offset, b.n_bytes)
