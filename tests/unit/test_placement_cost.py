"""The cost envelope of a Slurm job: nodes and GPUs per het group with their processes, node- and GPU-hours."""

from __future__ import annotations

from pathlib import Path

from golden.layouts import LAYOUTS, make_cfg, merge

from toolkit.config.slurm_time import parse_slurm_time
from toolkit.placement import build_plan
from toolkit.placement.cost import cost_envelope
from toolkit.preflight.site import load_site
from toolkit.run.layout import RunDir

PI = load_site("prime-intellect")


def _plan(over: dict, **kw):
    cfg = make_cfg(over, site="prime-intellect", **kw)
    return cfg, build_plan(cfg, PI, RunDir(cfg.output_dir / cfg.run.name), job_id="7")


def test_a_plain_job_is_its_nodes_times_the_time_limit() -> None:
    cfg, plan = _plan(LAYOUTS["train2-infer1"], slurm={"time": "02:30:00"})
    env = cost_envelope(plan, parse_slurm_time(cfg.slurm.time))
    assert (env.nodes, env.gpus, env.node_hours, env.gpu_hours) == (3, 24, 7.5, 60.0)
    assert env.groups == ("3 node(s) x 8 GPU(s) (partition cluster; inference-0-0, trainer, orchestrator)",)
    assert "at most 7.5 node-hours and 60.0 GPU-hours per attempt" in env.line()
    assert "no upper bound" in cost_envelope(plan, None).line()


def test_het_groups_of_a_served_teacher_and_an_orchestrator_are_counted_with_their_processes(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    opd = {"train": {"algo": {"type": "opd", "teacher": {"serve": True, "name": str(tmp_path / "m"), "tp": 2}}}}
    over = merge(LAYOUTS["train2-infer1"], {"deployment": {"orchestrator_partition": "cpu"}})
    _cfg, plan = _plan(over, orchestrator=opd, slurm={"time": "60"})
    env = cost_envelope(plan, 3600)
    assert (env.nodes, env.gpus, env.node_hours, env.gpu_hours) == (5, 26, 5.0, 26.0)
    assert env.groups[1] == "group 1: 1 node(s) x 0 GPU(s) (partition cpu; orchestrator)"
    assert env.groups[2].startswith("group 2: 1 node(s) x 2 GPU(s) (") and env.groups[2].endswith("teacher-0)")
