"""srl sft against hostile and unusual input: each case is refused at the login node with the file, row or field
and the fix, before anything is written, or read the same way by the login check and the trainer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from sft_rows import tiny_renderer, write_jsonl

from toolkit.config import ConfigError
from toolkit.config.sft import ColumnsConfig, LossMaskConfig
from toolkit.trainer.sft_data import (
    DataError,
    check_dataset,
    load_conversations,
    tokenize,
)

REPO = Path(__file__).resolve().parents[2]
RL_TOML = REPO / "jobs" / "reverse-text" / "rl.toml"


@pytest.fixture(scope="module")
def renderer():
    return tiny_renderer()


_jsonl = write_jsonl


def _sft_toml(tmp_path: Path, data: Path, extra: str = "") -> Path:
    f = tmp_path / "sft.toml"
    f.write_text(
        f'max_steps = 2\noutput_dir = "{tmp_path / "outputs"}"\n[model]\nname = "tiny-qwen3"\n'
        f'[data]\nname = "{data}"\nbatch_size = 2\nseq_len = 128\n{extra}'
    )
    return f


# ------------------------------------------------------------------------------------------------------------
# Data files: what the login check accepts, the trainer's datasets path reads the same way
# ------------------------------------------------------------------------------------------------------------
def test_duplicate_key_is_named_at_login_not_a_trainer_crash(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": "b", "prompt": "c"}\n')
    with pytest.raises(DataError, match=r"d\.jsonl: row 1 \(line 2\): the key 'prompt' appears twice"):
        check_dataset(f, ColumnsConfig())
    g = tmp_path / "d.json"
    g.write_text('[{"prompt": "a", "completion": "b", "completion": "c"}]')
    with pytest.raises(DataError, match="'completion' twice"):
        check_dataset(g, ColumnsConfig())


def test_lone_surrogate_escape_is_named_and_a_pair_is_fine(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "a", "completion": "ok \\ud83d\\ude00"}\n{"prompt": "a", "completion": "\\ud800"}\n')
    with pytest.raises(DataError, match=r"row 1 \(line 2\): a string holds a lone UTF-16 surrogate"):
        check_dataset(f, ColumnsConfig())
    f.write_text('{"prompt": "a", "completion": "ok \\ud83d\\ude00"}\n')
    (conv,) = load_conversations(f, ColumnsConfig())[0]
    assert conv.messages[-1]["content"] == "ok \U0001f600"


def test_files_of_one_directory_may_differ_in_columns_and_types(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    j = tmp_path / "j"
    j.mkdir()
    _jsonl(j / "a.jsonl", [{"prompt": "a", "completion": "b"}])
    _jsonl(j / "b.jsonl", [{"prompt": [{"role": "user", "content": "c"}], "completion": "d", "extra": 1}])
    assert check_dataset(j, ColumnsConfig()) == 2
    convs, wheres = load_conversations(j, ColumnsConfig())
    assert [c.messages[0]["content"] for c in convs] == ["a", "c"]
    assert wheres == [f"{j / 'a.jsonl'}: row 0", f"{j / 'b.jsonl'}: row 0"]
    p = tmp_path / "p"
    p.mkdir()
    pq.write_table(pa.table({"prompt": ["a"], "completion": ["b"]}), p / "a.parquet")
    pq.write_table(
        pa.table({"prompt": [[{"role": "user", "content": "c"}]], "completion": ["d"], "x": [1]}), p / "b.parquet"
    )
    assert [c.messages[0]["content"] for c in load_conversations(p, ColumnsConfig())[0]] == ["a", "c"]


def test_a_file_datasets_cannot_read_is_a_data_error_naming_it(tmp_path):
    f = tmp_path / "fake.parquet"
    f.write_text('{"prompt": "a", "completion": "b"}\n')
    with pytest.raises(DataError, match="fake.parquet: the datasets library cannot read this file"):
        load_conversations(f, ColumnsConfig())


@pytest.mark.parametrize("name", ["b.JSONL", "b.jsonl.gz", "b.Parquet"])
def test_data_looking_files_a_directory_would_skip_are_refused(tmp_path, name):
    _jsonl(tmp_path / "a.jsonl", [{"prompt": "a", "completion": "b"}])
    (tmp_path / name).write_bytes(b"x")
    with pytest.raises(DataError, match=name.replace(".", r"\.")):
        check_dataset(tmp_path, ColumnsConfig())


def test_unreadable_file_is_a_data_error(tmp_path, monkeypatch):
    f = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}])

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(DataError, match=r"d\.jsonl: cannot be read \(Permission denied\)"):
        check_dataset(f, ColumnsConfig())


# ------------------------------------------------------------------------------------------------------------
# Tools: a template that drops them would train a tool-calling turn as an empty reply
# ------------------------------------------------------------------------------------------------------------
_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]


def test_tools_the_template_ignores_are_refused(renderer, tmp_path):
    f = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b", "tools": json.dumps(_TOOLS)}])
    (conv,), _ = load_conversations(f, ColumnsConfig())
    with pytest.raises(DataError, match="row 0: the row has tools, but renderer 'auto'"):
        tokenize(renderer, conv, LossMaskConfig(), "d.jsonl: row 0")


def test_tool_calls_the_template_ignores_are_refused(renderer, tmp_path):
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": None, "tool_calls": [_CALL]},
        {"role": "tool", "content": "1", "tool_call_id": "c1"},
        {"role": "assistant", "content": "done"},
    ]
    f = _jsonl(tmp_path / "d.jsonl", [{"messages": msgs}])
    (conv,), _ = load_conversations(f, ColumnsConfig())
    with pytest.raises(DataError, match="message 1: renderer 'auto' .* ignores the message's tool_calls"):
        tokenize(renderer, conv, LossMaskConfig(), "d.jsonl: row 0")


def test_a_renderer_that_renders_tools_and_tool_calls_trains_them(renderer, tmp_path):
    class ToolRenderer:
        name = "tools"
        stop_token_ids = renderer.stop_token_ids

        def render(self, messages, *, add_generation_prompt=True, tools=None):
            msgs = [
                {"role": m["role"], "content": m["content"] + json.dumps(m.get("tool_calls", ""))} for m in messages
            ]
            if tools:
                msgs = [{"role": "system", "content": json.dumps(tools)}, *msgs]
            return renderer.render(msgs, add_generation_prompt=add_generation_prompt)

    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [_CALL]}]
    f = _jsonl(tmp_path / "d.jsonl", [{"messages": msgs, "tools": _TOOLS}])
    (conv,), _ = load_conversations(f, ColumnsConfig())
    ids, mask = tokenize(ToolRenderer(), conv, LossMaskConfig(), "x")
    assert '"name": "f"' in renderer.decode([int(t) for t, m in zip(ids, mask, strict=True) if m])


def test_tool_call_rows_train_the_calls_and_answers_not_the_tool_results_with_the_hermes_renderer(tmp_path):
    # srl's own hermes renderer (what a tool env trains with) on the tiny model: the tool schema reaches the
    # prompt, the assistant's tool call and its final answer are trained, the tool's result and the user's turn
    # are not (masks as the RL samples of the same conversation have them).
    from toolkit.models import resolve_model
    from toolkit.models.renderer import HermesRenderer

    hermes = HermesRenderer(resolve_model("tiny-qwen3"))
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "heron"}'}}
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "look a word up",
                "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
            },
        }
    ]
    msgs = [
        {"role": "user", "content": "What is the code for heron?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "BLUE-7", "tool_call_id": "c1"},
        {"role": "assistant", "content": "The code is BLUE-7."},
    ]
    f = _jsonl(tmp_path / "d.jsonl", [{"messages": msgs, "tools": json.dumps(tools)}])
    (conv,), _ = load_conversations(f, ColumnsConfig())
    ids, mask = tokenize(hermes, conv, LossMaskConfig(), "d.jsonl: row 0")
    trained = hermes.decode([int(t) for t, m in zip(ids, mask, strict=True) if m])
    untrained = hermes.decode([int(t) for t, m in zip(ids, mask, strict=True) if not m])
    assert '<tool_call>\n{"name": "lookup", "arguments": {"word": "heron"}}\n</tool_call>' in trained, trained
    assert "The code is BLUE-7." in trained
    assert "<tool_response>\nBLUE-7\n</tool_response>" in untrained and "<tool_response>" not in trained
    assert "What is the code for heron?" in untrained and '"name": "lookup"' in untrained  # the schema in <tools>
    assert hermes.decode([int(t) for t in ids]) == hermes.render_text(msgs, add_generation_prompt=False, tools=tools)


# ------------------------------------------------------------------------------------------------------------
# srl sft: refused at login, before the run directory is written
# ------------------------------------------------------------------------------------------------------------
def test_one_row_with_a_held_out_val_split_is_refused_at_login(tmp_path):
    from toolkit.commands.sft import load

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}])
    with pytest.raises(ConfigError, match=r"val\.fraction: .*d\.jsonl has 1 row"):
        load([_sft_toml(tmp_path, data, "[val]\nfraction = 0.5\n")], [])
    load([_sft_toml(tmp_path, data)], [])  # without [val], one row trains


@pytest.mark.parametrize(
    ("override", "field"),
    [(["--model.name", "/nonexistent/model"], "model.name"), (["--site", "no-such-site"], "site")],
)
def test_missing_model_or_unknown_site_is_refused_before_the_run_directory(tmp_path, override, field):
    from toolkit.cli import main

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}])
    cfg = _sft_toml(tmp_path, data)
    assert main(["sft", "@", str(cfg), "--run.name", "r", "--dry-run", *override]) != 0
    assert not (tmp_path / "outputs" / "r").exists()


def test_local_start_from_an_unfinished_sft_run_is_a_config_error(tmp_path):
    from toolkit.config import load_config
    from toolkit.launch.pipeline import Launch, start
    from toolkit.run.layout import RunDir

    sft_run = tmp_path / "sft-run"
    sft_run.mkdir()
    (sft_run / "run_meta.json").write_text("{}")
    loaded = load_config(
        [RL_TOML], ["--model.name", str(sft_run), "--output-dir", str(tmp_path), "--run.name", "rl-run"]
    )
    with pytest.raises(ConfigError, match="model.name: run directory .* has no final model yet"):
        start(Launch(loaded, RunDir(tmp_path / "rl-run"), argv=["srl", "rl"]))
    assert not (tmp_path / "rl-run").exists()
    # A dry run (or a Slurm job, which may queue behind the SFT run) is not refused for it.
    assert start(Launch(loaded, RunDir(tmp_path / "rl-run"), argv=["srl", "rl"], dry_run=True)).status == 0


# ------------------------------------------------------------------------------------------------------------
# srl sft chain: the RL half is checked before the SFT run is written
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rl", [[], ["@", str(RL_TOML), "--orchestrator.batch-size", "-3"], ["@", str(RL_TOML), "--then", "@", str(RL_TOML)]]
)
def test_chain_refuses_a_bad_rl_half_before_writing_the_sft_run(tmp_path, rl):
    from toolkit.commands.sft import cmd_chain

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}] * 2)
    with pytest.raises(ConfigError, match="--then"):
        cmd_chain(["@", str(_sft_toml(tmp_path, data)), "--run.name", "s", "--dry-run", "--then", *rl])
    assert not (tmp_path / "outputs" / "s").exists()


# ------------------------------------------------------------------------------------------------------------
# srl sft make-data
# ------------------------------------------------------------------------------------------------------------
def _make_data(out: Path, *extra: str) -> int:
    from toolkit.commands.sft import cmd_make_data

    return cmd_make_data([str(out), "@", str(RL_TOML), *extra])


@pytest.mark.parametrize("name", ["rows.parquet", "rows", "rows.json"])
def test_make_data_refuses_an_output_srl_sft_would_not_read_as_written(tmp_path, name):
    with pytest.raises(ConfigError, match=r"name the output file \*\.jsonl"):
        _make_data(tmp_path / name, "--taskset.num-train-examples", "2")
    assert not (tmp_path / name).exists()


def test_make_data_refuses_a_directory_or_unwritable_output(tmp_path):
    d = tmp_path / "d.jsonl"
    d.mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        _make_data(d, "--taskset.num-train-examples", "2")
    f = _jsonl(tmp_path / "f.jsonl", [])
    with pytest.raises(ConfigError, match="is not a writable directory"):
        _make_data(f / "x.jsonl", "--taskset.num-train-examples", "2")


def test_make_data_keeps_an_existing_file_when_no_task_is_selected(tmp_path):
    out = _jsonl(tmp_path / "rows.jsonl", [{"prompt": "a", "completion": "b"}])
    before = out.read_text()
    with pytest.raises(ConfigError, match="selects no task; nothing written"):
        _make_data(out, "--taskset.num-train-examples", "0")
    assert out.read_text() == before


def test_make_data_bad_taskset_field_and_missing_config_are_config_errors(tmp_path):
    from toolkit.commands.sft import cmd_make_data

    with pytest.raises(ConfigError, match="rejects its fields"):
        _make_data(tmp_path / "rows.jsonl", "--taskset.no-such-field", "1")
    with pytest.raises(ConfigError, match="give the RL job's config"):
        cmd_make_data([str(tmp_path / "rows.jsonl")])
    assert not (tmp_path / "rows.jsonl").exists()


# ------------------------------------------------------------------------------------------------------------
# Columns and roles: a dataset that would train nothing, or the wrong thing, is refused at login
# ------------------------------------------------------------------------------------------------------------
def test_two_roles_naming_one_column_are_refused(tmp_path):
    from toolkit.config.sft import load_sft_config

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}])
    with pytest.raises(ConfigError, match="data.columns .*prompt and completion both name the column 'completion'"):
        load_sft_config([_sft_toml(tmp_path, data)], ["--data.columns.prompt", "completion"])
    # a swap is two distinct columns: allowed
    cfg = load_sft_config(
        [_sft_toml(tmp_path, data)], ["--data.columns.prompt", "completion", "--data.columns.completion", "prompt"]
    )
    assert cfg.data.columns.prompt == "completion"


def test_a_row_without_a_trained_message_is_refused_at_login(tmp_path):
    from toolkit.commands.sft import load

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}, {"messages": "hello"}])
    with pytest.raises(ConfigError, match=r"d\.jsonl: row 1: no message is trained \(roles \['user'\]"):
        load([_sft_toml(tmp_path, data)], [])
    # the same row trains when [loss_mask] enables user turns
    load([_sft_toml(tmp_path, data, "[loss_mask]\nuser = true\n")], [])
    masked = _jsonl(tmp_path / "m.jsonl", [{"prompt": "a", "completion": "b", "message_loss_mask": [1, 0]}])
    with pytest.raises(ConfigError, match=r"m\.jsonl: row 0: no message is trained"):
        load([_sft_toml(tmp_path, masked)], [])


# ------------------------------------------------------------------------------------------------------------
# srl diagnose on a local run whose trainer refused its data
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("status", "found"), [(2, True), (130, False), (0, False)])
def test_diagnose_reports_a_failed_local_launcher_with_the_error_line(tmp_path, status, found):
    from analysis.diagnose import diagnose

    run = tmp_path / "run"
    (run / "launcher").mkdir(parents=True)
    (run / "logs" / "attempt_1").mkdir(parents=True)
    (run / "launcher" / "local.json").write_text(json.dumps({"pid": 1, "host": "h", "attempt": 1, "status": status}))
    (run / "logs" / "attempt_1" / "trainer.log").write_text(
        "x srl.trainer INFO rank 0 of 1\nx srl.trainer ERROR DataError: d.jsonl: 1 row(s) cannot be split\n"
    )
    findings = [f for f in diagnose(run) if f.boundary == "local: launcher failed"]
    assert bool(findings) is found
    if found:
        ev = findings[0].evidence
        assert ev["status"] == 2 and ev["log_file"] == "logs/attempt_1/trainer.log" and ev["log_line"] == 2
        assert "DataError: d.jsonl" in ev["excerpt"]


# ------------------------------------------------------------------------------------------------------------
# --resume after the data changed: refused, not trained on a sequence no uninterrupted run sees
# ------------------------------------------------------------------------------------------------------------
def test_resume_refuses_when_the_data_order_of_the_newest_step_changed(tmp_path):
    from toolkit.run.layout import RunDir
    from toolkit.trainer.sft import check_resumed_order

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    check_resumed_order(run, lambda step: ["x"])  # no data order yet (the first attempt): nothing to compare
    run.data_order.write_text('{"step": 1, "samples": ["a", "b"]}\n{"step": 2, "samples": ["c", "d"]}\n{"step": 3, "sa')
    order = {1: ["a", "b"], 2: ["c", "d"]}
    check_resumed_order(run, order.__getitem__)  # same data: the resume goes on
    with pytest.raises(DataError, match=r"--resume: step 2 trained samples \['c', 'd'\].*gives \['e', 'd'\]"):
        check_resumed_order(run, {1: ["a", "b"], 2: ["e", "d"]}.__getitem__)


def test_parquet_string_that_is_not_utf8_is_named_at_login_and_in_the_trainer(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = pa.array([b"ok", b"\xff\xfe"], pa.binary())
    bad = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())  # a writer that skipped UTF-8 validation
    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": ["p", "q"], "completion": bad}), f)
    with pytest.raises(DataError, match=r"d\.parquet: row 1, column 'completion': .* not UTF-8"):
        check_dataset(f, ColumnsConfig())
    with pytest.raises(DataError, match=r"d\.parquet: row 1: .* not UTF-8"):
        load_conversations(f, ColumnsConfig())


def test_chain_refuses_a_dry_run_flag_that_only_reaches_the_rl_half(tmp_path):
    from toolkit.commands.sft import cmd_chain

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}] * 2)
    with pytest.raises(ConfigError, match="put --dry-run before --then"):
        cmd_chain(["@", str(_sft_toml(tmp_path, data)), "--run.name", "s", "--then", "@", str(RL_TOML), "--dry-run"])
    assert not (tmp_path / "outputs" / "s").exists()


def test_make_data_warns_when_it_writes_the_split_the_rl_job_evaluates_on(tmp_path, capsys):
    assert _make_data(tmp_path / "train.jsonl", "--taskset.num-train-examples", "2") == 0
    assert "eval answers" not in capsys.readouterr().err
    assert _make_data(tmp_path / "test.jsonl", "--taskset.split", "test") == 0
    assert "eval env(s) ['reverse-text-test'] of this config evaluate on taskset 'srl-reverse-text' split 'test'" in (
        capsys.readouterr().err
    )


def test_an_output_dir_that_is_a_file_is_a_config_error(tmp_path):
    from toolkit.commands.sft import load

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}])
    with pytest.raises(ConfigError, match=r"output_dir \[command line\]: .*d\.jsonl/runs: cannot hold run directories"):
        load([_sft_toml(tmp_path, data)], ["--output-dir", str(data / "runs")])


def test_openai_style_message_weight_is_refused_not_ignored(tmp_path):
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "bad", "weight": 0},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "good", "weight": 1},
    ]
    f = _jsonl(tmp_path / "d.jsonl", [{"messages": msgs}])
    with pytest.raises(DataError, match=r"row 0, column 'messages', message 1: has a 'weight' key"):
        check_dataset(f, ColumnsConfig())


def test_report_of_an_sft_run_shows_its_own_settings_not_the_rl_placeholders(tmp_path):
    from analysis.report import build_report
    from toolkit.cli import main

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}] * 2)
    assert main(["sft", "@", str(_sft_toml(tmp_path, data)), "--run.name", "r", "--dry-run"]) == 0
    paths = build_report([tmp_path / "outputs" / "r"], tmp_path / "report", run_figures=False)
    md = paths.markdown.read_text()
    section = md.split("### 2.", 1)[1].split("### 3.", 1)[0]
    assert "| data.batch_size | 2 |" in section and "| data.seq_len | 128 |" in section
    assert "group_size" not in section and "trainer.loss" not in section


def test_a_dangling_symlink_or_directory_named_like_data_is_refused_not_skipped(tmp_path):
    _jsonl(tmp_path / "a.jsonl", [{"prompt": "a", "completion": "b"}])
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "unmounted" / "b.jsonl")
    with pytest.raises(DataError, match=r"b\.jsonl: named like a data file but is a broken or looping symlink"):
        check_dataset(tmp_path, ColumnsConfig())
    (tmp_path / "b.jsonl").unlink()
    (tmp_path / "part.parquet").mkdir()  # a Spark-style dataset directory
    with pytest.raises(DataError, match=r"part\.parquet: named like a data file but is a directory"):
        check_dataset(tmp_path, ColumnsConfig())


def test_an_assistant_message_with_null_content_and_no_tool_calls_is_refused(tmp_path):
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": None}]
    f = _jsonl(tmp_path / "d.jsonl", [{"messages": msgs}])
    with pytest.raises(DataError, match=r"row 0, column 'messages', message 1: an assistant message without content"):
        check_dataset(f, ColumnsConfig())
    # an empty string is an explicit (if odd) reply, and a tool-calling turn may have no content
    msgs[1] = {"role": "assistant", "content": ""}
    assert check_dataset(_jsonl(f, [{"messages": msgs}]), ColumnsConfig()) == 1
    msgs[1] = {"role": "assistant", "content": None, "tool_calls": [_CALL]}
    assert check_dataset(_jsonl(f, [{"messages": msgs}]), ColumnsConfig()) == 1


def test_a_json_array_saved_as_jsonl_is_named_as_such(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('[\n  {"prompt": "a", "completion": "b"}\n]\n')
    with pytest.raises(DataError, match="looks like one JSON document, not one sample per line"):
        check_dataset(f, ColumnsConfig())
    g = tmp_path / "d.json"
    g.write_text(f.read_text())  # the same array as a .json file is a dataset
    assert check_dataset(g, ColumnsConfig()) == 1


def test_local_sft_from_an_unfinished_sft_run_is_refused_before_its_run_directory(tmp_path):
    from toolkit.commands.sft import cmd_run

    first = tmp_path / "first"
    first.mkdir()
    (first / "run_meta.json").write_text("{}")  # an SFT run directory whose run has not written model/ yet
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}])
    with pytest.raises(ConfigError, match="model.name: run directory .* has no final model yet"):
        cmd_run(["@", str(_sft_toml(tmp_path, data)), "--model.name", str(first), "--run.name", "second"])
    assert not (tmp_path / "outputs" / "second").exists()


# ------------------------------------------------------------------------------------------------------------
# The cross-field rules srl rl applies hold for srl sft too (one rule set, run on the SFT run's launch view)
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        ('[slurm]\nextra_directives = ["--nodes=4"]\n', "slurm.extra_directives", "set by srl"),
        ('[env_vars]\nHF_TOKEN = "hf_abc"\n', "env_vars.HF_TOKEN", "looks like a secret"),
        ('[env_vars]\n"BAD-NAME" = "1"\n', "env_vars.BAD-NAME", "not a valid environment variable name"),
        ('[trainer.env_vars]\n"1X" = "1"\n', "trainer.env_vars.1X", "not a valid environment variable name"),
        ('[slurm]\ntime = "ninety minutes"\n', "slurm.time", ""),
        (
            '[[eval.env]]\ntaskset = { id = "srl-reverse-text" }\n' * 2,
            "eval.env",
            "used 2 times",
        ),
    ],
)
def test_rl_rules_refuse_the_same_values_in_an_sft_config(tmp_path, extra, field, says):
    from toolkit.config.sft import load_sft_config

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}])
    with pytest.raises(ConfigError) as e:
        load_sft_config([_sft_toml(tmp_path, data, extra)])
    issue = next(i for i in e.value.issues if i.path == field)
    assert says in issue.message
    assert issue.source and issue.source.endswith("sft.toml"), "the finding names the file that set the field"


def test_preflight_findings_on_the_launch_view_name_the_sft_fields(tmp_path, capsys):
    """A finding of preflight about the eval env is reported under [eval], the table the user wrote."""
    from toolkit.commands.sft import load

    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}])
    toml = _sft_toml(tmp_path, data, '[[eval.env]]\ntaskset = { id = "revers-text" }\n')
    with pytest.raises(ConfigError) as e:
        load([toml], [])
    paths = [i.path for i in e.value.issues]
    assert any(p.startswith("eval.env[0]") for p in paths), paths
    assert not any(p.startswith("orchestrator.") for p in paths), paths


OWN_TASKSET = """
import verifiers.v1 as vf

