"""Which exit ends a run (``Supervisor.first_ending``), with real short-lived child processes: the same rule for a
local run and a Slurm batch job."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from toolkit.config.model import MonitorsConfig
from toolkit.launch.supervisor import Supervisor
from toolkit.run.heartbeat import LONG, Heartbeat
from toolkit.run.layout import RunDir


def _sup(tmp_path: Path, grace_s: float = 60.0, max_restarts: int = 0, **roles: str) -> Supervisor:
    """A supervisor whose children are ``python -c CODE`` processes, one per ``role=CODE``; ``grace_s`` is the
    run's ``slurm.checkpoint_grace_s``, ``max_restarts`` its ``inference.max_restarts``."""
    cfg = SimpleNamespace(
        slurm=SimpleNamespace(checkpoint_grace_s=grace_s),
        monitors=MonitorsConfig(),
        inference=SimpleNamespace(max_restarts=max_restarts),
    )
    sup = Supervisor(cfg, RunDir(tmp_path / "run"), None, say=lambda *a, **k: None, own_groups=False)
    for role, code in roles.items():
        sup.start(role, role, [sys.executable, "-c", code], dict(os.environ), tmp_path / f"{role}.log")
    return sup


def _settle(sup: Supervisor, *roles: str) -> None:
    """Wait until the children of ``roles`` have exited."""
    for c in sup.children:
        if c.role in roles:
            c.proc.wait(timeout=30)


def test_a_finished_sft_trainer_leaves_the_orchestrator_its_final_eval(tmp_path: Path) -> None:
    # The orchestrator runs until the test lets it finish, however slowly the test itself is scheduled.
    done = tmp_path / "eval-done"
    waits = f"import pathlib, time\nwhile not pathlib.Path({str(done)!r}).exists():\n    time.sleep(0.05)"
    sup = _sup(tmp_path, trainer="pass", orchestrator=waits)
    try:
        _settle(sup, "trainer")
        assert sup.first_ending() is None  # the orchestrator still evaluates the final weights
        done.touch()
        _settle(sup, "orchestrator")
        assert sup.first_ending() is not None and sup.first_ending().returncode == 0
    finally:
        sup.stop_all(term_wait_s=0.0)


def test_an_orchestrator_that_outlives_the_trainer_by_the_grace_period_is_stopped(tmp_path: Path) -> None:
    # It keeps no progress record (like the placement tests' probe, or a hung one): the grace runs from the
    # trainer's exit.
    sup = _sup(tmp_path, grace_s=0.5, trainer="pass", orchestrator="import time; time.sleep(60)")
    try:
        _settle(sup, "trainer")
        assert sup.first_ending() is None  # its exit is seen now: the grace period starts
        time.sleep(0.6)
        first = sup.first_ending()
        assert first is not None and (first.role, first.returncode) == ("trainer", 0)
    finally:
        sup.stop_all(term_wait_s=0.0)


def test_a_final_eval_that_progresses_outlives_the_grace_and_ends_one_grace_after_its_last_progress(
    tmp_path: Path,
) -> None:
    # A 400-task multi-turn final eval outlasted a fixed 5-minute grace from the trainer's exit and was cancelled.
    # Each eval group is progress in the orchestrator's record (written here for the child process).
    # The supervisor looks at the records every PROGRESS_CHECK_S (1 s): the grace here is longer than that.
    sup = _sup(tmp_path, grace_s=1.5, trainer="pass", orchestrator="import time; time.sleep(60)")
    record = Heartbeat(sup.run, "orchestrator")
    record.phase("eval at step 50", step=50, kind=LONG)
    try:
        _settle(sup, "trainer")
        assert sup.first_ending() is None
        for _ in range(3):  # 3.3 s of eval groups, more than twice the grace
            time.sleep(1.1)
            record.advance()
            sup.check_progress(now=time.monotonic())
            assert sup.first_ending() is None
        time.sleep(1.6)  # no progress for longer than the grace
        sup.check_progress(now=time.monotonic())
        first = sup.first_ending()
        assert first is not None and (first.role, first.returncode) == ("trainer", 0)
    finally:
        sup.stop_all(term_wait_s=0.0)


def test_a_finished_rl_orchestrator_leaves_the_trainer_its_last_batches(tmp_path: Path) -> None:
    sup = _sup(tmp_path, grace_s=0.1, orchestrator="pass", trainer="import time; time.sleep(60)")
    try:
        _settle(sup, "orchestrator")
        assert sup.first_ending() is None
        time.sleep(0.2)
        assert sup.first_ending() is None  # however long the trainer takes
    finally:
        sup.stop_all(term_wait_s=0.0)


def test_a_failed_role_or_any_server_exit_ends_the_run(tmp_path: Path) -> None:
    sup = _sup(tmp_path, orchestrator="raise SystemExit(3)", trainer="import time; time.sleep(60)")
    try:
        _settle(sup, "orchestrator")
        first = sup.first_ending()
        assert first is not None and (first.role, first.returncode) == ("orchestrator", 3)
    finally:
        sup.stop_all(term_wait_s=0.0)
    sup = _sup(tmp_path, inference="pass", trainer="import time; time.sleep(60)")
    try:
        _settle(sup, "inference")
        first = sup.first_ending()
        assert first is not None and (first.role, first.returncode) == ("inference", 0)  # an engine has no clean exit
    finally:
        sup.stop_all(term_wait_s=0.0)


def test_a_dead_engine_is_left_to_the_restarts_while_they_are_on(tmp_path: Path) -> None:
    """An engine that died after this poll's restart check is not the run's end while restarts are on: the next
    poll restarts it (or ends the run once its budget is used). A stop request turns that off."""
    sup = _sup(tmp_path, max_restarts=1, inference="pass", trainer="import time; time.sleep(60)")
    try:
        _settle(sup, "inference")
        assert sup.first_ending() is None
        sup.request_stop()
        first = sup.first_ending()
        assert first is not None and first.role == "inference"
    finally:
        sup.stop_all(term_wait_s=0.0)


def test_a_child_whose_env_names_cpus_starts_pinned_to_them(tmp_path: Path) -> None:
    # An engine's SRL_CPU_AFFINITY (placement/cpus.py) is applied between fork and exec, also on a restart.
    cpu = min(os.sched_getaffinity(0))
    out = tmp_path / "affinity.txt"
    code = f"import os, pathlib; pathlib.Path({str(out)!r}).write_text(str(sorted(os.sched_getaffinity(0))))"
    cfg = SimpleNamespace(
        slurm=SimpleNamespace(checkpoint_grace_s=60.0),
        monitors=MonitorsConfig(),
        inference=SimpleNamespace(max_restarts=0),
    )
    sup = Supervisor(cfg, RunDir(tmp_path / "run"), None, say=lambda *a, **k: None, own_groups=False)
    env = {**os.environ, "SRL_CPU_AFFINITY": str(cpu)}
    sup.start("inference-0-0", "inference", [sys.executable, "-c", code], env, tmp_path / "e.log")
    _settle(sup, "inference")
    assert out.read_text() == str([cpu])
