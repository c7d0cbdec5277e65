"""Gate verdict files (``reports/eval_gate.*``, ``reports/eval_validate.*``): pass/fail, JSON and Markdown round trip,
the readers reports and the Slurm gate use."""

from __future__ import annotations

import json

from toolkit.run.layout import RunDir
from toolkit.run.verdict import GateItem, Verdict, read_verdict, read_verdicts


def test_verdict_fails_only_on_fail_and_round_trips(tmp_path):
    v = Verdict("run", settings={"n": 2})
    v.items.append(GateItem("taskset_loads", "a", "PASS", "ok", {"tasks": 3}))
    v.items.append(GateItem("truncation_rate", "a", "WARN", "high-ish"))
    v.items.append(GateItem("mixed_reward", "a", "SKIP", "nothing"))
    assert v.passed
    v.items.append(GateItem("error_rate", "b", "FAIL", "50% | errored", {"rate": 0.5}))
    assert not v.passed and [i.key for i in v.failed()] == ["error_rate"]
    run = RunDir(tmp_path / "run")
    js, md = v.write(run.reports, "eval_gate")
    data = json.loads(js.read_text())
    assert data["passed"] is False and data["items"][3]["title"].startswith("infrastructure error rate")
    again = Verdict.from_dict(data)
    assert again.to_dict() == v.to_dict()
    text = md.read_text()
    assert "FAILED (1 item(s))" in text and "50% \\| errored" in text  # table cells escape pipes
    assert read_verdicts(run)["run"].items[3].evidence == {"rate": 0.5}


def test_read_verdict_skips_older_missing_and_unreadable_files(tmp_path):
    run = RunDir(tmp_path / "run")
    Verdict("run", created=100.0).write(run.reports, "eval_gate")
    assert read_verdict(run, "eval_gate").created == 100.0
    assert read_verdict(run, "eval_gate", newer_than=101.0) is None  # a verdict of an earlier job
    assert read_verdict(run, "eval_validate") is None
    (run.reports / "eval_gate.json").write_text("{")
    assert read_verdict(run, "eval_gate") is None
