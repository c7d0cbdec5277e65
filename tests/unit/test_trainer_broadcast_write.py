"""The broadcast's own safetensors writer: every dtype, shape and layout reads back bit-exact with the
safetensors library (what vLLM and transformers use to read broadcasts)."""

from __future__ import annotations

import json
import struct
from itertools import pairwise

import pytest
from prereqs import need_module

torch = need_module("torch")
from safetensors import safe_open
from safetensors.torch import load_file

from toolkit.trainer.broadcast import safetensors_header, save_safetensors


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 10, generator=g)
    return {
        "w.f32": torch.randn(7, 3, generator=g),
        "w.bf16": torch.randn(5, 4, generator=g).to(torch.bfloat16),
        "w.f16": torch.randn(9, generator=g).to(torch.float16),
        "w.f64": torch.randn(2, 2, generator=g, dtype=torch.float64),
        "i.i64": torch.arange(11, dtype=torch.int64),
        "i.i32": torch.arange(-3, 4, dtype=torch.int32),
        "i.u8": torch.arange(0, 250, 7, dtype=torch.uint8),
        "i.i8": torch.arange(-8, 8, dtype=torch.int8),
        "m.bool": torch.tensor([True, False, True]),
        "s.scalar": torch.tensor(3.5),
        "e.empty": torch.zeros(0, 4),
        "t.transposed": base.t(),  # non-contiguous: written in logical (row-major) order
        "t.slice": base[:, 2:5],
    }


def test_round_trip_bit_exact(tmp_path):
    src = _tensors()
    path = tmp_path / "m.safetensors"
    save_safetensors(path, src)
    back = load_file(str(path))
    assert set(back) == set(src)
    for k, v in src.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert torch.equal(back[k], v), k
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_header_is_aligned_and_data_has_no_holes(tmp_path):
    src = _tensors()
    head = safetensors_header(src, {"format": "pt"})
    (n,) = struct.unpack("<Q", head[:8])
    assert len(head) == 8 + n and len(head) % 8 == 0
    meta = json.loads(head[8:])
    spans = sorted(v["data_offsets"] for k, v in meta.items() if k != "__metadata__")
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in pairwise(spans))
    path = tmp_path / "m.safetensors"
    save_safetensors(path, src)
    assert path.stat().st_size == len(head) + spans[-1][1]


def test_unsupported_dtype_is_refused(tmp_path):
    with pytest.raises(ValueError, match="complex"):
        save_safetensors(tmp_path / "m.safetensors", {"c": torch.zeros(2, dtype=torch.complex64)})
