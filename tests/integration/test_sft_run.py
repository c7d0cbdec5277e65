"""``srl sft`` end to end on this machine, as a user runs it: reference data from the RL job's taskset, a run that is
stopped with Ctrl-C and resumed, against an uninterrupted twin.

Checks: the run directory layout (configs per attempt, logs, metrics with the SFT metric names, checkpoints with
COMPLETE and their HF weights, the final ``model/``); every step recorded exactly once; the resumed run trained on
exactly the samples of the uninterrupted one, step by step (``data_order.jsonl``), and ends with the same weights;
the final model loads in transformers and its loss on a batch equals the trainer's last recorded loss scale.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_records import srl_background

from toolkit.run import heartbeat
from toolkit.run.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
STEPS = 24


def _srl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        cwd=cwd,
        text=True,
        capture_output=True,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=600,
    )


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _trainer_steps(run: Path) -> list[int]:
    return [m["step"] for m in _lines(run / "metrics.jsonl") if m.get("role") == "trainer"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sft")
    r = _srl(
        "sft",
        "make-data",
        "data/rt.jsonl",
        "@",
        str(REPO / "jobs/reverse-text/rl.toml"),
        "--taskset.num-train-examples",
        "600",
        cwd=d,
    )
    assert r.returncode == 0, r.stderr
    assert "wrote 600 rows" in r.stdout
    return d


def _argv(name: str) -> list[str]:
    # No online eval here (test_sft_rl_chain has it): the trainer alone keeps this test quick.
    return [
        "sft",
        "@",
        str(REPO / "jobs/reverse-text/sft.toml"),
        "--data.name",
        "data/rt.jsonl",
        "--max-steps",
        str(STEPS),
        "--ckpt.interval",
        "4",
        "--val.interval",
        "8",
        "--data.batch-size",
        "16",
        "--eval.env",
        "[]",
        "--run.name",
        name,
    ]


def test_sft_stopped_and_resumed_trains_exactly_the_uninterrupted_samples(workdir):
    straight = _srl(*_argv("straight"), cwd=workdir)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    a = workdir / "outputs" / "straight"
    assert _trainer_steps(a) == list(range(1, STEPS + 1))
    trainer = [m for m in _lines(a / "metrics.jsonl") if m.get("role") == "trainer"]
    last = trainer[-1]
    for key in (
        "loss/mean",
        "loss/perplexity",
        "val/loss",
        "val/perplexity",
        "optim/lr",
        "optim/grad_norm",
        "progress/epoch",
        "progress/num_samples",
        "progress/num_tokens",
        "perf/throughput",
    ):
        assert key in last, key
    first = trainer[0]
    assert last["loss/mean"] < first["loss/mean"]  # it learns
    assert (a / "checkpoints" / f"step_{STEPS}" / "COMPLETE").is_file()
    assert (a / "checkpoints" / f"step_{STEPS}" / "hf" / "config.json").is_file()
    assert (a / "model" / "model.safetensors").is_file()
    assert (a / "configs" / "latest" / "resolved" / "sft.json").is_file()

    # The twin: Ctrl-C after step 10, then --resume.
    b = workdir / "outputs" / "stopped"
    proc = srl_background(*_argv("stopped"), cwd=workdir)
    deadline = time.monotonic() + 300
    while max((_trainer_steps(b) if (b / "metrics.jsonl").exists() else []), default=0) < 10:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "the SFT run did not reach step 10"
        time.sleep(0.2)
    # Hold the trainer (found by its progress record) until the launcher has handled Ctrl-C and written the run's
    # stop request: the trainer cannot train the remaining steps before the launcher is scheduled, however busy the
    # machine, and resumes to see the stop.
    run_b = RunDir(b)
    trainer_pid = next(r["pid"] for r in heartbeat.read_all(run_b).values() if r.get("role") == "trainer")
    os.kill(trainer_pid, signal.SIGSTOP)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + 120
        while not run_b.stop_request.exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the launcher never wrote the stop request after Ctrl-C"
            time.sleep(0.1)
    finally:
        os.kill(trainer_pid, signal.SIGCONT)
    out = proc.communicate(timeout=120)[0]
    stopped_at = max(_trainer_steps(b))
    assert stopped_at < STEPS, "stopped too late to test a resume"
    assert "--resume" in out  # the launcher prints how to continue
    resumed = _srl(*_argv("stopped"), "--resume", cwd=workdir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _trainer_steps(b) == list(range(1, STEPS + 1)), "a step lost or repeated"
    assert _lines(b / "data_order.jsonl") == _lines(a / "data_order.jsonl")

    # Same samples, same checkpointed state: the same final weights (CPU float32 is deterministic here).
    from safetensors.numpy import load_file

    wa, wb = load_file(a / "model" / "model.safetensors"), load_file(b / "model" / "model.safetensors")
    assert wa.keys() == wb.keys()
    worst = max(float(abs(wa[k] - wb[k]).max()) for k in wa)
    assert worst < 1e-5, worst

    # The final model is a plain HF directory: transformers loads it and generates.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a / "model")
    model = AutoModelForCausalLM.from_pretrained(a / "model")
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Reverse: abc"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    gen = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] > ids.shape[1]


def test_a_resume_of_a_finished_sft_run_is_refused(workdir):
    a = workdir / "outputs" / "straight"
    if not (a / "model").exists():
        pytest.skip("needs the run of the test above")
    r = _srl(*_argv("straight"), "--resume", cwd=workdir)
    assert r.returncode == 2 and "already finished" in r.stderr


def test_bad_data_is_refused_before_anything_is_written(workdir):
    bad = workdir / "data" / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a"\n')
    r = _srl(
        "sft", "@", str(REPO / "jobs/reverse-text/sft.toml"), "--data.name", str(bad), "--run.name", "bad", cwd=workdir
    )
    assert r.returncode == 2
    assert "bad.jsonl: row 1 (line 2): not valid JSON" in r.stderr
    assert not (workdir / "outputs" / "bad").exists()


def test_sft_run_logs_its_metrics_to_wandb_offline(workdir):
    """``[monitors.wandb]`` on an SFT run: the trainer mirrors every metrics.jsonl line into one offline W&B run in
    the run directory (read back with W&B's own reader), and the launcher prints the sync command."""
    from prereqs import need_module
    from wandb_records import read_offline_run, same_values, unprefixed

    need_module("wandb")
    r = _srl(
        "sft",
        "@",
        str(REPO / "jobs/reverse-text/sft.toml"),
        "--data.name",
        "data/rt.jsonl",
        "--max-steps",
        "4",
        "--data.batch-size",
        "8",
        "--val.interval",
        "2",
        "--eval.env",
        "[]",
        "--monitors.wandb.project",
        "srl-sft-test",
        "--run.name",
        "wb",
        cwd=workdir,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run = workdir / "outputs" / "wb"
    lines = _lines(run / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2, 3, 4] and "val/loss" in lines[1]
    (attempt,) = sorted((run / "wandb").glob("offline-run-*"))
    rec, rows = read_offline_run(attempt)
    assert rec["project"] == "srl-sft-test"
    assert len(rows) == len(lines)
    for row, line in zip(rows, lines, strict=True):
        assert same_values(unprefixed(row), line), (row, line)
    assert "wandb sync" in r.stdout and str(attempt) in r.stdout, r.stdout[-2000:]


def test_sft_on_tool_call_rows_with_the_hermes_renderer(workdir):
    """``srl sft`` on conversations with tools, tool calls and tool results (the shape a tool env's traces have),
    rendered by srl's hermes renderer as the RL job on a tool env renders them: the run trains, its loss falls on
    the trained tokens (the calls and answers), and it ends with its model."""
    words = ["heron", "maple", "quartz", "otter", "cedar", "falcon", "lotus", "amber"]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "the code of a word",
                "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
            },
        }
    ]
    rows = []
    for i in range(64):
        w = words[i % len(words)]
        code = f"{w[:3].upper()}-{i % 10}"
        call = {"id": f"c{i}", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"word": w})}}
        rows.append(
            {
                "tools": tools,
                "messages": [
                    {"role": "user", "content": f"What is the code for {w}?"},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "content": code, "tool_call_id": f"c{i}"},
                    {"role": "assistant", "content": f"The code is {code}."},
                ],
            }
        )
    (workdir / "data" / "tools.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = _srl(
        "sft",
        "@",
        str(REPO / "jobs/reverse-text/sft.toml"),
        "--data.name",
        "data/tools.jsonl",
        "--renderer.name",
        "hermes",
        "--data.seq-len",
        "2048",
        "--data.batch-size",
        "8",
        "--max-steps",
        "12",
        "--val.interval",
        "12",
        "--ckpt.interval",
        "12",
        "--eval.env",
        "[]",
        "--run.name",
        "tools",
        cwd=workdir,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run = workdir / "outputs" / "tools"
    assert _trainer_steps(run) == list(range(1, 13))
    losses = [m["loss/mean"] for m in _lines(run / "metrics.jsonl") if m.get("role") == "trainer"]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    assert (run / "model" / "model.safetensors").is_file()
