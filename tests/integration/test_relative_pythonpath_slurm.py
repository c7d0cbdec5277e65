"""A researcher's own taskset on a relative ``env_vars.PYTHONPATH``, submitted to the real local Slurm cluster.

The job runs from its run directory, so ``PYTHONPATH = "my_envs"`` only works because srl made it absolute from the
directory `srl rl` ran in (and checked the taskset there, with the job's interpreter, before submitting). Checks:
the resolved config holds the absolute path, the dry run's note and the orchestrator's log name the module in
``my_envs``, and the tiny job (2 steps) ends COMPLETED.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from run_records import metrics_lines

from toolkit.launch import slurm
from toolkit.launch.submit import read_job_ids
from toolkit.run.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.slurm, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 1500.0  # engine start-up and two steps on two cores shared by the emulated nodes (and other tests)

TASKSET = textwrap.dedent('''
    """A single-turn taskset of the user's own: say the letter asked for."""
    import verifiers.v1 as vf

    class EchoData(vf.TaskData):
        answer: str

    class EchoTask(vf.Task[EchoData]):
        @vf.stop
        async def answered_once(self, trace: vf.Trace) -> bool:
            return trace.num_turns >= 1

        @vf.reward(weight=1.0)
        async def exact(self, trace: vf.Trace) -> float:
            return float((trace.last_reply or "").strip() == self.data.answer)

    class EchoConfig(vf.TasksetConfig):
        letters: str = "abcdefghijklmnop"

    class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
        def load(self):
            return [EchoTask(EchoData(prompt=f"Say {c}", answer=c), self.config.task) for c in self.config.letters]

    __all__ = ["EchoTaskset"]
''')

CONFIG = textwrap.dedent("""
    max_steps = 2
    seed = 0
    output_dir = "{out}"
    site = "local-slurm"
    env_vars = {{ PYTHONPATH = "my_envs" }}
    [run]
    name = "own-echo"
    [model]
    name = "tiny-qwen3"
    dtype = "float32"
    [orchestrator]
    batch_size = 8
    group_size = 4
    max_async_level = 1
    [orchestrator.train.sampling]
    max_completion_tokens = 4
    [[orchestrator.train.env]]
    name = "echo"
    taskset = {{ id = "own-echo", letters = "abcdefgh" }}
    max_total_tokens = 256
    [deployment]
    type = "multi_node"
    gpus_per_node = 0
    num_train_nodes = 1
    orchestrator = "with_inference"
    [slurm]
    time = "00:30:00"
""")


@pytest.mark.timeout(BUDGET_S + 600)
def test_a_relative_pythonpath_taskset_job_completes_on_slurm(tmp_path: Path) -> None:
    (tmp_path / "my_envs").mkdir()
    (tmp_path / "my_envs" / "own_echo.py").write_text(TASKSET)
    (tmp_path / "rl.toml").write_text(CONFIG.format(out=tmp_path / "out"))
    proc = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "rl", "@", "rl.toml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    module = tmp_path / "my_envs" / "own_echo.py"
    assert f"taskset 'own-echo' resolves to module own_echo at {module}" in proc.stdout + proc.stderr

    run = RunDir(tmp_path / "out" / "own-echo")
    resolved = json.loads(run.resolved("rl").read_text())
    assert resolved["env_vars"]["PYTHONPATH"] == str(tmp_path / "my_envs")
    job = read_job_ids(run)[-1][0]
    try:
        st = slurm.wait(job, timeout_s=BUDGET_S, poll_s=2.0)
    except TimeoutError:
        slurm.cancel(job)
        raise AssertionError(f"job {job} not finished after {BUDGET_S:.0f} s\n{_logs(run)}") from None
    assert st.state == "COMPLETED" and st.exit_code == 0, f"{st}\n{_logs(run)}"
    steps = sorted(m["step"] for m in metrics_lines(run.root) if m["role"] == "trainer" and m["step"] > 0)
    assert steps == [1, 2]
    log = (run.log_attempt(1) / "orchestrator.log").read_text()
    assert f"resolved to module own_echo at {module}" in log


def _logs(run: RunDir) -> str:
    parts = [p.read_text() for p in sorted(run.logs.glob("*.out"))]
    for p in sorted(run.logs.glob("attempt_*/*.log")):
        parts.append(f"---- {p.relative_to(run.root)}\n" + "\n".join(p.read_text().splitlines()[-25:]))
    return "\n".join(parts)[-12000:]
