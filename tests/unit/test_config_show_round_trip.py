"""What ``srl config show`` and ``srl config convert`` print loads back into an equal config, nulls included.

TOML has no null: a null whose default is not null (``--ckpt.keep-last None``: keep every checkpoint) is written
as ``"None"``, the command line's spelling, and read back as null; left out, it would come back as its default.
"""

from __future__ import annotations

import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from toolkit.cli import main
from toolkit.config import ConfigError, RLConfig, load_config, toml_data, validate_dict
from toolkit.config.convert import to_canonical

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "jobs"
FIX = ROOT / "tests" / "fixtures" / "configs"

# Starting points: the shipped jobs (each variant with the file it overlays) and the seed-shape fixtures.
BASES: dict[str, list[Path]] = {
    "reverse-text": [JOBS / "reverse-text/rl.toml"],
    "reverse-text-slurm": [JOBS / "reverse-text/rl.toml", JOBS / "reverse-text/slurm.toml"],
    "reverse-text-lora-pd": [
        JOBS / "reverse-text/rl.toml",
        JOBS / "reverse-text/rl-lora.toml",
        JOBS / "reverse-text/rl-pd.toml",
    ],
    "multi-env": [JOBS / "multi-env/rl.toml"],
    "native-single": [FIX / "native_single.toml"],
    "legacy-v0": [FIX / "legacy_v0.toml"],
    "hosted-flat": [FIX / "hosted_flat.toml"],
}
LOADED = {name: load_config(files).config for name, files in BASES.items()}


def _admits_null(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def _nullable_fields(model: BaseModel, prefix: tuple = ()) -> list[tuple[tuple, bool]]:
    """(path, null is not the default) of every field of ``model``'s tree that takes null; list items by index."""
    out = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if _admits_null(field.annotation):
            out.append(((*prefix, name), field.get_default(call_default_factory=True) is not None))
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, BaseModel):
                where = (*prefix, name, i) if isinstance(value, list) else (*prefix, name)
                out += _nullable_fields(item, where)
    return out


NULLABLE = {name: _nullable_fields(cfg) for name, cfg in LOADED.items()}


def _null(data: dict, path: tuple, non_null_default: bool) -> None:
    """Make the field at ``path`` null the way an input file can: left out where null is its default, else the
    null itself (``--a.b None`` on the command line, ``"None"`` in a file)."""
    node: Any = data
    for part in path[:-1]:
        if isinstance(node, dict) and part not in node:
            return  # under a table already left out
        node = node[part]
    if not isinstance(node, dict):
        return
    if non_null_default:
        node[path[-1]] = None
    else:
        node.pop(path[-1], None)


def _reload(cfg: RLConfig, tmp: Path) -> RLConfig:
    path = tmp / "shown.toml"
    path.write_text(tomli_w.dumps(toml_data(cfg)))
    return load_config([path]).config


def _same(a: RLConfig, b: RLConfig) -> None:
    # notices say what loading an input mapped (printed as notes), not a setting: the canonical output maps nothing.
    assert a.model_dump(exclude={"notices"}) == b.model_dump(exclude={"notices"})


env_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)


@st.composite
def configs(draw) -> RLConfig:
    name = draw(st.sampled_from(sorted(BASES)))
    data = LOADED[name].model_dump()
    fields = NULLABLE[name]
    # Nulls whose default is not null are the ones a lossy dump turns back into values: drawn on their own.
    chosen = draw(st.sets(st.sampled_from([f for f in fields if f[1]])))
    chosen |= draw(st.sets(st.sampled_from(fields), max_size=6))
    for path, non_null_default in sorted(chosen, key=lambda f: len(f[0])):
        _null(data, path, non_null_default)
    # Text TOML has to quote or escape (quotes, backslashes, newlines, non-ASCII) in a field that takes any text.
    data["env_vars"] = draw(
        st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), env_text, max_size=3)
    )
    try:  # what load_config does after reading the files: map other shapes, then validate
        return validate_dict(to_canonical(data)[0]).config
    except ConfigError:
        reject()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(configs())
def test_shown_config_loads_back_equal_nulls_included(tmp_path_factory, cfg):
    again = _reload(cfg, tmp_path_factory.mktemp("show"))
    _same(again, cfg)


def test_config_show_keeps_nulls_that_have_a_non_null_default(tmp_path, capsys):
    argv = [
        "@",
        str(JOBS / "reverse-text/rl.toml"),
        "--ckpt.keep-last",
        "None",
        "--monitors.stop.max-empty-steps",
        "None",
        "--inference.restart-window-s",
        "None",
        "--monitors.stop.max-errored-share",
        "None",
    ]
    assert main(["config", "show", *argv]) == 0
    shown = tmp_path / "shown.toml"
    shown.write_text(capsys.readouterr().out)
    assert tomllib.loads(shown.read_text())["ckpt"]["keep_last"] == "None"
    again = load_config([shown]).config
    assert again.ckpt.keep_last is None and again.monitors.stop.max_empty_steps is None
    assert again.inference.restart_window_s is None and again.monitors.stop.max_errored_share is None
    _same(again, load_config([JOBS / "reverse-text/rl.toml"], argv[2:]).config)


@pytest.mark.parametrize("name", ["hosted_flat.toml", "legacy_v0.toml", "older_names.toml", "native_single.toml"])
def test_config_convert_output_loads_back_equal(name, tmp_path, capsys):
    assert main(["config", "convert", str(FIX / name)]) == 0
    converted = tmp_path / "converted.toml"
    converted.write_text(capsys.readouterr().out)
    loaded = load_config([converted])
    assert loaded.notices == []  # already canonical: nothing left to map
    _same(loaded.config, load_config([FIX / name]).config)


def test_none_in_a_file_is_null_only_where_no_text_is_allowed(tmp_path):
    over = tmp_path / "over.toml"
    over.write_text('[ckpt]\nkeep_last = "None"\n[monitors.wandb]\nproject = "None"\n')
    cfg = load_config([JOBS / "reverse-text/rl.toml", over]).config
    assert cfg.ckpt.keep_last is None
    assert cfg.monitors.wandb.project == "None"  # a text field keeps the text
