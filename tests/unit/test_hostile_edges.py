"""Hostile but realistic input to srl's newest commands (sweep, export, status, sampling, SFT): each is refused
with a message naming the field or file, or handled, before anything is submitted or written."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.config import ConfigError
from toolkit.launch.sweeps import plan_arrays
from toolkit.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[2]
RT = ROOT / "jobs" / "reverse-text"


def _sweep_file(tmp_path: Path, sweep_lines: str) -> Path:
    f = tmp_path / "sweep.toml"
    f.write_text(
        f'[sweep]\nname = "s"\nbase = ["{RT / "rl.toml"}"]\n{sweep_lines}\n'
        '[sweep.grid]\n"trainer.optim.lr" = [1e-4, 2e-4]\n'
    )
    return f


@pytest.mark.parametrize(
    "line",
    [
        "max_parallel = true",
        "seeds = [true, false]",
        '[sweep.random]\nsamples = true\n"trainer.optim.max_norm" = { choice = [1.0] }',
    ],
)
def test_sweep_refuses_booleans_for_counts_and_seeds(tmp_path, line):
    # TOML true is a Python int subclass: it ran as max_parallel 1 / seeds 1, 0 / one random sample without a word.
    with pytest.raises(ConfigError, match=r"sweep\.(max_parallel|seeds|random)"):
        load_sweep(_sweep_file(tmp_path, line))


@pytest.mark.parametrize("name", ["ab\u00b2", "x\u0663", "-x", "_x", "a" * 129])
def test_sweep_name_is_ascii_and_starts_with_a_letter_or_digit(tmp_path, name):
    # str.isalnum() let superscripts and Arabic-Indic digits into job and directory names, and '-x' read as an
    # option where the sweep directory is an argument.
    f = _sweep_file(tmp_path, "").read_text().replace('name = "s"', f'name = "{name}"')
    (tmp_path / "sweep.toml").write_text(f)
    with pytest.raises(ConfigError, match="sweep.name must be"):
        load_sweep(tmp_path / "sweep.toml")


def test_huge_max_parallel_throttle_stays_within_the_array():
    # max_parallel = 99999999999999999 rendered --array=0-5%99999999999999999, which sbatch refuses after every
    # point's run directory was written.
    chunks = plan_arrays([(6, True)], 99_999_999_999_999_999, 1001)
    assert [(len(c.points), c.throttle) for c in chunks] == [(6, 6)]
    chunks = plan_arrays([(3, True), (2, True)], 10**12, 1001)
    assert [c.throttle for c in chunks] == [3, 2]


def _run_with_empty_checkpoint(root: Path, weights: bool = False):
    from toolkit.run.layout import RunDir

    run = RunDir(root)
    run.resolved("rl").parent.mkdir(parents=True)
    run.resolved("rl").write_text("{}")
    for part in ("trainer", "orchestrator"):
        (run.checkpoint_step(1) / part).mkdir(parents=True)
    if weights:
        (run.checkpoint_step(1) / "trainer" / "model.safetensors").write_bytes(b"")
    (run.checkpoint_step(1) / "COMPLETE").write_text("")
    return run


@pytest.mark.parametrize("how", ["symlinked run", "dotdot run", "symlinked target"])
def test_export_refuses_a_target_inside_the_run_reached_through_a_link_or_dotdot(tmp_path, how):
    # Only the literal path was compared: `srl export link outputs/run/x` went on to load the weights and write
    # the export into the run directory it reads.
    from toolkit.trainer.export import ExportError, export_checkpoint

    run = _run_with_empty_checkpoint(tmp_path / "outputs" / "run", weights=True)
    (tmp_path / "link").symlink_to(run.root)
    run_arg, out = {
        "symlinked run": (tmp_path / "link", run.root / "x"),
        "dotdot run": (run.root / ".." / "run", run.root / "x"),
        "symlinked target": (run.root, tmp_path / "link" / "x"),
    }[how]
    with pytest.raises(ExportError, match="is inside the run directory"):
        export_checkpoint(run_arg, out)
    assert not (run.root / "x").exists()


def test_export_refusals_before_loading_weights(tmp_path):
    from toolkit.trainer.export import ExportError, export_checkpoint

    # A complete-marked checkpoint whose trainer weights are gone: a FileNotFoundError traceback after the
    # model was built; now one line naming the part.
    run = _run_with_empty_checkpoint(tmp_path / "run")
    with pytest.raises(ExportError, match=r"step 1 .* marked complete but .*trainer holds neither"):
        export_checkpoint(run.root, tmp_path / "new")
    assert not (tmp_path / "new").exists()
    # A sweep root (or any directory without a resolved config) is named as not a run.
    sweep_root = tmp_path / "sweep"
    (sweep_root / "p000").mkdir(parents=True)
    with pytest.raises(ExportError, match="not an srl run directory"):
        export_checkpoint(sweep_root, tmp_path / "new")
    # A DIR that cannot be created fails before the weights are loaded (not after minutes of loading).
    good = _run_with_empty_checkpoint(tmp_path / "good", weights=True)
    (tmp_path / "afile").write_text("")
    with pytest.raises(ExportError, match="cannot create"):
        export_checkpoint(good.root, tmp_path / "afile" / "model")


def _bare_run(root: Path):
    from toolkit.run.layout import RunDir

    run = RunDir(root)
    run.resolved("rl").parent.mkdir(parents=True)
    return run


def test_status_of_damaged_run_files_says_so_instead_of_crashing(tmp_path):
    from toolkit.launch.progress import progress_lines

    # A cut-off ending.json was left out without a word: the run looked as if it had never ended.
    run = _bare_run(tmp_path / "half")
    run.ending.write_text('{"cause": "completed", "step": 3')
    assert any("unreadable" in line and "ending.json" in line for line in progress_lines(run))
    # Metrics lines with a non-number time or reward, and a launcher record that is not an object, raised
    # ValueError / AttributeError out of srl status.
    run = _bare_run(tmp_path / "odd")
    run.metrics.write_text(
        '{"role": "trainer", "step": 2, "time": "x"}\n{"role": "orchestrator", "step": 2, "reward/all/mean": "abc"}\n'
    )
    run.launcher.mkdir(parents=True, exist_ok=True)
    (run.launcher / "local.json").write_text("[1, 2]")
    lines = progress_lines(run)
    assert any(line.startswith("trainer: step 2") for line in lines), lines
    assert any(line.startswith("orchestrator: step 2, reward nan") for line in lines), lines


def _env_sampling(base: dict, env: dict) -> dict:
    from config_cases import config

    return config(
        {
            "orchestrator": {
                "train": {"sampling": base, "env": [{"taskset": {"id": "srl-reverse-text"}, "sampling": env}]}
            }
        }
    )


def test_per_env_sampling_is_checked_as_the_env_samples_it():
    # The per-env override was checked alone: an inherited top_k did not count (a valid env refused), and an
    # override top_k = 0 switched off the top_k that the inherited top_p < 1 needs (an invalid env accepted).
    from config_cases import errors_of, validate

    validate(_env_sampling({"top_k": 50, "top_p": 0.9}, {"max_completion_tokens": 8}))
    # A train env's own distribution is refused: the trainer applies the batch's one sampling to every sample.
    text = errors_of(_env_sampling({"top_k": 50}, {"top_p": 0.9, "temperature": 0.7}))
    assert "orchestrator.train.env[0].sampling.temperature" in text and "env[0].sampling.top_p" in text, text
    validate(_env_sampling({"top_k": 50, "top_p": 0.9}, {"top_p": 0.9}))  # the same values: nothing differs
    assert "orchestrator.train.env[0].sampling.top_k" in errors_of(
        _env_sampling({"top_k": 50, "top_p": 0.9}, {"top_k": 0})
    )
    # An env that only changes max_completion_tokens samples as the train sampling: one error, at its field.
    text = errors_of(_env_sampling({"temperature": 0.0}, {"max_completion_tokens": 4}))
    assert "orchestrator.train.sampling.temperature" in text and "env[0].sampling.temperature" not in text


def test_derived_inference_nodes_past_the_bound_name_the_layout_not_num_infer_nodes():
    # A P/D layout of 60000 + 60000 nodes was refused as "num_infer_nodes: Input should be less than or equal to
    # 100000", a field the user had left out; a single huge count was not bounded at all.
    from config_cases import config, errors_of

    multi = {"site": "local-slurm", "deployment": {"type": "multi_node", "gpus_per_node": 0, "num_train_nodes": 1}}
    pd = {"type": "disaggregated", "prefill_nodes_per_replica": 60000, "decode_nodes_per_replica": 60000}
    text = errors_of(config(multi, {"inference": {"deployment": pd}}))
    assert "[inference.deployment] (disaggregated) implies 120000 node(s) per replica" in text, text
    assert "less than or equal" not in text
    text = errors_of(config(multi, {"inference": {"deployment": {**pd, "prefill_nodes_per_replica": 10**20}}}))
    assert "inference.deployment.disaggregated.prefill_nodes_per_replica" in text, text


def test_sft_launch_view_refusal_is_a_config_error_not_a_traceback(tmp_path):
    # The RL config built for an SFT run has checks of its own; one failing there escaped load_sft_config as a
    # pydantic ValidationError traceback.
    from toolkit.config.sft import load_sft_config

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "abc", "completion": "cba"}\n' * 4)
    with pytest.raises(ConfigError, match=r"\[inference.deployment\] \(disaggregated\) implies 120000"):
        load_sft_config(
            [RT / "sft.toml"],
            [
                f"--data.name={data}",
                "--site=local-slurm",
                "--deployment.type=multi_node",
                "--inference.deployment.type=disaggregated",
                "--inference.deployment.prefill_nodes_per_replica=60000",
                "--inference.deployment.decode_nodes_per_replica=60000",
            ],
        )


def test_env_without_taskset_shows_the_toml_to_write():
    # The hint was a plain string written with f-string escapes: it printed 'taskset = {{ id = "..." }}'.
    from config_cases import config, errors_of

    text = errors_of(config({"orchestrator": {"eval": {"env": [{"name": "x"}]}}}))
    assert "orchestrator.eval.env[0].taskset" in text and 'taskset = { id = "..." }' in text, text


def _dry_sweep_root(tmp_path: Path) -> Path:
    from toolkit.sweep import main

    f = _sweep_file(tmp_path, "max_parallel = 1")
    assert main(["@", str(f), "@", str(RT / "slurm.toml"), "--output-dir", str(tmp_path / "out"), "--dry-run"]) == 0
    return tmp_path / "out" / "s"


@pytest.mark.parametrize("manifest", ['{"name": "s", "points": [', '{"name": "s"}', "[]"])
def test_status_of_a_sweep_with_a_damaged_manifest_names_the_file(tmp_path, capsys, manifest):
    # A cut-off or foreign manifest.json raised JSONDecodeError / KeyError / TypeError out of srl status.
    from toolkit.cli import main as srl

    root = _dry_sweep_root(tmp_path)
    (root / "manifest.json").write_text(manifest)
    capsys.readouterr()
    assert srl(["status", str(root)]) == 2
    err = capsys.readouterr().err
    assert str(root / "manifest.json") in err and "Traceback" not in err


# srl cancel asks the real scancel to cancel the recorded array: with the test cluster up that answers at once; with
# no controller the Slurm client retries for about a minute, too long for the quick selection.
@pytest.mark.slow
@pytest.mark.slurm
def test_sweep_status_and_cancel_survive_a_cut_off_arrays_record(tmp_path, capsys):
    # A half-written last line of arrays.jsonl (submission interrupted) raised JSONDecodeError out of srl status
    # and srl cancel; a damaged manifest made srl cancel end in a traceback after it had cancelled the arrays.
    from toolkit.launch.sweeps import cancel_main, status_main

    root = _dry_sweep_root(tmp_path)
    (root / "arrays.jsonl").write_text('{"job_id": "4242424", "array": true, "points": ["p000"]}\n{"job_id": "42')
    capsys.readouterr()
    assert status_main(root) == 0
    out = capsys.readouterr()
    assert "job 4242424: array of 1 point(s)" in out.out and "line 2 is not a submission record" in out.err
    (root / "manifest.json").write_text('{"name": "s", "points": [')
    assert cancel_main(root, grace_s=0) == 0
    err = capsys.readouterr().err
    assert "cannot read the sweep manifest" in err and "--resume" in err


def test_sweep_overlay_that_sets_an_axis_is_refused_like_an_override(tmp_path):
    # `srl sweep @ sweep.toml @ overlay.toml` with the overlay setting a swept field ran every point with its axis
    # value and ignored the overlay without a word (the same field as --trainer.optim.lr was refused).
    from toolkit.sweep import check_overrides

    sweep = load_sweep(_sweep_file(tmp_path, ""))
    overlay = tmp_path / "overlay.toml"
    overlay.write_text("seed = 3\n[trainer.optim]\nlr = 0.5\n")
    sweep.overlays = [overlay]
    with pytest.raises(ConfigError, match=rf"trainer\.optim\.lr \[{overlay}\]: is varied by the sweep"):
        check_overrides(sweep)
    overlay.write_text("seed = 3\nmax_steps = 5\n")  # a whole run config's seed is let through
    check_overrides(sweep)


def test_sweep_overlay_field_under_a_table_axis_is_refused(tmp_path):
    from toolkit.sweep import check_overrides

    f = tmp_path / "sweep.toml"
    f.write_text(
        f'[sweep]\nname = "t"\nbase = ["{RT / "rl.toml"}"]\n[sweep.grid]\n'
        'deployment = [{ type = "single_node" }, { type = "single_node", cpu_train_ranks = 2 }]\n'
    )
    sweep = load_sweep(f)
    sweep.overlays = [RT / "slurm.toml"]  # sets deployment.type, deployment.num_train_nodes, ...: all replaced
    with pytest.raises(ConfigError, match=r"deployment\.type \[.*slurm\.toml\]: is varied by the sweep"):
        check_overrides(sweep)
    sweep.overlays, sweep.overrides = [], ["--deployment.cpu_train_ranks", "2"]
    with pytest.raises(ConfigError, match=r"deployment\.cpu_train_ranks \[command line\]"):
        check_overrides(sweep)


@pytest.mark.parametrize("what", ["file", "plain directory", "missing"])
def test_cancel_of_something_that_is_no_run_says_so(tmp_path, capsys, what):
    # srl cancel /etc/passwd raised NotADirectoryError (its lease path); a plain directory got "no Slurm job
    # recorded" as if it were a run.
    from toolkit.launch.control import cancel_main

    target = tmp_path / "x"
    if what == "file":
        target.write_text("")
    elif what == "plain directory":
        target.mkdir()
    assert cancel_main([str(target)]) == 1
    assert ("does not exist" if what == "missing" else "not a run directory") in capsys.readouterr().err


def test_a_sweep_and_a_run_of_the_same_name_do_not_share_a_directory(tmp_path):
    # Either way round, the second one's files went into the first's directory: srl status and srl cancel then
    # saw a run where a sweep was, or the reverse.
    from toolkit.config import load_config
    from toolkit.launch.prepare import prepare_run
    from toolkit.sweep import main as sweep_main

    out = tmp_path / "out"
    (out / "s" / "configs").mkdir(parents=True)  # a run named like the sweep
    f = _sweep_file(tmp_path, "")
    with pytest.raises(ConfigError, match="is a run directory"):
        sweep_main(["@", str(f), "--site", "local-slurm", "--output-dir", str(out), "--dry-run"])
    assert not (out / "s" / "manifest.json").exists()
    (out / "s" / "configs").rmdir()
    assert sweep_main(["@", str(f), "--site", "local-slurm", "--output-dir", str(out), "--dry-run"]) == 0
    loaded = load_config([RT / "rl.toml"], ["--run.name", "s", "--output-dir", str(out)])
    with pytest.raises(ConfigError, match="is a sweep's directory"):
        prepare_run(loaded, argv=["srl", "rl"], dry_run=True)
    assert not (out / "s" / "configs").exists()


def test_status_of_a_moved_sweep_reads_its_points_where_they_are(tmp_path):
    # The manifest's absolute run_dir was read: a sweep directory moved (or reached through another mount) showed
    # every point as not submitted, or the old copy's state.
    from toolkit.launch.sweeps import sweep_status
    from toolkit.run.layout import RunDir

    root = _dry_sweep_root(tmp_path)
    moved = tmp_path / "moved"
    root.rename(moved)
    RunDir(moved / "p001").metrics.write_text('{"role": "trainer", "step": 7, "time": 1}\n')
    rows = {r.point_id: r for r in sweep_status(moved)}
    assert rows["p001"].step == 7 and rows["p000"].step is None
