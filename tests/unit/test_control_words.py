"""srl status / srl cancel name a path that does not exist as such, and srl cancel --grace takes finite seconds
>= 0 only ('nan' skipped the wait, 'inf' waited forever, -5 did not wait), refused before anything is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.launch.control import cancel_main, status_main


@pytest.mark.parametrize("main", [status_main, cancel_main], ids=["status", "cancel"])
def test_a_missing_path_is_named_as_missing(main, tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path / "nope")]) == 1
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("grace", ["nan", "inf", "-5", "abc"])
def test_bad_grace_is_refused(grace: str, tmp_path: Path, capsys) -> None:
    (tmp_path / "configs").mkdir()
    with pytest.raises(SystemExit) as exc:
        cancel_main([str(tmp_path), "--graceful", "--grace", grace])
    assert exc.value.code == 2
    assert "--grace" in capsys.readouterr().err
    assert not (tmp_path / "control").exists()
