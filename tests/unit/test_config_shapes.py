"""Each config shape the seeds show validates to the expected canonical config."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.config import ConfigError, load_config

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
JOBS = Path(__file__).resolve().parents[2] / "jobs"


def load(name: str, *overrides: str):
    return load_config([FIX / name], list(overrides))


def test_native_single_env():
    cfg = load("native_single.toml").config
    env = cfg.orchestrator.train.env[0]
    assert env.env_name == "rt-train"
    assert env.taskset.id == "srl-reverse-text" and env.taskset.split == "train"
    assert env.harness.id == "default" and env.harness.runtime.type == "subprocess"
    assert env.timeout.rollout == 600 and env.timeout.scoring == 120
    assert env.max_turns == 8 and env.max_total_tokens == 32768
    assert cfg.orchestrator.eval.interval == 20
    assert cfg.orchestrator.eval.env[0].num_examples == 200
    assert cfg.orchestrator.eval.env[0].group_size == 4
    assert not env.legacy


def test_multi_env_ratios():
    cfg = load("multi_env.toml").config
    assert [(e.env_name, e.ratio) for e in cfg.orchestrator.train.env] == [("math", 3), ("sort", 1)]


def test_agentic_runtime_pool_and_timeouts():
    # The seed's agentic shape parses field by field (its elastic/multiplexed pool is then refused by the rules:
    # see test_unsupported_pool_is_refused).
    import tomllib

    from toolkit.config.model import RLConfig

    cfg = RLConfig.model_validate(tomllib.loads((FIX / "agentic.toml").read_text()))
    env = cfg.orchestrator.train.env[0]
    assert env.harness.runtime.type == "prime" and env.harness.runtime.cpu == 4 and env.harness.runtime.memory == 8
    assert (env.timeout.setup, env.timeout.rollout, env.timeout.finalize, env.timeout.scoring) == (600, 3600, 600, 600)
    assert (env.pool.type, env.pool.max_workers, env.pool.multiplex) == ("elastic", 8, 64)
    # Typed taskset fields the taskset itself validates are kept.
    assert env.taskset.model_extra == {"dataset": "terminal-bench/terminal-bench-2"}
    assert env.env_name == "harbor"


def test_unsupported_pool_is_refused(tmp_path):
    # srl runs a static pool and has no interception tunnels: elastic / multiplex would be accepted and ignored.
    with pytest.raises(ConfigError) as e:
        load("agentic.toml")
    issues = {i.path: i.message for i in e.value.issues}
    assert "'static'" in issues["orchestrator.train.env[0].pool.type"]
    assert "allowed: [1]" in issues["orchestrator.train.env[0].pool.multiplex"]
    p = tmp_path / "eval_pool.toml"
    p.write_text(
        '[[orchestrator.train.env]]\ntaskset = { id = "srl-reverse-text" }\n'
        'pool = { type = "static", max_workers = 2 }\n'
        '[[orchestrator.eval.env]]\ntaskset = { id = "srl-reverse-text" }\npool = { type = "elastic" }\n'
    )
    with pytest.raises(ConfigError) as e:
        load_config([p])
    assert [i.path for i in e.value.issues] == ["orchestrator.eval.env[0].pool.type"]


def test_legacy_v0_bridge_is_labelled():
    loaded = load("legacy_v0.toml")
    env = loaded.config.orchestrator.train.env[0]
    assert env.legacy and env.id == "srl-reverse-text"
    assert env.taskset.id == "srl-reverse-text" and env.taskset.split == "train" and env.taskset.seed == 3
    assert any("legacy" in n for n in loaded.notices)
    assert any("legacy" in n for n in loaded.config.notices)


def test_legacy_with_native_fields_in_args_is_an_error(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[[orchestrator.train.env]]\nid = "x"\nargs = { timeout = { rollout = 5 }, max_turns = 3 }\n')
    with pytest.raises(ConfigError) as e:
        load_config([p])
    text = str(e.value)
    assert "orchestrator.train.env[0].args" in text and "max_turns" in text and "move them" in text


def test_hosted_flat_shape():
    loaded = load("hosted_flat.toml")
    cfg = loaded.config
    assert cfg.model.name == "tiny-qwen3"
    assert cfg.max_steps == 500
    assert cfg.orchestrator.batch_size == 256 and cfg.orchestrator.group_size == 8
    assert cfg.orchestrator.train.sampling.max_completion_tokens == 512
    env = cfg.orchestrator.train.env[0]
    assert env.legacy and env.taskset.id == "srl-alphabet-sort"
    assert cfg.monitors.wandb.project == "alphabet-sort"
    assert len(loaded.notices) >= 5


def test_older_names_of_the_second_seed():
    loaded = load("older_names.toml")
    o = loaded.config.orchestrator
    assert o.group_size == 16 and o.max_async_level == 2 and o.max_concurrent == 128
    assert o.buffer.online_difficulty_filtering and o.buffer.oversampling_factor == 2.0
    assert (o.buffer.easy_threshold, o.buffer.hard_threshold) == (0.9, 0.1)
    assert any("rollouts_per_example" in n for n in loaded.notices)


def test_overrides_files_merge_and_lists_replace(tmp_path):
    over = tmp_path / "over.toml"
    over.write_text('[orchestrator]\nbatch_size = 32\n[[orchestrator.train.env]]\ntaskset = { id = "srl-arith" }\n')
    cfg = load_config([FIX / "multi_env.toml", over], ["--trainer.optim.lr", "1e-5", "--no-monitors.file"]).config
    assert cfg.orchestrator.batch_size == 32 and cfg.orchestrator.group_size == 8  # tables deep-merge
    assert [e.env_name for e in cfg.orchestrator.train.env] == ["srl-arith"]  # lists replace
    assert cfg.trainer.optim.lr == 1e-5 and cfg.monitors.file is False


def test_override_none_means_null():
    cfg = load("native_single.toml", "--ckpt.keep-last", "None").config
    assert cfg.ckpt.keep_last is None


def test_canonical_round_trip_is_stable():
    import tomllib

    import tomli_w

    from toolkit.config import toml_data, validate_dict

    # A mapped shape plus a null whose default is not null: the TOML text `srl config convert` prints, parsed again,
    # validates to the same config.
    cfg = load("hosted_flat.toml", "--ckpt.keep-last", "None").config
    text = tomli_w.dumps(toml_data(cfg))
    again = validate_dict(tomllib.loads(text)).config
    assert again.ckpt.keep_last is None
    assert again.model_dump(exclude={"notices"}) == cfg.model_dump(exclude={"notices"})


@pytest.mark.parametrize("flag", ["--trainer.optim.lr", "--max-steps", "--orchestrator.batch-size"])
def test_bare_flag_on_a_number_field_is_an_error_not_one(flag):
    # pydantic would turn the `true` of a bare flag into 1 (lr = 1.0, max_steps = 1) without a word.
    with pytest.raises(ConfigError, match="expects a number, got a boolean"):
        load_config([JOBS / "reverse-text" / "rl.toml"], [flag])


def test_boolean_flags_still_work():
    cfg = load_config([JOBS / "reverse-text" / "rl.toml"], ["--no-orchestrator.update-weights"]).config
    assert cfg.orchestrator.update_weights is False


def test_each_error_names_the_layer_that_set_the_value(tmp_path):
    base = JOBS / "reverse-text" / "rl.toml"
    over = tmp_path / "over.toml"
    over.write_text("[orchestrator]\ngroup_size = -4\n[trainer.optim]\nlr = 1e-5\n")
    with pytest.raises(ConfigError) as e:
        load_config([base, over], ["--orchestrator.max-concurrent", "0", "--orchestrator.batchsize", "30"])
    by_path = {i.path: i.source for i in e.value.issues}
    assert by_path["orchestrator.group_size"] == str(over)  # the second file, not the first
    assert by_path["orchestrator.max_concurrent"] == "command line"
    assert by_path["orchestrator.batchsize"] == "command line"  # an unknown key
    # A cross-field rule names both layers of the values it relates.
    groups = tmp_path / "groups.toml"
    groups.write_text("[orchestrator]\ngroup_size = 4\n")
    with pytest.raises(ConfigError) as e:
        load_config([base, groups], ["--orchestrator.batch-size", "30"])
    (issue,) = e.value.issues
    assert issue.path == "orchestrator.batch_size, orchestrator.group_size"
    assert issue.source == f"command line, {groups}"


@pytest.mark.parametrize(("given", "limit"), [("00:01:00", "00:01:00"), ("1", "1"), ("2-0", "2-0"), ("90", "90")])
def test_slurm_time_from_the_command_line_is_the_limit_as_written(given, limit):
    # TOML would read 00:01:00 as a time of day and 1 as an integer; sbatch takes both as a limit.
    over = ["--slurm.time", given, "--slurm.signal-lead-s", "30", "--slurm.checkpoint-grace-s", "10"]
    assert load_config([JOBS / "reverse-text" / "rl.toml"], over).config.slurm.time == limit


def test_unquoted_slurm_time_in_a_file(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text("[slurm]\ntime = 01:30:00\n")
    assert load_config([JOBS / "reverse-text" / "rl.toml", f]).config.slurm.time == "01:30:00"


def test_signal_lead_is_only_checked_when_the_job_requeues(tmp_path):
    short = ["--slurm.time", "00:01:00"]  # the default lead (600 s) is longer than the limit
    with pytest.raises(ConfigError, match="slurm.signal_lead_s"):
        load_config([JOBS / "reverse-text" / "rl.toml"], short)
    cfg = load_config([JOBS / "reverse-text" / "rl.toml"], [*short, "--no-slurm.requeue"]).config
    assert cfg.slurm.requeue is False


def test_typed_table_without_type_is_the_default_variant():
    job = [JOBS / "reverse-text" / "rl.toml"]
    cfg = load_config(job, ["--deployment.cpu-train-ranks", "2", "--trainer.loss.eps", "0.2"]).config
    assert cfg.deployment.type == "single_node" and cfg.deployment.cpu_train_ranks == 2
    assert cfg.trainer.loss.type == "ipo" and cfg.trainer.loss.eps == 0.2


@pytest.mark.parametrize(
    ("flag", "variant"), [("--deployment.num-train-nodes", "multi_node"), ("--trainer.loss.ratio-low", "icepop")]
)
def test_a_key_of_another_variant_says_which_type_to_set(flag, variant):
    with pytest.raises(ConfigError) as e:
        load_config([JOBS / "reverse-text" / "rl.toml"], [flag, "0.5" if "ratio" in flag else "2"])
    (issue,) = e.value.issues
    assert f"belongs to type '{variant}'" in issue.message and issue.source == "command line"


@pytest.mark.parametrize(
    "text",
    [
        'output_dir = "runs\\u0000x"',
        '[resume]\ndir = "a\\u0000b"',
        '[inference]\nexternal = "a\\u0000b"',
        '[trainer.env]\nX = "a\\u0000b"',
        '[model]\nname = "m\\u0000"',
    ],
)
def test_a_nul_byte_in_any_value_is_a_config_error_naming_the_field(tmp_path, text):
    # Paths with NUL bytes used to escape as "ValueError: embedded null byte" from the first filesystem call.
    over = tmp_path / "over.toml"
    over.write_text(text + "\n")
    with pytest.raises(ConfigError, match="NUL byte") as e:
        load_config([JOBS / "reverse-text" / "rl.toml", over], [])
    key = text.split("\n")[-1].split(" = ")[0]
    assert key in str(e.value)


def test_a_nul_byte_in_a_sweep_base_path_is_a_config_error(tmp_path):
    from toolkit.sweep import load_sweep

    path = tmp_path / "sweep.toml"
    path.write_text('[sweep]\nname = "s"\nbase = ["rl\\u0000.toml"]\n[sweep.grid]\n"trainer.optim.lr" = [1e-4]\n')
    with pytest.raises(ConfigError, match="sweep.base"):
        load_sweep(path)
