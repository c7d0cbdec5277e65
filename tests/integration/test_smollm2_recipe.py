"""The reverse-text SFT -> RL recipe on a real pretrained model, SmolLM2-135M-Instruct, on CPU:
`jobs/sft-then-rl.sh jobs/reverse-text-smollm2 2000` as a user runs it (about 20 minutes on 2 cores).

Holds the curve README records: SFT lifts the held-out avg@4 far above the instruct model's (0.15 -> 0.66 measured),
and the RL phase gains over its own starting point (the SFT model) on the same held-out tasks and sampling seeds,
judged by the paired difference of per-task means and its standard error, not by two noisy readings.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from prereqs import need_module
from run_records import metrics_lines

from toolkit.run.store import load_rollouts

ROOT = Path(__file__).resolve().parents[2]
SCORE = "eval/reverse-text-test/avg@4"

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.vllm]


def _evals(run: Path) -> dict[int, float]:
    return {m["step"]: m[SCORE] for m in metrics_lines(run) if SCORE in m}


def paired_gain(run: Path, first: int, last: int) -> tuple[float, float]:
    """Mean over held-out tasks of (task's mean reward at eval ``last`` - at eval ``first``), and its standard
    error: both evals draw the same tasks with the same seeds, so the pairing removes the tasks' own spread."""
    df = load_rollouts(run / "store" / "rollouts.h5", columns=["step", "kind", "task_id", "reward"], kind="eval")
    per_task = df.groupby(["step", "task_id"], observed=True)["reward"].mean().unstack(0)
    diff = (per_task[last] - per_task[first]).dropna()
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff)))


@pytest.mark.timeout(3600)
def test_smollm2_learns_reverse_text_in_sft_and_gains_in_rl(tmp_path):
    need_module("torch")
    need_module("vllm")
    overlay = tmp_path / "out.toml"
    overlay.write_text(f'output_dir = "{tmp_path / "runs"}"\n')
    r = subprocess.run(
        ["jobs/sft-then-rl.sh", "jobs/reverse-text-smollm2", "2000", "@", str(overlay)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=3300,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-4000:]
    runs = {p.name.split("--")[0]: p for p in (tmp_path / "runs").iterdir() if (p / "metrics.jsonl").is_file()}
    sft, rl = runs["sft"], runs["reverse-text"]
    sft_evals, rl_evals = _evals(sft), _evals(rl)
    print("SFT evals", sft_evals, "\nRL evals", rl_evals)
    assert sft_evals[max(sft_evals)] >= sft_evals[0] + 0.3, sft_evals
    gain, stderr = paired_gain(rl, 0, max(rl_evals))
    print(f"RL gain over the SFT model: {gain:+.3f} +- {stderr:.3f} (paired, per held-out task)")
    assert gain > 2 * stderr, (gain, stderr, rl_evals)
