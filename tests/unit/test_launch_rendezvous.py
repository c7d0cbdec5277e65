"""The message of a failed torchrun rendezvous (toolkit/launch/rendezvous.py): which trainer node never joined, read
from what this start of the step wrote to each node's log. The real failure on the local Slurm cluster:
tests/integration/test_trainer_rendezvous_slurm.py."""

from __future__ import annotations

from pathlib import Path

from golden.layouts import LAYOUTS, make_cfg, merge

from toolkit.launch.rendezvous import StepLogs, node_logs, rendezvous_failure
from toolkit.placement import build_plan
from toolkit.placement.runtime import is_multinode_torchrun, torchrun_starting_line
from toolkit.preflight.site import load_site
from toolkit.run.layout import RunDir

TIMEOUT = "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n"
UNREACHABLE = (
    "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d "
    "store has failed. See inner exception for details.\n"
)


def _trainer(tmp_path: Path, train_nodes: int = 3):
    over = merge(
        LAYOUTS["train2-infer1"], {"deployment": {"num_train_nodes": train_nodes, "trainer_rendezvous_timeout_s": 120}}
    )
    cfg = make_cfg(over, site="prime-intellect")
    plan = build_plan(cfg, load_site("prime-intellect"), RunDir(tmp_path / "run"), job_id="77")
    plan.hosts = [f"gpu-{i:02d}" for i in range(plan.num_nodes)]
    plan.addresses = [f"10.0.0.{i}" for i in range(plan.num_nodes)]
    spec = plan.process("trainer")
    assert is_multinode_torchrun(spec) and spec.node_indices == (1, 2, 3)
    return plan, spec


def test_a_node_that_never_started_torchrun_is_named_from_this_start_of_the_step_only(tmp_path):
    plan, spec = _trainer(tmp_path)
    logs = node_logs(tmp_path, spec)
    assert [p.name for p in logs] == ["trainer-0.log", "trainer-1.log", "trainer-2.log"]
    # An earlier start of the step (before a requeue) left every node's marker; this start's node 2 writes nothing.
    for k, p in enumerate(logs):
        p.write_text(torchrun_starting_line(k, 3, plan.hosts[spec.node_indices[k]]) + "\nstep 5 done\n")
    marks = StepLogs.mark(logs)
    logs[0].open("a").write(torchrun_starting_line(0, 3, "gpu-01") + "\n" + TIMEOUT)
    logs[1].open("a").write(torchrun_starting_line(1, 3, "gpu-02") + "\n")  # killed by srun while it waited
    msg = rendezvous_failure(plan, spec, marks.texts(), marks.paths)
    assert msg == (
        "the torchrun rendezvous of the 3 trainer nodes did not complete within 120 s "
        "(deployment.trainer_rendezvous_timeout_s): gpu-03 (trainer node 2 of 3; log "
        f"{logs[2]}) did not join (its torchrun never started)"
    )


def test_nodes_that_could_not_reach_the_first_trainer_node_are_named_with_its_address(tmp_path):
    plan, spec = _trainer(tmp_path)
    texts = [
        torchrun_starting_line(0, 3, "gpu-01") + "\n" + TIMEOUT,
        torchrun_starting_line(1, 3, "gpu-02") + "\n" + UNREACHABLE,
        torchrun_starting_line(2, 3, "gpu-03") + "\n",
    ]
    msg = rendezvous_failure(plan, spec, texts, node_logs(tmp_path, spec))
    assert msg is not None and msg.endswith(
        f"gpu-02 (trainer node 1 of 3; log {tmp_path / 'trainer-1.log'}) did "
        f"not join (could not reach the rendezvous at 10.0.0.1:"
        f"{spec.ports['rdzv']})"
    )
    # When a node never started torchrun, the others' failure to reach it is the consequence, not the news.
    texts[0] = None
    msg = rendezvous_failure(plan, spec, texts, node_logs(tmp_path, spec))
    assert msg is not None and "gpu-01 (trainer node 0 of 3" in msg and "gpu-02" not in msg


def test_a_trainer_failure_without_a_rendezvous_error_keeps_its_exit_status(tmp_path):
    plan, spec = _trainer(tmp_path)
    texts = [torchrun_starting_line(k, 3, "h") + "\nRuntimeError: CUDA out of memory\n" for k in range(3)]
    assert rendezvous_failure(plan, spec, texts, node_logs(tmp_path, spec)) is None
    assert rendezvous_failure(plan, spec, [None, None, None], node_logs(tmp_path, spec)) is None
    # Every node started and none says why: the message points at every log rather than guessing a node.
    texts = [torchrun_starting_line(k, 3, "h") + "\n" + (TIMEOUT if k == 0 else "") for k in range(3)]
    msg = rendezvous_failure(plan, spec, texts, node_logs(tmp_path, spec))
    assert msg is not None and "every trainer node started torchrun" in msg and str(tmp_path / "trainer-2.log") in msg
