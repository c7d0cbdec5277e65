"""Which of the user's queued jobs log under a run directory (``slurm.jobs_logging_under``), against the squeue
output shapes a real cluster prints (hetjob components, array tasks, patterns left unexpanded in pending jobs' log
paths, relative paths, empty and N/A fields) and paths a user can choose (``|`` and symlinks in them, a run
directory whose name prefixes another's).

The squeue lines are parsed from text (``jobs_logging_under_in``). A stand-in ``squeue`` on PATH is used only for
what the real client cannot be made to print on demand: a hang, junk with exit status 0, bytes that are not UTF-8,
a file that is no program. The real client against a held job: integration/test_dry_run_queued_job_slurm.py.
"""

from __future__ import annotations

import os
import pwd
import stat
import time
from pathlib import Path

import pytest

from toolkit.launch import slurm
from toolkit.launch.slurm import jobs_logging_under_in


def _line(job: str, workdir: str, out: str, err: str | None = None) -> str:
    # squeue -h -O JobID:|,WorkDir:|,STDOUT:|,STDERR:| : each field ends with "|", no padding (width 0)
    return f"{job}|{workdir}|{out}|{out if err is None else err}|"


def test_a_pending_job_logging_under_the_run_is_found_and_others_are_not() -> None:
    text = "\n".join(
        [
            _line("41", "/home/u", "/out/r/logs/r-%j.out"),  # the dry run's script, submitted by hand
            _line("42", "/home/u", "/out/r2/logs/r2-%j.out"),  # a run whose name merely starts the same
            _line("43", "/home/u", "/out/rr/logs/x.out"),
            _line("44", "/out/r", "/elsewhere/x.out", "/out/r/logs/x.err"),  # only its stderr is under the run
            _line("45", "/home/u", "/out/r", "/dev/null"),  # the run directory itself as a file name
        ]
    )
    assert jobs_logging_under_in(text, "/out/r") == ["41", "44", "45"]
    assert jobs_logging_under_in(text, "/out/r/") == ["41", "44", "45"]
    assert jobs_logging_under_in(text, "/out/r2") == ["42"]
    assert jobs_logging_under_in("", "/out/r") == [] and jobs_logging_under_in("\n\n", "/out/r") == []


def test_hetjob_components_and_array_tasks_are_named_as_squeue_names_them_each_once() -> None:
    text = "\n".join(
        [
            _line("123+0", "/w", "/out/r/logs/r-%j.out"),
            _line("123+1", "/w", "/out/r/logs/r-%j.out"),
            _line("77_[1-3%2]", "/w", "/out/r/logs/sweep-%A_%a.out"),
            _line("77_4", "/w", "/out/r/logs/sweep-%A_%a.out"),
            _line("77_4", "/w", "/out/r/logs/sweep-%A_%a.out"),
            _line("78_[5,7]", "/w", "/out/q/logs/x.out"),
        ]
    )
    assert jobs_logging_under_in(text, "/out/r") == ["123+0", "123+1", "77_[1-3%2]", "77_4"]


def test_unexpanded_patterns_count_when_their_fixed_part_could_lead_under_the_run() -> None:
    def under(path: str, root: str = "/out/alice/r") -> bool:
        return jobs_logging_under_in(_line("9", "/w", path), root) == ["9"]

    assert under("/out/alice/r/logs/%x-%j.out")  # the usual case: patterns in the file name only
    assert under("/out/%u/r/logs/%x-%j.out")  # %u could be alice
    assert under("/out/alice/%x/logs/x.out")  # %x could be r
    assert under("/out/alice/r%x/x.out", "/out/alice/r")  # unknown expansion next to the name: kept
    assert not under("/elsewhere/%u/logs/%j.out")
    assert not under("/out/alice/r2%x/x.out")  # r2... can never be r
    assert not under("/out/bob/%u.out")


def test_relative_log_paths_are_taken_from_the_job_working_directory() -> None:
    text = "\n".join(
        [
            _line("1", "/out/r", "logs/x.out"),
            _line("2", "/out", "r/logs/x.out", "r2/y.err"),
            _line("3", "/home/u", "logs/x.out"),
            _line("4", "/out/r/sub", "../../r2/x.out"),
        ]
    )
    assert jobs_logging_under_in(text, "/out/r") == ["1", "2"]
    # A relative path with no working directory to resolve it against cannot be placed: counted.
    assert jobs_logging_under_in(_line("5", "N/A", "logs/x.out"), "/out/r") == ["5"]
    assert jobs_logging_under_in(_line("6", "", "slurm-6.out"), "/out/r") == ["6"]


@pytest.mark.parametrize("empty", ["", "N/A", "(null)", "None", " "])
def test_empty_and_placeholder_fields_are_no_paths(empty: str) -> None:
    # an interactive allocation (salloc) has no batch log; its working directory may be the run itself
    assert jobs_logging_under_in(_line("7", "/out/r", empty), "/out/r") == []
    assert jobs_logging_under_in(_line("7", "/out/r", empty, "/out/r/logs/e"), "/out/r") == ["7"]


def test_padded_fields_are_read() -> None:
    assert jobs_logging_under_in("  8   |/w  |/out/r/logs/x.out   |  |", "/out/r") == ["8"]


