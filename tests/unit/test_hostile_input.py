"""Hostile and malformed input (issue 9 item 5): site configs, sweep files, and strings that reach batch scripts.

- site configs (``load_site`` with a path): mutated real site files and raw garbage (broken TOML, invalid UTF-8)
  never raise anything but ConfigError, and reading one writes nothing;
- sweep files (``srl sweep @ FILE``): never a traceback, never a file outside the output directory, never a
  submission (or local run) after an error. Submission is replaced by a recorder: the one fake here, because a
  real submission is what must not happen;
- batch scripts: ``rl.sbatch`` is covered by ``tests/integration/test_rl_sbatch_stubs.py``.
"""

from __future__ import annotations

import copy
import math
import os
import tomllib
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SITES = sorted((ROOT / "site-configs").glob("*.toml"))
EVIL = [
    "$(touch PWNED1)",
    "`touch PWNED2`",
    "; touch PWNED3",
    "a'b\"c",
    "../../../../tmp/escape",
    "/etc/passwd",
    "ünïcødé-名前",
    "x\ny",
    "\x00",
    "-rf",
    "${IFS}",
    "1e999",
    "-1",
    "",
    " ",
    "{task_id}",
    "a" * 5000,
]
weird = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(EVIL),
    st.lists(st.sampled_from(EVIL + [1, 2.5]), max_size=3),
    st.dictionaries(
        st.sampled_from(["a", "uniform", "choice", "log_uniform", "samples"]),
        st.one_of(st.integers(-3, 3), st.lists(st.integers(-2, 5), max_size=3), st.text(max_size=3)),
        max_size=2,
    ),
)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


def _toml_bytes(data: dict) -> bytes:
    """Serialise ``data`` to TOML (None dropped, since TOML has no null); raw bytes kept as given."""

    def clean(x):
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items() if v is not None}
        if isinstance(x, list):
            return [clean(v) for v in x if v is not None]
        if isinstance(x, float) and math.isnan(x):
            return "nan"
        return x

    try:
        return tomli_w.dumps(clean(data)).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError, UnicodeEncodeError):
        return b"[broken"


def _leaves(tree: dict, prefix=()):
    for k, v in tree.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _leaves(v, prefix + (k,))


@st.composite
def mutated_doc(draw, base: dict) -> bytes:
    kind = draw(st.sampled_from(["mutate", "mutate", "mutate", "garbage", "bytes"]))
    if kind == "garbage":
        return draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    data = copy.deepcopy(base)
    paths = sorted(_leaves(data)) or [("x",)]
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(paths))
        node = data
        for p in path[:-1]:
            node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        action = draw(st.sampled_from(["set", "delete", "unknown"]))
        if action == "set":
            node[path[-1]] = draw(weird)
        elif action == "delete":
            node.pop(path[-1], None)
        else:
            node[draw(st.sampled_from(EVIL[:6] + ["zzz", "name"]))] = draw(weird)
    return _toml_bytes(data)


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


# ---- site configs ------------------------------------------------------------------------------------------
SITE_BASES = [tomllib.loads(p.read_text()) for p in SITES]


@SETTINGS
@given(doc=st.sampled_from(range(len(SITE_BASES))).flatmap(lambda i: mutated_doc(SITE_BASES[i])))
def test_site_config_never_tracebacks_and_writes_nothing(tmp_path_factory, doc):
    from toolkit.preflight.site import load_site

    box = tmp_path_factory.mktemp("site")
    path = box / "hostile.toml"
    path.write_bytes(doc)
    before = _files_under(box)
    cwd = os.getcwd()
    os.chdir(box)
    try:
        load_site(path)
    except ConfigError as e:
        assert "Traceback" not in str(e) and str(e).strip()
    finally:
        os.chdir(cwd)
    assert _files_under(box) == before


def _assert_refused_or_started_once(rc: int, err: str, calls: list[str], written: set[Path], out: Path) -> None:
    """A hostile input either fails with a message and starts nothing, or starts work exactly once; either way no
    traceback, and nothing is written outside the output directory."""
    assert "Traceback" not in err
    if rc != 0:
        assert calls == [], "work was started although the input failed validation"
        assert err.strip()
    else:
        assert len(calls) == 1
    assert all(p.is_relative_to(out) for p in written), sorted(written)


