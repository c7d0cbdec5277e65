"""The W&B mirror with the real wandb library in offline mode (no network): what W&B's files hold equals
``metrics.jsonl``, a second attempt continues the same W&B run, and the API key is taken only from its variable."""

from __future__ import annotations

import json
import math

import pytest
from prereqs import need_module
from wandb_records import read_offline_run, same_values, unprefixed

from toolkit.fsutil import append_jsonl
from toolkit.run.layout import RunDir


def _run(tmp_path, name="r1") -> RunDir:
    run = RunDir(tmp_path / name)
    run.root.mkdir(parents=True)
    run.run_meta.write_text(json.dumps({"run_id": "0123abcd" * 4, "created": 0.0, "name": name}))
    return run


def _line(role: str, step: int, **metrics) -> dict:
    return {"step": step, "time": 1000.0 + step, "role": role, **metrics}


def test_offline_files_hold_metrics_jsonl_and_a_resume_continues_the_same_run(tmp_path):
    need_module("wandb")
    from toolkit.trainer.wandb_mirror import WandbMirror

    run = _run(tmp_path)
    lines = [
        _line("orchestrator", 0, **{"eval/rt/avg@4": 0.25}),
        _line("orchestrator", 1, **{"reward/all/mean": 0.5, "time/step": 2.0}),
        _line("trainer", 1, **{"loss/mean": -0.01, "time/step": 1.5, "optim/grad_norm": float("nan")}),
    ]
    for m in lines[:2]:
        append_jsonl(run.metrics, m)
    mirror = WandbMirror.start(run, {"project": "p", "offline": True})
    assert mirror is not None
    append_jsonl(run.metrics, lines[2])
    with open(run.metrics, "ab") as f:  # a line still being written is not mirrored yet
        f.write(b'{"step": 2, "role": "trai')
    assert mirror.pump() == 1
    first = mirror.close()
    assert first is not None and first.parent == run.wandb

    # A second attempt (a resume): the torn line is completed, more lines arrive.
    with open(run.metrics, "ab") as f:
        f.write(b'ner", "time": 1002.0, "loss/mean": 0.2}\n')
    lines.append(_line("trainer", 2, **{"loss/mean": 0.2}))
    lines.append(_line("orchestrator", 2, **{"reward/all/mean": 0.75}))
    append_jsonl(run.metrics, lines[-1])
    mirror = WandbMirror.start(run, {"offline": True})
    second = mirror.close()
    assert second is not None and second != first
    assert run.wandb_offline_runs() == [first, second]
    from toolkit.launch.progress import progress_lines

    # `srl status` (and the local launcher at the end of a run) print the upload command, oldest attempt first.
    assert f"W&B files saved offline; upload with: wandb sync {first} {second}" in progress_lines(run)

    rec1, rows1 = read_offline_run(first)
    rec2, rows2 = read_offline_run(second)
    assert rec1["run_id"] == rec2["run_id"] == "0123abcd" * 4  # one W&B run across attempts
    assert rec1["project"] == "p" and rec1["display_name"] == "r1"
    rows = rows1 + rows2
    assert [r["_step"] for r in rows] == list(range(len(lines)))  # each line once, at its index in the file
    for row, line in zip(rows, lines, strict=True):
        got = unprefixed(row)
        assert same_values(got, line), (got, line)
    assert rows[2]["trainer/optim/grad_norm"] in ("NaN", "nan") or math.isnan(rows[2]["trainer/optim/grad_norm"])


def test_sweep_points_are_grouped_by_sweep_name(tmp_path):
    need_module("wandb")
    from toolkit.trainer.wandb_mirror import WandbMirror, sweep_group

    (tmp_path / "lr-sweep").mkdir()
    (tmp_path / "lr-sweep" / "manifest.json").write_text(json.dumps({"name": "lr-sweep", "points": []}))
    run = _run(tmp_path / "lr-sweep", "p003")
    assert sweep_group(run) == "lr-sweep"
    assert sweep_group(_run(tmp_path, "alone")) is None
    append_jsonl(run.metrics, _line("trainer", 1, **{"loss/mean": 1.0}))
    first = WandbMirror.start(run, {}).close()
    rec, rows = read_offline_run(first)
    assert rec["run_group"] == "lr-sweep" and rec["display_name"] == "p003"
    assert rows[0]["trainer/loss/mean"] == 1.0


@pytest.mark.parametrize("kind", ["rl", "sft"])
def test_config_panel_holds_the_runs_own_resolved_config_without_env_vars(tmp_path, kind):
    need_module("wandb")
    from toolkit.trainer.wandb_mirror import WandbMirror

    run = _run(tmp_path)
    resolved = run.resolved(kind)
    resolved.parent.mkdir(parents=True)
    resolved.write_text(json.dumps({"trainer": {"lr": 2e-5}, "env_vars": {"HF_HOME": "/private"}}))
    rec, _ = read_offline_run(WandbMirror.start(run, {"offline": True}).close())
    config = rec["config"]["update"]
    assert config["trainer"] == {"lr": 2e-5} and "env_vars" not in config


def test_online_without_the_key_variable_logs_offline_and_never_reads_another(tmp_path, monkeypatch):
    need_module("wandb")
    from toolkit.trainer.wandb_mirror import WandbMirror

    monkeypatch.delenv("SRL_TEST_WB_KEY", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "not-this-one")  # only the named variable counts
    run = _run(tmp_path)
    append_jsonl(run.metrics, _line("trainer", 1, **{"loss/mean": 1.0}))
    mirror = WandbMirror.start(run, {"offline": False, "api_key_var": "SRL_TEST_WB_KEY"})
    assert mirror is not None and mirror.wb_run.settings.mode == "offline"
    assert mirror.close() is not None
    for f in run.root.rglob("*"):
        if f.is_file():
            assert b"not-this-one" not in f.read_bytes(), f


@pytest.mark.parametrize("file", [False])
def test_config_refuses_wandb_without_the_metrics_file(file):
    from pydantic import ValidationError

    from toolkit.config.model import MonitorsConfig

    with pytest.raises(ValidationError, match="needs monitors.file = true"):
        MonitorsConfig(file=file, wandb={})
