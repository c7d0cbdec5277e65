"""The progress watchdog's logic (toolkit.launch.watchdog) over real progress records (toolkit.run.heartbeat): who
is blamed for a stall, the bounds of long phases, the evidence from /proc, and the ending it records."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from pydantic import ValidationError

from toolkit.config.model import RLConfig
from toolkit.launch import watchdog
from toolkit.launch.watchdog import Bounds, HealthWatch, ProgressWatch
from toolkit.run import ending, heartbeat
from toolkit.run.heartbeat import STARTUP, WEIGHTS, Heartbeat
from toolkit.run.layout import RunDir

LIVE = {"trainer", "orchestrator"}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def run(tmp_path):
    return RunDir(tmp_path / "run")


def _roles(run, clock):
    t = Heartbeat(run, "trainer", key="trainer.rank0", clock=clock)
    o = Heartbeat(run, "orchestrator", clock=clock)
    return t, o


def test_a_stopped_trainer_is_blamed_not_the_orchestrator_waiting_on_it(run):
    clock = Clock()
    t, o = _roles(run, clock)
    w = ProgressWatch(Bounds(60.0))
    t.phase("train step 5", step=5)
    o.phase("waiting for policy 4 to collect step 6", step=6, waiting_for="trainer")
    assert w.observe(heartbeat.read_all(run), LIVE, 0.0) == []
    # The trainer is stopped: its record freezes. The orchestrator waits and keeps beating.
    for now in range(5, 61, 5):
        clock.t += 5
        o.beat()
        assert w.observe(heartbeat.read_all(run), LIVE, float(now)) == []
    clock.t += 5
    o.beat()
    stalls = w.observe(heartbeat.read_all(run), LIVE, 65.0)
    assert [s.key for s in stalls] == ["trainer.rank0"]
    s = stalls[0]
    assert s.hung and s.step == 5 and s.pids() == [os.getpid()]
    assert s.message().startswith("trainer made no progress for 65 s at step 5 (phase: train step 5; bound 60 s")


def test_progress_resets_the_clock_and_beats_alone_do_not(run):
    clock = Clock()
    t, _ = _roles(run, clock)
    w = ProgressWatch(Bounds(10.0), roles=("trainer",))
    t.phase("waiting for batch 1", step=1, waiting_for="orchestrator")
    w.observe(heartbeat.read_all(run), {"trainer"}, 0.0)
    for now in (4.0, 8.0, 12.0):
        t.phase(f"train step {int(now)}", step=int(now))
        assert w.observe(heartbeat.read_all(run), {"trainer"}, now) == []
    for now in (15.0, 18.0, 21.5):  # a busy loop that only beats: alive, but no progress
        clock.t += 6
        t.beat()
        assert w.observe(heartbeat.read_all(run), {"trainer"}, now) == []
    clock.t += 6
    t.beat()
    stalls = w.observe(heartbeat.read_all(run), {"trainer"}, 22.5)
    assert [s.key for s in stalls] == ["trainer.rank0"] and not stalls[0].hung


def test_a_trainer_waiting_for_an_orchestrator_that_exited_is_blamed_after_the_bound(run):
    clock = Clock()
    t, o = _roles(run, clock)
    w = ProgressWatch(Bounds(30.0))
    o.phase("writing batch 8", step=8)
    t.phase("waiting for batch 9", step=9, waiting_for="orchestrator")
    w.observe(heartbeat.read_all(run), LIVE, 0.0)
    # The orchestrator exited cleanly: only the trainer is live; it waits and beats forever.
    for now in (10.0, 20.0, 30.0):
        clock.t += 10
        t.beat()
        assert w.observe(heartbeat.read_all(run), {"trainer"}, now) == []
    clock.t += 10
    t.beat()
    stalls = w.observe(heartbeat.read_all(run), {"trainer"}, 31.0)
    assert [s.key for s in stalls] == ["trainer.rank0"] and stalls[0].peer_gone
    assert "the orchestrator it waits for has exited" in stalls[0].message()


def test_two_roles_waiting_on_each_other_are_both_named(run):
    clock = Clock()
    t, o = _roles(run, clock)
    w = ProgressWatch(Bounds(10.0))
    t.phase("waiting for batch 3", step=3, waiting_for="orchestrator")
    o.phase("waiting for policy 2", step=4, waiting_for="trainer")
    w.observe(heartbeat.read_all(run), LIVE, 0.0)
    clock.t += 11
    t.beat()
    o.beat()
    stalls = w.observe(heartbeat.read_all(run), LIVE, 11.0)
    assert {s.role for s in stalls} == LIVE


def test_a_waiting_role_is_never_blamed_while_its_peer_progresses(run):
    clock = Clock()
    t, o = _roles(run, clock)
    w = ProgressWatch(Bounds(10.0))
    o.phase("waiting for policy 1", step=3, waiting_for="trainer")
    for now in range(0, 100, 5):
        clock.t += 5
        t.phase(f"train step {now}", step=now)
        o.beat()
        assert w.observe(heartbeat.read_all(run), LIVE, float(now)) == []


def test_an_orchestrator_waiting_for_a_restarting_engine_is_not_blamed_while_an_engine_lives(run):
    clock = Clock()
    t, o = _roles(run, clock)
    w = ProgressWatch(Bounds(10.0))
    t.phase("waiting for batch 3", step=3, waiting_for="orchestrator")
    o.phase(
        "waiting for inference (an engine is down or restarting) during: collecting the groups of step 3",
        waiting_for="inference",
    )
    serving = LIVE | {"inference"}
    w.observe(heartbeat.read_all(run), serving, 0.0)
    for now in range(5, 100, 5):  # an engine restart longer than the bound: its own watch bounds it
        clock.t += 5
        t.beat()
        o.beat()
        assert w.observe(heartbeat.read_all(run), serving, float(now)) == []
    # No engine process left: nobody will ever serve; the orchestrator is named, and why.
    stalls = w.observe(heartbeat.read_all(run), LIVE, 100.0)
    assert [s.role for s in stalls] == ["orchestrator"] and stalls[0].peer_gone
    assert "the inference it waits for has exited" in stalls[0].message()


def test_an_orchestrator_collecting_nothing_from_a_healthy_engine_is_blamed(run):
    # Not waiting on anyone (the gate is open: the engine answers /health but never completes a request).
    clock = Clock()
    t, o = _roles(run, clock)
    w = ProgressWatch(Bounds(10.0))
    t.phase("waiting for batch 3", step=3, waiting_for="orchestrator")
    o.phase("collecting the groups of step 3", step=3)
    w.observe(heartbeat.read_all(run), LIVE | {"inference"}, 0.0)
    clock.t += 11
    t.beat()
    o.beat()
    assert [s.role for s in w.observe(heartbeat.read_all(run), LIVE | {"inference"}, 11.0)] == ["orchestrator"]


def test_an_excused_role_starts_its_clock_again(run):
    # The supervisor excuses the orchestrator while an engine does not answer: its bound counts from then on.
    clock = Clock()
    t, o = _roles(run, clock)
    w = ProgressWatch(Bounds(10.0))
    t.phase("waiting for batch 3", step=3, waiting_for="orchestrator")
    o.phase("collecting the groups of step 3", step=3)
    w.observe(heartbeat.read_all(run), LIVE, 0.0)
    clock.t += 11
    t.beat()
    o.beat()
    assert [s.role for s in w.observe(heartbeat.read_all(run), LIVE, 11.0)] == ["orchestrator"]
    w.excuse("orchestrator", 11.0)
    for now, blamed in ((16.0, []), (20.0, []), (22.0, ["orchestrator"])):
        clock.t += 3
        t.beat()
        o.beat()
        assert [s.role for s in w.observe(heartbeat.read_all(run), LIVE, now)] == blamed, now


def test_roles_without_a_record_and_exited_roles_are_not_watched(run):
    clock = Clock()
    t, _ = _roles(run, clock)
    w = ProgressWatch(Bounds(10.0))
    assert w.observe({}, LIVE, 0.0) == [] and w.observe({}, LIVE, 1000.0) == []
    t.phase("train step 1", step=1)
    w.observe(heartbeat.read_all(run), LIVE, 0.0)
    assert w.observe(heartbeat.read_all(run), {"orchestrator"}, 100.0) == []  # the trainer exited


def test_bounds_scale_for_start_up_and_for_the_weights_a_phase_moves():
    b = Bounds(100.0, startup_factor=3.0, s_per_gib=60.0)
    assert b.bound({"kind": None}) == 100.0
    assert b.bound({"kind": STARTUP}) == 300.0 == b.bound(None)
    assert b.bound({"kind": "long"}) == 300.0
    assert b.bound({"kind": WEIGHTS, "size_bytes": 4 * 2**30}) == 100.0 + 240.0
    assert b.bound({"kind": WEIGHTS, "size_bytes": "junk"}) == 100.0
    with pytest.raises(ValueError, match="stall_timeout_s must be > 0"):
        Bounds(0.0)


def test_a_long_phase_is_not_a_stall_within_its_scaled_bound(run):
    clock = Clock()
    t = Heartbeat(run, "trainer", key="trainer.rank0", clock=clock)
    w = ProgressWatch(Bounds(10.0, startup_factor=5.0, s_per_gib=10.0), roles=("trainer",))
    t.phase("checkpoint 4", step=4, kind=WEIGHTS, size_bytes=3 * 2**30)  # bound 10 + 30 s
    w.observe(heartbeat.read_all(run), {"trainer"}, 0.0)
    assert w.observe(heartbeat.read_all(run), {"trainer"}, 39.0) == []
    assert w.observe(heartbeat.read_all(run), {"trainer"}, 41.0)[0].bound_s == 40.0


def test_config_field_is_validated():
    m = RLConfig().monitors
    assert m.stall_timeout_s == 1800.0 and Bounds.from_config(m).bound(None) == 1800.0 * m.stall_startup_factor
    for bad in (0, -5, "soon"):
        with pytest.raises(ValidationError, match="stall_timeout_s"):
            RLConfig.model_validate({"monitors": {"stall_timeout_s": bad}})


def test_heartbeat_writes_are_rate_limited_and_never_raise(run, tmp_path):
    clock = Clock()
    t = Heartbeat(run, "trainer", key="trainer.rank0", clock=clock)
    t.phase("waiting for batch 1", step=1, waiting_for="orchestrator")
    beats = heartbeat.read_all(run)["trainer.rank0"]["beat"]
    t.beat()
    assert heartbeat.read_all(run)["trainer.rank0"]["beat"] == beats  # within BEAT_INTERVAL_S: not written
    clock.t += heartbeat.BEAT_INTERVAL_S
    t.beat()
    assert heartbeat.read_all(run)["trainer.rank0"]["beat"] == beats + 1
    with pytest.raises(ValueError, match="unknown phase kind"):
        t.phase("x", kind="forever")
    blocked = Heartbeat(RunDir(tmp_path / "file"), "trainer")
    (tmp_path / "file").write_text("not a directory")
    blocked.phase("train step 1", step=1)  # an unwritable run directory: said once, never raised
    assert blocked.failed
    (run.progress / "junk.json").write_text("{not json")
    assert set(heartbeat.read_all(run)) == {"trainer.rank0"}
    heartbeat.clear(run)
    assert heartbeat.read_all(run) == {}


def test_health_watch_names_an_engine_silent_past_the_bound():
    h = HealthWatch(30.0)
    h.reset("inference-0", 0.0)
    h.observe("inference-0", True, 10.0)
    h.observe("inference-0", False, 35.0)
    assert h.overdue(35.0) == []
    h.observe("inference-0", False, 41.0)
    assert h.overdue(41.0) == ["inference-0"] and h.silent_for("inference-0", 41.0) == 31.0
    h.reset("inference-0", 41.0)
    assert h.overdue(50.0) == []


def test_proc_state_sees_a_stopped_process_and_stack_dumps_reach_a_live_one(tmp_path):
    log = tmp_path / "child.log"
    # 'ready' is printed inside waiting_here, so a dump asked for after it always shows that frame.
    code = (
        "import sys, time; from toolkit.run.heartbeat import enable_stack_dumps; enable_stack_dumps()\n"
        "def waiting_here():\n    print('ready', flush=True)\n    time.sleep(600)\nwaiting_here()"
    )
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=f, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        # A live process may read as S, R or (on a loaded machine, paging) D: anything but stopped or gone.
        assert watchdog.proc_state(p.pid) not in ("T", "t", "Z", None)
        states = watchdog.request_stacks([p.pid])
        assert states[p.pid] not in ("T", "t", "Z", None)
        deadline = time.monotonic() + 120
        while "waiting_here" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "waiting_here" in log.read_text() and p.poll() is None  # dumped and still running
        os.kill(p.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 120
        while watchdog.proc_state(p.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watchdog.request_stacks([p.pid]) == {p.pid: "T"}  # not signalled: it could not answer
        assert "cannot dump its stacks" in watchdog.describe_state("T")
    finally:
        p.kill()
        p.wait()
    assert watchdog.proc_state(p.pid) is None


def test_remote_probe_script_reports_and_signals_like_the_local_one(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        os.kill(p.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 120
        while watchdog.proc_state(p.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        out = subprocess.run(
            ["sh", "-c", watchdog.remote_probe_script([p.pid, 999_999_99])], capture_output=True, text=True, check=True
        ).stdout
        assert watchdog.parse_probe(out) == {p.pid: "T", 999_999_99: None}
    finally:
        p.kill()
        p.wait()


def test_a_stall_ending_names_the_role_and_has_its_own_status(run):
    run.root.mkdir(parents=True)
    e = ending.settle(run, stalled="trainer", stalled_reason="trainer made no progress for 600 s at step 5 (phase: x)")
    assert (e.cause, e.role, e.exit_status) == ("stalled", "trainer", 7)
    assert ending.read(run) == e
    assert "progress watchdog" in e.line() and "trainer made no progress for 600 s at step 5" in e.line()
    # Recorded before the stop request and kills, which would otherwise read as a user's stop or a failure.
    run.stop_request.parent.mkdir(parents=True, exist_ok=True)
    run.stop_request.write_text("orchestrator: zero-signal guard: 10 steps\n")
    assert ending.settle(run, stalled="orchestrator", stalled_reason="r").cause == "stalled"


def test_waiting_for_a_role_to_finish_ends_on_its_finished_phase_or_its_silence(run):
    """The trainer's W&B mirror closes only after the orchestrator's last lines: it waits for the orchestrator's
    ``finished`` phase while the record keeps changing, and gives up on a record that stopped changing."""
    clock = Clock()
    orch = Heartbeat(run, "orchestrator", clock=clock)
    orch.phase("eval of the final policy", step=4)
    polls = []

    def on_wait():  # each poll: the orchestrator beats; at the fifth poll it finishes
        polls.append(clock.t)
        clock.t += 10.0
        orch.beat()
        if len(polls) == 5:
            orch.phase(heartbeat.FINISHED)

    got = heartbeat.wait_until_finished(run, "orchestrator", on_wait=on_wait, silent_s=30.0, poll_s=0, clock=clock)
    assert got == "finished" and len(polls) == 5  # 50 s of beats outlast a 30 s silence bound: still waited

    orch.phase("eval of the final policy", step=4)  # a new attempt's record, then the process dies silently
    polls.clear()

    def silent():
        polls.append(clock.t)
        clock.t += 10.0

    got = heartbeat.wait_until_finished(run, "orchestrator", on_wait=silent, silent_s=30.0, poll_s=0, clock=clock)
    assert got == "silent" and len(polls) == 3
    heartbeat.clear(run)  # no record at all (the orchestrator never started): silent too, not forever
    got = heartbeat.wait_until_finished(run, "orchestrator", on_wait=silent, silent_s=30.0, poll_s=0, clock=clock)
    assert got == "silent"
    stop = heartbeat.wait_until_finished(run, "orchestrator", should_stop=lambda: True, poll_s=0, clock=clock)
    assert stop == "stopped"
