"""The CLI on login-node paths: exit codes, messages, run directory, no torch/vllm imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "reverse-text" / "rl.toml"
# A fresh interpreter per command; a first dry run with a cold cache imports verifiers, slow on a busy machine. Only
# a hung command reaches this bound.
CLI_TIMEOUT_S = 300


def srl(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_help_and_schema():
    assert srl("--help").returncode == 0
    out = srl("rl", "--help")
    assert (
        out.returncode == 0 and "orchestrator.batch_size" in out.stdout and "Rollouts per training step" in out.stdout
    )


def test_config_error_exit_2_without_traceback(tmp_path):
    out = srl("rl", "@", JOB, "--orchestrator.batch-size", "100", "--output-dir", tmp_path)
    assert out.returncode == 2
    assert "orchestrator.batch_size" in out.stderr and "Traceback" not in out.stderr
    assert not any(tmp_path.iterdir()), "nothing may be written before validation passes"


def test_missing_file_and_broken_toml(tmp_path):
    out = srl("rl", "@", tmp_path / "nope.toml")
    assert out.returncode == 2 and "not found" in out.stderr and "Traceback" not in out.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[orchestrator\nbatch_size = ")
    out = srl("config", "show", "@", bad)
    assert out.returncode == 2 and "broken TOML" in out.stderr and str(bad) in out.stderr


def test_config_show_and_convert():
    out = srl("config", "show", "@", JOB, "--orchestrator.batch-size", "32")
    assert out.returncode == 0 and "batch_size = 32" in out.stdout
    out = srl("config", "convert", ROOT / "tests" / "fixtures" / "configs" / "hosted_flat.toml")
    assert out.returncode == 0 and "group_size = 8" in out.stdout and "legacy = true" in out.stdout
    assert "hosted shape" in out.stderr


def test_dry_run_writes_resolved_configs_and_refuses_existing(tmp_path):
    out = srl("rl", "@", JOB, "--dry-run", "--output-dir", tmp_path, "--run.name", "r1")
    assert out.returncode == 0, out.stderr
    run = tmp_path / "r1"
    # One resolved config, read by every role (no per-role copies that nothing reads).
    assert [p.name for p in (run / "configs" / "latest" / "resolved").iterdir()] == ["rl.json"]
    assert json.loads((run / "configs" / "latest" / "resolved" / "rl.json").read_text())
    assert (run / "configs" / "attempt_1" / "command.txt").read_text().startswith("srl rl @")
    assert (run / "configs" / "latest").resolve().name == "attempt_1"
    assert (run / "launcher" / "placement.json").exists()
    assert (run / "configs" / "attempt_1" / "DRY_RUN").exists()
    # Nothing ran in a directory that only held dry runs: the same command again (dry or not) takes it over.
    again = srl("rl", "@", JOB, "--dry-run", "--output-dir", tmp_path, "--run.name", "r1", "--max-steps", "7")
    assert again.returncode == 0, again.stderr
    assert [p.name for p in (run / "configs").glob("attempt_*")] == ["attempt_1"]
    assert json.loads((run / "configs" / "latest" / "resolved" / "rl.json").read_text())["max_steps"] == 7
    # An attempt that was launched (no dry-run marker) makes the directory a run: refused without --resume.
    (run / "configs" / "attempt_1" / "DRY_RUN").unlink()
    refused = srl("rl", "@", JOB, "--dry-run", "--output-dir", tmp_path, "--run.name", "r1")
    assert refused.returncode == 2 and "--resume" in refused.stderr
    resumed = srl("rl", "@", JOB, "--dry-run", "--resume", "--output-dir", tmp_path, "--run.name", "r1")
    assert resumed.returncode == 0 and (run / "configs" / "latest").resolve().name == "attempt_1"


def test_a_run_with_metrics_is_never_taken_over_even_if_its_attempts_were_dry(tmp_path):
    assert srl("rl", "@", JOB, "--dry-run", "--output-dir", tmp_path, "--run.name", "r2").returncode == 0
    (tmp_path / "r2" / "metrics.jsonl").write_text('{"step": 1}\n')
    refused = srl("rl", "@", JOB, "--dry-run", "--output-dir", tmp_path, "--run.name", "r2")
    assert refused.returncode == 2 and (tmp_path / "r2" / "metrics.jsonl").exists()


def test_auto_run_name(tmp_path):
    out = srl("rl", "@", JOB, "--dry-run", "--output-dir", tmp_path)
    assert out.returncode == 0, out.stderr
    (name,) = [p.name for p in tmp_path.iterdir()]
    assert name.startswith("reverse-text--tiny-qwen3--")


@pytest.mark.parametrize(
    "code",
    [
        "import toolkit.cli, toolkit.config, toolkit.config.schema_help",
        "from toolkit.cli import main; main(['rl', '@', r'{job}', '--dry-run', '--output-dir', r'{out}'])",
    ],
)
def test_login_node_paths_import_no_torch_or_vllm(code, tmp_path):
    code = code.format(job=JOB, out=tmp_path)
    probe = f"import sys\n{code}\nbad=[m for m in ('torch','vllm','transformers') if m in sys.modules]\nprint(bad)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=CLI_TIMEOUT_S, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("flag", ["--resume", "--clean"])
def test_dry_run_of_an_existing_run_leaves_it_untouched(tmp_path, flag):
    assert srl("rl", "@", JOB, "--dry-run", "--output-dir", tmp_path, "--run.name", "live").returncode == 0
    live = tmp_path / "live"
    before = {p.relative_to(live): p.stat().st_mtime_ns for p in live.rglob("*")}
    r = srl("rl", "@", JOB, "--output-dir", tmp_path, "--run.name", "live", "--dry-run", flag)
    assert r.returncode == 0, r.stderr
    assert "nothing in it is changed" in r.stdout
    after = {p.relative_to(live): p.stat().st_mtime_ns for p in live.rglob("*")}
    assert after == before  # not deleted by --clean, no new attempt, placement not rewritten
    assert (tmp_path / ".dry-run" / "live" / "launcher" / "placement.json").exists()


@pytest.mark.parametrize(
    ("tok", "want"),
    [("--dryrun", "--dry-run"), ("--dry_run", "--dry-run"), ("--resum", "--resume"), ("--clena", "--clean")],
)
def test_misspelt_own_flag_gets_a_did_you_mean(tok, want):
    from toolkit.config import ConfigError
    from toolkit.config.cli_args import split_config_args

    with pytest.raises(ConfigError, match=f"did you mean {want}"):
        split_config_args(["@", "x.toml", tok])
    assert split_config_args(["@", "x.toml", "--seed", "3"])[1] == ["--seed", "3"]


@pytest.mark.parametrize("argv", [["@", "x.toml", "--site", "@site.toml"], ["--output-dir", "@", "out.toml"]])
def test_an_override_followed_by_a_file_is_refused_naming_both(argv):
    """``--site @file.toml`` composed the site file into the run config: a boolean site and a dozen unknown keys."""
    from toolkit.config import ConfigError
    from toolkit.config.cli_args import split_config_args

    opt = next(t for t in argv if t.startswith("--"))
    with pytest.raises(ConfigError, match=f"{opt} is followed by '@.*without a value; give the value without '@'"):
        split_config_args(argv)
    assert split_config_args(["--no-foo.bar", "@", "x.toml", "--a.b=1", "@y.toml"])[0] == [
        Path("x.toml"),
        Path("y.toml"),
    ]


def test_an_override_picking_a_list_item_by_index_says_so():
    """``--orchestrator.train.env.0.name x`` once replaced the env list with a table: "should be a valid list"."""
    from toolkit.config import ConfigError
    from toolkit.config.compose import parse_overrides

    with pytest.raises(
        ConfigError, match=r"'orchestrator.train.env.0.name': a list item cannot be picked by its index"
    ):
        parse_overrides(["--orchestrator.train.env.0.name", "x"])
    with pytest.raises(ConfigError, match="bad override key 'a..b'"):
        parse_overrides(["--a..b", "1"])
    assert parse_overrides(["--env-vars.X1", "2", "--a.b2-c=3"]) == {"env_vars": {"X1": 2}, "a": {"b2_c": 3}}


def test_resume_without_name_continues_the_newest_run_that_trained(tmp_path):
    assert srl("rl", "@", JOB, "--dry-run", "--output-dir", tmp_path).returncode == 0
    (trained,) = list(tmp_path.iterdir())
    (trained / "metrics.jsonl").write_text('{"step": 1, "role": "trainer", "time": 0}\n')
    assert srl("rl", "@", JOB, "--dry-run", "--output-dir", tmp_path).returncode == 0  # a newer dry run
    out = srl("rl", "@", JOB, "--dry-run", "--resume", "--output-dir", tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"continuing {trained}" in out.stderr


def test_continue_command_is_ready_to_paste():
    from toolkit.launch.progress import continue_command

    assert (
        continue_command([".venv/bin/srl", "rl", "@", "jobs/a.toml", "--max-steps", "5"], "r1")
        == ".venv/bin/srl rl @ jobs/a.toml --max-steps 5 --run.name r1 --resume"
    )
    assert (
        continue_command(["x/cli.py", "rl", "@", "a b.toml", "--run.name=o", "--clean", "--resume"], "o")
        == "srl rl @ 'a b.toml' --resume --run.name o"
    )


def test_continue_command_of_a_run_is_its_newest_attempts_command(tmp_path):
    """What ``srl cancel`` prints: the newest attempt's recorded command (overrides kept), resuming this run."""
    from toolkit.launch.progress import continue_command_for
    from toolkit.run.layout import RunDir

    run = RunDir(tmp_path / "r7")
    assert continue_command_for(run) is None  # no attempt recorded
    for n, extra in ((1, ""), (2, " --max-steps 400")):
        run.config_attempt(n).mkdir(parents=True)
        (run.config_attempt(n) / "command.txt").write_text(
            f"srl rl @ jobs/a.toml @ jobs/s.toml{extra} --output-dir o\n"
        )
    assert (
        continue_command_for(run)
        == "srl rl @ jobs/a.toml @ jobs/s.toml --max-steps 400 --output-dir o --run.name r7 --resume"
    )
    (run.config_attempt(2) / "command.txt").write_text("srl rl @ 'unclosed\n")  # unreadable: no hint, no error
    assert continue_command_for(run) is None


