"""Test 9: the harness's output file is a valid safetensors file that the reference
library reads (safe_open, load_file), checked byte by byte against the format rules."""

import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import ftref


@pytest.fixture(scope="module")
def outputs(store, ft):
    shape = ftref.SHAPES["llama_gqa"]
    ids, labels = ftref.make_batch(96, 2, shape.T, 7)
    spec = dict(model_dir=store.model("llama_gqa"), input_ids=ids, labels=labels)
    return [ft(dict(spec, mode="eval"), "outfile-eval"), ft(dict(spec, mode="full"), "outfile-full")]


def _parse(path):
    raw = path.read_bytes()
    assert len(raw) >= 8, "file shorter than 8 bytes"
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), f"header length {n} runs past the end ({len(raw)} bytes)"
    text = raw[8:8 + n].decode("utf-8")
    assert text.startswith("{"), "header must start with '{'"
    header = json.loads(text)
    return raw, n, header


def test_output_safetensors_structure(outputs):
    sizes = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I64": 8, "I32": 4}
    for out in outputs:
        raw, n, header = _parse(out.path)
        meta = header.pop("__metadata__", None)
        if meta is not None:
            assert isinstance(meta, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in meta.items()), meta
        spans = []
        for name, info in header.items():
            assert set(info) == {"dtype", "shape", "data_offsets"}, (name, info)
            assert info["dtype"] == "F32", f"{name}: dtype {info['dtype']}, expected F32"
            b, e = info["data_offsets"]
            numel = 1
            for s in info["shape"]:
                assert isinstance(s, int) and s >= 0
                numel *= s
            assert e - b == numel * sizes[info["dtype"]], (name, info)
            spans.append((b, e, name))
        spans.sort()
        pos = 0
        for b, e, name in spans:
            assert b == pos, f"{name}: data_offsets begin {b}, expected {pos} (gap/overlap)"
            pos = e
        assert 8 + n + pos == len(raw), (
            f"{len(raw) - 8 - n - pos} trailing bytes after the last tensor")


def test_output_header_aligned(outputs):
    """The reference writer pads the header with spaces so the data starts 8-aligned."""
    for out in outputs:
        raw, n, _ = _parse(out.path)
        assert (8 + n) % 8 == 0, f"data starts at byte {8 + n}, not a multiple of 8"


def test_output_read_by_reference_library(outputs):
    for out in outputs:
        tensors = load_file(str(out.path))
        with safe_open(str(out.path), framework="pt") as f:
            keys = set(f.keys())
            meta = f.metadata()
            assert keys == set(tensors)
            for k in keys:
                t = f.get_tensor(k)
                assert t.dtype == torch.float32, (k, t.dtype)
                assert torch.equal(t, tensors[k])
        if meta is not None:
            assert meta.get("format", "pt") == "pt", meta
        assert tuple(tensors["logits"].shape) == (2, 12, 96)
        assert tuple(tensors["loss"].shape) == ()
    full = load_file(str(outputs[1].path))
    assert any(k.startswith("grad.") for k in full)
