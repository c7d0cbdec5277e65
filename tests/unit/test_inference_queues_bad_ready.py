"""srl inference queues on a readiness file that is torn, binary or not a readiness record: exit 2 naming the file,
not a JSONDecodeError / KeyError / TypeError traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.commands.inference import main
from toolkit.run.layout import RunDir


@pytest.mark.parametrize(
    "content",
    [b"{", b"\xa3\xff\x00", b'{"url": 5}', b"[]", b'{"engine_urls": [5]}', b'{"engine_urls": [], "roles": [1]}'],
)
def test_bad_readiness_file_is_named(tmp_path: Path, content: bytes, capsys) -> None:
    run = RunDir(tmp_path)
    run.inference_ready.parent.mkdir(parents=True)
    run.inference_ready.write_bytes(content)
    assert main(["queues", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(run.inference_ready) in err and "not a readiness record" in err
