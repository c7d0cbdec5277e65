"""The in-place safetensors read of a trainer checkpoint's weights (``checkpoint._load_weights``)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from toolkit.trainer import checkpoint
from toolkit.trainer.checkpoint import _contiguous_spans, _load_weights, _read_safetensors_into


class _Mixed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3, 5))
        self.h = torch.nn.Parameter(torch.zeros(7, dtype=torch.bfloat16))
        self.register_buffer("scale", torch.zeros(()))  # 0-d
        self.register_buffer("mask", torch.zeros(4, dtype=torch.bool))


def _source() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(3, 5, generator=g),
        "h": torch.randn(7, generator=g).to(torch.bfloat16),
        "scale": torch.tensor(2.5),
        "mask": torch.tensor([True, False, True, True]),
    }


def test_in_place_read_is_exact_and_keeps_parameter_storage(tmp_path):
    src = _source()
    save_file(src, str(tmp_path / "m.safetensors"))
    model = _Mixed()
    ptr = model.w.data_ptr()
    assert _read_safetensors_into(tmp_path / "m.safetensors", model.state_dict())
    for k, v in model.state_dict().items():
        assert torch.equal(v, src[k]), k
    assert model.w.data_ptr() == ptr and model.w.requires_grad


def test_layout_mismatch_changes_nothing_and_falls_back_to_strict_load(tmp_path):
    src = _source()
    src["w"] = torch.ones(5, 3)  # wrong shape
    save_file(src, str(tmp_path / "m.safetensors"))
    model = _Mixed()
    assert not _read_safetensors_into(tmp_path / "m.safetensors", model.state_dict())
    assert torch.count_nonzero(model.h.float()) == 0  # nothing was written before the mismatch was found
    with pytest.raises(RuntimeError, match="size mismatch"):
        _load_weights(tmp_path / "m.safetensors", model)


@pytest.mark.parametrize("streams", [1, 3])
def test_truncated_file_raises(tmp_path, monkeypatch, streams):
    monkeypatch.setattr(checkpoint, "READ_STREAMS", streams)
    monkeypatch.setattr(checkpoint, "PARALLEL_READ_BYTES", 0)
    save_file(_source(), str(tmp_path / "m.safetensors"))
    data = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "t.safetensors").write_bytes(data[:-8])
    with pytest.raises(ValueError, match="ends inside"):
        _read_safetensors_into(tmp_path / "t.safetensors", _Mixed().state_dict())


@pytest.mark.parametrize("streams", [2, 3, 8])
def test_concurrent_streams_read_the_same_bytes(tmp_path, monkeypatch, streams):
    monkeypatch.setattr(checkpoint, "READ_STREAMS", streams)
    monkeypatch.setattr(checkpoint, "PARALLEL_READ_BYTES", 0)  # streams even for a small file
    g = torch.Generator().manual_seed(1)
    src = {f"t{i}": torch.randn(int(n), generator=g) for i, n in enumerate(torch.randint(1, 5000, (40,), generator=g))}
    save_file(src, str(tmp_path / "many.safetensors"))
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    assert _read_safetensors_into(tmp_path / "many.safetensors", dst)
    for k, v in src.items():
        assert torch.equal(dst[k], v), k


def test_spans_cover_every_job_once_in_file_order():
    jobs = [(i * 10, f"t{i}", bytes(size)) for i, size in enumerate([5, 1, 1, 1, 9, 2, 2, 3])]
    for n in (1, 2, 3, 8, 20):
        spans = _contiguous_spans(jobs, n)
        assert 1 <= len(spans) <= n and all(spans)
        assert [job for span in spans for job in span] == jobs
