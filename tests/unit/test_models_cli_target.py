"""srl model build-tiny / import-smollm2 never replace a file or a directory of other files with a model (the
builders replace their target directory whole: a file given by mistake was deleted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.models.cli import main


@pytest.mark.parametrize("cmd", ["build-tiny", "import-smollm2"])
def test_a_file_or_a_directory_of_other_files_is_kept(tmp_path: Path, cmd: str, capsys) -> None:
    note = tmp_path / "notes.txt"
    note.write_text("important")
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print(1)")
    for target, words in ((note, "not a directory"), (project, "a directory of other files")):
        assert main([cmd, str(target)]) == 2
        err = capsys.readouterr().err
        assert str(target) in err and words in err, err
    assert note.read_text() == "important"
    assert (project / "train.py").read_text() == "print(1)"
