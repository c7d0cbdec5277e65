"""tests/argv_checks.py, the real-parser check of planned command lines, refuses what the real programs refuse.

vLLM's parser is exercised by the Slurm placement tests (its import alone takes ~10 s); here srl's role parsers,
torchrun's and the router's, whose checks must fail on a broken argv and pass on the plan's own.
"""

from __future__ import annotations

from argv_checks import argv_problems

GOOD = [
    ["srl", "orchestrator", "--run-dir", "/runs/a"],
    ["srl", "trainer", "--run-dir", "/runs/a"],
    [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "10.0.0.1:29500",
        "--rdzv-id",
        "srl-7",
        "-m",
        "toolkit.trainer.main",
        "--run-dir",
        "/runs/a",
    ],
    [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "10.0.0.1:29500",
        "--rdzv-id",
        "srl-7",
        "--rdzv-conf",
        "join_timeout=300,read_timeout=60",
        "-m",
        "toolkit.trainer.main",
        "--run-dir",
        "/runs/a",
    ],
    [
        "vllm-router",
        "--host",
        "10.0.0.1",
        "--port",
        "8000",
        "--policy",
        "round_robin",
        "--worker-urls",
        "http://10.0.0.2:8001",
    ],
]
RDZV = "torchrun --nnodes 2 --rdzv-backend c10d --rdzv-conf"
TRAINER = "-m toolkit.trainer.main --run-dir /r"
BAD = {
    "srl orchestrator --run-dir /runs/a --bogus": "unrecognized arguments: --bogus",
    "srl orchestratr --run-dir /runs/a": "unknown command 'orchestratr'",
    "srl trainer": "the following arguments are required: --run-dir",
    "torchrun --nnodes 3:2 -m toolkit.trainer.main --run-dir /runs/a": "min_nodes must be > 0 and <= max_nodes",
    "torchrun --nnodes 1 -m toolkit.trainer.main --rundir /runs/a": "torchrun's worker toolkit.trainer.main",
    "torchrun --nnodes 1 -m toolkit.trainer.nowhere": "no module named toolkit.trainer.nowhere",
    f"{RDZV} join_timout=300 {TRAINER}": "reads no key join_timout",
    f"{RDZV} join_timeout=0 {TRAINER}": "must be positive",
    f"{RDZV} join_timeout=1.5 {TRAINER}": "'join_timeout' does not represent a valid integer",
    "vllm-router --policy fastest": "invalid choice: 'fastest'",
    "mpirun -n 2 python": "unknown program 'mpirun'",
}


def test_plan_shaped_command_lines_are_accepted_and_broken_ones_refused_with_the_reason():
    problems = argv_problems(GOOD + [cmd.split() for cmd in BAD])
    assert len(problems) == len(BAD), problems  # every good one accepted, every bad one refused
    for (cmd, reason), problem in zip(BAD.items(), problems):
        assert problem.startswith(cmd + ":") and reason in problem, (cmd, problem)
