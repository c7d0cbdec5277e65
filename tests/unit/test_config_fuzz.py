"""Mutated configs never produce a traceback: only ConfigError with a message naming where."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

from config_cases import validate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.config import ConfigError, RLConfig, load_config

VALID = tomllib.loads((Path(__file__).resolve().parents[2] / "jobs" / "reverse-text" / "rl.toml").read_text())


def _paths(tree, prefix=()):
    for k, v in tree.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _paths(v, prefix + (k,))


PATHS = sorted(_paths(VALID))
weird = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.sampled_from(["$(touch /tmp/pwned)", "; rm -rf /", "../../etc/passwd", "ünïcødé", "1e999", "-1"]),
)


@st.composite
def mutated(draw):
    """(mutated config, the top-level keys under which something was changed)."""
    data = copy.deepcopy(VALID)
    touched: set[str] = set()
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        node = data
        for p in path[:-1]:
            node = node.get(p) if isinstance(node, dict) else None
            if not isinstance(node, dict):
                break
        if not isinstance(node, dict):
            continue
        action = draw(st.sampled_from(["set", "delete", "unknown", "section"]))
        if action == "set":
            node[path[-1]] = draw(weird)
        elif action == "delete":
            node.pop(path[-1], None)
        elif action == "unknown":
            key = draw(st.text(min_size=1, max_size=12))
            node[key] = draw(weird)
            path = (*path[:-1], key)
        else:
            node[path[-1]] = {}
        touched.add(path[0])
    return data, touched


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutations_give_clear_errors_or_valid_configs(case):
    data, touched = case
    try:
        validate(data)
    except ConfigError as e:
        text = e.render()
        assert text.startswith("invalid config") and e.issues
        for issue in e.issues:
            # What: a message of its own. Where: a field path through a top-level key of the config (a check of
            # the whole table names the key in its message instead).
            assert issue.message.strip() and issue.message.strip() != issue.path.strip(), issue
            assert any(_names(issue, k) for k in [*data, *RLConfig.model_fields]), issue
            assert f"  - {issue}" in text, issue
        # The config was valid before the mutation, so at least one problem lies where something changed.
        assert any(_names(i, k) for i in e.issues for k in touched), (touched, text)


def _names(issue, key: str) -> bool:
    """Whether ``issue`` locates itself by ``key``: in its path, or (a check of a whole table) in its message,
    where a key that cannot be printed as is appears as its repr."""
    return key in issue.path if issue.path else (key in issue.message or repr(key) in issue.message)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_broken_toml_files(tmp_path_factory, raw):
    p = tmp_path_factory.mktemp("cfg") / "broken.toml"
    p.write_bytes(raw)
    try:
        load_config([p])
    except ConfigError as e:
        assert str(p) in e.render() or "invalid config" in e.render()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=15), max_size=4))
def test_random_override_tokens(tokens):
    try:
        load_config([Path(__file__).resolve().parents[2] / "jobs" / "reverse-text" / "rl.toml"], tokens)
    except ConfigError:
        pass