def test_paths_holding_the_field_separator_are_tried_every_way() -> None:
    # "|" is legal in directory names (and in output_dir: #SBATCH values only exclude whitespace and quotes).
    text = "\n".join(
        [
            _line("11", "/home/u", "/out/a|b/logs/r-%j.out"),
            _line("12", "/w|x", "/out/a|b2/logs/x.out", "/dev/null"),
            _line("13", "/out/a|b", "logs/x.out", "/dev/null"),
        ]
    )
    assert jobs_logging_under_in(text, "/out/a|b") == ["11", "13"]
    assert jobs_logging_under_in(text, "/out/c") == []
    # One way of splitting "/out/a|b/logs/..." names the file "/out/a": for run /out/a it is ambiguous, and kept.
    assert jobs_logging_under_in(text, "/out/a") == ["11", "12", "13"]
    assert jobs_logging_under_in(_line("14", "/w", "/|" * 40), "/out/r") == ["14"]  # past the split budget: kept


def test_symlinked_run_directories_match_by_either_name(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch" / "r"
    (scratch / "logs").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "r").symlink_to(scratch)  # outputs/r -> /scratch/r
    (tmp_path / "home").symlink_to(tmp_path / "out")  # and the output dir reached through a link
    link, real = tmp_path / "out" / "r", scratch
    by_real = _line("21", "/w", f"{real}/logs/r-%j.out")
    by_link = _line("22", "/w", f"{link}/logs/r-%j.out")
    by_home = _line("23", str(tmp_path / "home"), "r/logs/x.out")
    text = "\n".join([by_real, by_link, by_home, _line("24", "/w", f"{tmp_path}/scratch/r2/x.out")])
    assert jobs_logging_under_in(text, link) == ["21", "22", "23"]
    assert jobs_logging_under_in(text, real) == ["21", "22", "23"]
    assert jobs_logging_under_in(text, tmp_path / "home" / "r") == ["21", "22", "23"]


@pytest.mark.parametrize(
    "junk",
    [
        "slurm_load_jobs error: Socket timed out on send/recv operation",
        "JOBID|WORK_DIR|STDOUT|STDERR|",  # a header: the option that suppresses it was not honoured
        "42|/out/r/logs/x.out|",  # fewer fields than asked for
        "42 /w /out/r/logs/x.out /out/r/logs/x.out",
    ],
)
def test_lines_that_are_no_job_records_raise(junk: str) -> None:
    with pytest.raises(ValueError, match="not a squeue job record"):
        jobs_logging_under_in(_line("1", "/w", "/x") + "\n" + junk, "/out/r")


def test_the_user_is_the_process_uid_not_the_environment(monkeypatch) -> None:
    # $USER/$LOGNAME can name someone else (carried over by su, a container, a wrapper); squeue -u must list the
    # jobs of the uid that will read and delete the directory.
    monkeypatch.setenv("USER", "someone-else")
    monkeypatch.setenv("LOGNAME", "someone-else")
    assert slurm.squeue_user() == pwd.getpwuid(os.getuid()).pw_name


# -- stand-in squeue: outputs the real client cannot be made to print on demand ----------------------------------


def _fake_squeue(bin_dir: Path, body: bytes, shebang: bool = True) -> None:
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "squeue"
    exe.write_bytes((b"#!/bin/sh\n" if shebang else b"") + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def fake_bin(tmp_path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return bin_dir


def test_a_hanging_squeue_is_an_error_after_the_timeout(fake_bin) -> None:
    _fake_squeue(fake_bin, b"exec sleep 30\n")
    t0 = time.monotonic()
    with pytest.raises(slurm.SlurmCommandError, match="timed out"):
        slurm.jobs_logging_under(Path("/out/r"), timeout_s=0.5)
    assert time.monotonic() - t0 < 10


def test_junk_with_exit_status_zero_is_an_error_not_an_empty_queue(fake_bin) -> None:
    _fake_squeue(fake_bin, b"echo 'slurm_load_jobs error: Unable to contact slurm controller'\nexit 0\n")
    with pytest.raises(slurm.SlurmCommandError, match="not a squeue job record"):
        slurm.jobs_logging_under(Path("/out/r"))


def test_a_squeue_that_is_no_program_is_an_error(fake_bin, monkeypatch) -> None:
    _fake_squeue(fake_bin, b"\x7fELF\x00garbage", shebang=False)  # exec fails with ENOEXEC
    monkeypatch.setenv("PATH", str(fake_bin))  # alone on PATH: subprocess would go on to a real squeue after it
    with pytest.raises(slurm.SlurmCommandError, match="could not start"):
        slurm.jobs_logging_under(Path("/out/r"))


def test_log_paths_that_are_not_utf8_are_read(fake_bin, tmp_path) -> None:
    run = os.fsencode(tmp_path) + b"/r\xff"  # a run directory whose name is not UTF-8
    os.mkdir(run)
    body = b"printf '%s\\n' '1|/w|/data/\xfe.out|/data/\xfe.out|' '2|/w|" + run + b"/logs/r-%j.out|/dev/null|'\n"
    _fake_squeue(fake_bin, body)
    assert slurm.jobs_logging_under(Path(os.fsdecode(run))) == ["2"]


def test_no_squeue_means_no_slurm_and_nothing_queued(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert slurm.jobs_logging_under(Path("/out/r")) == []