@pytest.fixture
def rl_recorder(monkeypatch):
    """Replace Slurm submission and the local launcher of ``srl rl`` by recorders."""
    calls: list[str] = []
    from toolkit.launch import local, submit

    monkeypatch.setattr(submit, "submit_job", lambda *a, **k: calls.append("submit_job") or "1")
    monkeypatch.setattr(local, "run_local", lambda *a, **k: calls.append("run_local") or 0)
    return calls


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=st.sampled_from(range(len(SITE_BASES))).flatmap(lambda i: mutated_doc(SITE_BASES[i])))
def test_rl_with_hostile_site_never_submits_after_error(tmp_path_factory, monkeypatch, rl_recorder, capsys, doc):
    from toolkit.cli import main

    box = tmp_path_factory.mktemp("rlsite")
    (box / "sites").mkdir()
    (box / "sites" / "hostile.toml").write_bytes(doc)
    monkeypatch.setenv("SRL_SITE_CONFIGS", str(box / "sites"))
    out = box / "out"
    rl_recorder.clear()
    rc = main(
        [
            "rl",
            "@",
            str(ROOT / "jobs/reverse-text/rl.toml"),
            "--site",
            "hostile",
            "--output-dir",
            str(out),
            "--run.name",
            "h",
        ]
    )
    written = _files_under(box) - _files_under(box / "sites") - {box / "sites"}
    _assert_refused_or_started_once(rc, capsys.readouterr().err, rl_recorder, written, out)


# ---- sweep files -------------------------------------------------------------------------------------------
SWEEP_BASE = {
    "sweep": {
        "name": "hostile",
        "base": [str(ROOT / "jobs/reverse-text/rl.toml")],
        "seeds": [0],
        "max_parallel": 2,
        "grid": {"trainer.optim.lr": [1e-4]},
        "random": {"samples": 1, "seed": 1, "trainer.optim.weight_decay": {"uniform": [0.0, 0.1]}},
    },
    "config": {"max_steps": 5, "output_dir": "outputs", "run": {"name": "x"}},
}


@pytest.fixture
def recorder(monkeypatch):
    """Replace the two ways a sweep starts work (Slurm array submission, local runs) by recorders."""
    calls: list[str] = []
    from toolkit import sweep
    from toolkit.launch import sweeps

    monkeypatch.setattr(sweeps, "submit_arrays", lambda *a, **k: calls.append("submit_arrays") or ["1"])
    monkeypatch.setattr(sweep, "_run_local", lambda *a, **k: calls.append("run_local") or 0)
    return calls


@SETTINGS
@given(doc=mutated_doc(SWEEP_BASE), site=st.sampled_from(["local", "local-slurm"]))
def test_sweep_file_never_tracebacks_escapes_or_submits_after_error(tmp_path_factory, recorder, capsys, doc, site):
    from toolkit.cli import main

    box = tmp_path_factory.mktemp("sweep")
    (box / "cwd").mkdir()
    path = box / "cwd" / "hostile.toml"
    path.write_bytes(doc)
    out = box / "out"
    recorder.clear()
    cwd = os.getcwd()
    os.chdir(box / "cwd")
    try:
        rc = main(["sweep", "@", str(path), "--output-dir", str(out), "--site", site])
    except SystemExit as e:  # argparse usage errors: a message, not a traceback
        rc = e.code
    finally:
        os.chdir(cwd)
    written = _files_under(box) - {box / "cwd", path}
    _assert_refused_or_started_once(rc, capsys.readouterr().err, recorder, written, out)


def test_sweep_random_and_size_errors_are_config_errors(tmp_path, recorder):
    from toolkit.sweep import load_sweep

    bad = [
        {"uniform": "abc"},
        {"uniform": [1]},
        {"log_uniform": [-1, 2]},
        {"log_uniform": [0, 1]},
        {"choice": []},
        {"choice": "ab"},
        {"uniform": [1, "x"]},
    ]
    for spec in bad:
        doc = copy.deepcopy(SWEEP_BASE)
        doc["sweep"]["random"] = {"samples": 2, "trainer.optim.weight_decay": spec}
        f = tmp_path / "s.toml"
        f.write_bytes(_toml_bytes(doc))
        with pytest.raises(ConfigError, match="sweep.random"):
            load_sweep(f)
    doc = copy.deepcopy(SWEEP_BASE)  # 10 axes x 10 values: 10**10 points must be refused, not expanded
    doc["sweep"]["grid"] = {f"a{i}.b": list(range(10)) for i in range(10)}
    f = tmp_path / "big.toml"
    f.write_bytes(_toml_bytes(doc))
    with pytest.raises(ConfigError, match="points"):
        load_sweep(f)
    assert recorder == []