def test_resume_changes_lists_dotted_fields():
    from toolkit.cli import resume_changes

    old = {"max_steps": 400, "trainer": {"optim": {"lr": 1e-3}, "seq_len": 512}, "seed": 0}
    new = {"max_steps": 200, "trainer": {"optim": {"lr": 1e-3}, "seq_len": 512}, "seed": 0, "extra": None}
    assert resume_changes(old, new) == ["max_steps: 400 -> 200"]  # None = absent
    assert resume_changes(old, old) == []
    assert resume_changes({"a": {"b": 1}}, {"a": 2}) == ["a: {'b': 1} -> 2"]


def test_resume_says_which_overrides_it_did_not_repeat(tmp_path):
    """A resume reads its config from its own command line: an override of the first attempt that is not repeated
    falls back to the job file's value, and srl says so (the run's last resolved config is the reference)."""
    args = ["rl", "@", JOB, "--output-dir", tmp_path, "--run.name", "r", "--dry-run"]
    assert srl(*args, "--max-steps", "40").returncode == 0
    same = srl(*args, "--max-steps", "40", "--resume")
    assert same.returncode == 0 and "differs" not in same.stderr
    dropped = srl(*args, "--resume")
    assert dropped.returncode == 0, dropped.stderr
    assert "the config differs from the run's last attempt" in dropped.stderr
    assert "max_steps: 40 -> " in dropped.stderr