class OwnData(vf.TaskData):
    answer: str

class OwnTask(vf.Task[OwnData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def exact(self, task: OwnData, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)

class OwnTaskset(vf.Taskset[OwnTask, vf.TasksetConfig]):
    def load(self):
        for i in range(3):
            yield OwnTask(OwnData(id=f"own/{i}", prompt=f"{i}+1=", answer=str(i + 1)), self.config.task)

__all__ = ["OwnTaskset"]
"""


def test_make_data_imports_the_taskset_from_the_jobs_pythonpath(tmp_path):
    """A taskset of one's own on env_vars.PYTHONPATH (README's walkthrough): make-data imports it as the job's env
    workers do, not only from srl's own sys.path."""
    from toolkit.commands.sft import cmd_make_data

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "own_make_data_tasks.py").write_text(OWN_TASKSET)
    job = tmp_path / "rl.toml"
    job.write_text('[[orchestrator.train.env]]\nname = "own"\ntaskset = { id = "own-make-data-tasks" }\n')
    out = tmp_path / "rows.jsonl"
    try:
        assert cmd_make_data([str(out), "@", str(job), "--env-vars.PYTHONPATH", str(tmp_path / "mods")]) == 0
    finally:
        sys.modules.pop("own_make_data_tasks", None)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["completion"][0]["content"] for r in rows] == ["1", "2", "3"]
    assert str(tmp_path / "mods") not in sys.path  # the job's path is only borrowed
