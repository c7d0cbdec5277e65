"""Overlays added to a job change only what their name says (issue 34 item 2).

``@ jobs/reverse-text/rl-pd.toml`` redefined ``[[orchestrator.train.env]]``; lists replace, so the job's train env
lost its ``prompt = "Reverse: {text}"`` (and the overlay also set ``max_steps = 20``). An overlay now amends a list
entry by name (``[orchestrator.train.env.reverse-text]``), and a file that replaces a whole list of tables gets a
note naming the list and the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolkit.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "jobs" / "reverse-text"


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else k))
        return out
    if isinstance(tree, list):
        out = {}
        for i, v in enumerate(tree):
            out.update(_leaves(v, f"{prefix}[{i}]"))
        return out
    return {prefix: tree}


def _changed(base: list[Path], overlay: Path) -> set[str]:
    alone = _leaves(load_config(base).config.model_dump(mode="json"))
    added = _leaves(load_config([*base, overlay]).config.model_dump(mode="json"))
    return {k for k in set(alone) | set(added) if alone.get(k) != added.get(k)}


# What each overlay's name says it changes (dotted prefixes of the resolved config).
_OWN = {
    "rl-pd.toml": (
        "inference.deployment.",
        "deployment.",
        "orchestrator.train.env[0].taskset.prompt_padding",
        "orchestrator.train.env[0].timeout.rollout",
    ),
    "slurm.toml": ("site", "deployment.", "slurm."),
}


@pytest.mark.parametrize("job", ["rl.toml", "rl-lora.toml"])
@pytest.mark.parametrize("overlay", sorted(_OWN))
def test_an_overlay_changes_only_what_its_name_says(job: str, overlay: str) -> None:
    changed = _changed([JOBS / job], JOBS / overlay)
    stray = sorted(k for k in changed if not k.startswith(_OWN[overlay]))
    assert not stray, f"{overlay} added to {job} also changes {stray}"
    loaded = load_config([JOBS / job, JOBS / overlay])
    assert not [n for n in loaded.notices if "replaces the whole list" in n], loaded.notices


def test_rl_pd_keeps_the_jobs_prompt_and_steps() -> None:
    cfg = load_config([JOBS / "rl.toml", JOBS / "rl-pd.toml"]).config
    (env,) = cfg.orchestrator.train.env
    assert env.taskset.model_extra["prompt"] == "Reverse: {text}"
    assert env.taskset.model_extra["prompt_padding"] == 160
    assert cfg.max_steps == load_config([JOBS / "rl.toml"]).config.max_steps
    assert cfg.inference.deployment.type == "disaggregated"


def test_replacing_a_whole_list_prints_a_note_naming_list_and_file(tmp_path: Path) -> None:
    over = tmp_path / "envs.toml"
    over.write_text('[[orchestrator.train.env]]\nname = "other"\ntaskset = { id = "reverse-text" }\n')
    loaded = load_config([JOBS / "rl.toml", over])
    notes = [n for n in loaded.notices if "replaces the whole list" in n]
    assert len(notes) == 1, loaded.notices
    assert str(over) in notes[0] and "orchestrator.train.env" in notes[0]
    assert "[orchestrator.train.env.<name>]" in notes[0]


def test_an_entry_is_amended_by_name_from_a_file_and_the_command_line(tmp_path: Path) -> None:
    over = tmp_path / "longer.toml"
    over.write_text("[orchestrator.eval.env.reverse-text-test]\nnum_examples = 8\n")
    loaded = load_config([JOBS / "rl.toml", over], ["--orchestrator.train.env.reverse-text.timeout.rollout", "90"])
    assert loaded.config.orchestrator.eval.env[0].num_examples == 8
    assert loaded.config.orchestrator.eval.env[0].taskset.model_extra["prompt"] == "Reverse: {text}"
    assert loaded.config.orchestrator.train.env[0].timeout.rollout == 90
    assert loaded.origins["orchestrator.eval.env[0].num_examples"] == str(over)
    assert loaded.origins["orchestrator.eval.env[0].group_size"] == str(JOBS / "rl.toml")


def test_an_unknown_entry_name_is_refused_naming_file_and_names(tmp_path: Path) -> None:
    over = tmp_path / "typo.toml"
    over.write_text("[orchestrator.train.env.revers-text]\ntimeout = { rollout = 5 }\n")
    with pytest.raises(ConfigError) as e:
        load_config([JOBS / "rl.toml", over])
    text = e.value.render()
    assert "revers-text" in text and "'reverse-text'" in text and str(over) in text


def test_an_amendment_before_the_list_exists_is_refused_not_dropped(tmp_path: Path) -> None:
    # Composed before the job file, the amendment was replaced by the job's list without a word (rollout stayed 60).
    early = tmp_path / "early.toml"
    early.write_text("[orchestrator.train.env.reverse-text]\ntimeout = { rollout = 120 }\n")
    with pytest.raises(ConfigError) as e:
        load_config([early, JOBS / "rl.toml"])
    (issue,) = e.value.issues
    assert issue.path == "orchestrator.train.env"
    assert str(early) in issue.message and "'reverse-text'" in issue.message
    assert f"after {JOBS / 'rl.toml'}" in issue.message
    # Alone (no list at all), the table is named as an amendment instead of pydantic's "a valid list".
    with pytest.raises(ConfigError) as e:
        load_config([early])
    text = e.value.render()
    assert "[[orchestrator.train.env]]" in text and "'reverse-text'" in text and str(early) in text


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "--orchestrator.train.env.reverse-text.max-turns",
            "3",
            "--orchestrator.train.env",
            '[{name = "zz", taskset = {id = "srl-reverse-text"}}]',
        ],
        [
            "--orchestrator.train.env",
            '[{name = "zz", taskset = {id = "srl-reverse-text"}}]',
            "--orchestrator.train.env.zz.max-turns",
            "3",
        ],
    ],
)
def test_overrides_that_overlap_are_refused_naming_both(overrides: list[str]) -> None:
    # The list given after the amendment dropped it without a word (max_turns stayed 1); given before it, the
    # amendment replaced the list and the error named an entry the user had just given.
    with pytest.raises(ConfigError) as e:
        load_config([JOBS / "rl.toml"], overrides)
    text = e.value.render()
    assert "--orchestrator.train.env " in text and "max-turns" in text and "overlap" in text


def test_repeated_and_sibling_overrides_still_compose() -> None:
    cfg = load_config(
        [JOBS / "rl.toml"],
        [
            "--orchestrator.batch-size",
            "8",
            "--orchestrator.batch-size",
            "16",
            "--orchestrator.train.env.reverse-text.max-turns",
            "2",
            "--orchestrator.train.env.reverse-text.timeout.rollout",
            "30",
        ],
    ).config
    (env,) = cfg.orchestrator.train.env
    assert cfg.orchestrator.batch_size == 16 and env.max_turns == 2 and env.timeout.rollout == 30
