"""tests/gpu/run.sh, the GPU readiness script (MFU, checkpoint and broadcast write rates), without a GPU.

What a machine without a GPU can check: the script's CPU dry mode runs the same code path end to end (model build,
srl's load_policy, packing, train_step plain and under FSDP2, checkpoint, broadcast) with srl's tiny model shape
and prints every figure; a machine that lacks a module is told which, before anything runs; the FLOP count behind
MFU is the textbook one.
"""

from __future__ import annotations

import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "tests" / "gpu" / "run.sh"


def test_script_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(RUN)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_flop_count_is_six_n_t_plus_causal_attention():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(RUN.parent))
    try:
        from bench import GPU_SHAPE, matmul_params, step_flops
    finally:
        sys.path.remove(str(RUN.parent))
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(**GPU_SHAPE, tie_word_embeddings=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    n = matmul_params(model)
    d, layers, heads, hd, kv, ff, v = 1024, 28, 16, 128, 8, 3072, 32768
    per_layer = d * heads * hd * 2 + d * kv * hd * 2 + 3 * d * ff  # q, o; k, v; gate, up, down
    assert n == layers * per_layer + d * v  # the output layer is a matmul, the embedding lookup is not
    total = sum(p.numel() for p in model.parameters())
    assert 0.5e9 < total < 0.52e9  # "a 0.5B-parameter model"
    lengths = [100, 300]
    want = 6 * n * 400 + 6 * layers * heads * hd * (100**2 + 300**2)
    assert step_flops(cfg, n, lengths) == pytest.approx(want)


@pytest.mark.slow  # about 15 s: torch, transformers and two process-group set-ups
def test_cpu_dry_mode_prints_every_figure(tmp_path):
    proc = subprocess.run(
        [str(RUN), "--cpu", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=600, check=False
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    for name in ("plain", "fsdp2"):
        m = re.search(rf"^MFU {name}: n/a \(([\d.e+-]+) TFLOP/s achieved, step ([\d.]+) s", out, re.MULTILINE)
        assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, out
    for what in ("checkpoint", "broadcast"):
        m = re.search(rf"^{what} write: ([\d.]+) MB in [\d.]+ s = (\d+) MB/s", out, re.MULTILINE)
        assert m and float(m.group(1)) > 0 and int(m.group(2)) > 0, out
    assert (tmp_path / "run" / "broadcasts" / "step_1" / "STABLE").is_file()
    assert re.search(r"^tests/gpu/run.sh: \d+ s, status 0$", out, re.MULTILINE), out


def test_missing_modules_are_named_before_anything_runs(tmp_path):
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # an interpreter without torch and the rest
    proc = subprocess.run(
        [str(RUN), "--cpu"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "SRL_PYTHON": str(bare / "bin" / "python")},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot import: torch numpy pydantic safetensors transformers" in proc.stderr, proc.stderr
    assert "SRL_GPU_WHEELS" in proc.stderr and "MFU" not in proc.stdout
