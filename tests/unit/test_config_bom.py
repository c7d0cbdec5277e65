"""A config file saved with a UTF-8 byte-order mark (some Windows editors) reads as its text: the mark was reported
as "broken TOML: Invalid statement (at line 1, column 1)"."""

from __future__ import annotations

from pathlib import Path

from toolkit.config.compose import read_toml


def test_byte_order_mark_is_not_a_toml_error(tmp_path: Path) -> None:
    p = tmp_path / "run.toml"
    p.write_bytes(b"\xef\xbb\xbfmax_steps = 3\n")
    assert read_toml(p) == {"max_steps": 3}
