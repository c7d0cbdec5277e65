"""A failed role's ending names the exception and the line that raised it (its log's last traceback), offers a resume
only when one can get past it, and `srl diagnose` reports the same instead of only "the orchestrator failed"."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from analysis.diagnose import diagnose
from toolkit.run import ending
from toolkit.run.launcher import write_local_record
from toolkit.run.layout import RunDir

# A role module that fails the way srl's roles fail: an exception raised several frames down, after some logging.
ROLE = """
import logging, sys
logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
logging.getLogger("srl.orchestrator").warning("starting")

def check(envs):
    if not envs:
        raise {exc}("orchestrator.train.env is empty: nothing to train on")

def main():
    try:
        open("/nonexistent/srl-test")
    except OSError:
        check([])

main()
"""


def _failed_role_log(tmp_path, run: RunDir, exc: str) -> tuple[str, int]:
    """Run ``ROLE`` as a real process with its output in ``logs/latest/orchestrator.log``; returns the module's
    path and the line of its ``raise``."""
    module = tmp_path / "role_module.py"
    module.write_text(ROLE.format(exc=exc))
    run.log_attempt(1).mkdir(parents=True)
    run.latest_logs.symlink_to("attempt_1")
    with open(run.latest_logs / "orchestrator.log", "wb") as log:
        rc = subprocess.run([sys.executable, str(module)], stdout=log, stderr=log, timeout=60, check=False).returncode
    assert rc == 1
    line = next(i for i, t in enumerate(module.read_text().splitlines(), 1) if "raise " in t)
    return str(module), line


@pytest.fixture
def run(tmp_path):
    r = RunDir(tmp_path / "run")
    r.control.mkdir(parents=True)
    r.metrics.write_text(json.dumps({"role": "trainer", "step": 4, "loss/mean": 0.1}) + "\n")
    return r


def test_a_failed_role_names_its_exception_and_line_and_a_repeating_one_offers_no_resume(tmp_path, run):
    module, line = _failed_role_log(tmp_path, run, "ValueError")
    log = run.latest_logs / "orchestrator.log"
    end = ending.settle(run, failed="orchestrator", failed_reason=f"exit status 1 (log: {log})")
    assert end.exception == "ValueError: orchestrator.train.env is empty: nothing to train on"
    assert end.where == f"{module}:{line}"  # the innermost frame, not main()'s call
    assert "failed in orchestrator at step 4: ValueError: orchestrator.train.env is empty" in end.line()
    assert f"({module}:{line}); exit status 1 (log: {log})" in end.line()
    assert not end.resume_helps  # the same config raises it again
    assert ending.read(run) == end  # recorded, and read back with both fields


def test_a_transient_failure_or_one_without_a_traceback_still_offers_the_resume(tmp_path, run):
    _failed_role_log(tmp_path, run, "ConnectionError")
    end = ending.settle(run, failed="orchestrator", failed_reason="exit status 1")  # the log found by its name
    assert end.exception.startswith("ConnectionError: ") and end.resume_helps
    (run.latest_logs / "orchestrator.log").write_text("killed by the OOM killer\n")
    end = ending.settle(run, failed="orchestrator", failed_reason="exit status -9")
    assert end.exception is None and end.resume_helps and end.summary().endswith(": exit status -9")
    assert ending.Ending("completed").resume_helps is False


def test_the_last_traceback_of_a_log_wins_and_odd_logs_answer_none(tmp_path):
    log = tmp_path / "x.log"
    assert ending.last_exception(log) is None and ending.last_exception(None) is None
    log.write_text(
        'Traceback (most recent call last):\n  File "/a/toolkit/envs/server.py", line 3, in f\n'
        "    g()\nKeyError: 'old'\nretrying\n"
        'Traceback (most recent call last):\n  File "/venv/lib/site-packages/verifiers/v1/x.py", '
        "line 9, in h\n    raise TasksetFieldError('split')\n    ^^^^^\n"
        "toolkit.envs.registry.TasksetFieldError: taskset 'reverse-text' has no field 'split'\n"
        "  more of the message\n"
    )
    found = ending.last_exception(log)
    assert found.where == "verifiers/v1/x.py:9"
    assert found.exception == "toolkit.envs.registry.TasksetFieldError: taskset 'reverse-text' has no field 'split'"
    assert ending.exception_name(found.exception) == "TasksetFieldError"
    log.write_bytes(b"\xff\xfe garbage\n" * 10)
    assert ending.last_exception(log) is None


def test_diagnose_reports_the_exception_of_a_failed_local_run(tmp_path, run):
    module, line = _failed_role_log(tmp_path, run, "ValueError")
    (run.root / "configs").mkdir()
    run.local_record.parent.mkdir(parents=True)
    write_local_record(run, attempt=1, status=1)
    ending.settle(run, failed="orchestrator", failed_reason="exit status 1")
    found = [f for f in diagnose(run.root) if f.boundary == "local: launcher failed"]
    assert len(found) == 1
    f = found[0]
    assert "orchestrator raised ValueError: orchestrator.train.env is empty" in f.summary
    assert f"at {module}:{line}" in f.summary and f.evidence["failed_role"] == "orchestrator"
    # Without the ending record (a supervisor killed before it wrote one), the role logs' last traceback.
    run.ending.unlink()
    f = next(f for f in diagnose(run.root) if f.boundary == "local: launcher failed")
    assert f.evidence["exception"].startswith("ValueError: ") and f.evidence["raised_at"] == f"{module}:{line}"


def test_diagnose_prefers_a_roles_traceback_over_an_engine_logs_earlier_sorting_one(tmp_path, run):
    """Without an ending record, the failed role is looked for in the trainer's and orchestrator's logs before
    others: an engine log (``engine-0.log`` sorts first) may hold a harmless traceback it recovered from."""
    module, line = _failed_role_log(tmp_path, run, "ValueError")
    (run.latest_logs / "engine-0.log").write_text(
        "Traceback (most recent call last):\n  File \"/opt/vllm/x.py\", line 3, in f\nKeyError: 'harmless'\n"
    )
    (run.root / "configs").mkdir()
    run.local_record.parent.mkdir(parents=True)
    write_local_record(run, attempt=1, status=1)
    f = next(f for f in diagnose(run.root) if f.boundary == "local: launcher failed")
    assert f.evidence["failed_role"] == "orchestrator" and f.evidence["raised_at"] == f"{module}:{line}"
