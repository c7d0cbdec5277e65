"""Secrets (issue 9 item 6), login-node side: with canary secrets in the environment and named in the config,
nothing srl writes while preparing and rendering a Slurm run (resolved configs, placement, sbatch scripts, sweep
manifest and array script) and nothing it prints contains a canary value; a secret value put into a config's
env table is refused before anything is written. (The local run with real components is scanned by
``tests/integration/test_faults_local_resume.py``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CANARIES = {
    "WANDB_API_KEY": "canary-wandb-4a1f0c93be27",
    "HF_TOKEN": "hf_canary8c21d7e04b5f",
    "OPENAI_API_KEY": "sk-canary-f00dfacec0ffee",
}


@pytest.fixture
def canary_env(monkeypatch):
    for k, v in CANARIES.items():
        monkeypatch.setenv(k, v)


def _scan(root: Path, text: str) -> list[str]:
    found = [f"output: {k}" for k, v in CANARIES.items() if v in text]
    for f in root.rglob("*"):
        if f.is_file() and not f.is_symlink():
            data = f.read_bytes()
            found += [f"{f}: {k}" for k, v in CANARIES.items() if v.encode() in data]
    return found


def test_rendered_slurm_run_holds_no_secret(tmp_path, canary_env, capsys):
    from toolkit.cli import main

    out = tmp_path / "out"
    rc = main(["rl", "@", str(ROOT / "jobs/reverse-text/rl.toml"), "@", str(ROOT / "jobs/reverse-text/slurm.toml"),
               "--site", "local-slurm", "--output-dir", str(out), "--run.name", "sec", "--dry-run",
               "--slurm.secret-env-vars", '["HF_TOKEN", "OPENAI_API_KEY"]', "--monitors.wandb.project", "p"])
    text = "".join(capsys.readouterr())
    assert rc == 0, text
    script = out / "sec" / "launcher" / "rl.sbatch"
    body = script.read_text()
    for name in CANARIES:  # names only: the job checks they are set, sbatch propagates the values
        assert name in body
    assert _scan(out, text) == []


def test_rendered_sweep_holds_no_secret(tmp_path, canary_env, capsys):
    from toolkit.cli import main

    sweep = tmp_path / "s.toml"
    sweep.write_text(f'[sweep]\nname = "sec"\nbase = ["{ROOT}/jobs/reverse-text/rl.toml"]\nseeds = [0, 1]\n'
                     '[config]\nslurm = {{ secret_env_vars = ["HF_TOKEN", "OPENAI_API_KEY"] }}\n'.replace("{{", "{")
                     .replace("}}", "}"))  # fmt: skip
    out = tmp_path / "out"
    rc = main(["sweep", "@", str(sweep), "--output-dir", str(out), "--site", "local-slurm", "--dry-run"])
    text = "".join(capsys.readouterr())
    assert rc == 0, text
    assert list(out.rglob("array_*.sbatch"))
    assert _scan(out, text) == []


@pytest.mark.parametrize("table", ["env_vars", "trainer.env_vars", "orchestrator.env_vars", "inference.env_vars"])
def test_secret_value_in_config_is_refused_before_writing(tmp_path, canary_env, capsys, table):
    from toolkit.cli import main

    out = tmp_path / "out"
    rc = main(["rl", "@", str(ROOT / "jobs/reverse-text/rl.toml"), "--output-dir", str(out), "--dry-run",
               f"--{table}.OPENAI_API_KEY", CANARIES["OPENAI_API_KEY"]])
    err = capsys.readouterr().err
    assert rc != 0 and "secret_env_vars" in err
    assert CANARIES["OPENAI_API_KEY"] not in err  # the refusal does not echo the value
    assert not out.exists()