def test_resume_of_a_finished_run_says_so_and_starts_nothing(tmp_path):
    assert (
        srl("rl", "@", JOB, "--dry-run", "--output-dir", tmp_path, "--run.name", "done", "--max-steps", "4").returncode
        == 0
    )
    run = tmp_path / "done"
    for part in ("trainer", "orchestrator"):  # a COMPLETE checkpoint at the last step, as a finished run leaves
        (run / "checkpoints" / "step_4" / part).mkdir(parents=True)
    (run / "checkpoints" / "step_4" / "COMPLETE").touch()
    attempts = sorted(p.name for p in (run / "configs").iterdir())
    out = srl("rl", "@", JOB, "--resume", "--output-dir", tmp_path, "--run.name", "done", "--max-steps", "4")
    assert out.returncode == 2 and "already finished" in out.stderr and "--max-steps 8" in out.stderr, out.stderr
    assert sorted(p.name for p in (run / "configs").iterdir()) == attempts  # no new attempt written
    # A dry run is not refused: it only shows what a resume would write, in a shadow directory.
    out = srl(
        "rl", "@", JOB, "--resume", "--dry-run", "--output-dir", tmp_path, "--run.name", "done", "--max-steps", "4"
    )
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("where", ["file", "pseudo-fs"])
@pytest.mark.parametrize("command", ["rl", "sft", "sweep", "inference"])
def test_an_output_dir_that_cannot_hold_runs_is_refused_naming_it(tmp_path, command, where):
    # A file on the way, or a filesystem where nothing can be created (/proc, where root passes every permission
    # check): srl rl and srl sweep ended in a NotADirectoryError / FileNotFoundError traceback at the first mkdir.
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "runs" if where == "file" else Path("/proc/srl-test-nope")
    job = {
        "rl": JOB,
        "sft": ROOT / "jobs/reverse-text/sft.toml",
        "sweep": ROOT / "jobs/reverse-text/sweep.toml",
        "inference": ROOT / "jobs/serve/tiny.toml",
    }[command]
    r = srl(command, "@", job, "--output-dir", out, "--dry-run", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "output_dir" in r.stderr and "cannot hold run directories" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written


@pytest.mark.parametrize(
    "command",
    [
        ["sft", "chain"],
        ["sft", "make-data"],
        ["config"],
        ["config", "show"],
        ["config", "convert"],
        ["inference", "queues"],
    ],
)
def test_subcommand_help_prints_its_usage(tmp_path, command):
    # --help was read as a config file, an output path or a run directory: "invalid config", exit 2.
    r = srl(*command, "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("usage: srl " + " ".join(command[:2] if command[0] != "config" else ["config"]))
    assert r.stderr == "" and list(tmp_path.iterdir()) == []
