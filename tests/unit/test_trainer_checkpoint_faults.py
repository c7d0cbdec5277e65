"""Hostile checkpoints for the in-place reads (``_read_safetensors_into``, ``_load_optimizer_state``): a malformed,
truncated or mismatched file raises ValueError before anything is written into the live tensors, and an
optimizer whose own state differs in dtype, shape or layout from the file still gets the file's exact values."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from toolkit.run.layout import RunDir
from toolkit.trainer import checkpoint
from toolkit.trainer.checkpoint import (
    _load_optimizer_state,
    _read_safetensors_into,
    load_trainer_state,
    save_trainer_state,
)
from toolkit.trainer.optim import build_optimizer


def _file(path, header: dict | list, data: bytes, *, length: int | None = None):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


FLOATS = struct.pack("<4f", 1, 2, 3, 4)
A = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
B = {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}


@pytest.mark.parametrize(
    ("header", "data", "length", "match"),
    [
        ({"a": A, "b": B}, FLOATS, 2**40, "not a safetensors file"),  # corrupt length: no terabyte allocation
        ({"a": A, "b": A}, FLOATS, None, "overlap"),  # b would silently read a's bytes
        ({"a": A, "b": {**B, "data_offsets": [-8, 0]}}, FLOATS, None, "malformed"),  # into the header
        ({"a": A, "b": {**B, "data_offsets": [8, 16.0]}}, FLOATS, None, "malformed"),
        ({"a": A, "b": {**B, "shape": "2"}}, FLOATS, None, "malformed"),
        ({"a": A, "b": [0, 8]}, FLOATS, None, "malformed"),
        ([1, 2], FLOATS, None, "JSON object"),
        ({"a": A, "b": B}, FLOATS[:12], None, "ends inside tensor b"),  # truncated
        ({"a": A, "b": B}, FLOATS + b"\0" * 8, None, "after the last tensor"),
        ({"a": A, "b": {**B, "data_offsets": [12, 20]}}, FLOATS + b"\0" * 4, None, "gap"),
    ],
    ids=[
        "huge_length",
        "overlap",
        "negative",
        "float_offset",
        "shape_str",
        "entry_list",
        "not_object",
        "truncated",
        "trailing",
        "gap",
    ],
)
def test_malformed_files_raise_value_error_and_write_nothing(tmp_path, header, data, length, match):
    path = _file(tmp_path / "x.safetensors", header, data, length=length)
    dst = {"a": torch.full((2,), 7.0), "b": torch.full((2,), 7.0)}
    with pytest.raises(ValueError, match=match):
        _read_safetensors_into(path, dst)
    assert all(torch.equal(t, torch.full((2,), 7.0)) for t in dst.values())


def test_short_and_non_json_headers_raise_value_error(tmp_path):
    for blob in (b"", b"\x03", struct.pack("<Q", 4) + b"\xff\xfe{}", struct.pack("<Q", 3000) + b"[" * 3000):
        (tmp_path / "x.safetensors").write_bytes(blob)
        with pytest.raises(ValueError):
            _read_safetensors_into(tmp_path / "x.safetensors", {"a": torch.zeros(2)})


class _Net(torch.nn.Module):
    """Two matrices of transposed shapes, a bias and a zero-size parameter (a LoRA rank-0 factor, an empty
    expert): every edge of the optimizer layout in a few hundred bytes."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(3, 4, generator=g))
        self.w2 = torch.nn.Parameter(torch.randn(4, 3, generator=g))
        self.b = torch.nn.Parameter(torch.randn(3, generator=g))
        self.empty = torch.nn.Parameter(torch.zeros(0, 3))

    def forward(self, x):
        return (x @ self.w1.t() @ self.w2.t() @ self.w1.t()).sum() + self.b.sum() + self.empty.sum()


def _trained(seed: int, order=None):
    torch.manual_seed(seed)
    net = _Net()
    params = order(net) if order else None
    opt = (
        torch.optim.AdamW([{"params": params}], lr=1e-2)
        if params
        else build_optimizer(net, lr=1e-2, weight_decay=0.01, betas=(0.9, 0.99))
    )
    for _ in range(2):
        opt.zero_grad()
        net(torch.randn(5, 4)).backward()
        opt.step()
    return net, opt


def _moments(opt) -> dict:
    return {
        (i, k): v.clone()
        for i, p in enumerate(x for g in opt.param_groups for x in g["params"])
        for k, v in opt.state[p].items()
    }


@pytest.fixture
def saved(tmp_path):
    net, opt = _trained(1)
    part = save_trainer_state(RunDir(tmp_path / "run"), 2, net, opt, None)
    return part, _moments(opt)


def test_round_trip_with_a_zero_size_parameter_is_exact(saved):
    part, want = saved
    net, opt = _trained(2)
    assert load_trainer_state(part, net, opt, None) == 2
    got = _moments(opt)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("odd", ["bf16", "non_contiguous", "wrong_shape", "missing"])
def test_own_state_of_another_dtype_shape_or_layout_still_gets_the_files_values(saved, odd):
    part, want = saved
    net, opt = _trained(2)
    for p in (net.w1, net.w2):
        st = opt.state[p]
        if odd == "bf16":
            st["exp_avg"] = st["exp_avg"].to(torch.bfloat16)  # read in place, its bytes would be garbage
        elif odd == "non_contiguous":
            st["exp_avg_sq"] = st["exp_avg_sq"].t().contiguous().t()
            assert not st["exp_avg_sq"].is_contiguous()
        elif odd == "wrong_shape":
            st["exp_avg"] = torch.zeros(st["exp_avg"].numel())
        else:
            del opt.state[p]
    load_trainer_state(part, net, opt, None)
    got = _moments(opt)
    assert all(torch.equal(got[k].to(want[k].dtype), want[k]) for k in want)


@pytest.mark.parametrize("other", ["fewer_params", "reordered"])
def test_an_optimizer_of_another_layout_raises_before_touching_its_state(saved, other):
    part, _ = saved
    if other == "fewer_params":
        torch.manual_seed(2)
        net = _Net()
        net.b.requires_grad_(False)  # the same weights, one parameter fewer in the optimizer
        opt = build_optimizer(net, lr=1e-2, weight_decay=0.01, betas=(0.9, 0.99))
        opt.zero_grad()
        net(torch.randn(5, 4)).backward()
        opt.step()
    else:  # the same parameters in another order: w1's moments would be given to w2 (shape (4, 3) != (3, 4))
        net, opt = _trained(2, order=lambda n: [n.w2, n.w1, n.empty])
    before = _moments(opt)
    with pytest.raises(ValueError, match="parameter groups of sizes|another model"):
        load_trainer_state(part, net, opt, None)
    after = _moments(opt)
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_a_truncated_optimizer_file_raises_and_leaves_the_live_state(saved):
    part, _ = saved
    data = (part / "optimizer.safetensors").read_bytes()
    (part / "optimizer.safetensors").write_bytes(data[:-4])
    _, opt = _trained(2)
    before = _moments(opt)
    own, _ = checkpoint._split_optimizer_state(opt.state_dict())
    with pytest.raises(ValueError, match="ends inside"):
        _load_optimizer_state(part, own, params=[list(g["params"]) for g in opt.param_groups])
    after = _moments(opt)
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_a_checkpoint_of_more_params_than_the_optimizer_is_refused(saved):
    part, _ = saved
    net, opt = _trained(2)
    fewer = [[p for p in g["params"] if p is not net.empty] for g in opt.param_groups]
    with pytest.raises(ValueError, match="parameter groups of sizes"):
        _load_optimizer_state(part, None, params=fewer)
